// Tests of the float32 CPU attention kernels (kernels/cpu/attention.h), which work on blocks of
// query rows through sgemm, against the double-precision row-at-a-time definition: causal and
// not, T below, equal to and above S (the first rows then see no key), head sizes that differ
// for keys and values, and block sizes from the smallest (long S) to the largest (short S).
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"

namespace cleave::testing {
namespace {

using kernels::cpu::AttentionParams;

struct Case {
  int64_t batch, T, S, D, Dv;
  bool causal;
};

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<double> Wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// max |got - want| / max(1, max |want|).
double Error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, mag = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    mag = std::max(mag, std::abs(want[i]));
  }
  return err / mag;
}

class AttentionKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernel, BlockedFloatMatchesTheDefinition) {
  const Case c = GetParam();
  AttentionParams p;
  p.batch = c.batch, p.T = c.T, p.S = c.S, p.D = c.D, p.Dv = c.Dv;
  p.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  p.causal = c.causal;
  std::mt19937 rng(static_cast<unsigned>(c.T * 131 + c.S));
  // Scores of a few units, so the softmax is neither flat nor one-hot.
  const std::vector<float> q = Random(c.batch * c.T * c.D, rng, 1.5f), k = Random(c.batch * c.S * c.D, rng, 1.5f),
                           v = Random(c.batch * c.S * c.Dv, rng), dout = Random(c.batch * c.T * c.Dv, rng);
  ThreadPool pool(2);

  std::vector<double> want_out(c.batch * c.T * c.Dv);
  std::vector<float> want_lse(c.batch * c.T);
  const std::vector<double> qd = Wide(q), kd = Wide(k), vd = Wide(v), doutd = Wide(dout);
  kernels::cpu::AttentionForwardReference(p, qd.data(), kd.data(), vd.data(), want_out.data(), want_lse.data(),
                                          nullptr);
  std::vector<float> out(want_out.size(), 7.f), lse(want_lse.size(), 7.f);
  kernels::cpu::AttentionForward(p, q.data(), k.data(), v.data(), out.data(), lse.data(), &pool);
  EXPECT_LT(Error(out, want_out), 2e-6);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(want_lse[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i << " sees no key; lse " << lse[i];
    } else {
      EXPECT_NEAR(lse[i], want_lse[i], 1e-5 * std::max(1.f, std::abs(want_lse[i]))) << "row " << i;
    }
  }

  std::vector<double> want_dq(q.size()), want_dk(k.size()), want_dv(v.size());
  kernels::cpu::AttentionBackwardReference(p, doutd.data(), qd.data(), kd.data(), vd.data(), want_out.data(),
                                           want_dq.data(), want_dk.data(), want_dv.data(), nullptr);
  // With the forward's lse, and with none (the kernel forms it from the scores).
  for (const float* l : {static_cast<const float*>(lse.data()), static_cast<const float*>(nullptr)}) {
    std::vector<float> dq(q.size(), 7.f), dk(k.size(), 7.f), dv(v.size(), 7.f);
    kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), l, dq.data(), dk.data(),
                                    dv.data(), &pool);
    EXPECT_LT(Error(dq, want_dq), 2e-5) << (l ? "with lse" : "without lse");
    EXPECT_LT(Error(dk, want_dk), 2e-5) << (l ? "with lse" : "without lse");
    EXPECT_LT(Error(dv, want_dv), 2e-5) << (l ? "with lse" : "without lse");
  }
  // Each gradient alone is the same.
  std::vector<float> dq(q.size(), 7.f), dk(k.size(), 7.f), dv(v.size(), 7.f);
  kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), dq.data(),
                                  nullptr, nullptr, &pool);
  kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr,
                                  dk.data(), nullptr, &pool);
  kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr,
                                  nullptr, dv.data(), &pool);
  EXPECT_LT(Error(dq, want_dq), 2e-5);
  EXPECT_LT(Error(dk, want_dk), 2e-5);
  EXPECT_LT(Error(dv, want_dv), 2e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionKernel,
    ::testing::Values(Case{3, 5, 7, 8, 6, false},        // one partial block, D != Dv
                      Case{2, 200, 200, 16, 16, true},   // 128-row blocks, the second partial
                      Case{1, 40, 700, 8, 8, true},      // T < S: every row sees S - T keys more
                      Case{2, 9, 4, 4, 5, true},         // T > S: the first 5 rows see no key
                      Case{1, 37, 5000, 4, 4, false},    // 16-row blocks (long S)
                      Case{4, 130, 130, 32, 32, true}),  // the small GPT's shape class
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return absl::StrCat("b", c.batch, "_T", c.T, "_S", c.S, "_D", c.D, "x", c.Dv, c.causal ? "_causal" : "");
    });

TEST(AttentionKernelEdges, RowsThatSeeNoKeyAreZeroWithMinusInfinityLse) {
  AttentionParams p;
  p.batch = 1, p.T = 3, p.S = 1, p.D = 2, p.Dv = 2, p.scale = 1, p.causal = true;
  const std::vector<float> q = {1, 2, 3, 4, 5, 6}, k = {1, -1}, v = {0.5f, 2}, dout = {1, 1, 1, 1, 1, 1};
  std::vector<float> out(6, 7.f), lse(3, 7.f);
  kernels::cpu::AttentionForward(p, q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr);
  // Rows 0 and 1 see no key (j <= i + S - T = i - 2); row 2 sees key 0 alone.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[2 * r], 0.f);
    EXPECT_EQ(out[2 * r + 1], 0.f);
    EXPECT_EQ(lse[r], -std::numeric_limits<float>::infinity());
  }
  EXPECT_FLOAT_EQ(out[4], 0.5f);
  EXPECT_FLOAT_EQ(out[5], 2.f);
  EXPECT_FLOAT_EQ(lse[2], 5.f - 6.f);
  std::vector<float> dq(6, 7.f), dk(2, 7.f), dv(2, 7.f);
  kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), dq.data(),
                                  dk.data(), dv.data(), nullptr);
  for (float g : dq) EXPECT_EQ(g, 0.f);  // one visible key: the probability is 1 whatever the score
  for (float g : dk) EXPECT_EQ(g, 0.f);
  EXPECT_FLOAT_EQ(dv[0], 1.f);  // only row 2's dOut reaches v
  EXPECT_FLOAT_EQ(dv[1], 1.f);
}

}  // namespace
}  // namespace cleave::testing
