// The CUDA provider's own kernels (kernels/cuda/*.cu), run on the CPU under the emulation of
// the CUDA thread model in cuda_emu/, against references in double precision and the CPU
// kernels. These check the kernels' indexing, barriers, warp reductions, launch shapes and
// rounding on every machine; the gpu-labelled tests check the same kernels on a device, with
// libdevice's math and FMA contraction, and the cuBLASLt and cuDNN paths these cannot reach.
//
// Every test runs under three orders of the threads (ascending, descending, shuffled): a result
// that depends on the order is a race. The arrays stand in for device memory and end at an
// inaccessible page, so a kernel reading or writing past one faults.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

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
  ~DeviceMemory() { munmap(base_, span_); }
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
// three orders disagree, which is how a missing __syncthreads shows in these tests.
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

INSTANTIATE_TEST_SUITE_P(Orders, CudaEmu,
                         ::testing::Values(emu::Order::kAscending, emu::Order::kDescending, emu::Order::kShuffled),
                         [](const ::testing::TestParamInfo<emu::Order>& info) {
                           return info.param == emu::Order::kAscending    ? std::string("Ascending")
                                  : info.param == emu::Order::kDescending ? std::string("Descending")
                                                                          : std::string("Shuffled");
                         });

}  // namespace
}  // namespace cleave
