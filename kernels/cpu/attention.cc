// Scaled dot-product attention on the CPU (kernels/cpu/). float32: blocks of query rows (in the
// backward, against one chunk of keys at a time), whose scores and probabilities live only in a
// per-thread buffer, with the products through sgemm; float64: one query row at a time, the
// reference.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "base/shape.h"
#include "base/status.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/thread_buffer.h"

namespace cleave::kernels::cpu {

namespace attention_rows {

int64_t Visible(const AttentionParams& p, int64_t i) {
  return p.causal ? std::clamp<int64_t>(i + 1 + (p.S - p.T), 0, p.S) : p.S;
}

// At T = S = 128 a causal block of 64 rows computes three quarters of the full square of
// scores, not all.
int64_t BlockRows(const AttentionParams& p) {
  return std::clamp<int64_t>((int64_t{64} << 10) / std::max<int64_t>(p.S, 1), 16, p.causal ? 64 : kMaxBlockRows);
}

// The row steps are built for each vector width (lanes.h), as the softmax rows are.
CLEAVE_SIMD_CLONES double ExpRow(float* sr, int64_t nr, int64_t n, float* m) {
  *m = LaneMax(sr, nr, -std::numeric_limits<float>::infinity());
  if (*m == -std::numeric_limits<float>::infinity()) nr = 0;  // every score masked
  for (int64_t j = 0; j < nr; ++j) sr[j] -= *m;
  ExpF32(sr, sr, nr);
  std::fill(sr + nr, sr + n, 0.f);
  return LaneSum<double>(sr, nr);
}

CLEAVE_SIMD_CLONES void ProbabilityRow(float* sr, int64_t nr, int64_t n, float lse) {
  if (lse == -std::numeric_limits<float>::infinity()) nr = 0;  // a row that attends to nothing
  for (int64_t j = 0; j < nr; ++j) sr[j] -= lse;
  ExpF32(sr, sr, nr);
  std::fill(sr + nr, sr + n, 0.f);
}

CLEAVE_SIMD_CLONES void ScoreGradRow(const float* pr, float* dsr, int64_t n, float delta, float scale) {
  for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (dsr[j] - delta) * scale;
}

int64_t FirstRowSeeing(const AttentionParams& p, int64_t j) {
  return p.causal ? std::clamp<int64_t>(j + (p.T - p.S), 0, p.T) : j < p.S ? 0 : p.T;
}

void ZeroScoreGrads(const AttentionParams& p, ThreadPool* pool) {
  ParallelFor(pool, p.batch * p.T, 64, [&](int64_t r0, int64_t r1) {
    std::fill(p.dscores + r0 * p.S, p.dscores + r1 * p.S, 0.f);
  });
}

KeyChunks PlanKeyChunks(const AttentionParams& p) {
  constexpr int64_t kStep = 16;
  const int64_t want = std::clamp<int64_t>((kBackwardTasks + p.batch - 1) / std::max<int64_t>(p.batch, 1), 1,
                                           std::clamp<int64_t>(p.S / kMinChunkKeys, 1, kMaxKeyChunks));
  // The (row, key) pairs seen: T - FirstRowSeeing(j) rows see key j.
  int64_t total = 0;
  for (int64_t j = 0; j < p.S; ++j) total += p.T - FirstRowSeeing(p, j);
  KeyChunks ch;
  int c = 0;
  int64_t seen = 0;
  for (int64_t j0 = 0; j0 < p.S; j0 += kStep) {
    const int64_t j1 = std::min(j0 + kStep, p.S);
    for (int64_t j = j0; j < j1; ++j) seen += p.T - FirstRowSeeing(p, j);
    if (j1 < p.S && c + 1 < want && seen * want >= total * (c + 1)) ch.begin[++c] = j1;
  }
  ch.count = c + 1;
  ch.begin[ch.count] = p.S;
  for (c = 0; c < ch.count; ++c) {
    ch.first_row[c] = FirstRowSeeing(p, ch.begin[c]);
    ch.widest = std::max(ch.widest, ch.begin[c + 1] - ch.begin[c]);
  }
  return ch;
}

QueryGradPartials::QueryGradPartials(const AttentionParams& p, const KeyChunks& chunks) : p_(p), chunks_(chunks) {
  int64_t n = 0;
  for (int c = 0; c < chunks.count; ++c) {
    offset_[c] = n;
    n += p.batch * (p.T - chunks.first_row[c]) * p.D;
  }
  data_.reset(new float[static_cast<size_t>(n)]);  // every row is written before it is read
}
}  // namespace attention_rows

using namespace attention_rows;

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// s[j] = scale q_i . k_j (+ the bias of row i of slice b) for the first n keys of slice kb;
// returns their max (-inf for none).
template <typename T>
double Scores(const AttentionParams& p, int64_t b, int64_t i, const T* qi, const T* kb, int64_t n,
              std::vector<double>& s) {
  double m = kNegInf;
  const float* bias = p.bias.data ? p.bias.data + p.bias.At(b, i) : nullptr;
  const double* bias64 = p.bias.data64 ? p.bias.data64 + p.bias.At(b, i) : nullptr;
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.D; ++d) dot += static_cast<double>(qi[d]) * static_cast<double>(kb[j * p.k.row + d]);
    s[j] = dot * p.scale + (bias64 ? bias64[j * p.bias.col] : bias ? static_cast<double>(bias[j * p.bias.col]) : 0.0);
    m = std::max(m, s[j]);
  }
  return m;
}

// c [M, N] = alpha op(a) op(b) + beta c, single-threaded: the callers already run one block
// per thread.
void Product(int64_t M, int64_t N, int64_t K, bool ta, bool tb, float alpha, const float* a, int64_t lda,
             const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  GemmParams g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.trans_a = ta;
  g.trans_b = tb;
  g.alpha = alpha;
  g.beta = beta;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  Sgemm(g, a, b, c);
}

// s [rows, n] = scale * q_blk k[0:n]^T.
void BlockScores(const AttentionParams& p, const float* q_blk, const float* kb, int64_t rows, int64_t n, float* s) {
  Product(rows, n, p.D, false, true, static_cast<float>(p.scale), q_blk, p.q.row, kb, p.k.row, 0.f, s, n);
}

}  // namespace

absl::StatusOr<AttentionParams> PlanAttention(std::span<const int64_t> q, std::span<const int64_t> k,
                                              std::span<const int64_t> v, double scale, bool causal) {
  const size_t r = q.size();
  bool ok = r >= 2 && k.size() == r && v.size() == r && q[r - 1] == k[r - 1] && k[r - 2] == v[r - 2];
  for (size_t d = 0; ok && d + 2 < r; ++d) ok = q[d] == k[d] && q[d] == v[d];
  if (!ok)
    return InvalidArgument("expected q [..., T, D], k [..., S, D] and v [..., S, Dv] with the same leading dims, got ",
                           DimsToString(q.data(), static_cast<int>(q.size())), ", ",
                           DimsToString(k.data(), static_cast<int>(k.size())), ", ",
                           DimsToString(v.data(), static_cast<int>(v.size())));
  AttentionParams p;
  p.T = q[r - 2];
  p.D = q[r - 1];
  p.S = k[r - 2];
  p.Dv = v[r - 1];
  for (size_t d = 0; d + 2 < r; ++d) p.batch *= q[d];
  p.scale = scale;
  p.causal = causal;
  SetLayout(p, AttentionLayout::kBhsd, 1);
  return p;
}

void SetLayout(AttentionParams& p, AttentionLayout layout, int64_t heads) {
  p.heads = heads;
  const int64_t H = heads;
  switch (layout) {
    case AttentionLayout::kBhsd:  // heads among the leading dims: one slice after another
      p.heads = 1;
      p.q = {p.T * p.D, 0, p.D};
      p.k = {p.S * p.D, 0, p.D};
      p.v = {p.S * p.Dv, 0, p.Dv};
      p.o = {p.T * p.Dv, 0, p.Dv};
      return;
    case AttentionLayout::kBshd:
      p.q = {p.T * H * p.D, p.D, H * p.D};
      p.k = {p.S * H * p.D, p.D, H * p.D};
      p.v = {p.S * H * p.Dv, p.Dv, H * p.Dv};
      p.o = {p.T * H * p.Dv, p.Dv, H * p.Dv};
      return;
    case AttentionLayout::kBs3hd:
      p.q = p.k = p.v = {p.T * 3 * H * p.D, p.D, 3 * H * p.D};
      p.o = {p.T * H * p.Dv, p.Dv, H * p.Dv};
      return;
  }
}

AttentionLayout AttentionLayoutNamed(std::string_view name) {
  return name == "bshd" ? AttentionLayout::kBshd : name == "bs3hd" ? AttentionLayout::kBs3hd : AttentionLayout::kBhsd;
}

absl::StatusOr<AttentionOperands> PlanAttentionOperands(AttentionLayout layout, std::span<const int64_t> q,
                                                        std::span<const int64_t> k, std::span<const int64_t> v,
                                                        double scale, bool causal) {
  AttentionOperands a;
  if (layout == AttentionLayout::kBhsd) {
    ASSIGN_OR_RETURN(a.p, PlanAttention(q, k, v, scale, causal));
    a.out = DimVector(q);
    a.out.back() = a.p.Dv;
    a.lse = DimVector(q.first(q.size() - 1));
    return a;
  }
  if (layout == AttentionLayout::kBs3hd) {
    if (q.size() != 5 || q[2] != 3)
      return InvalidArgument("layout \"bs3hd\": expected q, k and v packed [B, T, 3, H, D], got ",
                             DimsToString(q.data(), static_cast<int>(q.size())));
    const int64_t one[4] = {q[0], q[3], q[1], q[4]};
    ASSIGN_OR_RETURN(a.p, PlanAttention(one, one, one, scale, causal));
    a.packed = true;
    a.k_offset = q[3] * q[4];
    a.v_offset = 2 * a.k_offset;
  } else {
    const std::span<const int64_t> t[3] = {q, k, v};
    int64_t dims[3][4];
    for (int i = 0; i < 3; ++i) {
      if (t[i].size() != 4)
        return InvalidArgument("layout \"bshd\": expected ", std::string(1, "qkv"[i]),
                               " of rank 4 [B, T, H, D], got rank ", t[i].size());
      dims[i][0] = t[i][0], dims[i][1] = t[i][2], dims[i][2] = t[i][1], dims[i][3] = t[i][3];
    }
    ASSIGN_OR_RETURN(a.p, PlanAttention(dims[0], dims[1], dims[2], scale, causal));
  }
  const int64_t B = q[0], T = q[1], H = layout == AttentionLayout::kBs3hd ? q[3] : q[2];
  SetLayout(a.p, layout, H);
  a.out = {B, T, H, a.p.Dv};
  a.lse = {B, H, T};
  return a;
}

DimVector ScoreDims(const AttentionOperands& a) {
  DimVector scores = a.lse;
  scores.push_back(a.p.S);
  return scores;
}

absl::Status PlanAttentionBias(AttentionOperands& a, std::span<const int64_t> bias) {
  const DimVector scores = ScoreDims(a);
  const size_t R = scores.size(), r = bias.size();
  const auto mismatch = [&](const char* why) {
    return InvalidArgument("expected a bias that broadcasts to the scores ",
                           DimsToString(scores.data(), static_cast<int>(R)), why, ", got ",
                           DimsToString(bias.data(), static_cast<int>(r)));
  };
  if (r > R) return mismatch("");
  // The bias' dims aligned to the scores', and its strides there (0 where it broadcasts).
  std::vector<int64_t> dim(R, 1), step(R, 1), stride(R, 0);
  for (size_t d = 0; d < r; ++d) dim[R - r + d] = bias[d];
  for (size_t d = R; d-- > 0;) {
    if (dim[d] != 1 && dim[d] != scores[d]) return mismatch("");
    if (d + 1 < R) step[d] = step[d + 1] * dim[d + 1];
    stride[d] = dim[d] == 1 ? 0 : step[d];
  }
  AttentionBias& b = a.p.bias;
  b = AttentionBias{};
  b.col = stride[R - 1];
  b.row = stride[R - 2];
  if (R == 2) return absl::OkStatus();
  b.heads = scores[R - 3];
  b.head = stride[R - 3];
  // The lead dims before the last flatten to b / heads: all of them broadcast, or all are whole.
  bool some = false, whole = true;
  for (size_t d = 0; d + 3 < R; ++d) {
    some |= stride[d] != 0;
    whole &= dim[d] == scores[d];
  }
  if (some && !whole) return mismatch(" (all or none of the dims before the heads' broadcast)");
  if (some) b.batch = step[R - 4];  // the whole lead dims, flattened
  return absl::OkStatus();
}

template <typename T>
void AttentionForwardReference(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse,
                               ThreadPool* pool) {
  const int64_t rows = p.batch * p.T;
  ParallelFor(pool, rows, 4, [&](int64_t r0, int64_t r1) {
    std::vector<double> s(p.S), acc(p.Dv);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.T, i = r % p.T;
      const T* qi = q + p.At(p.q, b, i);
      const T* kb = k + p.At(p.k, b, 0);
      const T* vb = v + p.At(p.v, b, 0);
      const double m = Scores(p, b, i, qi, kb, Visible(p, i), s);
      const int64_t n = m == kNegInf ? 0 : Visible(p, i);  // none when every score is masked
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double e = std::exp(s[j] - m);
        sum += e;
        for (int64_t d = 0; d < p.Dv; ++d) acc[d] += e * static_cast<double>(vb[j * p.v.row + d]);
      }
      T* o = out + p.At(p.o, b, i);
      for (int64_t d = 0; d < p.Dv; ++d) o[d] = static_cast<T>(n ? acc[d] / sum : 0.0);
      if (lse) lse[r] = static_cast<float>(n ? m + std::log(sum) : kNegInf);
    }
  });
}

template <typename T>
void AttentionBackwardReference(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v,
                                const T* out, T* dq, T* dk, T* dv, ThreadPool* pool) {
  // Per slice b (in parallel): recompute each row's probabilities from q and k in double, then
  //   dV += P^T dO,  dS = P * (dO V^T - rowsum(dO * O)),  dQ = scale dS K,  dK += scale dS^T Q.
  ParallelFor(pool, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<double> s(p.S), dk_acc, dv_acc, dqi(p.D);
    for (int64_t b = b0; b < b1; ++b) {
      if (p.dscores) std::fill(p.dscores + b * p.T * p.S, p.dscores + (b + 1) * p.T * p.S, 0.f);
      dk_acc.assign(p.S * p.D, 0.0);
      dv_acc.assign(p.S * p.Dv, 0.0);
      const T* kb = k + p.At(p.k, b, 0);
      const T* vb = v + p.At(p.v, b, 0);
      for (int64_t i = 0; i < p.T; ++i) {
        const T* qi = q + p.At(p.q, b, i);
        const T* doi = dout + p.At(p.o, b, i);
        const T* oi = out + p.At(p.o, b, i);
        const double m = Scores(p, b, i, qi, kb, Visible(p, i), s);
        const int64_t n = m == kNegInf ? 0 : Visible(p, i);
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
        const double lse = n ? m + std::log(sum) : 0.0;
        double delta = 0;  // rowsum(dO * O)
        for (int64_t d = 0; d < p.Dv; ++d) delta += static_cast<double>(doi[d]) * static_cast<double>(oi[d]);
        std::fill(dqi.begin(), dqi.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double pj = std::exp(s[j] - lse);
          double dpj = 0;
          for (int64_t d = 0; d < p.Dv; ++d) {
            dpj += static_cast<double>(doi[d]) * static_cast<double>(vb[j * p.v.row + d]);
            dv_acc[j * p.Dv + d] += pj * static_cast<double>(doi[d]);
          }
          if (p.dscores) p.dscores[(b * p.T + i) * p.S + j] = static_cast<float>(pj * (dpj - delta));
          const double ds = pj * (dpj - delta) * p.scale;
          for (int64_t d = 0; d < p.D; ++d) {
            dqi[d] += ds * static_cast<double>(kb[j * p.k.row + d]);
            dk_acc[j * p.D + d] += ds * static_cast<double>(qi[d]);
          }
        }
        if (dq)
          for (int64_t d = 0; d < p.D; ++d) dq[p.At(p.q, b, i) + d] = static_cast<T>(dqi[d]);
      }
      for (int64_t j = 0; j < p.S; ++j) {
        if (dk)
          for (int64_t d = 0; d < p.D; ++d) dk[p.At(p.k, b, j) + d] = static_cast<T>(dk_acc[j * p.D + d]);
        if (dv)
          for (int64_t d = 0; d < p.Dv; ++d) dv[p.At(p.v, b, j) + d] = static_cast<T>(dv_acc[j * p.Dv + d]);
      }
    }
  });
}

void AttentionForward(const AttentionParams& p, const float* q, const float* k, const float* v, float* out,
                      float* lse, ThreadPool* pool) {
  const int64_t br = BlockRows(p), blocks = (p.T + br - 1) / br;
  // One task per (slice, block of query rows): scores s [rows, n] for the n keys the block's
  // last row sees, each row's visible part exponentiated against its max and the rest zeroed,
  // out = s v / rowsum, lse = max + log(rowsum).
  ParallelFor(pool, p.batch * blocks, 1, [&](int64_t t0, int64_t t1) {
    float* s = ThreadBuffer(0, static_cast<size_t>(br * p.S));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = (t % blocks) * br, rows = std::min(br, p.T - i0);
      const int64_t n = Visible(p, i0 + rows - 1);
      float* o = out ? out + p.At(p.o, b, i0) : nullptr;
      float* l = lse ? lse + b * p.T + i0 : nullptr;
      if (n == 0) {
        if (o) ZeroRows(o, rows, p.Dv, p.o.row);
        if (l) std::fill(l, l + rows, -std::numeric_limits<float>::infinity());
        continue;
      }
      BlockScores(p, q + p.At(p.q, b, i0), k + p.At(p.k, b, 0), rows, n, s);
      float inv[kMaxBlockRows];
      for (int64_t r = 0; r < rows; ++r) {
        AddBias(p, b, i0 + r, 0, s + r * n, n);
        float m;
        const double sum = ExpRow(s + r * n, Visible(p, i0 + r), n, &m);
        inv[r] = sum > 0 ? static_cast<float>(1.0 / sum) : 0.f;
        if (l) l[r] = sum > 0 ? static_cast<float>(m + std::log(sum)) : -std::numeric_limits<float>::infinity();
      }
      if (!o) continue;
      Product(rows, p.Dv, n, false, false, 1.f, s, n, v + p.At(p.v, b, 0), p.v.row, 0.f, o, p.o.row);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < p.Dv; ++d) o[r * p.o.row + d] *= inv[r];
    }
  });
}

void AttentionForward(const AttentionParams& p, const double* q, const double* k, const double* v, double* out,
                      float* lse, ThreadPool* pool) {
  AttentionForwardReference(p, q, k, v, out, lse, pool);
}

void AttentionBackward(const AttentionParams& p, const float* dout, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, float* dq, float* dk, float* dv, ThreadPool* pool) {
  const int64_t br = BlockRows(p);
  const KeyChunks ch = PlanKeyChunks(p);
  const BackwardRowStats stats(
      p, lse, dq || dk || p.dscores, pool,
      [&](int64_t at) {
        float sum = 0;
        for (int64_t d = 0; d < p.Dv; ++d) sum += dout[at + d] * out[at + d];
        return sum;
      },
      [&](float* into) { AttentionForward(p, q, k, v, nullptr, into, pool); });
  std::optional<QueryGradPartials> partials;
  if (dq && ch.count > 1) partials.emplace(p, ch);
  const float scale = static_cast<float>(p.scale);
  if (p.dscores) ZeroScoreGrads(p, pool);
  // One task per (slice, chunk of w keys from j0), over the blocks of query rows that see the
  // chunk, with P [rows, n] recomputed from the scores and lse:
  //   dV[j0:j0+n] += P^T dO,  dS = P * (dO V[j0:j0+n]^T - delta) * scale,
  //   dQ (the chunk's part) = dS K[j0:j0+n],  dK[j0:j0+n] += dS^T Q.
  ParallelFor(pool, p.batch * ch.count, 1, [&](int64_t t0, int64_t t1) {
    float* s = ThreadBuffer(0, static_cast<size_t>(br * ch.widest));
    float* ds = ThreadBuffer(1, static_cast<size_t>(br * ch.widest));
    for (int64_t t = t0; t < t1; ++t) {
      const auto [b, c, j0, w, first] = ch.Task(t);
      const float* kc = k + p.At(p.k, b, j0);
      const float* vc = v + p.At(p.v, b, j0);
      // dK and dV accumulate in place.
      float* dkc = dk ? dk + p.At(p.k, b, j0) : nullptr;
      float* dvc = dv ? dv + p.At(p.v, b, j0) : nullptr;
      if (dkc) ZeroRows(dkc, w, p.D, p.k.row);
      if (dvc) ZeroRows(dvc, w, p.Dv, p.v.row);
      if (dq && !partials) ZeroRows(dq + p.At(p.q, b, 0), first, p.D, p.q.row);  // rows that see no key
      for (int64_t i0 = first; i0 < p.T; i0 += br) {
        const int64_t rows = std::min(br, p.T - i0), row0 = b * p.T + i0;
        const int64_t n = SeenOf(p, i0 + rows - 1, j0, w);
        const float* qb = q + p.At(p.q, b, i0);
        const float* dob = dout + p.At(p.o, b, i0);
        BlockScores(p, qb, kc, rows, n, s);
        for (int64_t r = 0; r < rows; ++r) {
          AddBias(p, b, i0 + r, j0, s + r * n, n);
          ProbabilityRow(s + r * n, SeenOf(p, i0 + r, j0, n), n, stats.lse(row0 + r));
        }
        if (dvc) Product(n, p.Dv, rows, true, false, 1.f, s, n, dob, p.o.row, 1.f, dvc, p.v.row);
        if (!dq && !dkc && !p.dscores) continue;
        Product(rows, n, p.Dv, false, true, 1.f, dob, p.o.row, vc, p.v.row, 0.f, ds, n);
        for (int64_t r = 0; r < rows; ++r) {
          float* dsr = ds + r * n;
          ScoreGradRow(s + r * n, dsr, n, stats.delta(row0 + r), p.dscores ? 1.f : scale);
          if (p.dscores) StoreScoreGrads(p, b, i0 + r, j0, dsr, n, scale);
        }
        if (partials) Product(rows, p.D, n, false, false, 1.f, ds, n, kc, p.k.row, 0.f, partials->Row(c, b, i0), p.D);
        else if (dq) Product(rows, p.D, n, false, false, 1.f, ds, n, kc, p.k.row, 0.f, dq + p.At(p.q, b, i0), p.q.row);
        if (dkc) Product(n, p.D, rows, true, false, 1.f, ds, n, qb, p.q.row, 1.f, dkc, p.k.row);
      }
    }
  });
  if (partials)
    partials->Sum(pool, [&](int64_t b, int64_t i, const float* sum) { std::copy(sum, sum + p.D, dq + p.At(p.q, b, i)); });
}

void AttentionBackward(const AttentionParams& p, const double* dout, const double* q, const double* k,
                       const double* v, const double* out, const float* /*lse*/, double* dq, double* dk, double* dv,
                       ThreadPool* pool) {
  AttentionBackwardReference(p, dout, q, k, v, out, dq, dk, dv, pool);
}

template void AttentionForwardReference<float>(const AttentionParams&, const float*, const float*, const float*,
                                               float*, float*, ThreadPool*);
template void AttentionForwardReference<double>(const AttentionParams&, const double*, const double*, const double*,
                                                double*, float*, ThreadPool*);
template void AttentionBackwardReference<float>(const AttentionParams&, const float*, const float*, const float*,
                                                const float*, const float*, float*, float*, float*, ThreadPool*);
template void AttentionBackwardReference<double>(const AttentionParams&, const double*, const double*, const double*,
                                                 const double*, const double*, double*, double*, double*,
                                                 ThreadPool*);

}  // namespace cleave::kernels::cpu
