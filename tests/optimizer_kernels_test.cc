// The training step's kernels against their formulas: AdamW (decoupled decay, bias
// correction), SGD (momentum, dampening, Nesterov, weight decay), gradient accumulation, the
// squared norm and the finiteness check; Philox4x32-10 against its published answers and the
// dropout mask drawn from it; the learning-rate schedules.
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/philox.h"
#include "tests/op_tester.h"
#include "trainer/train_loop.h"

namespace cleave::trainer {
namespace {

TEST(OptimizerKernels, AdamWFollowsTheFormulaWithDecoupledDecayAndBiasCorrection) {
  const int64_t n = 40013;  // several blocks, so the threaded path runs, and a tail past the vectors
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::sin(0.1f * i);
    g[i] = std::cos(0.37f * i) * 0.01f;
    m[i] = 0.001f * std::sin(0.5f * i);
    v[i] = 1e-5f * (1 + std::cos(0.2f * i));
  }
  kernels::cpu::AdamWParams a;
  a.lr = 3e-3;
  a.step = 7;
  a.grad_scale = 0.5f;
  a.beta1 = 0.8f;
  a.beta2 = 0.99f;
  a.epsilon = 1e-6f;
  a.weight_decay = 0.1f;
  std::vector<float> po(n), mo(n), vo(n);
  ThreadPool pool(2);
  kernels::cpu::AdamWStep(a, p.data(), g.data(), m.data(), v.data(), po.data(), mo.data(), vo.data(), n, &pool);
  for (int64_t i = 0; i < n; i += 997) {
    const double gs = double(g[i]) * 0.5, b1 = 0.8f, b2 = 0.99f;
    const double m1 = b1 * m[i] + (1 - b1) * gs, v1 = b2 * v[i] + (1 - b2) * gs * gs;
    const double mhat = m1 / (1 - std::pow(b1, 7)), vhat = v1 / (1 - std::pow(b2, 7));
    const double want = p[i] * (1 - 3e-3 * double(0.1f)) - 3e-3 * mhat / (std::sqrt(vhat) + double(1e-6f));
    EXPECT_NEAR(mo[i], m1, 1e-9 + 1e-5 * std::abs(m1)) << i;
    EXPECT_NEAR(vo[i], v1, 1e-12 + 1e-5 * std::abs(v1)) << i;
    EXPECT_NEAR(po[i], want, 1e-6) << i;
  }
  // Every element is the update spelled out in float32, each multiply and add rounded (the
  // kernel's vector builds fuse none of them), with the step-wide factors from double.
  const float decay = static_cast<float>(1.0 - a.lr * a.weight_decay), c1 = static_cast<float>(1.0 - 0.8f),
              c2 = static_cast<float>(1.0 - 0.99f), step_size = static_cast<float>(-(a.lr / (1 - std::pow(0.8f, 7.0)))),
              bc2 = static_cast<float>(std::sqrt(1 - std::pow(0.99f, 7.0)));
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float gs = g[i] * 0.5f, m1 = m[i] * 0.8f + c1 * gs, v1 = v[i] * 0.99f + c2 * (gs * gs);
    const float want = p[i] * decay + step_size * (m1 / (std::sqrt(v1) / bc2 + 1e-6f));
    differ += po[i] != want || mo[i] != m1 || vo[i] != v1;
  }
  EXPECT_EQ(differ, 0) << "of " << n << " elements differ from the float32 update";
  // In place (outputs aliasing inputs) gives the same result.
  kernels::cpu::AdamWStep(a, p.data(), g.data(), m.data(), v.data(), p.data(), m.data(), v.data(), n, &pool);
  EXPECT_EQ(p, po);
  EXPECT_EQ(m, mo);
  EXPECT_EQ(v, vo);
}

TEST(OptimizerKernels, SgdMomentumDampeningNesterovAndWeightDecay) {
  const int64_t n = 5;
  std::vector<float> p = {1, -2, 3, 0.5f, 0}, g = {0.1f, 0.2f, -0.3f, 0, 1}, buf = {1, 1, 1, 1, 1};
  for (bool nesterov : {false, true}) {
    for (int64_t step : {1, 2}) {
      kernels::cpu::SgdParams s;
      s.lr = 0.1;
      s.step = step;
      s.momentum = 0.9f;
      s.dampening = nesterov ? 0.0f : 0.5f;
      s.weight_decay = 0.01f;
      s.nesterov = nesterov;
      std::vector<float> po(n), bo(n);
      kernels::cpu::SgdStep(s, p.data(), g.data(), buf.data(), po.data(), bo.data(), n, nullptr);
      for (int64_t i = 0; i < n; ++i) {
        double d = g[i] + 0.01 * p[i];
        double b = step == 1 ? d : 0.9 * buf[i] + (1 - s.dampening) * d;
        double upd = nesterov ? d + 0.9 * b : b;
        EXPECT_NEAR(bo[i], b, 1e-6);
        EXPECT_NEAR(po[i], p[i] - 0.1 * upd, 1e-6) << "nesterov " << nesterov << " step " << step;
      }
    }
  }
}

TEST(OptimizerKernels, AccumulateAndSquaredNorm) {
  std::vector<float> buf = {1, 2, 3}, g = {0.5f, -1, 2}, out(3);
  kernels::cpu::AccumulateGrad(buf.data(), g.data(), false, out.data(), 3, nullptr);
  EXPECT_EQ(out, (std::vector<float>{1.5f, 1, 5}));
  kernels::cpu::AccumulateGrad(buf.data(), g.data(), true, out.data(), 3, nullptr);
  EXPECT_EQ(out, g);
  std::vector<float> x(100000);
  double want = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.01 * i);
    want += double(x[i]) * x[i];
  }
  ThreadPool one(1), two(2);
  const double a = kernels::cpu::SquaredNorm(x.data(), x.size(), &one);
  EXPECT_EQ(a, kernels::cpu::SquaredNorm(x.data(), x.size(), &two));  // thread-count independent
  EXPECT_NEAR(a, want, 1e-9 * want);
}

// The loss scaler's overflow test: false for one infinite or NaN element anywhere in any
// input (here past the first of the parallel blocks, in the second input), true for finite
// values up to the largest float.
TEST(OptimizerKernels, IsAllFinite) {
  std::vector<float> big(100000, 1.f);
  big[99999] = std::numeric_limits<float>::max();
  big[123] = -std::numeric_limits<float>::max();
  ThreadPool two(2);
  EXPECT_TRUE(kernels::cpu::AllFinite(big.data(), static_cast<int64_t>(big.size()), &two));
  const std::vector<float> small = {1.f, -2.f, 3.f};
  auto run = [&](float bad_value) {
    std::vector<float> bad = big;
    bad[70001] = bad_value;
    return testing::OpTester("IsAllFinite", 1, "ai.cleave")
        .Input<float>("a", {3}, small)
        .Input<float>("b", {100000}, bad)
        .Output<bool>("y", {}, {std::isfinite(bad_value)})
        .Run();
  };
  run(0.5f);
  run(std::numeric_limits<float>::infinity());
  run(-std::numeric_limits<float>::infinity());
  run(std::numeric_limits<float>::quiet_NaN());
}

// Random123's published known answers for Philox4x32-10, and the dropout mask drawn from it:
// elements 2j and 2j + 1 from the two halves of counter j (an odd count ends half a pair in).
TEST(Philox, KnownAnswersAndTheDropoutDraws) {
  auto eq = [](kernels::Philox4 r, std::array<uint32_t, 4> want) {
    return std::array<uint32_t, 4>{r.v[0], r.v[1], r.v[2], r.v[3]} == want;
  };
  EXPECT_TRUE(eq(kernels::Philox4x32({{0, 0, 0, 0}}, 0, 0), {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_TRUE(eq(kernels::Philox4x32({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff),
                 {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_TRUE(eq(kernels::Philox4x32({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0),
                 {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  // The kernels' integer keep test is the uniform's: m >= threshold exactly when m * 2^-53 >=
  // ratio, at the threshold and one below it, for ratios whose scaled value is whole or not.
  for (double ratio : {0.0, 0.1, 0.25, 0.5, 0.3f + 0.0, 0.9, 0x1.0p-53, 3 * 0x1.0p-54, 1 - 0x1.0p-53}) {
    const uint64_t t = kernels::DropoutKeepThreshold(ratio);
    EXPECT_GE(static_cast<double>(t) * 0x1.0p-53, ratio) << ratio;
    if (t > 0) {
      EXPECT_LT(static_cast<double>(t - 1) * 0x1.0p-53, ratio) << ratio;
    }
  }
  EXPECT_EQ(kernels::DropoutKeepThreshold(0.5), uint64_t{1} << 52);
  EXPECT_EQ(kernels::DropoutKeepThreshold(3 * 0x1.0p-54), 2u);
  // The kernel's vector blocks and its scalar tail against the pair-by-pair definition: counts
  // that end inside and between blocks, ratios whose threshold is exact or not, both dtypes,
  // and two threads whose chunks start anywhere.
  const uint64_t key = 0x0123456789abcdefull;
  ThreadPool two(2);
  auto check = [&](auto zero, int64_t n, float ratio, ThreadPool* pool) {
    using T = decltype(zero);
    std::vector<T> x(n), y(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(i % 7) - T(2.5);
    std::unique_ptr<bool[]> m(new bool[n]);
    kernels::cpu::DropoutKeyed<T>(key, ratio, n, x.data(), y.data(), m.get(), pool);
    const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(ratio)));
    for (int64_t i = 0; i < n; ++i) {
      double u[2];
      kernels::PhiloxUniformPair(key, static_cast<uint64_t>(i / 2), &u[0], &u[1]);
      ASSERT_EQ(m[i], u[i % 2] >= static_cast<double>(ratio)) << "n " << n << " ratio " << ratio << " i " << i;
      ASSERT_EQ(y[i], m[i] ? x[i] * scale : T(0)) << "n " << n << " ratio " << ratio << " i " << i;
    }
  };
  for (int64_t n : {1, 15, 16, 17, 33, 1001})
    for (float ratio : {0.25f, 0.1f, 0.5f, 0.9f}) {
      check(0.0f, n, ratio, nullptr);
      check(0.0, n, ratio, nullptr);
    }
  check(0.0f, 2 * 50003 + 1, 0.3f, &two);
  check(0.0, 2 * 50003, 0.7f, &two);
}

TEST(DropoutKeyed, MaskIsAPureFunctionOfTheKeyWithTheRightRate) {
  const int64_t n = 100000;
  std::vector<float> x(n, 1.0f), y1(n), y2(n), y3(n);
  std::unique_ptr<bool[]> m(new bool[n]);
  ThreadPool one(1), two(2);
  kernels::cpu::DropoutKeyed<float>(42, 0.3f, n, x.data(), y1.data(), m.get(), &one);
  kernels::cpu::DropoutKeyed<float>(42, 0.3f, n, x.data(), y2.data(), nullptr, &two);
  kernels::cpu::DropoutKeyed<float>(43, 0.3f, n, x.data(), y3.data(), nullptr, &two);
  EXPECT_EQ(y1, y2);  // thread-count independent
  EXPECT_NE(y1, y3);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += m[i];
    EXPECT_EQ(y1[i], m[i] ? 1.0f / 0.7f : 0.0f);
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);
}

TEST(LrSchedule, WarmupThenCosineLinearOrConstant) {
  LrSchedule s{LrSchedule::Kind::kCosine, 1.0, 0.1, 4, 14};
  EXPECT_DOUBLE_EQ(s.At(0), 0.25);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(4), 1.0);
  EXPECT_NEAR(s.At(9), 0.55, 1e-12);  // halfway through the decay
  EXPECT_NEAR(s.At(14), 0.1, 1e-12);
  EXPECT_NEAR(s.At(100), 0.1, 1e-12);
  s.kind = LrSchedule::Kind::kLinear;
  EXPECT_NEAR(s.At(9), 0.55, 1e-12);
  EXPECT_NEAR(s.At(6), 1.0 - 0.9 * 0.2, 1e-12);
  s.kind = LrSchedule::Kind::kConstant;
  EXPECT_DOUBLE_EQ(s.At(13), 1.0);
  EXPECT_FALSE(ParseLrScheduleKind("exponential").ok());
}

}  // namespace
}  // namespace cleave::trainer
