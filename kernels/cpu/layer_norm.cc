// Layer normalisation (and RMSNorm, its uncentred form) on the CPU (kernels/cpu/), one row at
// a time, rows in parallel.
// Statistics are two-pass and accumulate in double: pass one gives the mean, pass two the
// variance as the mean of (x - mean)^2. The one-pass E[x^2] - E[x]^2 would cancel
// catastrophically for rows with a large mean and small spread (activations with a big
// common offset), and double accumulation keeps both sums exact to ~1e-16 relative for
// any realistic width. Rows are short (C ~ 1e3) and stay in L1 between passes, so the
// second pass costs little next to the GEMMs around a LayerNorm.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

namespace {

// Normalises one row; returns {mean, 1 / sqrt(var + eps)}.
template <typename T>
CLEAVE_ALWAYS_INLINE void LayerNormRowImpl(const T* x, const T* scale, const T* bias, T* y,
                                           int64_t n, double eps, bool rms, double* mean_out,
                                           double* inv_std_out) {
  const double mean = rms ? 0.0 : LaneSum<double>(x, n) / static_cast<double>(n);
  const double var = LaneSumSquares(x, n, mean) / static_cast<double>(n);
  const double inv_std = 1.0 / std::sqrt(var + eps);
  *mean_out = mean;
  *inv_std_out = inv_std;
  // The affine part runs in T: the statistics are rounded once, then each output is
  // (x - mean) * inv_std * scale + bias as the ONNX reference writes it.
  const T m = static_cast<T>(mean), s = static_cast<T>(inv_std);
  if (bias) {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * s * scale[i] + bias[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * s * scale[i];
  }
}

CLEAVE_SIMD_CLONES void LayerNormRowF32(const float* x, const float* scale, const float* bias,
                                        float* y, int64_t n, double eps, bool rms, double* mean,
                                        double* inv_std) {
  LayerNormRowImpl(x, scale, bias, y, n, eps, rms, mean, inv_std);
}

void LayerNormRow(const float* x, const float* scale, const float* bias, float* y, int64_t n,
                  double eps, bool rms, double* mean, double* inv_std) {
  LayerNormRowF32(x, scale, bias, y, n, eps, rms, mean, inv_std);
}
void LayerNormRow(const double* x, const double* scale, const double* bias, double* y, int64_t n,
                  double eps, bool rms, double* mean, double* inv_std) {
  LayerNormRowImpl(x, scale, bias, y, n, eps, rms, mean, inv_std);
}

}  // namespace

template <typename T, typename U>
void LayerNorm(const LayerNormParams& p, const T* x, const T* scale, const T* bias, T* y,
               U* mean, U* inv_std, ThreadPool* pool) {
  const int64_t n = p.cols;
  if (p.rows == 0) return;
  if (n == 0) {  // an empty row has mean 0/0: report NaN statistics, as numpy would
    for (int64_t r = 0; r < p.rows; ++r) {
      if (mean) mean[r] = static_cast<U>(NAN);
      if (inv_std) inv_std[r] = static_cast<U>(NAN);
    }
    return;
  }
  int64_t grain = std::max<int64_t>(1, 8192 / n);
  ParallelFor(pool, p.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double m, s;
      LayerNormRow(x + r * n, scale, bias, y + r * n, n, p.epsilon, p.rms, &m, &s);
      if (mean) mean[r] = static_cast<U>(m);
      if (inv_std) inv_std[r] = static_cast<U>(s);
    }
  });
}

#define CLEAVE_INSTANTIATE_LAYER_NORM(T, U)                                                  \
  template void LayerNorm<T, U>(const LayerNormParams&, const T*, const T*, const T*, T*, U*, \
                                U*, ThreadPool*);
CLEAVE_INSTANTIATE_LAYER_NORM(float, float)
CLEAVE_INSTANTIATE_LAYER_NORM(float, double)
CLEAVE_INSTANTIATE_LAYER_NORM(double, float)
CLEAVE_INSTANTIATE_LAYER_NORM(double, double)
#undef CLEAVE_INSTANTIATE_LAYER_NORM

}  // namespace cleave::kernels::cpu
