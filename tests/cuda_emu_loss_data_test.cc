// The CUDA provider's cross-entropy, reduction, Where, Gather and Transpose kernels on the
// emulated device (see cuda_emu_kernels_test.cc), against double-precision references.
#include <algorithm>
#include <string>
#include <vector>

#include "tests/cuda_emu_test_util.h"  // last: cuda_emu.h defines threadIdx and friends as macros

namespace cleave {
namespace {

using namespace emu_testing;  // NOLINT: the helpers of these tests

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

TEST_P(CudaEmu, ReduceSumMeanMaxMinOverEveryLayout) {
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
  const ck::ReduceOp ops[] = {ck::ReduceOp::kSum, ck::ReduceOp::kMean, ck::ReduceOp::kMax, ck::ReduceOp::kMin};
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
        const bool extreme = op == ck::ReduceOp::kMax || op == ck::ReduceOp::kMin;
        if (extreme && n > 100) xv[77] = kNaN;  // a max or min propagates NaN
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
        std::vector<double> want(static_cast<size_t>(outputs), op == ck::ReduceOp::kMax   ? -INFINITY
                                                               : op == ck::ReduceOp::kMin ? INFINITY
                                                                                          : 0.0);
        for (int64_t i = 0; i < n; ++i) {
          int64_t rest = i, o = 0, scale = 1;
          for (int d = rank - 1; d >= 0; --d) {
            const int64_t size = rc.dims[static_cast<size_t>(d)], c = rest % size;
            rest /= size;
            if (!reduce[d]) o += c * scale, scale *= size;
          }
          double& w = want[static_cast<size_t>(o)];
          const double v = x[i];
          if (!extreme) w += v;
          else if (std::isnan(v) || std::isnan(w)) w = NAN;
          else w = op == ck::ReduceOp::kMax ? std::max(w, v) : std::min(w, v);
        }
        for (double& w : want) {
          if (op == ck::ReduceOp::kMean) w /= static_cast<double>(R);
          w = Round(dt, static_cast<float>(w));
        }
        EXPECT_TRUE(Near(y, dt, want, 1e-6, 1e-6));
      }
}

// A bias gradient's column sums into float32, where cuBLASLt's epilogue cannot form them: bf16
// and fp16 values (and float32) summed in double over chunks of rows, combined in order, and
// rounded once; no rows give zeros.
TEST_P(CudaEmu, ColumnSumsIntoFloat32) {
  for (Dt dt : kDts)
    for (const auto& [R, C] : {std::pair<int64_t, int64_t>{300, 70}, {5, 33}, {0, 9}}) {
      SCOPED_TRACE(std::string(Name(dt)) + " " + std::to_string(R) + " x " + std::to_string(C));
      Values x(dt, Uniform(R * C, -3.f, 3.f, 25));
      Values y(Dt::kF32, std::vector<float>(static_cast<size_t>(C), kNaN));
      const int64_t parts = ck::ColumnSumsScratch(R, C);
      EXPECT_EQ(parts > C, R > 64) << "more than one chunk of rows";
      Array<double> scratch(std::max<int64_t>(parts, 1), NAN);
      ASSERT_TRUE(Ok(ck::ColumnSums(dt, x.data(), reinterpret_cast<float*>(y.data()), R, C, scratch.data(), nullptr)));
      std::vector<double> want(static_cast<size_t>(C), 0.0);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) want[static_cast<size_t>(c)] += x[r * C + c];
      for (double& w : want) w = static_cast<float>(w);
      EXPECT_TRUE(Near(y, Dt::kF32, want, 1e-6, 1e-6));
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

// Along the first axis (outer 1, the embedding) and a middle one (outer 3), int64 and int32 ids;
// the ids out of range give zeros (add nothing) and are reported.
TEST_P(CudaEmu, GatherAlongAnAxisAndScatterAddTheGradient) {
  const int64_t rows = 10, inner = 7;
  const std::vector<int64_t> id_values = {3, -1, 0, 10, -11, 9, 3, 2, 3};  // 10 and -11: out of range, zeros
  const int64_t k = static_cast<int64_t>(id_values.size());
  auto row_of = [&](int64_t i) {
    const int64_t id = id_values[static_cast<size_t>(i)];
    return id < -rows || id >= rows ? -1 : (id + rows) % rows;
  };
  Array<int64_t> ids64(k);
  Array<int32_t> ids32(k);
  for (int64_t i = 0; i < k; ++i) {
    ids64[i] = id_values[static_cast<size_t>(i)];
    ids32[i] = static_cast<int32_t>(id_values[static_cast<size_t>(i)]);
  }
  for (int64_t outer : {1, 3}) {
    for (bool int32 : {false, true}) {
      SCOPED_TRACE("outer " + std::to_string(outer) + (int32 ? ", int32 ids" : ", int64 ids"));
      const void* ids = int32 ? static_cast<const void*>(ids32.data()) : static_cast<const void*>(ids64.data());
      auto run = [&](auto zero) {
        using E = decltype(zero);
        Array<E> table(outer * rows * inner), out(outer * k * inner, E{77});
        for (int64_t i = 0; i < outer * rows * inner; ++i) table[i] = static_cast<E>(i + 1);
        Array<int64_t> words(4, 0);
        ASSERT_TRUE(Ok(ck::Gather(sizeof(E), table.data(), ids, int32, out.data(), outer, k, rows, inner, nullptr,
                                  {words.data(), 5})));
        // One of the two bad ids is reported under the tag, with its position and the axis size.
        EXPECT_EQ(words[0], 5);
        EXPECT_TRUE((words[1] == 10 && words[2] == 3) || (words[1] == -11 && words[2] == 4)) << words[1];
        EXPECT_EQ(words[3], rows);
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < k; ++i)
            for (int64_t c = 0; c < inner; ++c)
              EXPECT_EQ(out[(o * k + i) * inner + c],
                        row_of(i) < 0 ? E{} : table[(o * rows + row_of(i)) * inner + c])
                  << o << ", " << i << ", " << c;
      };
      run(uint8_t{});
      run(int16_t{});
      run(float{});
      run(double{});
      // Small integers, so the sums are exact whatever order the additions take.
      Array<float> dy(outer * k * inner), dtable(outer * rows * inner, kNaN);
      for (int64_t i = 0; i < outer * k * inner; ++i) dy[i] = static_cast<float>(i % 11 - 5);
      Array<int64_t> words(4, 0);
      ASSERT_TRUE(Ok(ck::GatherGrad(dy.data(), ids, int32, dtable.data(), outer, k, rows, inner, nullptr, nullptr,
                                    {words.data(), 2})));
      EXPECT_EQ(words[0], 2);
      EXPECT_TRUE(words[1] == 10 || words[1] == -11) << words[1];
      std::vector<double> want(static_cast<size_t>(outer * rows * inner), 0.0);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < k; ++i)
          if (row_of(i) >= 0)
            for (int64_t c = 0; c < inner; ++c)
              want[static_cast<size_t>((o * rows + row_of(i)) * inner + c)] += dy[(o * k + i) * inner + c];
      EXPECT_TRUE(Near(dtable, Dt::kF32, want, 0, 0));
    }
  }
}

// StridedScatter puts a contiguous block where StridedCopy reads it from (forward and negative
// strides, dims of 1, 8-bit to 64-bit elements) and leaves the rest of the output alone.
TEST_P(CudaEmu, StridedScatterInvertsStridedCopy) {
  struct Case {
    std::vector<int64_t> dims, strides;
    int64_t first, size;  // the offset of element 0, and the buffer's elements
  };
  const std::vector<Case> cases = {
      {{3, 4}, {10, 2}, 1, 40},          // a step of 2 in rows of 10
      {{2, 1, 5}, {-20, 7, -3}, 35, 40},  // both axes backwards, a dim of 1
      {{4, 3, 2}, {12, 4, 1}, 0, 48},    // whole rows of a wider buffer
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    SCOPED_TRACE("case " + std::to_string(c));
    const int rank = static_cast<int>(k.dims.size());
    int64_t n = 1;
    for (int64_t d : k.dims) n *= d;
    auto run = [&](auto zero) {
      using E = decltype(zero);
      Array<E> x(n), y(k.size, E{99}), back(n, E{0});
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<E>(i + 1);
      ASSERT_TRUE(Ok(ck::StridedScatter(sizeof(E), x.data(), y.data() + k.first, rank, k.dims.data(),
                                        k.strides.data(), nullptr)));
      // Every element landed where its index says, and nothing else changed.
      std::vector<bool> hit(static_cast<size_t>(k.size), false);
      for (int64_t i = 0; i < n; ++i) {
        int64_t rest = i, off = k.first;
        for (int d = rank - 1; d >= 0; --d) {
          off += rest % k.dims[d] * k.strides[d];
          rest /= k.dims[d];
        }
        EXPECT_EQ(y[off], x[i]) << i;
        hit[static_cast<size_t>(off)] = true;
      }
      for (int64_t j = 0; j < k.size; ++j) {
        if (!hit[static_cast<size_t>(j)]) {
          EXPECT_EQ(y[j], E{99}) << j;
        }
      }
      ASSERT_TRUE(Ok(ck::StridedCopy(sizeof(E), y.data() + k.first, back.data(), rank, k.dims.data(),
                                     k.strides.data(), nullptr)));
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back[i], x[i]) << i;
    };
    run(uint8_t{});
    run(uint16_t{});
    run(float{});
    run(int64_t{});
  }
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

// The value makers: Fill writes the value's low bytes at every element size; Range counts from
// start by delta (int64 beyond 2^53, where a double would round; float32 rounded once); Trilu
// keeps a triangle of each matrix of a batch for k on either side and past either edge.
TEST_P(CudaEmu, FillRangeAndTrilu) {
  Array<uint16_t> h(37, 0);
  ASSERT_TRUE(Ok(ck::Fill(2, 0xabcd1234u, h.data(), 37, nullptr)));
  for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(h[i], 0x1234u) << i;
  Array<uint64_t> w(9, 0);
  ASSERT_TRUE(Ok(ck::Fill(8, 0x0123456789abcdefull, w.data(), 9, nullptr)));
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(w[i], 0x0123456789abcdefull) << i;
  EXPECT_FALSE(Ok(ck::Fill(3, 0, w.data(), 3, nullptr)));

  const int64_t big = (int64_t{1} << 53) + 1;
  Array<int64_t> r(50, 0);
  ASSERT_TRUE(Ok(ck::Range(ck::Elem::kI64, big, -3, 0, 0, r.data(), 50, nullptr)));
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(r[i], big - 3 * i) << i;
  Array<int32_t> r32(20, 0);
  ASSERT_TRUE(Ok(ck::Range(ck::Elem::kI32, -7, 2, 0, 0, r32.data(), 20, nullptr)));
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(r32[i], -7 + 2 * i) << i;
  Array<float> rf(300, 0.f);
  ASSERT_TRUE(Ok(ck::Range(ck::Elem::kF32, 0, 0, 0.5, 0.1f, rf.data(), 300, nullptr)));
  for (int64_t i = 0; i < 300; ++i)
    EXPECT_EQ(rf[i], static_cast<float>(0.5 + static_cast<double>(i) * static_cast<double>(0.1f))) << i;

  const int64_t batch = 3, rows = 4, cols = 6;
  for (bool upper : {true, false})
    for (int64_t k : {int64_t{0}, int64_t{2}, int64_t{-1}, int64_t{-9}, int64_t{40}, INT64_MIN / 2}) {
      SCOPED_TRACE(std::string(upper ? "upper" : "lower") + " k " + std::to_string(k));
      Array<float> x(batch * rows * cols), y(batch * rows * cols, kNaN);
      for (int64_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
      ASSERT_TRUE(Ok(ck::Trilu(4, x.data(), y.data(), batch, rows, cols, k, upper, nullptr)));
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t at = (b * rows + i) * cols + j;
            const bool keep = upper ? j - i >= k : j - i <= k;
            EXPECT_EQ(y[at], keep ? x[at] : 0.f) << b << " " << i << " " << j;
          }
    }
}

}  // namespace
}  // namespace cleave
