// The CUDA provider's own kernels (kernels/cuda/*.cu), run on the CPU under the emulation of
// the CUDA thread model in cuda_emu/, against references in double precision and the CPU
// kernels. These check the kernels' indexing, barriers, warp reductions, launch shapes and
// rounding on every machine; the gpu-labelled tests check the same kernels on a device, with
// libdevice's math and FMA contraction, and the cuBLASLt and cuDNN paths these cannot reach.
//
// Every test runs under four orders of the threads (ascending, descending, shuffled, and warps
// running ahead of each other): a result that depends on the order is a race. The arrays stand in for device memory and end at an
// inaccessible page, so a kernel reading or writing past one faults.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kernels.h"
#include "cuda_emu.h"  // last: it defines threadIdx and friends as macros

namespace cleave {
namespace {

namespace ck = kernels::cuda;
namespace emu = cuda_emu;
using ck::Dt;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Stand-in device memory of `bytes`, ending (to a 16-byte multiple) where an inaccessible page
// begins, with another before it.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (bytes + 15) / 16 * 16;
    span_ = (rounded + page - 1) / page * page + 2 * page;
    void* p = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<char*>(p);
    mprotect(base_, page, PROT_NONE);
    mprotect(base_ + span_ - page, page, PROT_NONE);
    data_ = base_ + span_ - page - rounded;
  }
  ~DeviceMemory() {
    if (base_) munmap(base_, span_);
  }
  DeviceMemory(DeviceMemory&& o) noexcept : base_(o.base_), data_(o.data_), span_(o.span_) {
    o.base_ = o.data_ = nullptr;
    o.span_ = 0;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* data() const { return data_; }

 private:
  char* base_ = nullptr;
  char* data_ = nullptr;
  size_t span_ = 0;
};

// An array of T in stand-in device memory, filled with `fill`.
template <typename T>
class Array {
 public:
  explicit Array(int64_t n, T fill = T{}) : n_(n), mem_(static_cast<size_t>(n) * sizeof(T)) {
    for (int64_t i = 0; i < n; ++i) data()[i] = fill;
  }
  Array(std::initializer_list<T> v) : Array(static_cast<int64_t>(v.size())) {
    int64_t i = 0;
    for (const T& x : v) data()[i++] = x;
  }
  Array(Array&&) = default;
  T* data() const { return static_cast<T*>(mem_.data()); }
  T& operator[](int64_t i) const { return data()[i]; }
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  DeviceMemory mem_;
};

size_t Bytes(Dt dt) { return dt == Dt::kF32 ? 4 : 2; }
float Round(Dt dt, float v) {
  if (dt == Dt::kBf16) return BFloat16ToFloat(FloatToBFloat16(v));
  if (dt == Dt::kF16) return HalfToFloat(FloatToHalf(v));
  return v;
}
const char* Name(Dt dt) { return dt == Dt::kF32 ? "float32" : dt == Dt::kBf16 ? "bfloat16" : "float16"; }

// n values stored as dt in stand-in device memory; NaN until set.
class Values {
 public:
  Values(Dt dt, int64_t n) : dt_(dt), n_(n), mem_(static_cast<size_t>(n) * Bytes(dt)) {
    for (int64_t i = 0; i < n; ++i) Set(i, kNaN);
  }
  Values(Dt dt, const std::vector<float>& v) : Values(dt, static_cast<int64_t>(v.size())) {
    for (int64_t i = 0; i < n_; ++i) Set(i, v[static_cast<size_t>(i)]);
  }
  float operator[](int64_t i) const {
    if (dt_ == Dt::kF32) return static_cast<const float*>(mem_.data())[i];
    const uint16_t b = static_cast<const uint16_t*>(mem_.data())[i];
    return dt_ == Dt::kBf16 ? BFloat16ToFloat(b) : HalfToFloat(b);
  }
  void Set(int64_t i, float v) {
    if (dt_ == Dt::kF32) static_cast<float*>(mem_.data())[i] = v;
    else static_cast<uint16_t*>(mem_.data())[i] = dt_ == Dt::kBf16 ? FloatToBFloat16(v) : FloatToHalf(v);
  }
  void* data() const { return mem_.data(); }
  int64_t size() const { return n_; }
  Dt dt() const { return dt_; }
  std::vector<double> Wide() const {
    std::vector<double> w(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) w[static_cast<size_t>(i)] = (*this)[i];
    return w;
  }

 private:
  Dt dt_;
  int64_t n_;
  DeviceMemory mem_;
};

std::vector<float> Uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

std::string Text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// got[i] within atol + rtol |want[i]| of want[i], where rtol grows by a rounding of got's
// storage type (a bf16 result may round the other way from a fp32 value that differs by ulps).
template <typename Got>
::testing::AssertionResult Near(const Got& got, Dt dt, const std::vector<double>& want, double rtol, double atol) {
  const double unit = dt == Dt::kF32 ? 0.0 : dt == Dt::kBf16 ? 1.0 / 128 : 1.0 / 1024;
  if (dt == Dt::kF16) atol += std::ldexp(1.0, -24);  // fp16's subnormal spacing
  int bad = 0;
  std::string text;
  if (static_cast<int64_t>(want.size()) != got.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[static_cast<int64_t>(i)], w = want[i];
    const bool same_special = (std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w);
    if (same_special || std::abs(g - w) <= atol + (rtol + unit) * std::abs(w)) continue;
    if (++bad <= 5) text += "\n  [" + std::to_string(i) + "] " + Text(g) + " want " + Text(w);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " values differ (" << Name(dt)
                                       << ", rtol " << rtol << ", atol " << atol << "):" << text;
}

::testing::AssertionResult Ok(int status) {
  if (status == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "launcher returned " << status << ": " << emu::LastFault();
}

class CudaEmu : public ::testing::TestWithParam<emu::Order> {
 protected:
  void SetUp() override {
    emu::SetOrder(GetParam(), 20261201);
    emu::ClearFault();
  }
};

const Dt kDts[] = {Dt::kF32, Dt::kBf16, Dt::kF16};

// ---- The emulation itself ------------------------------------------------------------------

TEST_P(CudaEmu, BarriersPublishSharedMemoryAndShufflesExchangeLanes) {
  Array<int> mirrored(128, -1), warp_sums(128, -1);
  emu::Launch("mirror", [&] {
    __shared__ int tile[64];
    const int t = static_cast<int>(threadIdx.x);
    tile[t] = 1000 * static_cast<int>(blockIdx.x) + t;
    __syncthreads();
    mirrored[blockIdx.x * 64 + t] = tile[63 - t];
    int v = t;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    warp_sums[blockIdx.x * 64 + t] = v;
  }, dim3(2), dim3(64));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << emu::LastFault();
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 64; ++t) {
      EXPECT_EQ(mirrored[b * 64 + t], 1000 * b + 63 - t);
      EXPECT_EQ(warp_sums[b * 64 + t], t < 32 ? 31 * 32 / 2 : 32 * 32 + 31 * 32 / 2);
    }
}

// Reading a neighbour's shared-memory slot without a barrier gives what the order gives: the
// orders disagree, which is how a missing __syncthreads shows in these tests.
TEST(CudaEmuOrders, AMissingBarrierReadsDifferentlyUnderAnotherOrder) {
  auto racy = [](emu::Order order) {
    emu::SetOrder(order, 7);
    Array<int> out(64, -1);
    emu::Launch("racy", [&] {
      __shared__ int slot[64];
      slot[threadIdx.x] = static_cast<int>(threadIdx.x);
      out[threadIdx.x] = slot[(threadIdx.x + 1) % 64];  // no __syncthreads in between
    }, dim3(1), dim3(64));
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    return std::vector<int>(out.data(), out.data() + 64);
  };
  const std::vector<int> up = racy(emu::Order::kAscending), down = racy(emu::Order::kDescending);
  EXPECT_NE(up, down);
  emu::SetOrder(emu::Order::kAscending);
}

TEST_P(CudaEmu, BarriersAndShufflesNotEveryThreadReachesAreFaults) {
  emu::Launch("early_return", [&] {
    if (threadIdx.x < 32) return;
    __syncthreads();
  }, dim3(1), dim3(64));
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(emu::LastFault()).find("kernel early_return, block (0, 0, 0)"), std::string::npos)
      << emu::LastFault();
  EXPECT_NE(std::string(emu::LastFault()).find("a __syncthreads not every thread reaches"),
            std::string::npos)
      << emu::LastFault();

  emu::ClearFault();
  emu::Launch("split_warp", [&] {
    if (threadIdx.x % 32 < 16) return;
    (void)__shfl_xor_sync(0xffffffffu, 1.f, 1);
  }, dim3(1), dim3(32));
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(emu::LastFault()).find("a full-mask shuffle not every lane reaches"), std::string::npos)
      << emu::LastFault();

  emu::ClearFault();
  emu::Launch("crossed", [&] {
    if (threadIdx.x < 16) (void)__shfl_xor_sync(0xffffffffu, 1.f, 1);  // lanes 16-31 are at the barrier
    else __syncthreads();
  }, dim3(1), dim3(64));
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_NE(std::string(emu::LastFault()).find("deadlock"), std::string::npos) << emu::LastFault();
}

TEST_P(CudaEmu, LaunchConfigurationsTheDeviceRefusesAreErrors) {
  struct Case {
    dim3 grid, block;
    size_t shared;
    cudaError_t error;
    const char* text;
  };
  const Case cases[] = {
      {dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration, "a launch of no blocks"},
      {dim3(1), dim3(2048), 0, cudaErrorInvalidConfiguration, "a block of 2048 threads"},
      {dim3(1, 70000), dim3(32), 0, cudaErrorInvalidConfiguration, "(1, 70000, 1) blocks"},
      {dim3(1), dim3(32), 300000, cudaErrorInvalidValue, "300000 bytes of dynamic shared memory"},
  };
  for (const Case& c : cases) {
    emu::ClearFault();
    bool ran = false;
    emu::Launch("refused", [&] { ran = true; }, c.grid, c.block, c.shared);
    EXPECT_EQ(cudaGetLastError(), c.error) << c.text;
    EXPECT_FALSE(ran) << c.text;
    EXPECT_NE(std::string(emu::LastFault()).find(c.text), std::string::npos) << emu::LastFault();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the error was taken
}

// ---- Elementwise ---------------------------------------------------------------------------

::testing::AssertionResult Exact(const Values& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    const float g = got[static_cast<int64_t>(i)];
    if (g == want[i] || (std::isnan(g) && std::isnan(want[i]))) continue;
    return ::testing::AssertionFailure() << "[" << i << "] " << g << " want " << want[i] << " (" << Name(got.dt())
                                         << ")";
  }
  return ::testing::AssertionSuccess();
}

double RefBinary(ck::BinaryOp op, double a, double b) {
  switch (op) {
    case ck::BinaryOp::kAdd: return a + b;
    case ck::BinaryOp::kSub: return a - b;
    case ck::BinaryOp::kMul: return a * b;
    case ck::BinaryOp::kDiv: return a / b;
    case ck::BinaryOp::kMax: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case ck::BinaryOp::kMin: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case ck::BinaryOp::kPow: return std::pow(a, b);
  }
  return NAN;
}

TEST_P(CudaEmu, BinaryOpsSameShapeAndBroadcast) {
  const ck::BinaryOp ops[] = {ck::BinaryOp::kAdd, ck::BinaryOp::kSub, ck::BinaryOp::kMul, ck::BinaryOp::kDiv,
                              ck::BinaryOp::kMax, ck::BinaryOp::kMin, ck::BinaryOp::kPow};
  for (Dt dt : kDts) {
    for (ck::BinaryOp op : ops) {
      SCOPED_TRACE(std::string(Name(dt)) + " op " + std::to_string(static_cast<int>(op)));
      const bool pow = op == ck::BinaryOp::kPow;
      // Same shape: 1000 elements, NaN at a few places for max and min.
      std::vector<float> av = Uniform(1000, pow ? 0.2f : -2.f, 2.f, 1), bv = Uniform(1000, 0.5f, 2.f, 2);
      for (size_t i = 0; i < bv.size(); i += 3) bv[i] = pow ? bv[i] - 2.5f : -bv[i];
      av[17] = kNaN;
      bv[400] = kNaN;
      Values a(dt, av), b(dt, bv), y(dt, 1000);
      ASSERT_TRUE(Ok(ck::Binary(op, dt, a.data(), b.data(), y.data(), 1000, nullptr, nullptr)));
      std::vector<double> want(1000);
      for (int64_t i = 0; i < 1000; ++i) want[static_cast<size_t>(i)] = Round(dt, static_cast<float>(RefBinary(op, a[i], b[i])));
      EXPECT_TRUE(Near(y, dt, want, pow ? 4e-7 : 1e-7, 0));
      // [3, 1, 5] op [1, 4, 5] -> [3, 4, 5].
      Values ba(dt, Uniform(15, pow ? 0.2f : -2.f, 2.f, 3)), bb(dt, Uniform(20, 0.5f, 2.f, 4)), by(dt, 60);
      ck::Broadcast bc;
      bc.rank = 3;
      const int64_t dims[] = {3, 4, 5}, as[] = {5, 0, 1}, bs[] = {0, 5, 1};
      for (int d = 0; d < 3; ++d) bc.out_dims[d] = dims[d], bc.a_strides[d] = as[d], bc.b_strides[d] = bs[d];
      ASSERT_TRUE(Ok(ck::Binary(op, dt, ba.data(), bb.data(), by.data(), 60, &bc, nullptr)));
      std::vector<double> bwant;
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j)
          for (int k = 0; k < 5; ++k)
            bwant.push_back(Round(dt, static_cast<float>(RefBinary(op, ba[i * 5 + k], bb[j * 5 + k]))));
      EXPECT_TRUE(Near(by, dt, bwant, pow ? 4e-7 : 1e-7, 0));
    }
  }
}

double Phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double RefUnary(ck::UnaryOp op, double x) {
  const double k = std::sqrt(2.0 / M_PI);
  switch (op) {
    case ck::UnaryOp::kIdentity: return x;
    case ck::UnaryOp::kRelu: return x > 0 ? x : 0;
    case ck::UnaryOp::kGelu: return x * Phi(x);
    case ck::UnaryOp::kGeluTanh: return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
    case ck::UnaryOp::kTanh: return std::tanh(x);
    case ck::UnaryOp::kExp: return std::exp(x);
    case ck::UnaryOp::kLog: return std::log(x);
    case ck::UnaryOp::kNeg: return -x;
    case ck::UnaryOp::kSqrt: return std::sqrt(x);
    case ck::UnaryOp::kSigmoid: return 1 / (1 + std::exp(-x));
    case ck::UnaryOp::kErf: return std::erf(x);
    case ck::UnaryOp::kReciprocal: return 1 / x;
    case ck::UnaryOp::kAbs: return std::abs(x);
  }
  return NAN;
}

TEST_P(CudaEmu, UnaryOpsAndTheGeluGradient) {
  for (Dt dt : kDts) {
    for (int o = 0; o <= static_cast<int>(ck::UnaryOp::kAbs); ++o) {
      const auto op = static_cast<ck::UnaryOp>(o);
      SCOPED_TRACE(std::string(Name(dt)) + " op " + std::to_string(o));
      std::vector<float> xv = Uniform(777, -4.f, 4.f, 5);
      for (float& x : xv) {
        if (op == ck::UnaryOp::kLog || op == ck::UnaryOp::kSqrt) x = std::abs(x) + 0.01f;
        if (op == ck::UnaryOp::kReciprocal) x += x < 0 ? -0.1f : 0.1f;
      }
      Values x(dt, xv), y(dt, 777);
      ASSERT_TRUE(Ok(ck::Unary(op, dt, x.data(), y.data(), 777, nullptr)));
      std::vector<double> want;
      for (int64_t i = 0; i < 777; ++i) want.push_back(Round(dt, static_cast<float>(RefUnary(op, x[i]))));
      EXPECT_TRUE(Near(y, dt, want, 1e-6, 1e-7));
    }
    for (bool tanh_form : {false, true}) {
      SCOPED_TRACE(std::string(Name(dt)) + (tanh_form ? " GeluGrad tanh" : " GeluGrad"));
      Values x(dt, Uniform(555, -6.f, 6.f, 6)), dy(dt, Uniform(555, -1.f, 1.f, 7)), dx(dt, 555);
      ASSERT_TRUE(Ok(ck::GeluGrad(dt, dy.data(), x.data(), dx.data(), 555, tanh_form, nullptr)));
      std::vector<double> want;
      const double k = std::sqrt(2.0 / M_PI);
      for (int64_t i = 0; i < 555; ++i) {
        const double v = x[i];
        const double t = std::tanh(k * (v + 0.044715 * v * v * v));
        const double d = tanh_form ? 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v)
                                   : Phi(v) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
        want.push_back(Round(dt, static_cast<float>(dy[i] * d)));
      }
      EXPECT_TRUE(Near(dx, dt, want, 1e-5, 1e-6));
    }
  }
}

TEST_P(CudaEmu, CastBetweenEveryPairOfFloatTypes) {
  std::vector<float> v = Uniform(600, -300.f, 300.f, 8);
  const float special[] = {0.f, -0.f, kInf, -kInf, kNaN, 1e-8f, 70000.f, 3.0e38f, 1.00390625f, 65520.f};
  for (size_t i = 0; i < std::size(special); ++i) v[i * 7] = special[i];
  for (Dt from : kDts)
    for (Dt to : kDts) {
      SCOPED_TRACE(std::string(Name(from)) + " to " + Name(to));
      Values x(from, v), y(to, 600);
      ASSERT_TRUE(Ok(ck::Cast(from, to, x.data(), y.data(), 600, nullptr)));
      std::vector<float> want;
      for (int64_t i = 0; i < 600; ++i) want.push_back(Round(to, x[i]));
      EXPECT_TRUE(Exact(y, want));
    }
}

TEST_P(CudaEmu, DropoutDrawsTheCpusMask) {
  const int64_t n = 3000;
  std::vector<float> xv = Uniform(n, -1.f, 1.f, 9);
  for (Dt dt : kDts)
    for (float ratio : {0.1f, 0.5f}) {
      SCOPED_TRACE(std::string(Name(dt)) + " ratio " + std::to_string(ratio));
      Values x(dt, xv), y(dt, n);
      Array<bool> mask(n, false);
      ASSERT_TRUE(Ok(ck::DropoutKeyed(dt, 0x1234abcdull, ratio, x.data(), y.data(), mask.data(), n, nullptr)));
      std::vector<float> xs(static_cast<size_t>(n)), cpu_y(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) xs[static_cast<size_t>(i)] = x[i];
      std::unique_ptr<bool[]> cpu_mask(new bool[n]);
      kernels::cpu::DropoutKeyed<float>(0x1234abcdull, ratio, n, xs.data(), cpu_y.data(), cpu_mask.get(), nullptr);
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(mask[i], cpu_mask[i]) << i;
        kept += mask[i];
        cpu_y[static_cast<size_t>(i)] = Round(dt, cpu_y[static_cast<size_t>(i)]);
      }
      EXPECT_TRUE(Exact(y, cpu_y));
      EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - ratio, 0.05);
    }
}

// The same-shape maps move 16 bytes per access where every pointer is aligned to it, and go
// element by element where one is not; both cover the tail past the last whole vector.
TEST_P(CudaEmu, SameShapeMapsInWholeVectorsAndElementByElement) {
  for (Dt dt : kDts)
    for (int64_t n : {1000, 777, 5})
      for (int64_t off : {0, 1}) {
        SCOPED_TRACE(std::string(Name(dt)) + " n " + std::to_string(n) + " offset " + std::to_string(off));
        const bool whole = off == 0;
        Values a(dt, Uniform(n + off, -3.f, 3.f, 40)), b(dt, Uniform(n + off, -3.f, 3.f, 41));
        auto at = [&](const Values& v) { return static_cast<char*>(v.data()) + off * Bytes(v.dt()); };
        {  // Unary
          Values y(dt, n + off);
          ASSERT_TRUE(Ok(ck::Unary(ck::UnaryOp::kGelu, dt, at(a), at(y), n, nullptr)));
          EXPECT_STREQ(emu::LastKernel(), whole ? "Map1<P>" : "Map1<1>");
          std::vector<double> want;
          for (int64_t i = 0; i < n + off; ++i)
            want.push_back(i < off ? NAN : Round(dt, static_cast<float>(RefUnary(ck::UnaryOp::kGelu, a[i]))));
          EXPECT_TRUE(Near(y, dt, want, 1e-6, 1e-7));
        }
        {  // Binary, and in place (y = a)
          Values y(dt, n + off);
          ASSERT_TRUE(Ok(ck::Binary(ck::BinaryOp::kMul, dt, at(a), at(b), at(y), n, nullptr, nullptr)));
          EXPECT_STREQ(emu::LastKernel(), whole ? "Map2<P>" : "Map2<1>");
          std::vector<double> want;
          for (int64_t i = 0; i < n + off; ++i) want.push_back(i < off ? NAN : Round(dt, a[i] * b[i]));
          EXPECT_TRUE(Near(y, dt, want, 0, 0));
          ASSERT_TRUE(Ok(ck::Binary(ck::BinaryOp::kMul, dt, at(y), at(b), at(y), n, nullptr, nullptr)));
          for (int64_t i = off; i < n + off; ++i) want[static_cast<size_t>(i)] = Round(dt, Round(dt, a[i] * b[i]) * b[i]);
          EXPECT_TRUE(Near(y, dt, want, 0, 0));
        }
        {  // GeluGrad
          Values dx(dt, n + off);
          ASSERT_TRUE(Ok(ck::GeluGrad(dt, at(b), at(a), at(dx), n, false, nullptr)));
          EXPECT_STREQ(emu::LastKernel(), whole ? "Map2<P>" : "Map2<1>");
          std::vector<double> want;
          for (int64_t i = 0; i < n + off; ++i) {
            const double v = a[i];
            want.push_back(i < off ? NAN
                                   : Round(dt, static_cast<float>(b[i] * (Phi(v) + v * std::exp(-0.5 * v * v) /
                                                                                     std::sqrt(2 * M_PI)))));
          }
          EXPECT_TRUE(Near(dx, dt, want, 1e-5, 1e-6));
        }
        for (Dt to : kDts) {  // Cast: 4 elements an access between float32 and a 16-bit type
          Values y(to, n + off);
          ASSERT_TRUE(Ok(ck::Cast(dt, to, at(a), at(y), n, nullptr)));
          EXPECT_STREQ(emu::LastKernel(), whole ? "Map1<P>" : "Map1<1>");
          std::vector<float> want;
          for (int64_t i = 0; i < n + off; ++i) want.push_back(i < off ? kNaN : Round(to, a[i]));
          EXPECT_TRUE(Exact(y, want));
        }
      }
}

// ---- Row kernels: LayerNorm, Softmax -------------------------------------------------------

struct RowStats {
  std::vector<double> mean, inv;
};
RowStats Stats(const std::vector<double>& x, int64_t rows, int64_t cols, double eps) {
  RowStats s;
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, q = 0;
    for (int64_t c = 0; c < cols; ++c) m += x[static_cast<size_t>(r * cols + c)];
    m /= static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) q += std::pow(x[static_cast<size_t>(r * cols + c)] - m, 2);
    s.mean.push_back(m);
    s.inv.push_back(1 / std::sqrt(q / static_cast<double>(cols) + eps));
  }
  return s;
}

TEST_P(CudaEmu, LayerNormAndSkipLayerNorm) {
  const float eps = 1e-5f;
  for (Dt dt : kDts)
    for (int64_t cols : {300, 70}) {
      SCOPED_TRACE(std::string(Name(dt)) + " cols " + std::to_string(cols));
      const int64_t rows = 37, n = rows * cols;
      const bool with_beta = cols == 300;
      Values x(dt, Uniform(n, -3.f, 5.f, 10)), skip(dt, Uniform(n, -1.f, 1.f, 11));
      Values gamma(dt, Uniform(cols, 0.5f, 1.5f, 12)), beta(dt, Uniform(cols, -0.5f, 0.5f, 13));
      Values y(dt, n);
      Array<float> mean(rows, kNaN), inv(rows, kNaN);
      ASSERT_TRUE(Ok(ck::LayerNorm(dt, x.data(), gamma.data(), with_beta ? beta.data() : nullptr, y.data(),
                                   mean.data(), inv.data(), rows, cols, eps, nullptr)));
      auto expect = [&](const std::vector<double>& in, const Values& got, const char* what) {
        SCOPED_TRACE(what);
        const RowStats st = Stats(in, rows, cols, eps);
        std::vector<double> want;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            want.push_back((in[static_cast<size_t>(r * cols + c)] - st.mean[static_cast<size_t>(r)]) *
                               st.inv[static_cast<size_t>(r)] * gamma[c] +
                           (with_beta ? beta[c] : 0.0));
        EXPECT_TRUE(Near(got, got.dt(), want, 1e-5, 1e-5));
        EXPECT_TRUE(Near(mean, Dt::kF32, st.mean, 1e-6, 1e-6));
        EXPECT_TRUE(Near(inv, Dt::kF32, st.inv, 1e-5, 0));
      };
      expect(x.Wide(), y, "LayerNorm");
      // x + skip, the sum stored in x's type; y in x's type, and bf16 from float32.
      for (Dt y_dt : {dt, Dt::kBf16}) {
        Values sy(y_dt, n), sum(dt, n);
        ASSERT_TRUE(Ok(ck::SkipLayerNorm(dt, y_dt, x.data(), skip.data(), gamma.data(),
                                         with_beta ? beta.data() : nullptr, sy.data(), mean.data(), inv.data(),
                                         sum.data(), rows, cols, eps, nullptr)));
        std::vector<float> want_sum;
        for (int64_t i = 0; i < n; ++i) want_sum.push_back(Round(dt, x[i] + skip[i]));
        EXPECT_TRUE(Exact(sum, want_sum));
        expect(sum.Wide(), sy, "SkipLayerNorm");
      }
    }
}

TEST_P(CudaEmu, LayerNormGradientWithTheResidualAndParameterSums) {
  for (Dt dt : kDts)
    for (int64_t rows : {300, 5, 0}) {
      SCOPED_TRACE(std::string(Name(dt)) + " rows " + std::to_string(rows));
      const int64_t cols = 70, n = rows * cols;
      const bool with_add = rows != 5;
      Values x(dt, Uniform(n, -2.f, 3.f, 14)), dy(dt, Uniform(n, -1.f, 1.f, 15)), add(dt, Uniform(n, -1.f, 1.f, 16));
      Values gamma(dt, Uniform(cols, 0.5f, 1.5f, 17)), dx(dt, n);
      const RowStats st = Stats(x.Wide(), rows, cols, 1e-5);
      Array<float> mean(rows), inv(rows), dgamma(cols, kNaN), dbeta(cols, kNaN);
      for (int64_t r = 0; r < rows; ++r) {
        mean[r] = static_cast<float>(st.mean[static_cast<size_t>(r)]);
        inv[r] = static_cast<float>(st.inv[static_cast<size_t>(r)]);
      }
      Array<float> scratch(std::max<int64_t>(1, ck::LayerNormGradScratch(rows, cols)), kNaN);
      ASSERT_TRUE(Ok(ck::LayerNormGrad(dt, dy.data(), x.data(), gamma.data(), mean.data(), inv.data(),
                                       with_add ? add.data() : nullptr, dx.data(), dgamma.data(), dbeta.data(),
                                       scratch.data(), rows, cols, nullptr)));
      std::vector<double> want_dx, want_g(static_cast<size_t>(cols), 0.0), want_b(static_cast<size_t>(cols), 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        double a = 0, b = 0;
        auto xhat = [&](int64_t c) { return (x[r * cols + c] - mean[r]) * static_cast<double>(inv[r]); };
        for (int64_t c = 0; c < cols; ++c) {
          const double gd = static_cast<double>(gamma[c]) * dy[r * cols + c];
          a += gd;
          b += gd * xhat(c);
          want_g[static_cast<size_t>(c)] += dy[r * cols + c] * xhat(c);
          want_b[static_cast<size_t>(c)] += dy[r * cols + c];
        }
        for (int64_t c = 0; c < cols; ++c) {
          double v = inv[r] * (gamma[c] * static_cast<double>(dy[r * cols + c]) - a / cols - xhat(c) * b / cols);
          if (with_add) v = Round(dt, static_cast<float>(v)) + static_cast<double>(add[r * cols + c]);
          want_dx.push_back(v);
        }
      }
      EXPECT_TRUE(Near(dx, dt, want_dx, 1e-5, 1e-5));
      EXPECT_TRUE(Near(dgamma, Dt::kF32, want_g, 1e-5, 1e-5));
      EXPECT_TRUE(Near(dbeta, Dt::kF32, want_b, 1e-5, 1e-5));
    }
}

TEST_P(CudaEmu, SoftmaxLogSoftmaxAndTheirGradients) {
  const int64_t rows = 19, cols = 1000, n = rows * cols;
  for (Dt dt : kDts)
    for (bool log : {false, true}) {
      SCOPED_TRACE(std::string(Name(dt)) + (log ? " LogSoftmax" : " Softmax"));
      Values x(dt, Uniform(n, -8.f, 8.f, 18)), y(dt, n);
      ASSERT_TRUE(Ok(ck::Softmax(dt, x.data(), y.data(), rows, cols, log, nullptr)));
      std::vector<double> want;
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[r * cols + c]));
        for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
        for (int64_t c = 0; c < cols; ++c) {
          const double lp = x[r * cols + c] - m - std::log(s);
          want.push_back(log ? lp : std::exp(lp));
        }
      }
      EXPECT_TRUE(Near(y, dt, want, 1e-5, log ? 1e-5 : 1e-8));

      Values dy(dt, Uniform(n, -1.f, 1.f, 19)), dx(dt, n);
      ASSERT_TRUE(Ok(ck::SoftmaxGrad(dt, dy.data(), y.data(), dx.data(), rows, cols, log, nullptr)));
      std::vector<double> want_dx;
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c)
          s += log ? static_cast<double>(dy[r * cols + c]) : static_cast<double>(dy[r * cols + c]) * y[r * cols + c];
        for (int64_t c = 0; c < cols; ++c) {
          const double g = dy[r * cols + c], v = y[r * cols + c];
          want_dx.push_back(log ? g - std::exp(v) * s : v * (g - s));
        }
      }
      EXPECT_TRUE(Near(dx, dt, want_dx, 1e-5, log ? 1e-5 : 1e-7));
    }
}

// ---- Softmax cross-entropy -----------------------------------------------------------------

constexpr int64_t kIgnore = -100;

// Labels over [0, C) with every fifth row ignored.
Array<int64_t> Labels(int64_t N, int64_t C, uint32_t seed) {
  Array<int64_t> l(N);
  std::mt19937 gen(seed);
  for (int64_t n = 0; n < N; ++n) l[n] = n % 5 == 3 ? kIgnore : static_cast<int64_t>(gen() % C);
  return l;
}

std::vector<double> RowLse(const Values& s, int64_t N, int64_t C) {
  std::vector<double> lse;
  for (int64_t n = 0; n < N; ++n) {
    double m = -INFINITY, e = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, static_cast<double>(s[n * C + c]));
    for (int64_t c = 0; c < C; ++c) e += std::exp(s[n * C + c] - m);
    lse.push_back(m + std::log(e));
  }
  return lse;
}

TEST_P(CudaEmu, SoftmaxCrossEntropyForwardEveryReductionAndABadLabel) {
  const int64_t N = 29, C = 1000;
  Values scores(Dt::kF32, Uniform(N * C, -6.f, 6.f, 20));
  for (int64_t c = 0; c < C; c += 7) scores.Set(2 * C + c, -kInf);  // masked classes add nothing
  Array<int64_t> labels = Labels(N, C, 21);
  const std::vector<double> lse = RowLse(scores, N, C);
  std::vector<double> rows, log_prob;
  double sum = 0;
  int counted = 0;
  for (int64_t n = 0; n < N; ++n) {
    const bool ignored = labels[n] == kIgnore;
    rows.push_back(ignored ? 0.0 : lse[static_cast<size_t>(n)] - scores[n * C + labels[n]]);
    sum += rows.back();
    counted += !ignored;
    for (int64_t c = 0; c < C; ++c) log_prob.push_back(scores[n * C + c] - lse[static_cast<size_t>(n)]);
  }
  for (int reduction : {0, 1, 2}) {
    SCOPED_TRACE("reduction " + std::to_string(reduction));
    Array<float> row_loss(N, kNaN), loss(1, kNaN), lp(N * C, kNaN);
    Array<double> count(1, NAN);
    ASSERT_TRUE(Ok(ck::SoftmaxCrossEntropy(static_cast<const float*>(scores.data()), labels.data(), row_loss.data(), lp.data(), loss.data(),
                                           count.data(), N, C, reduction, true, kIgnore, nullptr)));
    EXPECT_TRUE(Near(row_loss, Dt::kF32, rows, 1e-6, 1e-6));
    EXPECT_TRUE(Near(lp, Dt::kF32, log_prob, 1e-6, 1e-6));
    if (reduction != 2) {
      EXPECT_EQ(count[0], counted);
      EXPECT_NEAR(loss[0], reduction == 0 ? sum / counted : sum, 1e-5 * sum);
    }
  }
  // A label outside [0, C) that is not ignore_index makes the row's loss, and the mean, NaN.
  labels[4] = C;
  Array<float> row_loss(N, 0.f), loss(1, 0.f);
  Array<double> count(1);
  ASSERT_TRUE(Ok(ck::SoftmaxCrossEntropy(static_cast<const float*>(scores.data()), labels.data(), row_loss.data(), nullptr, loss.data(),
                                         count.data(), N, C, 0, true, kIgnore, nullptr)));
  EXPECT_TRUE(std::isnan(row_loss[4]));
  EXPECT_FALSE(std::isnan(row_loss[5]));
  EXPECT_TRUE(std::isnan(loss[0]));
}

TEST_P(CudaEmu, SoftmaxCrossEntropyGradientFromLogProbAndFromScores) {
  const int64_t N = 23, C = 700;
  Array<int64_t> labels = Labels(N, C, 22);
  for (Dt in_dt : {Dt::kF32, Dt::kBf16})
    for (Dt out_dt : {Dt::kF32, Dt::kBf16})
      for (int reduction : {0, 1, 2})
        for (bool from_scores : {false, true}) {
          if (in_dt != Dt::kF32 && !from_scores) continue;  // log_prob is float32
          SCOPED_TRACE(std::string(Name(in_dt)) + " in, " + Name(out_dt) + " out, reduction " +
                       std::to_string(reduction) + (from_scores ? ", from scores" : ", from log_prob"));
          Values scores(in_dt, Uniform(N * C, -5.f, 5.f, 23));
          const std::vector<double> lse = RowLse(scores, N, C);
          Array<float> log_prob(N * C);
          for (int64_t i = 0; i < N * C; ++i)
            log_prob[i] = static_cast<float>(scores[i] - lse[static_cast<size_t>(i / C)]);
          // From log_prob, a slice of the classes (a vocabulary-parallel loss): labels are global
          // classes and this slice starts at class 100.
          const int64_t offset = from_scores ? 0 : 100;
          Array<float> dy(reduction == 2 ? N : 1);
          for (int64_t n = 0; n < dy.size(); ++n) dy[n] = 0.5f + 0.25f * static_cast<float>(n % 3);
          Values dx(out_dt, N * C);
          Array<double> count(1, NAN);
          Array<float> row_loss(N, kNaN), loss(1, kNaN);
          const bool with_loss = from_scores;
          ASSERT_TRUE(Ok(ck::SoftmaxCrossEntropyGrad(
              dy.data(), from_scores ? scores.data() : static_cast<const void*>(log_prob.data()), in_dt, from_scores,
              labels.data(), dx.data(), out_dt, count.data(), N, C, reduction, true, kIgnore, offset,
              with_loss ? row_loss.data() : nullptr, with_loss ? loss.data() : nullptr, nullptr)));
          int counted = 0;
          for (int64_t n = 0; n < N; ++n) counted += labels[n] != kIgnore;
          std::vector<double> want, want_rows;
          double sum = 0;
          for (int64_t n = 0; n < N; ++n) {
            const bool ignored = labels[n] == kIgnore;
            const double g = reduction == 2 ? dy[n] : reduction == 1 ? dy[0] : dy[0] / counted;
            for (int64_t c = 0; c < C; ++c)
              want.push_back(ignored ? 0.0
                                     : g * (std::exp(scores[n * C + c] - lse[static_cast<size_t>(n)]) -
                                            (c + offset == labels[n] ? 1.0 : 0.0)));
            want_rows.push_back(ignored ? 0.0 : lse[static_cast<size_t>(n)] - scores[n * C + labels[n]]);
            sum += want_rows.back();
          }
          EXPECT_TRUE(Near(dx, out_dt, want, 1e-5, 1e-8));
          if (with_loss) {
            EXPECT_TRUE(Near(row_loss, Dt::kF32, want_rows, 1e-6, 1e-6));
            if (reduction != 2) {
              EXPECT_NEAR(loss[0], reduction == 0 ? sum / counted : sum, 1e-5 * sum);
            }
          }
        }
}

// ---- Reductions and Where ------------------------------------------------------------------

struct ReduceCase {
  std::vector<int64_t> dims;
  std::vector<bool> reduce;
  bool scratch;
};

TEST_P(CudaEmu, ReduceSumMeanMaxOverEveryLayout) {
  const ReduceCase cases[] = {
      {{300, 70}, {true, false}, true},               // leading axes in row chunks, combined in a second pass
      {{300, 70}, {true, false}, false},              // the same in one pass
      {{1, 40, 1, 3}, {true, true, false, false}, false},  // dims of 1 ignored
      {{5, 3000}, {false, true}, false},              // trailing, long rows: 256 threads per output
      {{7, 50}, {false, true}, false},                // trailing, short rows: a warp per output
      {{6, 50}, {true, true}, false},                 // everything
      {{4, 6, 5}, {false, true, false}, false},       // the middle axis: a thread per output
      {{3, 0, 4}, {false, true, false}, false},       // nothing to reduce
  };
  const ck::ReduceOp ops[] = {ck::ReduceOp::kSum, ck::ReduceOp::kMean, ck::ReduceOp::kMax};
  for (Dt dt : kDts)
    for (const ReduceCase& rc : cases)
      for (ck::ReduceOp op : ops) {
        const int rank = static_cast<int>(rc.dims.size());
        int64_t n = 1;
        for (int64_t d : rc.dims) n *= d;
        std::string shape;
        for (int64_t d : rc.dims) shape += std::to_string(d) + " ";
        SCOPED_TRACE(std::string(Name(dt)) + " dims " + shape + "op " + std::to_string(static_cast<int>(op)));
        std::vector<float> xv = Uniform(n, -3.f, 3.f, 24);
        if (op == ck::ReduceOp::kMax && n > 100) xv[77] = kNaN;  // a max propagates NaN
        Values x(dt, xv);
        bool reduce[ck::kMaxRank];
        for (int d = 0; d < rank; ++d) reduce[d] = rc.reduce[static_cast<size_t>(d)];
        int64_t outputs = 1, R = 1;
        for (int d = 0; d < rank; ++d) (reduce[d] ? R : outputs) *= rc.dims[static_cast<size_t>(d)];
        Values y(dt, outputs);
        const int64_t scratch_n = ck::ReduceScratch(rank, rc.dims.data(), reduce);
        if (rc.scratch) {
          EXPECT_GT(scratch_n, 0);
        }
        Array<double> scratch(std::max<int64_t>(scratch_n, 1), NAN);
        ASSERT_TRUE(Ok(ck::Reduce(op, dt, x.data(), y.data(), rank, rc.dims.data(), reduce,
                                  rc.scratch ? scratch.data() : nullptr, nullptr)));
        // The reference: walk x in order, each element to its output.
        std::vector<double> want(static_cast<size_t>(outputs), op == ck::ReduceOp::kMax ? -INFINITY : 0.0);
        for (int64_t i = 0; i < n; ++i) {
          int64_t rest = i, o = 0, scale = 1;
          for (int d = rank - 1; d >= 0; --d) {
            const int64_t size = rc.dims[static_cast<size_t>(d)], c = rest % size;
            rest /= size;
            if (!reduce[d]) o += c * scale, scale *= size;
          }
          double& w = want[static_cast<size_t>(o)];
          const double v = x[i];
          w = op == ck::ReduceOp::kMax ? (std::isnan(v) || std::isnan(w) ? NAN : std::max(w, v)) : w + v;
        }
        for (double& w : want) {
          if (op == ck::ReduceOp::kMean) w /= static_cast<double>(R);
          w = Round(dt, static_cast<float>(w));
        }
        EXPECT_TRUE(Near(y, dt, want, 1e-6, 1e-6));
      }
}

TEST_P(CudaEmu, WhereBroadcastsItsThreeOperands) {
  // cond [4, 1], a [4, 5], b [1, 5] -> y [4, 5], for 2-, 4- and 8-byte elements.
  Array<bool> cond{true, false, false, true};
  ck::Broadcast3 bc;
  bc.rank = 2;
  bc.out_dims[0] = 4, bc.out_dims[1] = 5;
  const int64_t strides[3][2] = {{1, 0}, {5, 1}, {0, 1}};
  for (int k = 0; k < 3; ++k) bc.strides[k][0] = strides[k][0], bc.strides[k][1] = strides[k][1];
  auto run = [&](auto zero) {
    using E = decltype(zero);
    Array<E> a(20), b(5), y(20, E{99});
    for (int i = 0; i < 20; ++i) a[i] = static_cast<E>(i + 1);
    for (int i = 0; i < 5; ++i) b[i] = static_cast<E>(-i - 1);
    ASSERT_TRUE(Ok(ck::Where(sizeof(E), cond.data(), a.data(), b.data(), y.data(), 20, bc, nullptr)));
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 5; ++c) EXPECT_EQ(y[r * 5 + c], cond[r] ? a[r * 5 + c] : b[c]) << r << ", " << c;
  };
  run(int16_t{});
  run(float{});
  run(int64_t{});
}

// ---- Gather, its gradient, Transpose -------------------------------------------------------

TEST_P(CudaEmu, GatherRowsAndScatterAddTheirGradient) {
  const int64_t rows = 10, width = 7;
  Array<int64_t> ids{3, -1, 0, 10, -11, 9, 3, 2, 3};  // 10 and -11 are out of range: zero rows
  const int64_t k = ids.size();
  auto row_of = [&](int64_t i) { return ids[i] < -rows || ids[i] >= rows ? -1 : (ids[i] + rows) % rows; };
  auto run = [&](auto zero) {
    using E = decltype(zero);
    Array<E> table(rows * width), out(k * width, E{77});
    for (int64_t i = 0; i < rows * width; ++i) table[i] = static_cast<E>(i + 1);
    ASSERT_TRUE(Ok(ck::Gather(sizeof(E), table.data(), ids.data(), out.data(), k, rows, width, nullptr)));
    for (int64_t i = 0; i < k; ++i)
      for (int64_t c = 0; c < width; ++c)
        EXPECT_EQ(out[i * width + c], row_of(i) < 0 ? E{} : table[row_of(i) * width + c]) << i << ", " << c;
  };
  run(uint8_t{});
  run(int16_t{});
  run(float{});
  run(double{});
  // Small integers, so the sums are exact whatever order the additions take.
  Array<float> dy(k * width), dtable(rows * width, kNaN);
  for (int64_t i = 0; i < k * width; ++i) dy[i] = static_cast<float>(i % 11 - 5);
  ASSERT_TRUE(Ok(ck::GatherGrad(dy.data(), ids.data(), dtable.data(), k, rows, width, nullptr)));
  std::vector<double> want(static_cast<size_t>(rows * width), 0.0);
  for (int64_t i = 0; i < k; ++i)
    if (row_of(i) >= 0)
      for (int64_t c = 0; c < width; ++c) want[static_cast<size_t>(row_of(i) * width + c)] += dy[i * width + c];
  EXPECT_TRUE(Near(dtable, Dt::kF32, want, 0, 0));
}

TEST_P(CudaEmu, TransposeEveryPermutationAndTheWideWordPaths) {
  auto check = [](std::vector<int64_t> dims, std::vector<int64_t> perm, size_t elem, int64_t offset) {
    const int rank = static_cast<int>(dims.size());
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::string text;
    for (int64_t p : perm) text += std::to_string(p);
    SCOPED_TRACE("perm " + text + ", " + std::to_string(elem) + "-byte elements, offset " + std::to_string(offset));
    Array<uint8_t> x(static_cast<int64_t>(n * elem) + offset), y(static_cast<int64_t>(n * elem) + offset, 0xee);
    for (int64_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i * 7 + i / 251);
    ASSERT_TRUE(Ok(ck::Transpose(static_cast<int>(elem), x.data() + offset, y.data() + offset, rank, dims.data(),
                                 perm.data(), nullptr)));
    std::vector<int64_t> strides(dims.size());
    int64_t st = 1;
    for (int d = rank - 1; d >= 0; --d) strides[static_cast<size_t>(d)] = st, st *= dims[static_cast<size_t>(d)];
    for (int64_t i = 0; i < n; ++i) {
      int64_t rest = i, src = 0;
      for (int d = rank - 1; d >= 0; --d) {
        const int64_t size = dims[static_cast<size_t>(perm[static_cast<size_t>(d)])];
        src += (rest % size) * strides[static_cast<size_t>(perm[static_cast<size_t>(d)])];
        rest /= size;
      }
      ASSERT_EQ(std::memcmp(y.data() + offset + i * elem, x.data() + offset + src * elem, elem), 0) << "element " << i;
    }
  };
  std::vector<int64_t> perm = {0, 1, 2, 3};
  do {
    for (size_t elem : {1, 2, 4, 8}) check({2, 3, 4, 5}, perm, elem, 0);
  } while (std::next_permutation(perm.begin(), perm.end()));
  // Attention's [B, T, H, D] -> [B, H, T, D]: rows of D move as 16-, 8- or 4-byte words where the
  // run and the pointers allow, element by element where they do not.
  for (int64_t d : {8, 4, 2, 3})
    for (int64_t offset : {0, 2}) check({2, 5, 3, d}, {0, 2, 1, 3}, 2, offset);
  check({3, 1, 4}, {1, 2, 0}, 4, 0);   // a dim of 1 dropped
  check({6, 7}, {0, 1}, 4, 0);         // the identity is a copy
  check({1, 1, 9}, {2, 0, 1}, 8, 0);
}

// ---- Attention -----------------------------------------------------------------------------

struct AttnCase {
  int64_t batch, T, S;
  int D, Dv;
  bool causal;
};

TEST_P(CudaEmu, AttentionForwardAndBackwardAgainstTheDefinition) {
  const AttnCase cases[] = {
      {3, 37, 45, 40, 24, true},  // T < S: query i sees keys j <= i + 8
      {2, 20, 20, 128, 128, false},
      {2, 9, 5, 16, 16, true},    // T > S: the first four queries see no key
      {1, 33, 70, 256, 8, false},
  };
  for (Dt dt : kDts)
    for (const AttnCase& a : cases) {
      SCOPED_TRACE(std::string(Name(dt)) + " T " + std::to_string(a.T) + " S " + std::to_string(a.S) + " D " +
                   std::to_string(a.D) + (a.causal ? " causal" : ""));
      const int64_t B = a.batch, T = a.T, S = a.S, D = a.D, Dv = a.Dv;
      const float scale = 1.f / std::sqrt(static_cast<float>(D));
      Values q(dt, Uniform(B * T * D, -1.f, 1.f, 25)), k(dt, Uniform(B * S * D, -1.f, 1.f, 26));
      Values v(dt, Uniform(B * S * Dv, -1.f, 1.f, 27)), dout(dt, Uniform(B * T * Dv, -1.f, 1.f, 28));
      Values out(dt, B * T * Dv), dq(dt, B * T * D), dk(dt, B * S * D), dv(dt, B * S * Dv);
      Array<float> lse(B * T, kNaN), delta(B * T, kNaN);
      ASSERT_TRUE(Ok(ck::AttentionForward(dt, q.data(), k.data(), v.data(), out.data(), lse.data(), B, T, S, a.D,
                                          a.Dv, scale, a.causal, nullptr)));
      ASSERT_TRUE(Ok(ck::AttentionBackward(dt, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                           dq.data(), dk.data(), dv.data(), delta.data(), B, T, S, a.D, a.Dv, scale,
                                           a.causal, nullptr)));
      std::vector<double> want_out(static_cast<size_t>(B * T * Dv), 0.0), want_lse;
      std::vector<double> want_dq(static_cast<size_t>(B * T * D), 0.0), want_dk(static_cast<size_t>(B * S * D), 0.0),
          want_dv(static_cast<size_t>(B * S * Dv), 0.0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t visible = a.causal ? std::clamp<int64_t>(i + 1 + S - T, 0, S) : S;
          std::vector<double> p(static_cast<size_t>(S), 0.0);
          double m = -INFINITY, l = 0;
          for (int64_t j = 0; j < visible; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[(b * T + i) * D + d]) * k[(b * S + j) * D + d];
            p[static_cast<size_t>(j)] = dot * scale;
            m = std::max(m, p[static_cast<size_t>(j)]);
          }
          for (int64_t j = 0; j < visible; ++j) l += std::exp(p[static_cast<size_t>(j)] - m);
          for (int64_t j = 0; j < visible; ++j) p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m) / l;
          want_lse.push_back(visible ? m + std::log(l) : -INFINITY);
          for (int64_t j = 0; j < visible; ++j)
            for (int64_t d = 0; d < Dv; ++d)
              want_out[static_cast<size_t>((b * T + i) * Dv + d)] += p[static_cast<size_t>(j)] * v[(b * S + j) * Dv + d];
          // The backward, from the kernel's own forward output (as the provider runs it).
          double di = 0;
          for (int64_t d = 0; d < Dv; ++d) di += static_cast<double>(dout[(b * T + i) * Dv + d]) * out[(b * T + i) * Dv + d];
          for (int64_t j = 0; j < visible; ++j) {
            const double pij = p[static_cast<size_t>(j)];
            double dp = 0;
            for (int64_t d = 0; d < Dv; ++d) {
              dp += static_cast<double>(dout[(b * T + i) * Dv + d]) * v[(b * S + j) * Dv + d];
              want_dv[static_cast<size_t>((b * S + j) * Dv + d)] += pij * dout[(b * T + i) * Dv + d];
            }
            const double ds = pij * (dp - di);
            for (int64_t d = 0; d < D; ++d) {
              want_dq[static_cast<size_t>((b * T + i) * D + d)] += scale * ds * k[(b * S + j) * D + d];
              want_dk[static_cast<size_t>((b * S + j) * D + d)] += scale * ds * q[(b * T + i) * D + d];
            }
          }
        }
      const double rtol = 1e-5, atol = dt == Dt::kF32 ? 1e-5 : 2e-3;
      EXPECT_TRUE(Near(out, dt, want_out, rtol, atol));
      EXPECT_TRUE(Near(lse, Dt::kF32, want_lse, 1e-6, 1e-5));
      EXPECT_TRUE(Near(dq, dt, want_dq, rtol, atol));
      EXPECT_TRUE(Near(dk, dt, want_dk, rtol, atol));
      EXPECT_TRUE(Near(dv, dt, want_dv, rtol, atol));
    }
}

TEST_P(CudaEmu, AttentionRefusesHeadsWiderThan256) {
  Values q(Dt::kF32, 300), out(Dt::kF32, 300);
  EXPECT_EQ(ck::AttentionForward(Dt::kF32, q.data(), q.data(), q.data(), out.data(), nullptr, 1, 1, 1, 300, 300, 1.f,
                                 false, nullptr),
            cudaErrorInvalidValue);
}

// ---- Optimizers ----------------------------------------------------------------------------

// `count` tensors of assorted sizes (some empty) with their float arrays.
struct TensorSet {
  std::vector<std::unique_ptr<Array<float>>> arrays;
  std::vector<const float*> in;
  std::vector<float*> out;
  std::vector<int64_t> n;
  TensorSet(const std::vector<int64_t>& sizes, float lo, float hi, uint32_t seed) {
    for (size_t t = 0; t < sizes.size(); ++t) {
      arrays.push_back(std::make_unique<Array<float>>(sizes[t]));
      const std::vector<float> v = Uniform(sizes[t], lo, hi, seed + static_cast<uint32_t>(t));
      for (int64_t i = 0; i < sizes[t]; ++i) (*arrays.back())[i] = v[static_cast<size_t>(i)];
      in.push_back(arrays.back()->data());
      out.push_back(arrays.back()->data());
      n.push_back(sizes[t]);
    }
  }
};

std::vector<int64_t> Sizes(int count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> s;
  for (int t = 0; t < count; ++t) s.push_back(t % 9 == 4 ? 0 : static_cast<int64_t>(gen() % 2500 + 1));
  return s;
}

::testing::AssertionResult SameAs(const TensorSet& got, const std::vector<std::vector<float>>& want, const char* what) {
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      const float g = (*got.arrays[t])[static_cast<int64_t>(i)];
      if (g != want[t][i])
        return ::testing::AssertionFailure() << what << " tensor " << t << " [" << i << "] " << Text(g) << " want "
                                             << Text(want[t][i]);
    }
  return ::testing::AssertionSuccess();
}

TEST_P(CudaEmu, MultiTensorAdamWIsTheCpuStepOverManyLaunches) {
  const std::vector<int64_t> sizes = Sizes(70, 29);  // 32 tensors a launch: three launches
  for (bool on_device_scale : {false, true}) {
    SCOPED_TRACE(on_device_scale ? "scale on the device" : "scale from the host");
    TensorSet p(sizes, -1.f, 1.f, 100), g(sizes, -2.f, 2.f, 200), m(sizes, -0.1f, 0.1f, 300), v(sizes, 0.f, 0.1f, 400);
    kernels::cpu::AdamWParams ap;
    ap.lr = static_cast<float>(3e-4), ap.step = 7,  // the learning rate is a float32 input on either side ap.grad_scale = 0.625f, ap.beta1 = 0.9f, ap.beta2 = 0.95f, ap.epsilon = 1e-8f;
    ap.weight_decay = 0.1f;
    std::vector<std::vector<float>> wp, wm, wv;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = static_cast<size_t>(sizes[t]);
      wp.emplace_back(k), wm.emplace_back(k), wv.emplace_back(k);
      kernels::cpu::AdamWStep(ap, p.in[t], g.in[t], m.in[t], v.in[t], wp[t].data(), wm[t].data(), wv[t].data(),
                              sizes[t], nullptr);
    }
    Array<float> device_scale(1, ap.grad_scale);
    // In place, as the training session updates its state.
    ASSERT_TRUE(Ok(ck::MultiTensorAdamW(static_cast<int>(sizes.size()), p.in.data(), g.in.data(), m.in.data(),
                                        v.in.data(), p.out.data(), m.out.data(), v.out.data(), p.n.data(),
                                        static_cast<float>(ap.lr), ap.beta1, ap.beta2, ap.epsilon, ap.weight_decay,
                                        ap.step, on_device_scale ? 99.f : ap.grad_scale, nullptr,
                                        on_device_scale ? device_scale.data() : nullptr)));
    EXPECT_TRUE(SameAs(p, wp, "param"));
    EXPECT_TRUE(SameAs(m, wm, "exp_avg"));
    EXPECT_TRUE(SameAs(v, wv, "exp_avg_sq"));
  }
}

TEST_P(CudaEmu, MultiTensorSgdIsTheCpuStepWithAndWithoutMomentum) {
  const std::vector<int64_t> sizes = Sizes(35, 31);
  struct Case {
    float momentum, dampening;
    bool nesterov;
    int64_t step;
  };
  for (const Case& c : {Case{0.f, 0.f, false, 1}, Case{0.9f, 0.1f, false, 1}, Case{0.9f, 0.1f, false, 2},
                        Case{0.9f, 0.f, true, 3}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " step " + std::to_string(c.step) +
                 (c.nesterov ? " nesterov" : ""));
    TensorSet p(sizes, -1.f, 1.f, 500), g(sizes, -2.f, 2.f, 600), buf(sizes, -0.5f, 0.5f, 700);
    kernels::cpu::SgdParams sp;
    sp.lr = static_cast<float>(0.05), sp.step = c.step, sp.grad_scale = 0.5f, sp.momentum = c.momentum, sp.dampening = c.dampening;
    sp.weight_decay = 0.01f, sp.nesterov = c.nesterov;
    std::vector<std::vector<float>> wp, wb;
    for (size_t t = 0; t < sizes.size(); ++t) {
      const size_t k = static_cast<size_t>(sizes[t]);
      wp.emplace_back(k), wb.emplace_back(buf.in[t], buf.in[t] + k);
      kernels::cpu::SgdStep(sp, p.in[t], g.in[t], c.momentum != 0.f ? buf.in[t] : nullptr, wp[t].data(),
                            c.momentum != 0.f ? wb[t].data() : nullptr, sizes[t], nullptr);
    }
    ASSERT_TRUE(Ok(ck::MultiTensorSgd(static_cast<int>(sizes.size()), p.in.data(), g.in.data(), buf.in.data(),
                                      p.out.data(), buf.out.data(), p.n.data(), static_cast<float>(sp.lr), c.momentum,
                                      c.dampening, sp.weight_decay, c.nesterov, c.step, sp.grad_scale, nullptr)));
    EXPECT_TRUE(SameAs(p, wp, "param"));
    EXPECT_TRUE(SameAs(buf, wb, "momentum buffer"));
  }
}

TEST_P(CudaEmu, SquaredNormOfManyTensorsAndTheClippingScale) {
  const std::vector<int64_t> sizes = Sizes(130, 37);  // 128 tensors a launch: two launches
  TensorSet x(sizes, -1.f, 1.f, 800);
  double want = 0;
  for (size_t t = 0; t < sizes.size(); ++t) want += kernels::cpu::SquaredNorm(x.in[t], sizes[t], nullptr);
  Array<float> sumsq(1, kNaN);
  Array<double> acc(1, NAN);
  ASSERT_TRUE(Ok(ck::SquaredNorm(x.in.data(), x.n.data(), static_cast<int>(sizes.size()), sumsq.data(), acc.data(),
                                 nullptr)));
  EXPECT_NEAR(sumsq[0], want, 1e-6 * want);
  // The CPU's clipping, in its float operations.
  for (float max_norm : {0.f, 1.f, 1e6f}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    Array<float> norm(1, kNaN), scale(1, kNaN);
    const float grad_scale = 0.25f, eps = 1e-6f;
    ASSERT_TRUE(Ok(ck::ClipScale(sumsq.data(), grad_scale, max_norm, eps, norm.data(), scale.data(), nullptr)));
    const float want_norm = std::sqrt(sumsq[0]) * grad_scale;
    EXPECT_EQ(norm[0], want_norm);
    EXPECT_EQ(scale[0], max_norm > 0.f ? grad_scale * std::min(max_norm / (want_norm + eps), 1.f) : grad_scale);
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, CudaEmu,
                         ::testing::Values(emu::Order::kAscending, emu::Order::kDescending, emu::Order::kShuffled,
                                           emu::Order::kWarpsAhead),
                         [](const ::testing::TestParamInfo<emu::Order>& info) {
                           switch (info.param) {
                             case emu::Order::kAscending: return std::string("Ascending");
                             case emu::Order::kDescending: return std::string("Descending");
                             case emu::Order::kShuffled: return std::string("Shuffled");
                             case emu::Order::kWarpsAhead: return std::string("WarpsAhead");
                           }
                           return std::string("Unknown");
                         });

}  // namespace
}  // namespace cleave
