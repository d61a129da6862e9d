// Scaled dot-product attention on the CPU (kernels/cpu/): one query row at a time, in double.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/shape.h"
#include "base/status.h"

namespace cleave::kernels::cpu {

namespace {
// The keys query row i may see.
int64_t Visible(const AttentionParams& p, int64_t i) {
  return p.causal ? std::clamp<int64_t>(i + 1 + (p.S - p.T), 0, p.S) : p.S;
}

// s[j] = scale q_i . k_j for the first n keys of slice kb; returns their max (-inf for none).
template <typename T>
double Scores(const AttentionParams& p, const T* qi, const T* kb, int64_t n, std::vector<double>& s) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    double dot = 0;
    for (int64_t d = 0; d < p.D; ++d) dot += static_cast<double>(qi[d]) * static_cast<double>(kb[j * p.D + d]);
    s[j] = dot * p.scale;
    m = std::max(m, s[j]);
  }
  return m;
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
  return p;
}

template <typename T>
void AttentionForward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse,
                      ThreadPool* pool) {
  const int64_t rows = p.batch * p.T;
  ParallelFor(pool, rows, 4, [&](int64_t r0, int64_t r1) {
    std::vector<double> s(p.S), acc(p.Dv);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / p.T, i = r % p.T;
      const T* qi = q + (b * p.T + i) * p.D;
      const T* kb = k + b * p.S * p.D;
      const T* vb = v + b * p.S * p.Dv;
      const int64_t n = Visible(p, i);
      const double m = Scores(p, qi, kb, n, s);
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double e = std::exp(s[j] - m);
        sum += e;
        for (int64_t d = 0; d < p.Dv; ++d) acc[d] += e * static_cast<double>(vb[j * p.Dv + d]);
      }
      T* o = out + (b * p.T + i) * p.Dv;
      for (int64_t d = 0; d < p.Dv; ++d) o[d] = static_cast<T>(n ? acc[d] / sum : 0.0);
      if (lse) lse[r] = static_cast<float>(n ? m + std::log(sum) : -std::numeric_limits<double>::infinity());
    }
  });
}

template <typename T>
void AttentionBackward(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v, const T* out,
                       const float* lse_in, T* dq, T* dk, T* dv, ThreadPool* pool) {
  // Per slice b (in parallel): recompute each row's probabilities from q, k and the row's
  // log-sum-exp (recomputed in double here for accuracy), then
  //   dV += P^T dO,  dS = P * (dO V^T - rowsum(dO * O)),  dQ = scale dS K,  dK += scale dS^T Q.
  ParallelFor(pool, p.batch, 1, [&](int64_t b0, int64_t b1) {
    std::vector<double> s(p.S), dk_acc, dv_acc;
    for (int64_t b = b0; b < b1; ++b) {
      dk_acc.assign(p.S * p.D, 0.0);
      dv_acc.assign(p.S * p.Dv, 0.0);
      const T* kb = k + b * p.S * p.D;
      const T* vb = v + b * p.S * p.Dv;
      for (int64_t i = 0; i < p.T; ++i) {
        const int64_t row = b * p.T + i;
        const T* qi = q + row * p.D;
        const T* doi = dout + row * p.Dv;
        const T* oi = out + row * p.Dv;
        const int64_t n = Visible(p, i);
        const double m = Scores(p, qi, kb, n, s);
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
        const double lse = n ? m + std::log(sum) : 0.0;
        (void)lse_in;
        double delta = 0;  // rowsum(dO * O)
        for (int64_t d = 0; d < p.Dv; ++d) delta += static_cast<double>(doi[d]) * static_cast<double>(oi[d]);
        if (dq) std::fill(dq + row * p.D, dq + (row + 1) * p.D, T(0));
        std::vector<double> dqi(p.D, 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double pj = std::exp(s[j] - lse);
          double dpj = 0;
          for (int64_t d = 0; d < p.Dv; ++d) {
            dpj += static_cast<double>(doi[d]) * static_cast<double>(vb[j * p.Dv + d]);
            dv_acc[j * p.Dv + d] += pj * static_cast<double>(doi[d]);
          }
          const double ds = pj * (dpj - delta) * p.scale;
          for (int64_t d = 0; d < p.D; ++d) {
            dqi[d] += ds * static_cast<double>(kb[j * p.D + d]);
            dk_acc[j * p.D + d] += ds * static_cast<double>(qi[d]);
          }
        }
        if (dq)
          for (int64_t d = 0; d < p.D; ++d) dq[row * p.D + d] = static_cast<T>(dqi[d]);
      }
      if (dk)
        for (int64_t e = 0; e < p.S * p.D; ++e) dk[b * p.S * p.D + e] = static_cast<T>(dk_acc[e]);
      if (dv)
        for (int64_t e = 0; e < p.S * p.Dv; ++e) dv[b * p.S * p.Dv + e] = static_cast<T>(dv_acc[e]);
    }
  });
}

template void AttentionForward<float>(const AttentionParams&, const float*, const float*, const float*, float*,
                                      float*, ThreadPool*);
template void AttentionForward<double>(const AttentionParams&, const double*, const double*, const double*, double*,
                                       float*, ThreadPool*);
template void AttentionBackward<float>(const AttentionParams&, const float*, const float*, const float*, const float*,
                                       const float*, const float*, float*, float*, float*, ThreadPool*);
template void AttentionBackward<double>(const AttentionParams&, const double*, const double*, const double*,
                                        const double*, const double*, const float*, double*, double*, double*,
                                        ThreadPool*);

}  // namespace cleave::kernels::cpu
