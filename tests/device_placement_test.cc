// Host/device placement in the executor, on a stand-in device: a provider whose memory is a
// caching arena over host memory it alone hands out, whose kernels (Add, Mul, Relu) refuse any
// input or output outside that arena, and whose CopyTensor counts the transfers. A graph
// mixing its ops with ops only the CPU has must compute what the CPU alone computes, with
// copies exactly at the boundaries, initializers uploaded once, a warning listing the ops that
// fell back, device memory reused across runs, and out-of-memory reported with the request.
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/arena_allocator.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"

namespace cleave {
namespace {

using providers::ArenaAllocator;
using providers::KernelContext;
using providers::OpKernel;

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
  std::vector<std::unique_ptr<providers::ExecutionProvider>> extra;
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
}

TEST(DevicePlacement, OutOfDeviceMemoryNamesTheValueAndTheBytes) {
  constexpr char kBig[] = R"(
    input x: float32[1024,1024]
    y = Relu(x)
    z = Relu(y)
    output z
  )";
  auto dev = std::make_unique<StandInDevice>(size_t{6} << 20);  // x, y and z need 12 MiB
  std::vector<std::unique_ptr<providers::ExecutionProvider>> extra;
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

}  // namespace
}  // namespace cleave
