// Host/device placement in the executor, on a stand-in device: a provider whose memory is a
// caching arena over host memory it alone hands out, whose kernels (Add, Mul, Relu) refuse any
// input or output outside that arena, and whose CopyTensor counts the transfers. A graph
// mixing its ops with ops only the CPU has must compute what the CPU alone computes, with
// copies exactly at the boundaries, initializers uploaded once, a warning listing the ops that
// fell back, device memory reused across runs, and out-of-memory reported with the request.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/arena_allocator.h"
#include "runtime/inference_session.h"
#include "runtime/profiler.h"
#include "onnx_ext/onnx_io.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/simulated_communicator.h"
#include "tests/device_comm.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/partition_plan.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

using providers::ArenaAllocator;
using testing::DeviceComm;
using providers::KernelContext;
using providers::OpKernel;

class HostTimer : public providers::StreamTimer {
 public:
  explicit HostTimer(std::atomic<int>* marks) : marks_(marks) {}
  absl::StatusOr<int> Mark() override {
    ++*marks_;
    times_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(times_.size()) - 1;
  }
  absl::StatusOr<std::vector<double>> Collect() override {
    std::vector<double> us;
    for (auto t : times_) us.push_back(std::chrono::duration<double, std::micro>(t - times_.front()).count());
    times_.clear();
    return us;
  }

 private:
  std::atomic<int>* marks_;
  std::vector<std::chrono::steady_clock::time_point> times_;
};

class StandInDevice : public providers::ExecutionProvider {
 public:
  explicit StandInDevice(size_t capacity) : arena_(Backend(capacity), {.min_region_bytes = 1 << 16}) {
    for (const char* op : {"Add", "Mul", "Relu"}) {
      providers::KernelDef def;
      def.op = op;
      def.supports = providers::InputTypeIn(0, {DataType::kFloat32});
      def.create = [this, op = std::string(op)](const graph::Node&, int) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
        return std::unique_ptr<OpKernel>(new Elementwise(this, op));
      };
      registry_.Register(std::move(def));
    }
  }
  std::string name() const override { return "StandInDeviceProvider"; }
  providers::DeviceKind device() const override { return providers::DeviceKind::kCuda; }
  providers::Allocator* allocator() override { return &arena_; }
  absl::Status CopyTensor(const TensorView& src, TensorView& dst) const override {
    // Exactly one side is device memory.
    if (arena_.Owns(src.data) == arena_.Owns(dst.data))
      return absl::InternalError("a copy that does not cross between host and device");
    std::memcpy(dst.data, src.data, src.nbytes());
    ++(arena_.Owns(dst.data) ? uploads : downloads);
    return absl::OkStatus();
  }
  const ArenaAllocator& arena() const { return arena_; }
  int device_allocations() const { return device_allocations_; }
  mutable std::atomic<int> uploads{0}, downloads{0};
  std::atomic<int> launches{0};
  // The stand-in's "stream" is the host: a mark is the host clock, and counted.
  std::unique_ptr<providers::StreamTimer> MakeStreamTimer() const override {
    return std::make_unique<HostTimer>(&marks);
  }
  mutable std::atomic<int> marks{0};

 private:
  class Elementwise : public OpKernel {
   public:
    Elementwise(StandInDevice* d, std::string op) : d_(d), op_(std::move(op)) {}
    absl::Status Compute(KernelContext& ctx) const override {
      for (int i = 0; i < ctx.num_inputs(); ++i)
        if (!d_->arena_.Owns(ctx.input(i)->data))
          return absl::InternalError(absl::StrCat(op_, ": input ", i, " is not in device memory"));
      const TensorView& a = *ctx.input(0);
      const TensorView* b = ctx.num_inputs() > 1 ? ctx.input(1) : nullptr;
      // Same shapes, or b a scalar: enough for the graphs here.
      TensorView* y = ctx.Output(0, a.dim_span());
      if (!y) return absl::OkStatus();
      if (!d_->arena_.Owns(y->data)) return absl::InternalError(op_ + ": output is not in device memory");
      const float* x = a.as<const float>();
      float* out = y->as<float>();
      float* scratch = static_cast<float*>(ctx.Scratch(16));
      if (!d_->arena_.Owns(scratch)) return absl::InternalError(op_ + ": scratch is not in device memory");
      for (int64_t i = 0; i < a.numel(); ++i) {
        const float r = b ? b->as<const float>()[b->numel() == 1 ? 0 : i] : 0.0f;
        out[i] = op_ == "Add" ? x[i] + r : op_ == "Mul" ? x[i] * r : std::max(x[i], 0.0f);
      }
      ++d_->launches;
      return absl::OkStatus();
    }

   private:
    StandInDevice* d_;
    std::string op_;
  };

  providers::ArenaBackend Backend(size_t capacity) {
    providers::ArenaBackend b = providers::HostArenaBackend();
    b.device_name = "stand-in:0";
    b.kind = providers::DeviceKind::kCuda;
    auto host_alloc = b.allocate;
    b.allocate = [this, capacity, host_alloc](size_t bytes) -> void* {
      if (reserved_ + bytes > capacity) return nullptr;
      reserved_ += bytes;
      ++device_allocations_;
      return host_alloc(bytes);
    };
    auto host_release = b.release;
    b.release = [host_release](void* p) { host_release(p); };
    b.free_bytes = [this, capacity] { return static_cast<int64_t>(capacity - reserved_); };
    return b;
  }

  size_t reserved_ = 0;
  int device_allocations_ = 0;
  mutable ArenaAllocator arena_;
};

// x -> Mul(w) -> Add(b) -> Erf (CPU only) -> Relu -> y, and the Add's output also an output.
constexpr char kMixed[] = R"(
  input x: float32[4,8]
  init w: float32[] = 1.5
  init b: float32[4,8] = fill 0.25
  m = Mul(x, w)
  a = Add(m, b)
  e = Erf(a)
  r = Relu(e)
  y = Add(r, x)
  output y
  output a
)";

Tensor Ramp(std::vector<int64_t> dims) {
  Tensor t(DataType::kFloat32, dims);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.1f * static_cast<float>(i) - 1.3f;
  return t;
}

TEST(DevicePlacement, MixedGraphMatchesTheCpuWithCopiesAtTheBoundaries) {
  SessionOptions plain;
  auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(kMixed), plain);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto dev = std::make_unique<StandInDevice>(size_t{64} << 20);
  StandInDevice* d = dev.get();
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra;
  extra.push_back(std::move(dev));
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(kMixed), plain, std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  // Mul, Add, Relu, Add on the device; Erf falls back, and the warning says so.
  EXPECT_NE((*s)->warning().find("1 node(s) have no StandInDeviceProvider kernel and run on CPUExecutionProvider"),
            std::string::npos)
      << (*s)->warning();
  EXPECT_NE((*s)->warning().find("Erf"), std::string::npos);
  const auto& placement = (*s)->placement();
  EXPECT_EQ(placement.at("CPUExecutionProvider"), 1);
  // 4 compute nodes plus 6 copies: w and b up (once, at load), x and e up, a down (read by
  // Erf and returned: one copy serves both) and y down.
  EXPECT_EQ(placement.at("StandInDeviceProvider"), 4 + 6);
  const int uploads_at_load = d->uploads.load();
  EXPECT_EQ(uploads_at_load, 2) << "initializers w and b";

  const Feeds feeds = {{"x", Ramp({4, 8})}};
  auto want = (*cpu)->Run(feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int run = 0; run < 3; ++run) {
    auto got = (*s)->Run(feeds);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ(testing::CompareTensors((*got)[0], (*want)[0], 0, 0), "");
    EXPECT_EQ(testing::CompareTensors((*got)[1], (*want)[1], 0, 0), "");
  }
  // Per run: x and e go up, a and y come down.
  EXPECT_EQ(d->uploads.load() - uploads_at_load, 3 * 2);
  EXPECT_EQ(d->downloads.load(), 3 * 2);
  EXPECT_EQ(d->launches.load(), 3 * 4);
  // Device buffers are reused: nothing is left in use between runs, and later runs took no
  // new device memory.
  EXPECT_EQ(d->arena().stats().in_use_bytes, 2 * 256) << "only the two uploaded initializers (a chunk each) stay";
  const int allocations = d->device_allocations();
  ASSERT_TRUE((*s)->Run(feeds).ok());
  EXPECT_EQ(d->device_allocations(), allocations);

  // Outputs and the feed in device memory: y (made on the device, read by nothing) is written
  // in place; a (read by Erf on the host too) goes through a host buffer, then to its tensor;
  // x is read where it is.
  auto device_tensor = [&](const Tensor& like) {
    providers::Allocator* a = d->allocator();
    void* p = a->Allocate(like.nbytes());
    Tensor t(like.dtype(), like.dims(), std::shared_ptr<void>(p, [a](void* q) { a->Free(q); }), p);
    std::memcpy(p, like.raw(), like.nbytes());
    return t;
  };
  std::vector<Tensor> outs = {device_tensor(Tensor(DataType::kFloat32, {4, 8})), device_tensor(Tensor(DataType::kFloat32, {4, 8}))};
  const int uploads = d->uploads.load(), downloads = d->downloads.load();
  ASSERT_TRUE((*s)->RunInto({{"x", device_tensor(feeds[0].second)}}, outs).ok());
  EXPECT_EQ(testing::CompareTensors(CopyToTensor(outs[0].view()), (*want)[0], 0, 0), "");
  EXPECT_EQ(testing::CompareTensors(CopyToTensor(outs[1].view()), (*want)[1], 0, 0), "");
  // Up: only e (x is resident). Down: a, for Erf. Then a's host buffer goes up into its tensor.
  EXPECT_EQ(d->uploads.load() - uploads, 2);
  EXPECT_EQ(d->downloads.load() - downloads, 1);
}

// A profiled run puts each device node (compute and copies) between two stream marks on the
// device stream's track, beside its launch on the host track; a run not profiled takes no marks.
TEST(DevicePlacement, ProfiledRunsPutDeviceNodesOnTheStreamTrack) {
  auto dev = std::make_unique<StandInDevice>(size_t{64} << 20);
  StandInDevice* d = dev.get();
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra;
  extra.push_back(std::move(dev));
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(kMixed), SessionOptions(), std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  const Feeds feeds = {{"x", Ramp({4, 8})}};
  ASSERT_TRUE((*s)->Run(feeds).ok());
  EXPECT_EQ(d->marks.load(), 0);

  runtime::Profiler profiler("test");
  RunOptions options;
  options.profiler = &profiler;
  options.profile_track = profiler.Track("compute");
  std::vector<Tensor> outs = {Tensor(DataType::kFloat32, {4, 8}), Tensor(DataType::kFloat32, {4, 8})};
  for (int run = 0; run < 2; ++run) ASSERT_TRUE((*s)->RunInto(feeds, outs, options).ok());
  const std::vector<std::string> tracks = profiler.tracks();
  const auto it = std::find(tracks.begin(), tracks.end(), "StandInDeviceProvider stream");
  ASSERT_NE(it, tracks.end());
  const int stream = static_cast<int>(it - tracks.begin());
  // Per run: Mul, Add, Relu, Add and the four copies that run (x and e up, a and y down).
  std::map<std::string, int> on_stream;
  std::map<std::string, std::vector<const runtime::Profiler::Event*>> on_host;
  const std::vector<runtime::Profiler::Event> events = profiler.events();
  for (const auto& e : events) {
    if (e.track == stream) ++on_stream[e.category];
    else on_host[e.name].push_back(&e);
  }
  EXPECT_EQ(on_stream, (std::map<std::string, int>{{"Add", 4}, {"Mul", 2}, {"Relu", 2},
                                                   {"MemcpyFromHost", 4}, {"MemcpyToHost", 4}}));
  EXPECT_EQ(d->marks.load(), 2 * 2 * 8);
  // The stand-in's stream is the host, so each stream event sits where its host event does
  // (to the clocks' rounding), run after run: a new round starts each run.
  std::map<std::string, int> seen;
  for (const auto& e : events) {
    if (e.track != stream) continue;
    const auto& host = on_host[e.name];
    ASSERT_LT(seen[e.name], static_cast<int>(host.size())) << e.name;
    const runtime::Profiler::Event& h = *host[seen[e.name]++];
    EXPECT_GE(e.duration_us, 0);
    EXPECT_NEAR(static_cast<double>(e.start_us), static_cast<double>(h.start_us), 2000.0) << e.name;
    EXPECT_LE(e.duration_us, h.duration_us + 200) << e.name;
  }
}

TEST(DevicePlacement, OutOfDeviceMemoryNamesTheValueAndTheBytes) {
  constexpr char kBig[] = R"(
    input x: float32[1024,1024]
    y = Relu(x)
    z = Relu(y)
    output z
  )";
  auto dev = std::make_unique<StandInDevice>(size_t{6} << 20);  // x, y and z need 12 MiB
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra;
  extra.push_back(std::move(dev));
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(kBig), SessionOptions{}, std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->warning(), "");
  auto r = (*s)->Run({{"x", Ramp({1024, 1024})}});
  ASSERT_FALSE(r.ok());
  const std::string m(r.status().message());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << m;
  EXPECT_NE(m.find("(4194304 bytes): out of memory on stand-in:0: requested 4194304 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("the device has"), std::string::npos) << m;
}

TEST(DevicePlacement, CudaAskedOfABuildOrMachineWithoutIt) {
  SessionOptions need;
  need.device = DeviceChoice::kCuda;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(kMixed), need);
  if (s.ok()) GTEST_SKIP() << "a CUDA device is present: covered by the gpu tests";
  EXPECT_NE(std::string(s.status().message()).find("the session asks for CUDA: "), std::string::npos) << s.status();
  SessionOptions prefer;
  prefer.device = DeviceChoice::kCudaIfAvailable;
  auto p = InferenceSession::FromGraph(*graph::ParseGraph(kMixed), prefer);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE((*p)->warning().find("running on the CPU: "), std::string::npos) << (*p)->warning();
  auto r = (*p)->Run({{"x", Ramp({4, 8})}});
  EXPECT_TRUE(r.ok()) << r.status();
}


// A stand-in device whose kernels are the CPU's, run on memory that only its arena hands out:
// every input a kernel reads on the device must be in that arena. It claims every op the CPU
// provider has except `host_only`, so training graphs run on it nearly whole.
class CpuKernelDevice : public providers::ExecutionProvider {
 public:
  explicit CpuKernelDevice(std::set<std::string> host_only)
      : arena_(providers::HostArenaBackend(), {.min_region_bytes = 1 << 20}) {
    static const std::map<std::string, std::vector<int>> kHostInputs = {
        {"Reshape", {1}}, {"Unsqueeze", {1}}, {"Squeeze", {1}}, {"ReduceSum", {1}}, {"ReduceMean", {1}},
        {"ReduceMax", {1}}, {"Split", {1}}, {"Slice", {1, 2, 3, 4}}, {"Expand", {1}}, {"ConstantOfShape", {0}},
        {"AdamW", {0, 1, 2}}, {"MultiTensorAdamW", {0, 1, 2}}, {"SGD", {0, 1, 2}}, {"MultiTensorSGD", {0, 1, 2}}, {"InPlaceAccumulator", {2}}, {"Dropout", {1, 2}},
        {"GatherGrad", {0}}, {"SliceGrad", {1, 2, 3, 4, 5}}, {"Trilu", {1}}};
    for (const providers::KernelDef& cpu : cpu_.registry().defs()) {
      if (host_only.count(cpu.op)) continue;
      providers::KernelDef d = cpu;
      auto it = kHostInputs.find(cpu.op);
      if (it != kHostInputs.end()) d.host_inputs = it->second;
      d.create = [this, create = cpu.create, host = d.host_inputs](const graph::Node& n, int v)
          -> absl::StatusOr<std::unique_ptr<OpKernel>> {
        ASSIGN_OR_RETURN(std::unique_ptr<OpKernel> inner, create(n, v));
        return std::unique_ptr<OpKernel>(new OnDevice(this, std::move(inner), host, n.Describe()));
      };
      registry_.Register(std::move(d));
    }
  }
  std::string name() const override { return "CpuKernelDevice"; }
  providers::DeviceKind device() const override { return providers::DeviceKind::kCuda; }
  providers::Allocator* allocator() override { return &arena_; }
  absl::Status CopyTensor(const TensorView& src, TensorView& dst) const override {
    const bool up = arena_.Owns(dst.data), down = arena_.Owns(src.data);
    if (up == down) return absl::InternalError("a copy that does not cross between host and device");
    std::memcpy(dst.data, src.data, src.nbytes());
    (up ? uploaded : downloaded) += static_cast<int64_t>(src.nbytes());
    return absl::OkStatus();
  }
  const ArenaAllocator& arena() const { return arena_; }
  mutable std::atomic<int64_t> uploaded{0}, downloaded{0};

 private:
  class OnDevice : public OpKernel {
   public:
    OnDevice(const CpuKernelDevice* d, std::unique_ptr<OpKernel> inner, std::vector<int> host, std::string name)
        : d_(d), inner_(std::move(inner)), host_(std::move(host)), name_(std::move(name)) {}
    absl::Status Compute(KernelContext& ctx) const override {
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const TensorView* in = ctx.input(i);
        if (!in || std::count(host_.begin(), host_.end(), i) || in->nbytes() == 0) continue;
        if (!d_->arena_.Owns(in->data))
          return absl::InternalError(absl::StrCat(name_, ": input ", i, " is not in device memory"));
      }
      return inner_->Compute(ctx);
    }

   private:
    const CpuKernelDevice* d_;
    std::unique_ptr<OpKernel> inner_;
    std::vector<int> host_;
    std::string name_;
  };

  providers::CpuExecutionProvider cpu_{1};
  mutable ArenaAllocator arena_;
};

// View ops on a device: a Reshape that makes a graph output writes into the device tensor the
// caller bound to it (not a view of the product), and one over a device-resident feed reads it.
TEST(DevicePlacement, DeviceViewsWriteBoundOutputs) {
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra = {device};
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input x: float32[4,8]
    init shape: int64[2] = 8 4
    m = Mul(x, x)
    y = Reshape(m, shape)
    r = Reshape(x, shape)
    z = Relu(r)
    output y
    output z
  )"), SessionOptions{}, std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  providers::Allocator* a = device->allocator();
  auto on_device = [&](const Tensor& like) {
    void* p = a->Allocate(like.nbytes());
    Tensor t(like.dtype(), like.dims(), std::shared_ptr<void>(p, [a](void* q) { a->Free(q); }), p);
    std::memcpy(p, like.raw(), like.nbytes());
    return t;
  };
  const Tensor x = Ramp({4, 8});
  Tensor zero(DataType::kFloat32, {8, 4});
  std::memset(zero.raw(), 0, zero.nbytes());
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> outs = {on_device(zero), on_device(zero)};
    ASSERT_TRUE((*s)->RunInto({{"x", on_device(x)}}, outs).ok());
    for (int i = 0; i < 32; ++i) {
      const float v = x.data<float>()[i];
      ASSERT_EQ(outs[0].data<float>()[i], v * v) << "run " << run << " y at " << i;
      ASSERT_EQ(outs[1].data<float>()[i], std::max(v, 0.f)) << "run " << run << " z at " << i;
    }
  }
}

// With a device provider, a TrainingSession keeps parameters, gradient buffers and optimizer
// state in device memory: steps move only the data, the loss and the boundaries of the one op
// left on the host (Erf's GELU), the trajectory is the CPU's, and the state reads back through
// GetState and checkpoints.
TEST(DevicePlacement, TrainingStateStaysOnTheDevice) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  spec.optimizer.max_grad_norm = 1.0f;
  const Feeds feeds = testing::TokenBatch(16, 256);
  std::vector<float> losses[2];
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{"LayerNormalization"});
  int64_t state_bytes = 0, uploaded_per_step = 0;
  for (int on_device = 0; on_device < 2; ++on_device) {
    auto a = trainer::BuildTrainingArtifacts(**model, spec);
    ASSERT_TRUE(a.ok()) << a.status();
    if (on_device)
      for (const auto& [name, t] : a->initial) state_bytes += static_cast<int64_t>(t.nbytes());
    trainer::TrainingSessionOptions o;
    o.intra_op_threads = 1;
    if (on_device) o.device_provider = device;
    auto s = trainer::TrainingSession::Create(std::move(*a), o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->device_resident(), on_device == 1);
    for (int step = 0; step < 4; ++step) {
      const int64_t before = device->uploaded.load();
      auto loss = (*s)->TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      losses[on_device].push_back(*loss);
      if (on_device && step == 3) uploaded_per_step = device->uploaded.load() - before;
    }
    if (on_device) {
      // The state reads back (and checkpoints) through the device's copies.
      auto w = (*s)->GetState("wte.weight");
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_EQ(w->dims(), (std::vector<int64_t>{256, 64}));
      EXPECT_TRUE(device->arena().stats().in_use_bytes >= 3 * state_bytes) << "params, gradients, two moments";
    }
  }
  for (int step = 0; step < 4; ++step) EXPECT_EQ(losses[1][step], losses[0][step]) << "step " << step;
  // A step uploads the token ids and the LayerNorm boundaries, not the parameters.
  EXPECT_GT(uploaded_per_step, 0);
  EXPECT_LT(uploaded_per_step, state_bytes / 4) << "per step " << uploaded_per_step << " of " << state_bytes;
}

// A bf16 training session of `model` (attention fused, as CUDA training runs it) on the CPU, or
// with `device` on the stand-in device, where the device sessions' fusions run.
absl::StatusOr<std::unique_ptr<trainer::TrainingSession>> Bf16Session(const graph::Graph& model,
                                                                      trainer::TrainingSpec spec,
                                                                      std::shared_ptr<CpuKernelDevice> device,
                                                                      std::set<std::string> disabled = {}) {
  spec.precision = trainer::Precision::kBf16;
  spec.fuse_attention = true;
  ASSIGN_OR_RETURN(trainer::TrainingArtifacts a, trainer::BuildTrainingArtifacts(model, spec));
  trainer::TrainingSessionOptions o;
  o.intra_op_threads = 1;
  o.device_provider = std::move(device);
  o.disabled_optimizers = std::move(disabled);
  return trainer::TrainingSession::Create(std::move(a), o);
}

// A bf16 step on a device session, with the fusions device sessions run (attention, the
// residual add with its LayerNorm writing bf16, the cross-entropy gradient from the scores with
// the loss folded in), tracks the CPU session's step; the CPU kernels compute both.
TEST(DevicePlacement, Bf16TrainingWithTheDeviceFusionsTracksTheCpu) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  spec.optimizer.max_grad_norm = 1.0f;
  const Feeds feeds = testing::TokenBatch(16, 256);
  std::vector<float> losses[2];
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  for (int on_device = 0; on_device < 2; ++on_device) {
    auto s = Bf16Session(**model, spec, on_device ? device : nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    if (on_device) {
      const graph::Graph* g = (*s)->training_graph();
      ASSERT_NE(g, nullptr);
      int skip_low = 0, loss_in_grad = 0, forward_loss = 0, transposes = 0, packed = 0, splits = 0;
      for (const auto& n : g->nodes()) {
        skip_low += n->op_type() == "SkipLayerNormalization" && n->output(0)->dtype() == DataType::kBFloat16;
        loss_in_grad += n->op_type() == "SoftmaxCrossEntropyLossGrad" && n->num_outputs() == 2 && n->output(1);
        forward_loss += n->op_type() == "SoftmaxCrossEntropyLoss";
        transposes += n->op_type() == "Transpose";
        if (n->op_type() == "SoftmaxCrossEntropyLossGrad") {
          EXPECT_EQ(n->input(1)->dtype(), DataType::kBFloat16) << "the logits product writes bf16";
        }
        packed += (n->op_type() == "Attention" || n->op_type() == "AttentionGrad") &&
                  n->AttrString("layout", "") == "bs3hd";
        splits += n->op_type() == "Split" || n->op_type() == "Concat";
      }
      EXPECT_EQ(skip_low, 4) << "ln2 of both layers, ln1 of the second, ln_f";
      EXPECT_EQ(loss_in_grad, 1);
      EXPECT_EQ(forward_loss, 0);
      EXPECT_EQ(packed, 4) << "both layers' Attention and AttentionGrad read the q/k/v product itself";
      EXPECT_EQ(transposes, 0) << "the attention layouts' 16 transposes are gone";
      EXPECT_EQ(splits, 0) << "the q/k/v Splits and the Concats of their gradients are gone";
    }
    for (int step = 0; step < 4; ++step) {
      auto loss = (*s)->TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      losses[on_device].push_back(*loss);
    }
  }
  // The first step's loss differs by the logits' bf16 rounding alone; later ones also carry
  // bf16's rounding of the gradient formed from the scores instead of the stored log_prob.
  EXPECT_NEAR(losses[1][0], losses[0][0], 1e-4 * losses[0][0]);
  EXPECT_NE(losses[1][0], losses[0][0]) << "the device session's logits are bf16";
  for (int step = 1; step < 4; ++step) EXPECT_NEAR(losses[1][step], losses[0][step], 2e-3 * losses[0][step]) << step;
}

// A second micro-batch: each token id t of `first` as (t * mul + add) % 256.
Feeds RemappedTokens(const Feeds& first, int64_t mul, int64_t add) {
  Feeds second;
  for (const auto& [name, t] : first) {
    Tensor c = t.Clone();
    for (int64_t i = 0; i < c.numel(); ++i) c.data<int64_t>()[i] = (c.data<int64_t>()[i] * mul + add) % 256;
    second.emplace_back(name, std::move(c));
  }
  return second;
}

// The weight gradients' products accumulate into their buffers themselves
// (GradientAccumulationFusion): 4 per layer, the bias-free bf16 weight products. Two micro-batches
// per optimizer step, so the second adds to the first (the product's beta = 1), and the steps
// track the CPU session's.
TEST(DevicePlacement, WeightGradientsAccumulateInTheirProducts) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  const Feeds first = testing::TokenBatch(16, 256);
  const Feeds second = RemappedTokens(first, 3, 11);
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  std::vector<float> losses[2];
  for (int on_device = 0; on_device < 2; ++on_device) {
    auto s = Bf16Session(**model, spec, on_device ? device : nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    if (on_device) {
      int fused = 0, accumulators = 0;
      for (const auto& n : (*s)->training_graph()->nodes()) {
        fused += n->op_type() == "MatMulBf16" && n->num_inputs() == 5 && n->input(3);
        accumulators += n->op_type() == "InPlaceAccumulator";
      }
      EXPECT_EQ(fused, 8) << "qkv, proj, fc and proj weights of both layers";
      EXPECT_EQ(accumulators, 20) << "the other parameters' gradients";
    }
    for (int step = 0; step < 3; ++step) {
      for (const Feeds* micro : std::array<const Feeds*, 2>{&first, &second}) {
        auto loss = (*s)->TrainStep(*micro);
        ASSERT_TRUE(loss.ok()) << loss.status();
        losses[on_device].push_back(*loss);
      }
      ASSERT_TRUE((*s)->OptimizerStep().ok());
    }
  }
  ASSERT_EQ(losses[0].size(), 6u);
  // Within 6e-5 here (bf16 logits and rounding); a second micro-batch that overwrote the first's
  // weight gradients would move the later losses by 2% to 8%.
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 5e-4 * losses[0][i]) << i;
  EXPECT_LT(losses[0][4], losses[0][0]) << "the steps train";
}

// Each linear layer's bias gradient is formed by its weight gradient's product
// (BiasGradientFusion): 4 per layer, the ReduceSums of the unfused graph gone but the position
// embedding's. Over two micro-batches the bias gradients accumulate to the unfused session's
// within bf16 rounding (the fused sums stay float32; the unfused ones round the fc and qkv sums
// to bf16, while the fused proj sums read the residual gradient's bf16 rounding the product
// reads), the weight gradients are the same bits, and the steps track the CPU session's.
TEST(DevicePlacement, BiasGradientsFormInTheWeightGradientProducts) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  const Feeds first = testing::TokenBatch(16, 256);
  const Feeds second = RemappedTokens(first, 5, 7);
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  auto fused = Bf16Session(**model, spec, device);
  auto unfused = Bf16Session(**model, spec, device, {"BiasGradientFusion"});
  auto cpu = Bf16Session(**model, spec, nullptr);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto count = [](const trainer::TrainingSession& s, int* with_dbias, int* sums) {
    *with_dbias = *sums = 0;
    for (const auto& n : s.training_graph()->nodes()) {
      if (n->op_type() == "MatMulBf16" && n->num_outputs() > 1 && n->output(1)) {
        ++*with_dbias;
        EXPECT_EQ(n->AttrInt("dbias_operand", -1), 0) << "dW = dz^T x reads dz as A";
        EXPECT_EQ(n->output(1)->dtype(), DataType::kFloat32);
      }
      *sums += n->op_type() == "ReduceSum";
    }
  };
  // The residual gradients' bf16 roundings, written by the LayerNorm gradients that form them.
  auto low_outputs = [](const trainer::TrainingSession& s) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes())
      n += node->op_type() == "LayerNormalizationGrad" && node->num_outputs() > 3 && node->output(3);
    return n;
  };
  EXPECT_EQ(low_outputs(**fused), 4) << "ln_f's and three of the four block LayerNorms' (ln1 of block 0 has none)";
  int with_dbias = 0, sums = 0;
  count(**fused, &with_dbias, &sums);
  EXPECT_EQ(with_dbias, 8) << "qkv, proj, fc and proj of both layers";
  EXPECT_EQ(sums, 1) << "the position embedding's gradient still sums the batch";
  count(**unfused, &with_dbias, &sums);
  EXPECT_EQ(with_dbias, 0);
  EXPECT_EQ(sums, 9);

  std::vector<float> losses[2];
  for (int step = 0; step < 3; ++step) {
    for (const Feeds* micro : std::array<const Feeds*, 2>{&first, &second})
      for (auto* s : {&fused, &unfused, &cpu}) {
        auto loss = (**s)->TrainStep(*micro);
        ASSERT_TRUE(loss.ok()) << loss.status();
        if (s != &unfused) losses[s == &fused].push_back(*loss);
      }
    if (step == 0) {
      int biases = 0;
      for (const std::string& p : (*fused)->parameter_names()) {
        auto f = (*fused)->GetGradient(p);
        auto u = (*unfused)->GetGradient(p);
        ASSERT_TRUE(f.ok() && u.ok()) << p;
        ASSERT_EQ(f->dims(), u->dims()) << p;
        const bool linear_bias = p.find(".bias") != std::string::npos && p.find("ln") == std::string::npos;
        if (!linear_bias) {
          // The linear layers' weight gradients: the same products, bit for bit.
          const bool linear_weight = p.find(".weight") != std::string::npos && p.find("ln") == std::string::npos &&
                                     p.find("wte") == std::string::npos && p.find("wpe") == std::string::npos;
          if (linear_weight) {
            EXPECT_EQ(std::memcmp(f->data<float>(), u->data<float>(), f->nbytes()), 0) << p << ": same product";
          }
          continue;
        }
        ++biases;
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < f->numel(); ++i) {
          diff += std::pow(double(f->data<float>()[i]) - u->data<float>()[i], 2);
          norm += std::pow(double(u->data<float>()[i]), 2);
        }
        EXPECT_GT(norm, 0) << p;
        EXPECT_LT(std::sqrt(diff), 1e-2 * std::sqrt(norm)) << p << ": both micro-batches' bias gradient";
      }
      EXPECT_EQ(biases, 8);
    }
    for (auto* s : {&fused, &unfused, &cpu}) ASSERT_TRUE((**s)->OptimizerStep().ok());
  }
  ASSERT_EQ(losses[0].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 5e-4 * losses[0][i]) << i;
  EXPECT_LT(losses[0][4], losses[0][0]) << "the steps train";
}

// The residual gradients' bf16 roundings written by their LayerNorm gradients
// (LayerNormGradCastFusion) are the Casts' bits: the steps and the parameters they reach are
// the same as with the pass off, where the Casts stay.
TEST(DevicePlacement, LayerNormGradientsWriteTheResidualGradientsRoundingExactly) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  auto on = Bf16Session(**model, spec, device);
  auto off = Bf16Session(**model, spec, device, {"LayerNormGradCastFusion"});
  ASSERT_TRUE(on.ok() && off.ok()) << on.status() << off.status();
  auto casts = [](const trainer::TrainingSession& s) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes()) n += node->op_type() == "Cast";
    return n;
  };
  EXPECT_EQ(casts(**off) - casts(**on), 4);
  const Feeds feeds = testing::TokenBatch(16, 256);
  for (int step = 0; step < 3; ++step) {
    auto a = (*on)->TrainStep(feeds);
    auto b = (*off)->TrainStep(feeds);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(*a, *b) << step;
    ASSERT_TRUE((*on)->OptimizerStep().ok() && (*off)->OptimizerStep().ok());
  }
  for (const std::string& p : (*on)->parameter_names()) {
    auto a = (*on)->GetState(p);
    auto b = (*off)->GetState(p);
    ASSERT_TRUE(a.ok() && b.ok()) << p;
    EXPECT_EQ(std::memcmp(a->data<float>(), b->data<float>(), a->nbytes()), 0) << p;
  }
}

// The products the LayerNorms and their gradients read write bf16 (LowPrecisionNormInputs): the
// residual branches' last products (the skip of 4 SkipLayerNormalizations) and the products
// forming 5 LayerNorm gradients' dY, as PyTorch's autocast hands them on. The steps still track
// the CPU session's (which keeps them float32) within bf16 rounding, and those of the session
// without the pass.
TEST(DevicePlacement, ProductsTheLayerNormsReadWriteBf16) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  auto on = Bf16Session(**model, spec, device);
  auto off = Bf16Session(**model, spec, device, {"LowPrecisionNormInputs"});
  auto cpu = Bf16Session(**model, spec, nullptr);
  ASSERT_TRUE(on.ok() && off.ok() && cpu.ok()) << on.status() << off.status() << cpu.status();
  auto low_inputs = [](const trainer::TrainingSession& s, int* skips, int* dys) {
    *skips = *dys = 0;
    for (const auto& n : s.training_graph()->nodes()) {
      *skips += n->op_type() == "SkipLayerNormalization" && n->input(1)->dtype() == DataType::kBFloat16;
      *dys += n->op_type() == "LayerNormalizationGrad" && n->input(0)->dtype() == DataType::kBFloat16;
    }
  };
  int skips = 0, dys = 0;
  low_inputs(**on, &skips, &dys);
  EXPECT_EQ(skips, 4);
  EXPECT_EQ(dys, 5) << "ln_f, both ln2 and both ln1";
  low_inputs(**off, &skips, &dys);
  EXPECT_EQ(skips + dys, 0);
  const Feeds feeds = testing::TokenBatch(16, 256);
  std::vector<float> losses[3];
  for (int step = 0; step < 4; ++step)
    for (int k = 0; k < 3; ++k) {
      trainer::TrainingSession& s = ***(k == 0 ? &on : k == 1 ? &off : &cpu);
      auto loss = s.TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(s.OptimizerStep().ok());
      losses[k].push_back(*loss);
    }
  EXPECT_NE(losses[0][0], losses[1][0]) << "the proj outputs are rounded to bf16 in the first forward";
  for (int step = 0; step < 4; ++step) {
    EXPECT_NEAR(losses[0][step], losses[1][step], 2e-3 * losses[1][step]) << step;
    EXPECT_NEAR(losses[0][step], losses[2][step], 2e-3 * losses[2][step]) << step;
  }
  EXPECT_LT(losses[0][3], losses[0][0]) << "the steps train";
}

// Passes can be turned off by name (SessionOptions::disabled_optimizers, as ONNX Runtime's
// disabled_optimizers), and through CLEAVE_DISABLED_OPTIMIZERS; an unknown name is an error
// that lists the passes. Without the layout fusion the attention transposes stay, and the
// session still trains.
TEST(DevicePlacement, DisabledOptimizersAreSkipped) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  auto count = [](const trainer::TrainingSession& s, const char* op) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes()) n += node->op_type() == op;
    return n;
  };
  auto off = Bf16Session(**model, spec, device, {"AttentionLayoutFusion", "GradientAccumulationFusion"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(count(**off, "Transpose"), 16);
  EXPECT_EQ(count(**off, "InPlaceAccumulator"), 28);
  auto loss = (*off)->TrainStep(testing::TokenBatch(16, 256));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(std::isfinite(*loss));
  ASSERT_EQ(setenv("CLEAVE_DISABLED_OPTIMIZERS", "AttentionLayoutFusion", 1), 0);
  auto env = Bf16Session(**model, spec, device);
  unsetenv("CLEAVE_DISABLED_OPTIMIZERS");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(count(**env, "Transpose"), 16);
  EXPECT_EQ(count(**env, "InPlaceAccumulator"), 20);
  auto bad = Bf16Session(**model, spec, device, {"AttentionLayout"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("disabled optimizer 'AttentionLayout': no such pass"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("AttentionLayoutFusion"), std::string::npos) << bad.status();
}

// A small language model whose tied head has `vocab` classes, with seeded random weights: an
// embedding, a tanh layer and a LayerNorm, and the head h · wteᵀ.
std::unique_ptr<graph::Graph> TiedHeadLm(int64_t vocab) {
  const std::string text = absl::StrCat(R"(
    opset 17
    input input_ids: int64[batch,seq]
    init wte: float32[)", vocab, R"(,16] = fill 0
    init fc.w: float32[16,16] = fill 0
    init ln.w: float32[16] = fill 1
    init ln.b: float32[16] = fill 0
    x = Gather(wte, input_ids)
    h0 = MatMul(x, fc.w)
    h1 = Tanh(h0)
    h = LayerNormalization(h1, ln.w, ln.b) {axis = -1}
    wt = Transpose(wte) {perm = [1, 0]}
    logits = MatMul(h, wt)
    output logits
  )");
  auto g = graph::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  uint32_t state = 12345;
  for (const char* name : {"wte", "fc.w"}) {
    graph::Value* v = (*g)->FindValue(name);
    Tensor t(DataType::kFloat32, v->initializer()->dims());
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 1664525u + 1013904223u;
      t.data<float>()[i] = (static_cast<float>(state >> 8) / 16777216.f - 0.5f) * 0.5f;
    }
    (*g)->SetInitializer(v, std::move(t));
  }
  return std::move(*g);
}

// Under bf16, GPT-2's 50257 classes (and 1027) give the head's [N, V] scores rows that are not
// 16-byte aligned; a device session pads them (ClassPadding) to 50304 (and 1032): the padded
// weight, the -inf mask, the padded gradient products and the Split of the weight gradient.
// The steps train as the CPU session does, labels at both ends of the vocabulary included.
TEST(DevicePlacement, Bf16VocabularyPaddedToAlignedRowsTrainsAsTheCpu) {
  for (const auto& [vocab, padded] : std::vector<std::pair<int64_t, int64_t>>{{1027, 1032}, {50257, 50304}}) {
    SCOPED_TRACE(vocab);
    trainer::TrainingSpec spec;
    spec.dims = {{"batch", 2}, {"seq", 8}};
    spec.optimizer.max_grad_norm = 1.0f;
    Tensor ids(DataType::kInt64, {2, 8}), labels(DataType::kInt64, {2, 8});
    for (int64_t i = 0; i < 16; ++i) {
      ids.data<int64_t>()[i] = (i * 977 + 5) % vocab;
      labels.data<int64_t>()[i] = i == 0 ? vocab - 1 : i == 1 ? 0 : (i * 613 + 11) % vocab;
    }
    const Feeds feeds = {{"input_ids", ids}, {"labels", labels}};
    auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
    std::vector<float> losses[2];
    for (int on_device = 0; on_device < 2; ++on_device) {
      auto s = Bf16Session(*TiedHeadLm(vocab), spec, on_device ? device : nullptr);
      ASSERT_TRUE(s.ok()) << s.status();
      if (on_device) {
        const graph::Graph& g = *(*s)->training_graph();
        int padded_products = 0, splits = 0, short_rows = 0;
        for (const auto& n : g.nodes()) {
          const bool product = n->op_type() == "MatMulBf16";
          for (const graph::Value* v : n->inputs())
            short_rows += product && v && v->shape().rank() >= 1 && v->shape()[v->shape().rank() - 1].value == vocab;
          if (product && n->output(0)->shape().is_static()) {
            const Shape& y = n->output(0)->shape();
            padded_products += y[y.rank() - 1].value == padded || y[0].value == padded;
            short_rows += y[y.rank() - 1].value == vocab;
          }
          if (n->op_type() == "Split" && n->input(0)->shape()[0].value == padded) {
            ++splits;
            EXPECT_EQ(n->output(0)->shape()[0].value, vocab);
          }
          if (n->op_type() == "SoftmaxCrossEntropyLossGrad") {
            EXPECT_EQ(n->input(1)->shape()[1].value, padded) << n->name();
            EXPECT_EQ(n->input(1)->dtype(), DataType::kBFloat16) << n->name();
          }
        }
        EXPECT_EQ(padded_products, 2) << "the logits and dW = dyᵀ · h";
        EXPECT_EQ(splits, 1);
        EXPECT_EQ(short_rows, 0) << "a bf16 product still reads or writes rows of " << vocab;
      }
      for (int step = 0; step < 4; ++step) {
        auto loss = (*s)->TrainStep(feeds);
        ASSERT_TRUE(loss.ok()) << loss.status();
        ASSERT_TRUE((*s)->OptimizerStep().ok());
        losses[on_device].push_back(*loss);
      }
    }
    // The device session's scores are bf16 (LowPrecisionScores), which moves the loss by up to
    // 8e-5 of itself here; that the padding itself changes nothing is checked exactly by
    // ClassPadding.PadsTheHeadToAlignedRowsAndComputesTheSame.
    for (int step = 0; step < 4; ++step) {
      EXPECT_TRUE(std::isfinite(losses[1][step]));
      EXPECT_NEAR(losses[1][step], losses[0][step], 3e-4 * losses[0][step]) << step;
    }
    EXPECT_LT(losses[0][3], losses[0][0]) << "the steps train";
  }
}

// A session of one rank on the stand-in device, its host and device communicators given.
trainer::TrainingSessionOptions OnStandInDevice(Communicator* host, Communicator* device) {
  trainer::TrainingSessionOptions o;
  o.intra_op_threads = 1;
  o.device_provider = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
  o.device_communicator = device;
  o.communicator = host;
  return o;
}

// Device-resident data-parallel training over a device communicator: the gradient reductions
// run on its duplicate, deferred, the host synchronising with them before the update and the
// compute stream joining them; updates bit-identical to the graph's own device collectives.
TEST(DevicePlacement, GradientReductionsOnADeviceCommunicator) {
  trainer::TrainingSpec spec;
  spec.optimizer.max_grad_norm = 1.0f;
  const trainer::TrainingArtifacts a = testing::BuildArtifacts("tiny_gpt", 4, 16, spec);
  std::vector<Tensor> params[2][2];  // [overlap][rank]
  std::shared_ptr<DeviceComm::Counts> counts[2][2];
  int overlapped[2] = {0, 0}, in_backward[2] = {-1, -1};
  for (int overlap = 0; overlap < 2; ++overlap) {
    std::vector<trainer::TrainingArtifacts> mine = testing::DataParallelArtifacts(a, 2, 0, 16 << 10);
    runtime::SimulatedWorld world(2);
    std::vector<absl::Status> status(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        counts[overlap][r] = std::make_shared<DeviceComm::Counts>();
        DeviceComm comm(world.rank(r), counts[overlap][r]);
        trainer::TrainingSessionOptions o = OnStandInDevice(world.rank(r), &comm);
        o.overlap_grad_reduce = overlap == 1;
        o.overlap_collectives = false;  // this checks the reducer alone
        auto s = trainer::TrainingSession::Create(std::move(mine[r]), o);
        if (!s.ok()) {
          status[r] = s.status();
          return;
        }
        for (int step = 0; step < 2 && status[r].ok(); ++step) {
          Tensor ids(DataType::kInt64, {2, 16}), labels(DataType::kInt64, {2, 16});
          for (int64_t i = 0; i < 32; ++i) {
            ids.data<int64_t>()[i] = (i * 7 + 3 + r * 11 + step) % 256;
            labels.data<int64_t>()[i] = (i * 5 + 1 + r * 13 + step) % 256;
          }
          status[r] = (*s)->TrainStep({{"input_ids", ids}, {"labels", labels}}).status();
          if (status[r].ok()) status[r] = (*s)->OptimizerStep().status();
        }
        if (r == 0 && (*s)->gradient_reducer()) {
          overlapped[overlap] = static_cast<int>((*s)->gradient_reducer()->reductions().size());
          in_backward[overlap] = (*s)->gradient_reducer()->launched_in_backward();
        }
        for (const std::string& p : (*s)->parameter_names()) params[overlap][r].push_back(*(*s)->GetState(p));
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  EXPECT_EQ(overlapped[0], 0);
  ASSERT_GT(overlapped[1], 1);
  EXPECT_EQ(in_backward[1], overlapped[1]);
  for (int r = 0; r < 2; ++r) {
    const DeviceComm::Counts& c = *counts[1][r];
    EXPECT_EQ(c.duplicates.load(), 1);
    EXPECT_EQ(c.deferred.load(), 1);
    // Per step: the next backward waits for the last step's reductions, and the update for
    // this step's (host synchronisation, then the compute stream joins what was queued since).
    EXPECT_GE(c.syncs.load(), 2);
    EXPECT_EQ(c.joins.load() + c.partial_joins.load(), 2);
    EXPECT_EQ(counts[0][r]->duplicates.load(), 0);
    ASSERT_EQ(params[1][r].size(), params[0][r].size());
    for (size_t i = 0; i < params[1][r].size(); ++i)
      EXPECT_EQ(std::memcmp(params[1][r][i].raw(), params[0][r][i].raw(), params[0][r][i].nbytes()), 0)
          << "rank " << r << " parameter " << i;
  }
}


// Tensor parallelism and a pipeline on a device: the graphs' collectives and messages run on a
// deferred duplicate of the device communicator, the compute stream joining each just before
// the step that needs it (through its own operation, not the later ones); parameters
// bit-identical to collectives and messages run in line.
class DeviceAsync : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceAsync, CollectivesAndMessagesOnADeviceCommunicator) {
  const trainer::PlanConfig c = testing::TinyGptPlanConfig(GetParam());
  std::vector<Tensor> params[2][2];  // [overlap][rank]
  std::shared_ptr<DeviceComm::Counts> counts[2][2];
  size_t launched[2] = {0, 0}, messages = 0;
  for (int overlap = 0; overlap < 2; ++overlap) {
    auto plan = trainer::BuildPlan(c);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->mesh.world_size(), 2);
    runtime::SimulatedWorld world(2);
    std::vector<absl::Status> status(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        counts[overlap][r] = std::make_shared<DeviceComm::Counts>();
        DeviceComm comm(world.rank(r), counts[overlap][r]);
        trainer::TrainingSessionOptions o = OnStandInDevice(world.rank(r), &comm);
        o.overlap_collectives = overlap == 1;
        const std::vector<trainer::TrainingSession::PipelineWork> work = trainer::PipelineWorkFor(*plan, r);
        auto s = trainer::TrainingSession::Create(std::move(plan->ranks[r].artifacts), o);
        if (!s.ok()) {
          status[r] = s.status();
          return;
        }
        for (int step = 0; step < 2 && status[r].ok(); ++step) {
          const std::vector<Feeds> micro =
              testing::MicroBatches(c.microbatches, c.batch / c.microbatches, c.seq, step, /*salt=*/0);
          status[r] = (*s)->pipelined() ? (*s)->PipelineStep(work, micro).status() : (*s)->TrainStep(micro[0]).status();
          if (status[r].ok()) status[r] = (*s)->OptimizerStep().status();
        }
        if (r == 0) {
          launched[overlap] = (*s)->async_collectives().size();
          for (const runtime::AsyncCollective& a : (*s)->async_collectives())
            messages += a.op == "Send" || a.op == "Recv";
        }
        for (const std::string& p : (*s)->parameter_names()) params[overlap][r].push_back(*(*s)->GetState(p));
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  EXPECT_EQ(launched[0], 0u);
  EXPECT_GT(launched[1], 0u);
  for (int r = 0; r < 2; ++r) {
    const DeviceComm::Counts& on = *counts[1][r];
    // One more duplicate, the collectives' queue, deferred, and joined through its operations
    // (besides the reducer's, which a pipeline has for its tied embedding).
    const DeviceComm::Counts& off = *counts[0][r];
    EXPECT_EQ(on.duplicates.load(), off.duplicates.load() + 1);
    EXPECT_EQ(on.deferred.load(), off.deferred.load() + 1);
    EXPECT_GT(on.partial_joins.load(), off.partial_joins.load());
    ASSERT_EQ(params[1][r].size(), params[0][r].size());
    for (size_t i = 0; i < params[1][r].size(); ++i)
      EXPECT_EQ(std::memcmp(params[1][r][i].raw(), params[0][r][i].raw(), params[0][r][i].nbytes()), 0)
          << "rank " << r << " parameter " << i;
  }
  // A pipeline's messages are among them.
  if (std::string(GetParam()) == "pp=2") EXPECT_GT(messages, 0u);
  else EXPECT_EQ(messages, 0u);
}

INSTANTIATE_TEST_SUITE_P(Meshes, DeviceAsync, ::testing::Values("tp=2", "pp=2"), [](const auto& info) {
  return std::string(info.param).substr(0, 2);
});

}  // namespace
}  // namespace cleave
