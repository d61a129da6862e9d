// Host/device placement in the executor, on a stand-in device: a provider whose memory is a
// caching arena over host memory it alone hands out, whose kernels (Add, Mul, Relu) refuse any
// input or output outside that arena, and whose CopyTensor counts the transfers. A graph
// mixing its ops with ops only the CPU has must compute what the CPU alone computes, with
// copies exactly at the boundaries, initializers uploaded once, a warning listing the ops that
// fell back, device memory reused across runs, and out-of-memory reported with the request.
// (bf16 training on the stand-in device of cpu_kernel_device.h: device_bf16_test.cc.)
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
#include "tests/cpu_kernel_device.h"
#include "tests/device_comm.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/partition_plan.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

using providers::ArenaAllocator;
using testing::CpuKernelDevice;
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

// A feed in device memory that a host step reads (Erf has no device kernel) or that is passed
// straight to an output: the host gets its own copy of the feed, once per run, while the device
// Add still reads the feed where it is. A host feed needs no such copy.
TEST(DevicePlacement, HostReadersOfADeviceResidentFeedReadAHostCopy) {
  constexpr char kGraph[] = R"(
    input x: float32[4,8]
    e = Erf(x)
    y = Add(e, x)
    output y
    output x
  )";
  auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(kGraph));
  auto dev = std::make_shared<StandInDevice>(size_t{64} << 20);
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(kGraph), SessionOptions(), {dev});
  ASSERT_TRUE(cpu.ok() && s.ok()) << cpu.status() << s.status();
  const Feeds feeds = {{"x", Ramp({4, 8})}};
  auto want = (*cpu)->Run(feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  // A host feed: x and e go up, y comes down.
  auto got = (*s)->Run(feeds);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(dev->uploads.load(), 2);
  EXPECT_EQ(dev->downloads.load(), 1);
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(testing::CompareTensors((*got)[k], (*want)[k], 0, 0), "") << k;

  providers::Allocator* a = dev->allocator();
  void* p = a->Allocate(feeds[0].second.nbytes());
  Tensor x(DataType::kFloat32, {4, 8}, std::shared_ptr<void>(p, [a](void* q) { a->Free(q); }), p);
  std::memcpy(p, feeds[0].second.raw(), x.nbytes());
  for (int run = 0; run < 2; ++run) {
    const int uploads = dev->uploads.load(), downloads = dev->downloads.load();
    got = (*s)->Run({{"x", x}});
    ASSERT_TRUE(got.ok()) << got.status();
    // Up: e only. Down: x for its host readers (Erf and the output x), and y.
    EXPECT_EQ(dev->uploads.load() - uploads, 1);
    EXPECT_EQ(dev->downloads.load() - downloads, 2);
    for (size_t k = 0; k < 2; ++k) EXPECT_EQ(testing::CompareTensors((*got)[k], (*want)[k], 0, 0), "") << k;
    EXPECT_FALSE(a->Owns((*got)[1].raw())) << "the output x is a host tensor";
  }
}

// The exports of models/variants (dynamic batch and sequence) on a device that claims every op:
// the shape arithmetic between Shape and the shape inputs the device kernels read on the host
// (Reshape's, ConstantOfShape's, Slice's...) runs on the host, and Shape reads the dims of a
// device value where it is, so a run moves only the feeds up and the outputs down; the outputs
// are the CPU's.
TEST(DevicePlacement, AnExportsShapeArithmeticStaysOnTheHost) {
  for (const char* variant : {"gpt_opset14", "bert_opset15", "llama_opset18"}) {
    SCOPED_TRACE(variant);
    const std::string dir = testing::SourceDir() + "/models/variants/" + variant;
    auto dev = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
    auto g = onnx_ext::LoadModel(dir + "/model.onnx");
    ASSERT_TRUE(g.ok()) << g.status();
    auto cpu = InferenceSession::FromGraph((*g)->Clone());
    auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions(), {dev});
    ASSERT_TRUE(cpu.ok() && s.ok()) << cpu.status() << s.status();
    EXPECT_EQ((*s)->warning(), "");
    EXPECT_EQ((*s)->placement().count("CPUExecutionProvider"), 1u) << "no node on the host";
    Feeds feeds;
    int64_t feed_bytes = 0, output_bytes = 0;
    for (size_t k = 0; k < (*s)->inputs().size(); ++k) {
      auto t = onnx_ext::LoadTensorFile(dir + "/test_data_set_1/input_" + std::to_string(k) + ".pb");
      ASSERT_TRUE(t.ok()) << t.status();
      feeds.emplace_back((*s)->inputs()[k].name, t->second);
      feed_bytes += static_cast<int64_t>(t->second.nbytes());
    }
    auto want = (*cpu)->Run(feeds);
    ASSERT_TRUE(want.ok()) << want.status();
    for (const Tensor& t : *want) output_bytes += static_cast<int64_t>(t.nbytes());
    const int64_t up = dev->uploaded.load(), down = dev->downloaded.load();
    auto got = (*s)->Run(feeds);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(dev->uploaded.load() - up, feed_bytes);
    EXPECT_EQ(dev->downloaded.load() - down, output_bytes);
    ASSERT_EQ(got->size(), want->size());
    for (size_t k = 0; k < got->size(); ++k)
      EXPECT_EQ(testing::CompareTensors((*got)[k], (*want)[k], 1e-6, 1e-5), "") << "output " << k;
  }
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
  // The stand-in's stream is the host, so each stream event sits where its host event does,
  // run after run (a new round starts each run). The host event spans the node's two marks, so
  // the stream span is no longer than it, to the microsecond rounding of both.
  std::map<std::string, int> seen;
  for (const auto& e : events) {
    if (e.track != stream) continue;
    const auto& host = on_host[e.name];
    ASSERT_LT(seen[e.name], static_cast<int>(host.size())) << e.name;
    const runtime::Profiler::Event& h = *host[seen[e.name]++];
    EXPECT_GE(e.duration_us, 0);
    EXPECT_NEAR(static_cast<double>(e.start_us), static_cast<double>(h.start_us), 2000.0) << e.name;
    EXPECT_LE(e.duration_us, h.duration_us + 1) << e.name;
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
