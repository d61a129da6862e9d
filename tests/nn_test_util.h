// Reference math for the neural-network op tests (tests/): deterministic inputs and naive
// double-precision implementations written straight from the ONNX op definitions, with no
// code shared with kernels/, so a kernel bug cannot hide in its own expected values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

namespace cleave::testing {

using I64 = std::vector<int64_t>;

inline std::ostream& operator<<(std::ostream& os, const I64& d) {
  os << "[";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? "," : "") << d[i];
  return os << "]";
}

inline int64_t Numel(const I64& d) {
  int64_t n = 1;
  for (int64_t v : d) n *= v;
  return n;
}

// n values in [-1, 1), fixed by the seed.
inline std::vector<double> Values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(gen() % 20001) / 10000.0 - 1.0;
  return v;
}

// n small integers in [-4, 4] (exact in every dtype and in products).
inline std::vector<double> Ints(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<int>(gen() % 9) - 4);
  return v;
}

template <typename T>
std::vector<T> Cast(const std::vector<double>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return out;
}

// Row-major offset of `idx` (right-aligned against dims, size-1 dims broadcast).
inline int64_t BroadcastOffset(const I64& dims, const I64& idx) {
  int64_t off = 0;
  const size_t shift = idx.size() - dims.size();
  for (size_t k = 0; k < dims.size(); ++k) off = off * dims[k] + (dims[k] == 1 ? 0 : idx[k + shift]);
  return off;
}

// numpy.matmul: 1-D operands get a dim that is dropped again; batch dims broadcast.
inline std::vector<double> NaiveMatMul(const std::vector<double>& a, I64 ad,
                                       const std::vector<double>& b, I64 bd, I64* out_dims) {
  const bool a1 = ad.size() == 1, b1 = bd.size() == 1;
  if (a1) ad.insert(ad.begin(), 1);
  if (b1) bd.push_back(1);
  const int64_t M = ad[ad.size() - 2], K = ad.back(), N = bd.back();
  I64 abatch(ad.begin(), ad.end() - 2), bbatch(bd.begin(), bd.end() - 2);
  const size_t r = std::max(abatch.size(), bbatch.size());
  I64 batch(r, 1);
  for (size_t k = 0; k < r; ++k) {
    int64_t da = k + abatch.size() >= r ? abatch[k + abatch.size() - r] : 1;
    int64_t db = k + bbatch.size() >= r ? bbatch[k + bbatch.size() - r] : 1;
    batch[k] = da == 1 ? db : da;
  }
  std::vector<double> y(Numel(batch) * M * N);
  I64 idx(r, 0);
  for (int64_t bi = 0; bi < Numel(batch); ++bi) {
    int64_t rest = bi;
    for (int k = static_cast<int>(r) - 1; k >= 0; --k) idx[k] = rest % batch[k], rest /= batch[k];
    const double* am = a.data() + BroadcastOffset(abatch, idx) * M * K;
    const double* bm = b.data() + BroadcastOffset(bbatch, idx) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += am[m * K + k] * bm[k * N + n];
        y[(bi * M + m) * N + n] = s;
      }
  }
  *out_dims = batch;
  if (!a1) out_dims->push_back(M);
  if (!b1) out_dims->push_back(N);
  return y;
}

// Softmax (or log-softmax) of x viewed as [outer, n, inner] along the middle dim.
inline std::vector<double> NaiveSoftmax(const std::vector<double>& x, int64_t outer, int64_t n,
                                        int64_t inner, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t a) { return (o * n + a) * inner + i; };
      double mx = -INFINITY, sum = 0;
      for (int64_t a = 0; a < n; ++a) mx = std::max(mx, x[at(a)]);
      for (int64_t a = 0; a < n; ++a) sum += std::exp(x[at(a)] - mx);
      for (int64_t a = 0; a < n; ++a)
        y[at(a)] = log ? x[at(a)] - mx - std::log(sum) : std::exp(x[at(a)] - mx) / sum;
    }
  return y;
}

// LayerNorm over rows of `cols`; bias may be empty. Fills the row means and 1/std.
inline std::vector<double> NaiveLayerNorm(const std::vector<double>& x, int64_t rows, int64_t cols,
                                          const std::vector<double>& scale,
                                          const std::vector<double>& bias, double eps,
                                          std::vector<double>* mean, std::vector<double>* inv) {
  std::vector<double> y(x.size());
  mean->assign(rows, 0);
  inv->assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; ++c) m += x[r * cols + c] / cols;
    for (int64_t c = 0; c < cols; ++c) v += (x[r * cols + c] - m) * (x[r * cols + c] - m) / cols;
    (*mean)[r] = m;
    (*inv)[r] = 1 / std::sqrt(v + eps);
    for (int64_t c = 0; c < cols; ++c)
      y[r * cols + c] = (x[r * cols + c] - m) * (*inv)[r] * scale[c] + (bias.empty() ? 0 : bias[c]);
  }
  return y;
}

}  // namespace cleave::testing
