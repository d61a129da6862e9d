// Dropout and Trilu on the CPU (kernels/cpu/).
// Dropout draws its uniforms the way numpy's RandomState does (MT19937, 53-bit doubles), so a
// seeded kernel reproduces the ONNX reference's masks bit for bit. Trilu moves bytes.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/nn.h"
#include "kernels/philox.h"

namespace cleave::kernels::cpu {

template <typename T>
void Dropout(std::mt19937& gen, float ratio, int64_t n, const T* x, T* y, bool* mask) {
  // numpy's random_sample: a 27-bit and a 26-bit word make one double in [0, 1).
  // uniform(0, 1) is 0 + 1 * that double, compared against the ratio widened to double.
  const double r = static_cast<double>(ratio);
  const T scale = static_cast<T>(1.0 / (1.0 - r));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = static_cast<uint32_t>(gen()) >> 5;
    const uint32_t b = static_cast<uint32_t>(gen()) >> 6;
    const double u = (a * 67108864.0 + b) / 9007199254740992.0;
    const bool keep = u >= r;
    y[i] = keep ? x[i] * scale : T(0);
    if (mask) mask[i] = keep;
  }
}

template <typename T>
void DropoutKeyed(uint64_t key, float ratio, int64_t n, const T* x, T* y, bool* mask, ThreadPool* pool) {
  const double r = static_cast<double>(ratio);
  const T scale = static_cast<T>(1.0 / (1.0 - r));
  // Over pairs of elements: pair j is elements 2j and 2j + 1, both uniforms of counter j.
  const int64_t pairs = (n + 1) / 2;
  ParallelFor(pool, pairs, 1 << 13, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double u[2];
      PhiloxUniformPair(key, static_cast<uint64_t>(j), &u[0], &u[1]);
      for (int h = 0; h < 2 && 2 * j + h < n; ++h) {
        const int64_t i = 2 * j + h;
        const bool keep = u[h] >= r;
        y[i] = keep ? x[i] * scale : T(0);
        if (mask) mask[i] = keep;
      }
    }
  });
}

template void DropoutKeyed<float>(uint64_t, float, int64_t, const float*, float*, bool*, ThreadPool*);
template void DropoutKeyed<double>(uint64_t, float, int64_t, const double*, double*, bool*, ThreadPool*);
template void Dropout<float>(std::mt19937&, float, int64_t, const float*, float*, bool*);
template void Dropout<double>(std::mt19937&, float, int64_t, const double*, double*, bool*);

void Trilu(const TriluParams& p, const void* x, void* y, ThreadPool* pool) {
  const int64_t rows = p.rows, cols = p.cols;
  const size_t es = p.elem_size;
  // Beyond these bounds every row is entirely kept or entirely zeroed; clamping first
  // keeps i + k from overflowing for extreme k.
  const int64_t k = std::clamp<int64_t>(p.k, -rows - 1, cols + 1);
  const int64_t total_rows = p.batch * rows;
  int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cols * static_cast<int64_t>(es)));
  ParallelFor(pool, total_rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % rows;
      // Row i keeps columns j >= i + k (upper) or j <= i + k (lower): one contiguous run.
      int64_t lo = p.upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
      int64_t hi = p.upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
      const char* src = static_cast<const char*>(x) + r * cols * es;
      char* dst = static_cast<char*>(y) + r * cols * es;
      // All-zero bytes are zero for every numeric dtype and false for bool.
      std::memset(dst, 0, lo * es);
      std::memcpy(dst + lo * es, src + lo * es, (hi - lo) * es);
      std::memset(dst + hi * es, 0, (cols - hi) * es);
    }
  });
}

}  // namespace cleave::kernels::cpu
