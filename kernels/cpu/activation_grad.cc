// Softmax, LogSoftmax and Gelu gradients on the CPU (kernels/cpu/); see grad.h.
// The softmax gradients read each slice twice (its sum, then dx) in the forward's
// [outer, axis, inner] layout: contiguous rows when inner == 1 (attention), otherwise blocks
// of adjacent columns walked along contiguous inner elements. Every sum accumulates in
// double in a fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/grad.h"
#include "kernels/cpu/lanes.h"

namespace cleave::kernels::cpu {

namespace {

constexpr int64_t kChunk = 256;  // elements per stack buffer / columns per block

CLEAVE_ALWAYS_INLINE void ExpBlock(const float* x, float* y, int64_t n) { ExpF32(x, y, n); }
CLEAVE_ALWAYS_INLINE void ExpBlock(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// sum_i a[i] b[i] in double, in two vectors of four lanes (a fixed order).
template <typename T>
CLEAVE_ALWAYS_INLINE double DotDouble(const T* a, const T* b, int64_t n) {
  lanes::D4 acc[2] = {}, va, vb;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 2; ++k) {
      lanes::LoadD4(&va, a + i + 4 * k);
      lanes::LoadD4(&vb, b + i + 4 * k);
      acc[k] += va * vb;
    }
  acc[0] += acc[1];
  double s = (acc[0][0] + acc[0][1]) + (acc[0][2] + acc[0][3]);
  for (; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

// One contiguous row of n elements. The row sum is rounded to T once; dx then follows in T.
template <typename T>
CLEAVE_ALWAYS_INLINE void SoftmaxGradRowImpl(const T* dy, const T* y, T* dx, int64_t n, bool log) {
  if (!log) {
    const T dot = static_cast<T>(DotDouble(dy, y, n));
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - dot);
    return;
  }
  // y is log-softmax: exp(y) is the softmax, recomputed a chunk at a time.
  const T total = static_cast<T>(LaneSum<double>(dy, n));
  T buf[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    ExpBlock(y + i0, buf, len);
    for (int64_t j = 0; j < len; ++j) dx[i0 + j] = dy[i0 + j] - buf[j] * total;
  }
}

CLEAVE_SIMD_CLONES void SoftmaxGradRowF32(const float* dy, const float* y, float* dx, int64_t n,
                                          bool log) {
  SoftmaxGradRowImpl(dy, y, dx, n, log);
}
void SoftmaxGradRow(const float* dy, const float* y, float* dx, int64_t n, bool log) {
  SoftmaxGradRowF32(dy, y, dx, n, log);
}
void SoftmaxGradRow(const double* dy, const double* y, double* dx, int64_t n, bool log) {
  SoftmaxGradRowImpl(dy, y, dx, n, log);
}

// `len` (<= kChunk) adjacent columns of one [axis, inner] slice, summed together so every
// access runs along contiguous inner elements.
template <typename T>
void SoftmaxGradColumns(const T* dy, const T* y, T* dx, int64_t axis, int64_t inner, int64_t len,
                        bool log) {
  double sum[kChunk] = {};
  for (int64_t a = 0; a < axis; ++a) {
    const T* dya = dy + a * inner;
    const T* ya = y + a * inner;
    if (log) for (int64_t j = 0; j < len; ++j) sum[j] += static_cast<double>(dya[j]);
    else for (int64_t j = 0; j < len; ++j) sum[j] += static_cast<double>(dya[j]) * static_cast<double>(ya[j]);
  }
  T s[kChunk], buf[kChunk];
  for (int64_t j = 0; j < len; ++j) s[j] = static_cast<T>(sum[j]);
  for (int64_t a = 0; a < axis; ++a) {
    const T* dya = dy + a * inner;
    const T* ya = y + a * inner;
    T* dxa = dx + a * inner;
    if (log) {
      ExpBlock(ya, buf, len);
      for (int64_t j = 0; j < len; ++j) dxa[j] = dya[j] - buf[j] * s[j];
    } else {
      for (int64_t j = 0; j < len; ++j) dxa[j] = ya[j] * (dya[j] - s[j]);
    }
  }
}

template <typename T>
void SoftmaxGradImpl(const SoftmaxParams& p, const T* dy, const T* y, T* dx, ThreadPool* pool) {
  if (p.outer == 0 || p.axis == 0 || p.inner == 0) return;
  if (p.inner == 1) {
    const int64_t grain = std::max<int64_t>(1, 16384 / p.axis);
    ParallelFor(pool, p.outer, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t off = r * p.axis;
        SoftmaxGradRow(dy + off, y + off, dx + off, p.axis, p.log);
      }
    });
    return;
  }
  const int64_t blocks = (p.inner + kChunk - 1) / kChunk;
  const int64_t slice = p.axis * p.inner;
  const int64_t grain = std::max<int64_t>(1, 16384 / (p.axis * std::min(kChunk, p.inner)));
  ParallelFor(pool, p.outer * blocks, grain, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t o = w / blocks, c0 = (w % blocks) * kChunk;
      const int64_t off = o * slice + c0;
      SoftmaxGradColumns(dy + off, y + off, dx + off, p.axis, p.inner,
                         std::min(kChunk, p.inner - c0), p.log);
    }
  });
}

// The double-precision reference derivatives. x is clamped to +-40, beyond which both
// derivatives are exactly 0 or 1 in double, so that inf * 0 cannot make a NaN.
double GeluDerivative(double x) {
  const double xc = std::clamp(x, -40.0, 40.0);
  const double cdf = 0.5 * std::erfc(-xc * 0.70710678118654752440);  // erfc: no cancellation
  const double pdf = 0.39894228040143267794 * std::exp(-0.5 * xc * xc);
  return std::isnan(x) ? x : cdf + xc * pdf;
}

// y = 0.5 x (1 + t), t = tanh(u), u = s (x + c x^3):
// dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2).
double GeluTanhDerivative(double x) {
  constexpr double kS = 0.79788456080286535588, kC = 0.044715;
  const double xc = std::clamp(x, -40.0, 40.0);
  const double t = std::tanh(kS * (xc + kC * xc * xc * xc));
  const double d = 0.5 * (1 + t) + 0.5 * xc * (1 - t * t) * kS * (1 + 3 * kC * xc * xc);
  return std::isnan(x) ? x : d;
}

constexpr int64_t kGeluGrain = 4096;

}  // namespace

void SoftmaxGrad(const SoftmaxParams& p, const float* dy, const float* y, float* dx,
                 ThreadPool* pool) {
  SoftmaxGradImpl(p, dy, y, dx, pool);
}
void SoftmaxGrad(const SoftmaxParams& p, const double* dy, const double* y, double* dx,
                 ThreadPool* pool) {
  SoftmaxGradImpl(p, dy, y, dx, pool);
}

void GeluGrad(bool tanh_form, const float* dy, const float* x, float* dx, int64_t n,
              ThreadPool* pool) {
  ParallelFor(pool, n, kGeluGrain, [&](int64_t i0, int64_t i1) {
    if (tanh_form) GeluTanhGradF32(dy + i0, x + i0, dx + i0, i1 - i0);
    else GeluGradF32(dy + i0, x + i0, dx + i0, i1 - i0);
  });
}

void GeluGrad(bool tanh_form, const double* dy, const double* x, double* dx, int64_t n,
              ThreadPool* pool) {
  ParallelFor(pool, n, kGeluGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      dx[i] = dy[i] * (tanh_form ? GeluTanhDerivative(x[i]) : GeluDerivative(x[i]));
  });
}

}  // namespace cleave::kernels::cpu
