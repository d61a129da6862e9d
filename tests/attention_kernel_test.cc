// Tests of the float32 CPU attention kernels (kernels/cpu/attention.h), which work on blocks of
// query rows through sgemm, against the double-precision row-at-a-time definition: causal and
// not, T below, equal to and above S (the first rows then see no key), head sizes that differ
// for keys and values, block sizes from the smallest (long S) to the largest (short S), and the
// backward's chunks of keys (the same bits on every pool size); and the [B, T, H, D] and packed
// q/k/v layouts, read and written in place. The bf16 kernels (on
// CPUs with AVX-512 BF16) against the same definition over the bf16 values, within bf16's
// rounding, and in every layout bit for bit.
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_rows.h"

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

// max |got - want| / max(1, max |want|); infinite where got has a NaN.
double Error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0, mag = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(got[i] - want[i]));
    mag = std::max(mag, std::abs(want[i]));
  }
  return err / mag;
}

class AttentionKernel : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernel, BlockedFloatMatchesTheDefinition) {
  const Case c = GetParam();
  const int64_t qd[3] = {c.batch, c.T, c.D}, kd[3] = {c.batch, c.S, c.D}, vd[3] = {c.batch, c.S, c.Dv};
  const AttentionParams p = *kernels::cpu::PlanAttention(qd, kd, vd, 1.0 / std::sqrt(static_cast<double>(c.D)), c.causal);
  std::mt19937 rng(static_cast<unsigned>(c.T * 131 + c.S));
  // Scores of a few units, so the softmax is neither flat nor one-hot.
  const std::vector<float> q = Random(c.batch * c.T * c.D, rng, 1.5f), k = Random(c.batch * c.S * c.D, rng, 1.5f),
                           v = Random(c.batch * c.S * c.Dv, rng), dout = Random(c.batch * c.T * c.Dv, rng);
  ThreadPool pool(2);

  std::vector<double> want_out(c.batch * c.T * c.Dv);
  std::vector<float> want_lse(c.batch * c.T);
  const std::vector<double> qw = Wide(q), kw = Wide(k), vw = Wide(v), doutw = Wide(dout);
  kernels::cpu::AttentionForwardReference(p, qw.data(), kw.data(), vw.data(), want_out.data(), want_lse.data(),
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
  kernels::cpu::AttentionBackwardReference(p, doutw.data(), qw.data(), kw.data(), vw.data(), want_out.data(),
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
  // The same bits inline, on a pool of 2 and on one of 3 (the chunks of keys the backward
  // splits a slice into follow from the shapes alone).
  std::vector<float> all[3][3];
  ThreadPool three(3);
  ThreadPool* pools[3] = {nullptr, &pool, &three};
  for (int i = 0; i < 3; ++i) {
    all[i][0].assign(q.size(), 7.f), all[i][1].assign(k.size(), 7.f), all[i][2].assign(v.size(), 7.f);
    kernels::cpu::AttentionBackward(p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                                    all[i][0].data(), all[i][1].data(), all[i][2].data(), pools[i]);
  }
  for (int i = 1; i < 3; ++i)
    for (int g = 0; g < 3; ++g) EXPECT_EQ(all[i][g], all[0][g]) << "pool " << i << ", gradient " << "qkv"[g];
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionKernel,
    ::testing::Values(Case{3, 5, 7, 8, 6, false},        // one partial block, D != Dv
                      Case{2, 200, 200, 16, 16, true},   // 128-row blocks, the second partial
                      Case{1, 40, 700, 8, 8, true},      // T < S: every row sees S - T keys more
                      Case{2, 9, 4, 4, 5, true},         // T > S: the first 5 rows see no key
                      Case{1, 500, 400, 8, 8, true},     // T > S over three chunks of keys
                      Case{2, 300, 300, 16, 16, true},   // two chunks of keys, unequal when causal
                      Case{1, 37, 5000, 4, 4, false},    // 16-row blocks (long S)
                      Case{4, 130, 130, 32, 32, true}),  // the small GPT's shape class
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return absl::StrCat("b", c.batch, "_T", c.T, "_S", c.S, "_D", c.D, "x", c.Dv, c.causal ? "_causal" : "");
    });

// The bf16 kernels against the definition in double over the same bf16 values. Their products
// take the probabilities and the scores' gradient rounded to bf16 (as cuDNN's do) and each
// result is rounded to bf16, so they agree within a few of bf16's rounding steps (2^-8
// relative); the scores and lse are float32 sums of exact products, as the float32 kernel's.
std::vector<uint16_t> Bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = FloatToBFloat16(x[i]);
  return b;
}
std::vector<float> Widened(const std::vector<uint16_t>& b) {
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = BFloat16ToFloat(b[i]);
  return x;
}

class Bf16AttentionKernel : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16AttentionKernel, MatchesTheDefinitionWithinBf16Rounding) {
  const Case c = GetParam();
  const int64_t qd[3] = {c.batch, c.T, c.D}, kd[3] = {c.batch, c.S, c.D}, vd[3] = {c.batch, c.S, c.Dv};
  const AttentionParams p = *kernels::cpu::PlanAttention(qd, kd, vd, 1.0 / std::sqrt(static_cast<double>(c.D)), c.causal);
  if (!kernels::cpu::Bf16AttentionSupported(p)) GTEST_SKIP() << "this CPU has no AVX-512 BF16 (the bf16 kernels' products)";
  std::mt19937 rng(static_cast<unsigned>(c.T * 131 + c.S));
  const std::vector<uint16_t> q = Bf16(Random(c.batch * c.T * c.D, rng, 1.5f)),
                              k = Bf16(Random(c.batch * c.S * c.D, rng, 1.5f)), v = Bf16(Random(c.batch * c.S * c.Dv, rng)),
                              dout = Bf16(Random(c.batch * c.T * c.Dv, rng));
  ThreadPool pool(2), three(3);
  // The kernels read each operand's own elements only: NaN past the end of each is never
  // multiplied into a result (a pair past an odd last row is zeros, not the next row).
  std::vector<uint16_t> past[4] = {q, k, v, dout};
  for (auto& x : past) x.resize(x.size() + 512, 0x7fc0);
  const uint16_t *qp = past[0].data(), *kp = past[1].data(), *vp = past[2].data(), *dp = past[3].data();

  std::vector<double> want_out(c.batch * c.T * c.Dv);
  std::vector<float> want_lse(c.batch * c.T);
  const std::vector<double> qw = Wide(Widened(q)), kw = Wide(Widened(k)), vw = Wide(Widened(v)),
                            doutw = Wide(Widened(dout));
  kernels::cpu::AttentionForwardReference(p, qw.data(), kw.data(), vw.data(), want_out.data(), want_lse.data(),
                                          nullptr);
  std::vector<uint16_t> out(want_out.size(), 7);
  std::vector<float> lse(want_lse.size(), 7.f);
  kernels::cpu::AttentionForwardBf16(p, qp, kp, vp, out.data(), lse.data(), &pool);
  EXPECT_LT(Error(Widened(out), want_out), 1e-2);
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(want_lse[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i << " sees no key; lse " << lse[i];
      for (int64_t d = 0; d < c.Dv; ++d) EXPECT_EQ(out[i * c.Dv + d], 0) << "row " << i << " sees no key";
    } else {
      EXPECT_NEAR(lse[i], want_lse[i], 1e-5 * std::max(1.f, std::abs(want_lse[i]))) << "row " << i;
    }
  }
  // The same bits on a pool of 3.
  std::vector<uint16_t> out3(out.size(), 7);
  std::vector<float> lse3(lse.size(), 7.f);
  kernels::cpu::AttentionForwardBf16(p, qp, kp, vp, out3.data(), lse3.data(), &three);
  EXPECT_EQ(out3, out);
  EXPECT_EQ(lse3, lse);

  // The gradients of the definition at the bf16 out the backward reads.
  const std::vector<double> outw = Wide(Widened(out));
  std::vector<double> want_dq(q.size()), want_dk(k.size()), want_dv(v.size());
  kernels::cpu::AttentionBackwardReference(p, doutw.data(), qw.data(), kw.data(), vw.data(), outw.data(),
                                           want_dq.data(), want_dk.data(), want_dv.data(), nullptr);
  std::vector<uint16_t> dq(q.size(), 7), dk(k.size(), 7), dv(v.size(), 7);
  for (const float* l : {static_cast<const float*>(lse.data()), static_cast<const float*>(nullptr)}) {
    kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), l, dq.data(),
                                        dk.data(), dv.data(), &pool);
    EXPECT_LT(Error(Widened(dq), want_dq), 1e-2) << (l ? "with lse" : "without lse");
    EXPECT_LT(Error(Widened(dk), want_dk), 1e-2) << (l ? "with lse" : "without lse");
    EXPECT_LT(Error(Widened(dv), want_dv), 1e-2) << (l ? "with lse" : "without lse");
  }
  kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), lse.data(), dq.data(),
                                      dk.data(), dv.data(), &pool);
  // Each gradient alone, and all three on a pool of 3, are the same bits.
  std::vector<uint16_t> dq1(q.size(), 7), dk1(k.size(), 7), dv1(v.size(), 7);
  kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), lse.data(),
                                      dq1.data(), nullptr, nullptr, &pool);
  kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), lse.data(), nullptr,
                                      dk1.data(), nullptr, &pool);
  kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), lse.data(), nullptr,
                                      nullptr, dv1.data(), &pool);
  EXPECT_EQ(dq1, dq);
  EXPECT_EQ(dk1, dk);
  EXPECT_EQ(dv1, dv);
  std::vector<uint16_t> dq3(q.size(), 7), dk3(k.size(), 7), dv3(v.size(), 7);
  kernels::cpu::AttentionBackwardBf16(p, dp, qp, kp, vp, out.data(), lse.data(),
                                      dq3.data(), dk3.data(), dv3.data(), &three);
  EXPECT_EQ(dq3, dq);
  EXPECT_EQ(dk3, dk);
  EXPECT_EQ(dv3, dv);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Bf16AttentionKernel,
    ::testing::Values(Case{3, 5, 7, 8, 6, false},         // one partial tile of rows and columns, D != Dv
                      Case{2, 200, 200, 16, 16, true},    // 64-row causal blocks, the last partial
                      Case{1, 40, 701, 8, 8, true},       // T < S, odd key counts
                      Case{2, 9, 4, 4, 6, true},          // T > S: the first 5 rows see no key
                      Case{1, 500, 401, 8, 8, true},      // T > S over three chunks of keys, odd S
                      Case{2, 300, 300, 16, 16, true},    // two chunks of keys, unequal when causal
                      Case{1, 37, 1500, 34, 40, false},   // 43-row blocks; D and Dv past a 32-wide tile
                      Case{2, 65, 33, 96, 62, false},     // odd S, three column tiles of D
                      Case{4, 130, 130, 64, 64, true}),   // the bench GPT's head size
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return absl::StrCat("b", c.batch, "_T", c.T, "_S", c.S, "_D", c.D, "x", c.Dv, c.causal ? "_causal" : "");
    });

TEST(Bf16AttentionKernel, OddHeadSizesAreLeftToTheWideningKernels) {
  const int64_t even[3] = {2, 8, 16}, odd[3] = {2, 8, 15};
  EXPECT_FALSE(kernels::cpu::Bf16AttentionSupported(*kernels::cpu::PlanAttention(odd, odd, even, 1.0, false)));
  EXPECT_FALSE(kernels::cpu::Bf16AttentionSupported(*kernels::cpu::PlanAttention(even, even, odd, 1.0, false)));
}

// The layouts of ai.cleave.Attention (attention.h), read and written in place: q, k, v and the
// gradients [B, T, H, D] ("bshd"), or q, k, v and their gradients packed [B, T, 3, H, D]
// ("bs3hd"), against the same kernels on contiguous [B, H, T, D] copies.
struct LayoutCase {
  int64_t B, H, T, S, D, Dv;
  bool causal;
};

// Element (b, h, t, d) of [B, H, T, D] x, moved to index(b, h, t, d) of a buffer of n.
template <typename T, typename Index>
std::vector<T> Relaid(const std::vector<T>& x, int64_t B, int64_t H, int64_t rows, int64_t D, size_t n,
                      Index index, std::vector<T> into = {}) {
  if (into.empty()) into.assign(n, T{7});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t d = 0; d < D; ++d) into[index(b, h, t, d)] = x[((b * H + h) * rows + t) * D + d];
  return into;
}

template <typename T>
double MaxDiff(const std::vector<T>& a, const std::vector<T>& b) {
  double m = a.size() == b.size() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

class AttentionLayouts : public ::testing::TestWithParam<LayoutCase> {};

// The kernels of each element type: float and double, and bf16 bit patterns (uint16_t).
template <typename T>
void Forward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse, ThreadPool* pool) {
  if constexpr (std::is_same_v<T, uint16_t>) kernels::cpu::AttentionForwardBf16(p, q, k, v, out, lse, pool);
  else kernels::cpu::AttentionForward(p, q, k, v, out, lse, pool);
}
template <typename T>
void Backward(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v, const T* out,
              const float* lse, T* dq, T* dk, T* dv, ThreadPool* pool) {
  if constexpr (std::is_same_v<T, uint16_t>)
    kernels::cpu::AttentionBackwardBf16(p, dout, q, k, v, out, lse, dq, dk, dv, pool);
  else kernels::cpu::AttentionBackward(p, dout, q, k, v, out, lse, dq, dk, dv, pool);
}

template <typename T>
void CheckLayouts(const LayoutCase& c) {
  using kernels::cpu::AttentionLayout;
  const int64_t B = c.B, H = c.H;
  const int64_t qd[4] = {B, H, c.T, c.D}, kd[4] = {B, H, c.S, c.D}, vd[4] = {B, H, c.S, c.Dv};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const AttentionParams flat = *kernels::cpu::PlanAttention(qd, kd, vd, scale, c.causal);
  std::mt19937 rng(static_cast<unsigned>(c.T * 7 + c.S));
  auto random = [&](int64_t n) {
    std::vector<float> f = Random(n, rng, 1.5f);
    std::vector<T> x(f.size());
    for (size_t i = 0; i < f.size(); ++i)
      x[i] = std::is_same_v<T, uint16_t> ? static_cast<T>(FloatToBFloat16(f[i])) : static_cast<T>(f[i]);
    return x;
  };
  const std::vector<T> q = random(B * H * c.T * c.D), k = random(B * H * c.S * c.D), v = random(B * H * c.S * c.Dv),
                       dout = random(B * H * c.T * c.Dv);
  ThreadPool pool(2);
  std::vector<T> out(dout.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> lse(B * H * c.T);
  Forward(flat, q.data(), k.data(), v.data(), out.data(), lse.data(), &pool);
  Backward(flat, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), dq.data(),
                                  dk.data(), dv.data(), &pool);
  // bf16: the same arithmetic in every layout, so the same bits.
  const double tol = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, double> ? 1e-12 : 0;

  {  // "bshd"
    AttentionParams p = flat;
    kernels::cpu::SetLayout(p, AttentionLayout::kBshd, H);
    auto seq_major = [&](int64_t rows, int64_t D) {
      return [=](int64_t b, int64_t h, int64_t t, int64_t d) { return ((b * rows + t) * H + h) * D + d; };
    };
    auto relaid = [&](const std::vector<T>& x, int64_t rows, int64_t D) {
      return Relaid(x, B, H, rows, D, x.size(), seq_major(rows, D));
    };
    const std::vector<T> qs = relaid(q, c.T, c.D), ks = relaid(k, c.S, c.D), vs = relaid(v, c.S, c.Dv),
                         dos = relaid(dout, c.T, c.Dv), want_out = relaid(out, c.T, c.Dv);
    std::vector<T> os(out.size(), T{7}), dqs(q.size(), T{7}), dks(k.size(), T{7}), dvs(v.size(), T{7});
    std::vector<float> ls(lse.size(), 7.f);
    Forward(p, qs.data(), ks.data(), vs.data(), os.data(), ls.data(), &pool);
    EXPECT_LE(MaxDiff(os, want_out), tol) << "bshd out";
    EXPECT_LE(MaxDiff(ls, lse), tol) << "bshd lse ([B, H, T] in every layout)";
    Backward(p, dos.data(), qs.data(), ks.data(), vs.data(), os.data(), ls.data(), dqs.data(),
                                    dks.data(), dvs.data(), &pool);
    EXPECT_LE(MaxDiff(dqs, relaid(dq, c.T, c.D)), 10 * tol) << "bshd dq";
    EXPECT_LE(MaxDiff(dks, relaid(dk, c.S, c.D)), 10 * tol) << "bshd dk";
    EXPECT_LE(MaxDiff(dvs, relaid(dv, c.S, c.Dv)), 10 * tol) << "bshd dv";
  }
  if (c.S != c.T || c.D != c.Dv) return;
  {  // "bs3hd": one [B, T, 3, H, D] buffer for q, k and v, and one for their gradients
    AttentionParams p = flat;
    kernels::cpu::SetLayout(p, AttentionLayout::kBs3hd, H);
    const int64_t T_ = c.T, D = c.D;
    auto part = [&](int which) {
      return [=](int64_t b, int64_t h, int64_t t, int64_t d) { return (((b * T_ + t) * 3 + which) * H + h) * D + d; };
    };
    auto packed = [&](const std::vector<T>& a, const std::vector<T>& b, const std::vector<T>& e) {
      const size_t n = 3 * a.size();
      return Relaid(e, B, H, T_, D, n, part(2), Relaid(b, B, H, T_, D, n, part(1), Relaid(a, B, H, T_, D, n, part(0))));
    };
    const std::vector<T> qkv = packed(q, k, v);
    const T* base = qkv.data();
    const int64_t third = H * D;
    auto seq_major = [=](int64_t b, int64_t h, int64_t t, int64_t d) { return ((b * T_ + t) * H + h) * D + d; };
    const std::vector<T> dos = Relaid(dout, B, H, T_, D, dout.size(), seq_major);
    std::vector<T> os(out.size(), T{7}), dqkv(qkv.size(), T{7});
    std::vector<float> ls(lse.size(), 7.f);
    Forward(p, base, base + third, base + 2 * third, os.data(), ls.data(), &pool);
    EXPECT_LE(MaxDiff(os, Relaid(out, B, H, T_, D, out.size(), seq_major)), tol) << "bs3hd out";
    EXPECT_LE(MaxDiff(ls, lse), tol) << "bs3hd lse";
    T* g = dqkv.data();
    Backward(p, dos.data(), base, base + third, base + 2 * third, os.data(), ls.data(), g,
                                    g + third, g + 2 * third, &pool);
    EXPECT_LE(MaxDiff(dqkv, packed(dq, dk, dv)), 10 * tol) << "bs3hd dqkv";
  }
}

TEST_P(AttentionLayouts, Float32InPlace) { CheckLayouts<float>(GetParam()); }
TEST_P(AttentionLayouts, Float64InPlace) { CheckLayouts<double>(GetParam()); }
TEST_P(AttentionLayouts, Bf16InPlace) {
  const LayoutCase& c = GetParam();
  const int64_t qd[4] = {c.B, c.H, c.T, c.D}, kd[4] = {c.B, c.H, c.S, c.D}, vd[4] = {c.B, c.H, c.S, c.Dv};
  if (!kernels::cpu::Bf16AttentionSupported(*kernels::cpu::PlanAttention(qd, kd, vd, 1.0, c.causal)))
    GTEST_SKIP() << "this CPU has no AVX-512 BF16 (the bf16 kernels' products)";
  CheckLayouts<uint16_t>(c);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionLayouts,
    ::testing::Values(LayoutCase{2, 3, 37, 37, 8, 8, true},      // packed too; one partial block
                      LayoutCase{1, 2, 150, 150, 16, 16, false},  // two blocks of 128 rows
                      LayoutCase{1, 2, 260, 260, 16, 16, true},   // packed too; two chunks of keys
                      LayoutCase{2, 2, 5, 9, 4, 6, true}),        // bshd only: T != S, D != Dv
    [](const ::testing::TestParamInfo<LayoutCase>& info) {
      const LayoutCase& c = info.param;
      return absl::StrCat("B", c.B, "_H", c.H, "_T", c.T, "_S", c.S, "_D", c.D, "x", c.Dv, c.causal ? "_causal" : "");
    });

// The backward's chunks of keys (attention_rows.h): they cover the keys in order on multiples of
// 16, bring the tasks to about kBackwardTasks, and hold about the same share of the seen
// (query row, key) pairs each: within a step of 16 keys' worth.
TEST(AttentionKernelEdges, KeyChunksCoverTheKeysWithEvenShares) {
  namespace ar = kernels::cpu::attention_rows;
  struct Shape {
    int64_t batch, T, S;
    bool causal;
    int want;  // chunks
  };
  for (const Shape& s : {Shape{1, 1024, 1024, true, 8}, Shape{2, 512, 512, true, 4}, Shape{8, 512, 512, false, 2},
                         Shape{4, 300, 300, true, 2}, Shape{32, 1024, 1024, true, 1}, Shape{1, 500, 400, true, 3},
                         Shape{1, 40, 700, true, 5}, Shape{1, 37, 5000, false, 16}, Shape{3, 5, 7, false, 1},
                         Shape{2, 4, 0, true, 1}}) {
    const int64_t qd[3] = {s.batch, s.T, 8}, kd[3] = {s.batch, s.S, 8};
    const AttentionParams p = *kernels::cpu::PlanAttention(qd, kd, kd, 1.0, s.causal);
    const ar::KeyChunks ch = ar::PlanKeyChunks(p);
    const std::string at = absl::StrCat("batch ", s.batch, " T ", s.T, " S ", s.S, s.causal ? " causal" : "");
    ASSERT_EQ(ch.count, s.want) << at;
    EXPECT_EQ(ch.begin[0], 0) << at;
    EXPECT_EQ(ch.begin[ch.count], s.S) << at;
    int64_t total = 0, widest = 0;
    std::vector<int64_t> share(ch.count);
    for (int c = 0; c < ch.count; ++c) {
      const int64_t j0 = ch.begin[c], j1 = ch.begin[c + 1];
      EXPECT_LT(j0, std::max<int64_t>(j1, 1)) << at << ", chunk " << c;
      if (c > 0) {
        EXPECT_EQ(j0 % 16, 0) << at << ", chunk " << c;
      }
      widest = std::max(widest, j1 - j0);
      // The first row that sees the chunk sees its first key, and the row before it none.
      const int64_t first = ch.first_row[c];
      if (first < s.T) {
        EXPECT_GT(ar::Visible(p, first), j0) << at << ", chunk " << c;
      }
      if (first > 0) {
        EXPECT_LE(ar::Visible(p, first - 1), j0) << at << ", chunk " << c;
      }
      for (int64_t i = 0; i < s.T; ++i) share[c] += ar::SeenOf(p, i, j0, j1 - j0);
      total += share[c];
    }
    EXPECT_EQ(ch.widest, widest) << at;
    for (int c = 0; c < ch.count; ++c)
      EXPECT_LE(std::abs(share[c] * ch.count - total), 16 * s.T * ch.count) << at << ", chunk " << c;
  }
}

TEST(AttentionKernelEdges, RowsThatSeeNoKeyAreZeroWithMinusInfinityLse) {
  const int64_t qd[2] = {3, 2}, kd[2] = {1, 2};
  const AttentionParams p = *kernels::cpu::PlanAttention(qd, kd, kd, 1.0, /*causal=*/true);
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

// An additive bias over the scores [B, H, T, S], in each broadcast form the planner lays out,
// against the definition computed here over the bias expanded in full: the float32 blocked
// kernels (forward, then backward against the reference given the expanded bias) and, where the
// CPU has them, the bf16 ones. Masked keys hold -1e4 and -inf, and one query row's keys are all
// -inf where the bias has rows: that row attends to nothing (zeros, lse -inf, no gradient).
struct BiasCase {
  std::vector<int64_t> dims;
  bool causal;
};

class AttentionBias : public ::testing::TestWithParam<BiasCase> {};

TEST_P(AttentionBias, EveryBroadcastMatchesTheExpandedDefinition) {
  const BiasCase c = GetParam();
  constexpr int64_t B = 2, H = 3, T = 6, S = 7, D = 8, Dv = 5;
  const int64_t qd[4] = {B, H, T, D}, kd[4] = {B, H, S, D}, vd[4] = {B, H, S, Dv};
  const double scale = 0.4;
  auto planned = kernels::cpu::PlanAttentionOperands(kernels::cpu::AttentionLayout::kBhsd, qd, kd, vd, scale, c.causal);
  ASSERT_TRUE(planned.ok()) << planned.status();
  kernels::cpu::AttentionOperands a = *planned;
  ASSERT_TRUE(kernels::cpu::PlanAttentionBias(a, c.dims).ok());
  std::mt19937 rng(11);
  int64_t n = 1;
  for (int64_t d : c.dims) n *= d;
  std::vector<float> bias = Random(n, rng, 2.f);
  const float inf = std::numeric_limits<float>::infinity();
  // The bias' element for (b, h, i, j) by numpy broadcasting, computed apart from the planner.
  const auto index = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t full[4] = {b, h, i, j};
    int64_t at = 0;
    const size_t r = c.dims.size();
    for (size_t d = 0; d < r; ++d) at = at * c.dims[d] + (c.dims[d] == 1 ? 0 : full[4 - r + d]);
    return at;
  };
  bias[index(0, 0, 0, 1)] = -inf;  // padding (without a key axis, every key of the slice)
  if (c.dims.back() == S) {
    bias[index(B - 1, H - 1, T - 1, S - 1)] = -inf;
    bias[index(B - 1, H - 1, T - 1, S - 2)] = -1e4f;
  }
  const bool rows = c.dims.size() >= 2 && c.dims[c.dims.size() - 2] == T;
  if (rows)
    for (int64_t j = 0; j < S; ++j) bias[index(B - 1, 0, 2, j)] = -inf;
  std::vector<double> full(B * H * T * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < S; ++j) full[((b * H + h) * T + i) * S + j] = bias[index(b, h, i, j)];
  a.p.bias.data = bias.data();

  const std::vector<float> q = Random(B * H * T * D, rng, 1.5f), k = Random(B * H * S * D, rng, 1.5f),
                           v = Random(B * H * S * Dv, rng), dout = Random(B * H * T * Dv, rng);
  // The definition: softmax over the visible keys of scale q.k + bias, in double.
  std::vector<double> want(B * H * T * Dv, 0.0), want_lse(B * H * T);
  for (int64_t s = 0; s < B * H; ++s)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> e(S, 0.0);
      double m = -inf;
      const int64_t visible = c.causal ? std::min(S, i + 1 + S - T) : S;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double{q[(s * T + i) * D + d]} * k[(s * S + j) * D + d];
        e[j] = scale * dot + full[(s * T + i) * S + j];
        m = std::max(m, e[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < visible && m > -inf; ++j) sum += (e[j] = std::exp(e[j] - m));
      want_lse[s * T + i] = sum > 0 ? m + std::log(sum) : -inf;
      for (int64_t j = 0; j < visible && sum > 0; ++j)
        for (int64_t d = 0; d < Dv; ++d) want[(s * T + i) * Dv + d] += e[j] / sum * v[(s * S + j) * Dv + d];
    }
  ThreadPool pool(2);
  std::vector<float> out(want.size(), 7.f), lse(want_lse.size(), 7.f);
  kernels::cpu::AttentionForward(a.p, q.data(), k.data(), v.data(), out.data(), lse.data(), &pool);
  EXPECT_LT(Error(out, want), 2e-6);
  for (size_t r = 0; r < lse.size(); ++r) {
    if (std::isinf(want_lse[r])) EXPECT_EQ(lse[r], -inf) << "row " << r;
    else EXPECT_NEAR(lse[r], want_lse[r], 1e-5 * std::max(1.0, std::abs(want_lse[r]))) << "row " << r;
  }
  if (rows) {
    const int64_t masked = ((B - 1) * H) * T + 2;  // (b, h, i) = (B - 1, 0, 2)
    EXPECT_EQ(lse[masked], -inf);
    for (int64_t d = 0; d < Dv; ++d) EXPECT_EQ(out[masked * Dv + d], 0.f);
  }

  // The backward against the reference over the expanded bias (contiguous [B, H, T, S]).
  kernels::cpu::AttentionOperands e = *planned;
  const int64_t expanded[4] = {B, H, T, S};
  ASSERT_TRUE(kernels::cpu::PlanAttentionBias(e, expanded).ok());
  const std::vector<float> full32(full.begin(), full.end());
  e.p.bias.data = full32.data();
  std::vector<double> ref_out(want.size()), want_dq(q.size()), want_dk(k.size()), want_dv(v.size());
  const std::vector<double> qw = Wide(q), kw = Wide(k), vw = Wide(v), dw = Wide(dout);
  kernels::cpu::AttentionForwardReference(e.p, qw.data(), kw.data(), vw.data(), ref_out.data(), nullptr, nullptr);
  EXPECT_LT(Error(std::vector<float>(ref_out.begin(), ref_out.end()), want), 1e-6) << "the reference";
  // The scores' gradient too (a learned bias'), 7 where a kernel would leave an element unwritten.
  std::vector<float> want_ds32(B * H * T * S, 7.f), ds(B * H * T * S, 7.f);
  e.p.dscores = want_ds32.data();
  kernels::cpu::AttentionBackwardReference(e.p, dw.data(), qw.data(), kw.data(), vw.data(), ref_out.data(),
                                           want_dq.data(), want_dk.data(), want_dv.data(), nullptr);
  const std::vector<double> want_ds = Wide(want_ds32);
  std::vector<float> dq(q.size(), 7.f), dk(k.size(), 7.f), dv(v.size(), 7.f);
  a.p.dscores = ds.data();
  kernels::cpu::AttentionBackward(a.p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), dq.data(),
                                  dk.data(), dv.data(), &pool);
  EXPECT_LT(Error(dq, want_dq), 2e-5);
  EXPECT_LT(Error(dk, want_dk), 2e-5);
  EXPECT_LT(Error(dv, want_dv), 2e-5);
  EXPECT_LT(Error(ds, want_ds), 2e-5);
  // The definition's: P * (dP - delta), summed over the keys to zero in each row.
  for (int64_t r = 0; r < B * H * T; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += want_ds[r * S + j];
    EXPECT_NEAR(sum, 0.0, 1e-5) << "row " << r;
  }
  // The scores' gradient alone, no other gradient asked for.
  std::vector<float> alone(ds.size(), 7.f);
  a.p.dscores = alone.data();
  kernels::cpu::AttentionBackward(a.p, dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr,
                                  nullptr, nullptr, &pool);
  EXPECT_EQ(alone, ds);
  a.p.dscores = nullptr;
  if (rows) {
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dq[(((B - 1) * H) * T + 2) * D + d], 0.f);
  }

  if (!kernels::cpu::Bf16AttentionSupported(a.p)) return;  // this CPU has no AVX-512 BF16
  const std::vector<uint16_t> qb = Bf16(q), kb = Bf16(k), vb = Bf16(v), db = Bf16(dout);
  std::vector<uint16_t> ob(out.size()), dqb(q.size()), dkb(k.size()), dvb(v.size());
  std::vector<float> lseb(lse.size());
  kernels::cpu::AttentionForwardBf16(a.p, qb.data(), kb.data(), vb.data(), ob.data(), lseb.data(), &pool);
  EXPECT_LT(Error(Widened(ob), want), 3e-2) << "bf16";
  std::vector<float> dsb(ds.size(), 7.f);
  a.p.dscores = dsb.data();
  kernels::cpu::AttentionBackwardBf16(a.p, db.data(), qb.data(), kb.data(), vb.data(), ob.data(), lseb.data(),
                                      dqb.data(), dkb.data(), dvb.data(), &pool);
  EXPECT_LT(Error(dsb, want_ds), 6e-2) << "bf16";
  EXPECT_LT(Error(Widened(dqb), want_dq), 6e-2) << "bf16";
  EXPECT_LT(Error(Widened(dkb), want_dk), 6e-2) << "bf16";
  EXPECT_LT(Error(Widened(dvb), want_dv), 6e-2) << "bf16";
}

INSTANTIATE_TEST_SUITE_P(
    Broadcasts, AttentionBias,
    ::testing::Values(BiasCase{{2, 1, 1, 7}, false},  // a padding mask [B, 1, 1, S]
                      BiasCase{{2, 1, 6, 7}, true},   // one per batch row, shared by the heads
                      BiasCase{{3, 6, 7}, false},     // one per head, shared by the batch
                      BiasCase{{6, 7}, true},         // [T, S]
                      BiasCase{{2, 3, 6, 7}, false},  // whole
                      BiasCase{{2, 3, 1, 1}, false}),  // one value a row: the softmax ignores it
    [](const ::testing::TestParamInfo<BiasCase>& info) {
      std::string name = "bias";
      for (int64_t d : info.param.dims) absl::StrAppend(&name, "_", d);
      return info.param.causal ? name + "_causal" : name;
    });

TEST(AttentionBias, ABiasThatDoesNotBroadcastIsAnErrorNamingBothShapes) {
  const int64_t qd[4] = {2, 3, 6, 8};
  auto a = *kernels::cpu::PlanAttentionOperands(kernels::cpu::AttentionLayout::kBhsd, qd, qd, qd, 1.0, false);
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{{2, 1, 1, 5}, {1, 2, 3, 6, 6}, {4, 6}}) {
    const absl::Status st = kernels::cpu::PlanAttentionBias(a, bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("[2,3,6,6]"), std::string::npos) << st;
  }
  // Over leading dims [2, 4, 3] (heads 3): a bias whole in one leading dim before the heads and
  // broadcast in the other cannot be read as one stride.
  const int64_t q5[5] = {2, 4, 3, 6, 8};
  auto b = *kernels::cpu::PlanAttentionOperands(kernels::cpu::AttentionLayout::kBhsd, q5, q5, q5, 1.0, false);
  const std::vector<int64_t> mixed = {2, 1, 3, 6, 6};
  EXPECT_EQ(kernels::cpu::PlanAttentionBias(b, mixed).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> whole = {2, 4, 1, 1, 6};
  ASSERT_TRUE(kernels::cpu::PlanAttentionBias(b, whole).ok());
  EXPECT_EQ(b.p.bias.heads, 3);
  EXPECT_EQ(b.p.bias.batch, 6);  // slice s = (b, l, h): at s / 3 * 6, whatever h
  EXPECT_EQ(b.p.bias.head, 0);
  EXPECT_EQ(b.p.bias.row, 0);
  EXPECT_EQ(b.p.bias.col, 1);
}

}  // namespace
}  // namespace cleave::testing
