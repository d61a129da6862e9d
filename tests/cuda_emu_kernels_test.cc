// The CUDA provider's own kernels (kernels/cuda/*.cu), run on the CPU under the emulation of
// the CUDA thread model in cuda_emu/, against references in double precision and the CPU
// kernels: the emulation itself, the elementwise kernels and the row kernels (LayerNorm,
// Softmax). The loss, reduction and data-movement kernels are in cuda_emu_loss_data_test.cc,
// attention and the optimizers in cuda_emu_attention_optimizer_test.cc. These check the
// kernels' indexing, barriers, warp reductions, launch shapes and rounding on every machine;
// the gpu-labelled tests check the same kernels on a device, with libdevice's math and FMA
// contraction, and the cuBLASLt and cuDNN paths these cannot reach.
//
// Every test runs under four orders of the threads (ascending, descending, shuffled, and warps
// running ahead of each other): a result that depends on the order is a race.
#include <memory>

#include "kernels/cpu/nn.h"
#include "kernels/cuda/elementwise.h"
#include "tests/cuda_emu_test_util.h"  // last: cuda_emu.h defines threadIdx and friends as macros

namespace cleave {
namespace {

using namespace emu_testing;  // NOLINT: the helpers of these tests

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

double RefBinary(ck::BinaryOp op, double a, double b) {
  switch (op) {
    case ck::BinaryOp::kAdd: return a + b;
    case ck::BinaryOp::kSub: return a - b;
    case ck::BinaryOp::kMul: return a * b;
    case ck::BinaryOp::kDiv: return a / b;
    case ck::BinaryOp::kMax: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case ck::BinaryOp::kMin: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case ck::BinaryOp::kPow: return std::pow(a, b);
    case ck::BinaryOp::kFmod: return std::fmod(a, b);
    case ck::BinaryOp::kPRelu: return a < 0 ? a * b : a;
    case ck::BinaryOp::kMod: {
      const double r = std::fmod(a, b);
      return r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
    }
    default: return NAN;  // the integer bitwise ops and shifts have no float form
  }
}

TEST_P(CudaEmu, BinaryOpsSameShapeAndBroadcast) {
  const ck::BinaryOp ops[] = {ck::BinaryOp::kAdd, ck::BinaryOp::kSub, ck::BinaryOp::kMul, ck::BinaryOp::kDiv,
                              ck::BinaryOp::kMax, ck::BinaryOp::kMin, ck::BinaryOp::kPow, ck::BinaryOp::kMod,
                              ck::BinaryOp::kFmod, ck::BinaryOp::kPRelu};
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
    case ck::UnaryOp::kSin: return std::sin(x);
    case ck::UnaryOp::kCos: return std::cos(x);
    case ck::UnaryOp::kTan: return std::tan(x);
    case ck::UnaryOp::kAsin: return std::asin(x);
    case ck::UnaryOp::kAcos: return std::acos(x);
    case ck::UnaryOp::kAtan: return std::atan(x);
    case ck::UnaryOp::kSinh: return std::sinh(x);
    case ck::UnaryOp::kCosh: return std::cosh(x);
    case ck::UnaryOp::kAsinh: return std::asinh(x);
    case ck::UnaryOp::kAcosh: return std::acosh(x);
    case ck::UnaryOp::kAtanh: return std::atanh(x);
    case ck::UnaryOp::kSoftplus: return std::log1p(std::exp(x));
    case ck::UnaryOp::kSoftsign: return x / (1 + std::abs(x));
    case ck::UnaryOp::kMish: return x * std::tanh(std::log1p(std::exp(x)));
    case ck::UnaryOp::kFloor: return std::floor(x);
    case ck::UnaryOp::kCeil: return std::ceil(x);
    case ck::UnaryOp::kRound: return std::nearbyint(x);
    case ck::UnaryOp::kSign: return x > 0 ? 1 : x < 0 ? -1 : 0;
    default: return NAN;  // the activations with attributes: checked against the CPU's in cuda_kernels_test
  }
}

TEST_P(CudaEmu, UnaryOpsAndTheGeluGradient) {
  for (Dt dt : kDts) {
    for (int o = 0; o <= static_cast<int>(ck::UnaryOp::kSign); ++o) {
      const auto op = static_cast<ck::UnaryOp>(o);
      SCOPED_TRACE(std::string(Name(dt)) + " op " + std::to_string(o));
      std::vector<float> xv = Uniform(777, -4.f, 4.f, 5);
      for (float& x : xv) {
        if (op == ck::UnaryOp::kLog || op == ck::UnaryOp::kSqrt) x = std::abs(x) + 0.01f;
        if (op == ck::UnaryOp::kReciprocal) x += x < 0 ? -0.1f : 0.1f;
        if (op == ck::UnaryOp::kTan) x *= 0.3f;  // inside (-pi/2, pi/2)
        if (op == ck::UnaryOp::kAsin || op == ck::UnaryOp::kAcos || op == ck::UnaryOp::kAtanh) x *= 0.24f;
        if (op == ck::UnaryOp::kAcosh) x = std::abs(x) + 1.f;
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

// Clip as the CPU compares: NaN passes through, infinities are clipped, and bounds the wrong
// way round give hi everywhere.
TEST_P(CudaEmu, ClipKeepsNaNAndBoundsTheRest) {
  std::vector<float> v = Uniform(300, -5.f, 5.f, 9);
  v[3] = kNaN;
  v[4] = kInf;
  v[5] = -kInf;
  for (Dt dt : kDts)
    for (auto [lo, hi] : {std::pair{-1.5f, 2.25f}, std::pair{-kInf, 0.f}, std::pair{3.f, -3.f}}) {
      SCOPED_TRACE(std::string(Name(dt)) + " [" + Text(lo) + ", " + Text(hi) + "]");
      Values x(dt, v), y(dt, 300);
      ASSERT_TRUE(Ok(ck::Clip(dt, x.data(), y.data(), 300, lo, hi, nullptr)));
      std::vector<float> want;
      for (int64_t i = 0; i < 300; ++i) {
        const float e = x[i];
        float r = e < lo ? lo : e;
        want.push_back(Round(dt, r > hi ? hi : r));
      }
      EXPECT_TRUE(Exact(y, want));
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
  const int64_t n = 3001;  // odd: the last pair is half used
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
        ASSERT_TRUE(Ok(ck::SkipLayerNorm(dt, dt, y_dt, x.data(), skip.data(), gamma.data(),
                                         with_beta ? beta.data() : nullptr, sy.data(), mean.data(), inv.data(),
                                         sum.data(), rows, cols, eps, nullptr)));
        std::vector<float> want_sum;
        for (int64_t i = 0; i < n; ++i) want_sum.push_back(Round(dt, x[i] + skip[i]));
        EXPECT_TRUE(Exact(sum, want_sum));
        expect(sum.Wide(), sy, "SkipLayerNorm");
      }
      if (dt != Dt::kF32) continue;
      // A bf16 / fp16 skip (a low-precision product's result) added to the float32 x as float32.
      for (Dt skip_dt : {Dt::kBf16, Dt::kF16}) {
        SCOPED_TRACE(Name(skip_dt));
        Values low_skip(skip_dt, Uniform(n, -1.f, 1.f, 11)), sy(Dt::kBf16, n), sum(dt, n);
        ASSERT_TRUE(Ok(ck::SkipLayerNorm(dt, skip_dt, Dt::kBf16, x.data(), low_skip.data(), gamma.data(),
                                         with_beta ? beta.data() : nullptr, sy.data(), mean.data(), inv.data(),
                                         sum.data(), rows, cols, eps, nullptr)));
        std::vector<float> want_sum;
        for (int64_t i = 0; i < n; ++i) want_sum.push_back(static_cast<float>(x[i]) + static_cast<float>(low_skip[i]));
        EXPECT_TRUE(Exact(sum, want_sum));
        expect(sum.Wide(), sy, "SkipLayerNorm, low skip");
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
                                       scratch.data(), rows, cols, nullptr, Dt::kBf16, dt, nullptr)));
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
      if (dt != Dt::kF32) continue;
      // A float32 dx also written in bf16 / fp16: the same dx, and its rounding exactly (as a Cast).
      for (Dt low_dt : {Dt::kBf16, Dt::kF16}) {
        Values dx2(dt, n), low(low_dt, n);
        ASSERT_TRUE(Ok(ck::LayerNormGrad(dt, dy.data(), x.data(), gamma.data(), mean.data(), inv.data(),
                                         with_add ? add.data() : nullptr, dx2.data(), nullptr, nullptr, nullptr, rows,
                                         cols, low.data(), low_dt, dt, nullptr)));
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(dx2[i], dx[i]) << Name(low_dt) << " " << i;
          ASSERT_EQ(low[i], Round(low_dt, static_cast<float>(dx[i]))) << Name(low_dt) << " " << i;
        }
      }
      // A bf16 / fp16 dy (a low-precision product's result) read as float32: the same as a
      // float32 dy of its values, dx and the parameter sums alike.
      for (Dt dy_dt : {Dt::kBf16, Dt::kF16}) {
        SCOPED_TRACE(Name(dy_dt));
        Values low_dy(dy_dt, Uniform(n, -1.f, 1.f, 15));
        std::vector<float> widened;
        for (int64_t i = 0; i < n; ++i) widened.push_back(static_cast<float>(low_dy[i]));
        Values wide_dy(dt, widened), dx_low_in(dt, n), dx_wide_in(dt, n);
        Array<float> g1(cols, kNaN), b1(cols, kNaN), g2(cols, kNaN), b2(cols, kNaN);
        Array<float> scratch2(std::max<int64_t>(1, ck::LayerNormGradScratch(rows, cols)), kNaN);
        ASSERT_TRUE(Ok(ck::LayerNormGrad(dt, low_dy.data(), x.data(), gamma.data(), mean.data(), inv.data(),
                                         with_add ? add.data() : nullptr, dx_low_in.data(), g1.data(), b1.data(),
                                         scratch2.data(), rows, cols, nullptr, Dt::kBf16, dy_dt, nullptr)));
        ASSERT_TRUE(Ok(ck::LayerNormGrad(dt, wide_dy.data(), x.data(), gamma.data(), mean.data(), inv.data(),
                                         with_add ? add.data() : nullptr, dx_wide_in.data(), g2.data(), b2.data(),
                                         scratch2.data(), rows, cols, nullptr, Dt::kBf16, dt, nullptr)));
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx_low_in[i], dx_wide_in[i]) << i;
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(g1[c], g2[c]) << c;
          ASSERT_EQ(b1[c], b2[c]) << c;
        }
      }
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
