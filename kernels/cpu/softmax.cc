// Softmax and LogSoftmax on the CPU (kernels/cpu/).
// x is viewed as [outer, axis, inner] and normalised along `axis`. Each slice is shifted by
// its max before exp, so exp never overflows and the largest term is exactly 1; the sum of
// exps accumulates in double. Rows (inner == 1, the attention case) are the fast path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

namespace {

constexpr int64_t kChunk = 256;  // floats per stack buffer / column block

CLEAVE_ALWAYS_INLINE void ExpBlock(const float* x, float* y, int64_t n) { ExpF32(x, y, n); }
CLEAVE_ALWAYS_INLINE void ExpBlock(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// One contiguous row of n elements.
template <typename T>
CLEAVE_ALWAYS_INLINE void SoftmaxRowImpl(const T* x, T* y, int64_t n, bool log) {
  const T m = LaneMax(x, n, -std::numeric_limits<T>::infinity());
  double sum = 0;
  if (!log) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - m;
    ExpBlock(y, y, n);
    sum = LaneSum<double>(y, n);
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
    return;
  }
  // LogSoftmax needs the exps only for their sum: compute them in a stack buffer and
  // write y = (x - max) - log(sum), which keeps full precision for the largest entries.
  T buf[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    for (int64_t j = 0; j < len; ++j) buf[j] = x[i0 + j] - m;
    ExpBlock(buf, buf, len);
    sum += LaneSum<double>(buf, len);
  }
  const T log_sum = static_cast<T>(std::log(sum));
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - log_sum;
}

CLEAVE_SIMD_CLONES void SoftmaxRowF32(const float* x, float* y, int64_t n, bool log) {
  SoftmaxRowImpl(x, y, n, log);
}
void SoftmaxRowF64(const double* x, double* y, int64_t n, bool log) {
  SoftmaxRowImpl(x, y, n, log);
}
void SoftmaxRow(const float* x, float* y, int64_t n, bool log) { SoftmaxRowF32(x, y, n, log); }
void SoftmaxRow(const double* x, double* y, int64_t n, bool log) { SoftmaxRowF64(x, y, n, log); }

// A block of `len` (<= kChunk) adjacent columns of one [axis, inner] slice: the columns
// are normalised together so every memory access runs along contiguous inner elements.
template <typename T>
void SoftmaxColumns(const T* x, T* y, int64_t axis, int64_t inner, int64_t len, bool log) {
  T mx[kChunk], buf[kChunk];
  double sum[kChunk] = {};
  std::fill(mx, mx + len, -std::numeric_limits<T>::infinity());
  for (int64_t a = 0; a < axis; ++a)
    for (int64_t j = 0; j < len; ++j) mx[j] = MaxNan(mx[j], x[a * inner + j]);
  for (int64_t a = 0; a < axis; ++a) {
    const T* xa = x + a * inner;
    T* e = log ? buf : y + a * inner;  // softmax keeps the exps in y for the final scaling
    for (int64_t j = 0; j < len; ++j) e[j] = xa[j] - mx[j];
    ExpBlock(e, e, len);
    for (int64_t j = 0; j < len; ++j) sum[j] += e[j];
  }
  for (int64_t j = 0; j < len; ++j)
    buf[j] = static_cast<T>(log ? std::log(sum[j]) : 1.0 / sum[j]);
  for (int64_t a = 0; a < axis; ++a) {
    const T* xa = x + a * inner;
    T* ya = y + a * inner;
    if (log) for (int64_t j = 0; j < len; ++j) ya[j] = (xa[j] - mx[j]) - buf[j];
    else for (int64_t j = 0; j < len; ++j) ya[j] *= buf[j];
  }
}

template <typename T>
void SoftmaxImpl(const SoftmaxParams& p, const T* x, T* y, ThreadPool* pool) {
  if (p.outer == 0 || p.axis == 0 || p.inner == 0) return;
  if (p.inner == 1) {
    int64_t grain = std::max<int64_t>(1, 16384 / p.axis);
    ParallelFor(pool, p.outer, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) SoftmaxRow(x + r * p.axis, y + r * p.axis, p.axis, p.log);
    });
    return;
  }
  const int64_t blocks = (p.inner + kChunk - 1) / kChunk;
  const int64_t slice = p.axis * p.inner;
  int64_t grain = std::max<int64_t>(1, 16384 / (p.axis * std::min(kChunk, p.inner)));
  ParallelFor(pool, p.outer * blocks, grain, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t o = w / blocks, c0 = (w % blocks) * kChunk;
      const int64_t off = o * slice + c0;
      SoftmaxColumns(x + off, y + off, p.axis, p.inner, std::min(kChunk, p.inner - c0), p.log);
    }
  });
}

}  // namespace

void Softmax(const SoftmaxParams& p, const float* x, float* y, ThreadPool* pool) {
  SoftmaxImpl(p, x, y, pool);
}
void Softmax(const SoftmaxParams& p, const double* x, double* y, ThreadPool* pool) {
  SoftmaxImpl(p, x, y, pool);
}

}  // namespace cleave::kernels::cpu
