// Dropout and Trilu on the CPU (kernels/cpu/).
// Dropout draws its uniforms the way numpy's RandomState does (MT19937, 53-bit doubles), so a
// seeded kernel reproduces the ONNX reference's masks bit for bit; the keyed kernel draws from
// Philox4x32-10 counters (kernels/philox.h), in vector lanes. Trilu moves bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/nn.h"
#include "kernels/cpu/lanes.h"
#include "kernels/philox.h"

namespace cleave::kernels::cpu {

template <typename T>
void Dropout(std::mt19937& gen, float ratio, int64_t n, const T* x, T* y, bool* mask) {
  // uniform(0, 1) is 0 + 1 * random_sample (DrawKeep).
  const double r = static_cast<double>(ratio);
  const T scale = static_cast<T>(1.0 / (1.0 - r));
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = DrawKeep(gen, r);
    y[i] = keep ? x[i] * scale : T(0);
    if (mask) mask[i] = keep;
  }
}

namespace {

// Counter-based dropout in blocks of kPairs counters (2 * kPairs elements), the Philox rounds
// of all the block's counters in vector lanes. Each 32-bit word sits in a 64-bit lane, so a
// round's 32 x 32 -> 64-bit products are lane-wise 64-bit products (GCC does not see that the
// high halves are zero: vpmullq on AVX-512, three vpmuludq's on AVX2). The keep test is done on
// the integer behind the uniform (DropoutKeepThreshold, philox.h), as in the scalar tail.
// The select is branch-free: with a random mask, a branch per element mispredicts about
// min(ratio, 1 - ratio) of the time, which cost more than the generator itself.
constexpr int kPairs = 8;
typedef uint64_t U64x8 __attribute__((vector_size(64)));
typedef int64_t I64x8 __attribute__((vector_size(64)));
typedef int64_t I64x16 __attribute__((vector_size(128)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));
template <typename T>
struct Lanes16 {  // 16 elements of T and a mask of integers of T's width
  typedef T V __attribute__((vector_size(16 * sizeof(T))));
  typedef std::conditional_t<sizeof(T) == 4, int32_t, int64_t> I;
  typedef I M __attribute__((vector_size(16 * sizeof(T))));
};

template <typename T>
CLEAVE_ALWAYS_INLINE void DropoutBlocks(uint64_t key, uint64_t threshold, T scale, int64_t j0, int64_t blocks,
                                        const T* x, T* y, bool* mask) {
  using L = Lanes16<T>;
  const U64x8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
  const uint64_t low = 0xffffffffu;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j = j0 + b * kPairs, i = 2 * j;
    const U64x8 counter = static_cast<uint64_t>(j) + lane;
    U64x8 c0 = counter & low, c1 = counter >> 32, c2 = {}, c3 = {};
    uint64_t k0 = static_cast<uint32_t>(key), k1 = key >> 32;
    for (int round = 0; round < 10; ++round) {  // Philox4x32 (philox.h), lane by lane
      if (round > 0) k0 = (k0 + kPhiloxW0) & low, k1 = (k1 + kPhiloxW1) & low;
      const U64x8 p0 = c0 * uint64_t{kPhiloxM0}, p1 = c2 * uint64_t{kPhiloxM1};
      const U64x8 n0 = (p1 >> 32) ^ c1 ^ k0, n2 = (p0 >> 32) ^ c3 ^ k1;
      c1 = p1 & low;
      c3 = p0 & low;
      c0 = n0;
      c2 = n2;
    }
    // Element 2l from words 0-1 of counter l, element 2l + 1 from words 2-3.
    const I64x8 even = (((c0 << 32) | c1) >> 11) >= threshold, odd = (((c2 << 32) | c3) >> 11) >= threshold;
    const I64x16 keep64 =
        __builtin_shufflevector(even, odd, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const typename L::M keep = __builtin_convertvector(keep64, typename L::M);
    typename L::V v, zero = {};
    std::memcpy(&v, x + i, sizeof(v));
    v = keep ? v * scale : zero;
    std::memcpy(y + i, &v, sizeof(v));
    if (mask) {
      const U8x16 m = __builtin_convertvector(keep & 1, U8x16);
      std::memcpy(mask + i, &m, sizeof(m));
    }
  }
}

// Built for each vector width (lanes.h).
CLEAVE_SIMD_CLONES void DropoutBlocksF32(uint64_t key, uint64_t threshold, float scale, int64_t j0, int64_t blocks,
                                         const float* x, float* y, bool* mask) {
  DropoutBlocks(key, threshold, scale, j0, blocks, x, y, mask);
}
CLEAVE_SIMD_CLONES void DropoutBlocksF64(uint64_t key, uint64_t threshold, double scale, int64_t j0, int64_t blocks,
                                         const double* x, double* y, bool* mask) {
  DropoutBlocks(key, threshold, scale, j0, blocks, x, y, mask);
}

}  // namespace

template <typename T>
void DropoutKeyed(uint64_t key, float ratio, int64_t n, const T* x, T* y, bool* mask, ThreadPool* pool) {
  const double r = static_cast<double>(ratio);
  const T scale = static_cast<T>(1.0 / (1.0 - r));
  const uint64_t threshold = DropoutKeepThreshold(r);
  // Over pairs of elements: pair j is elements 2j and 2j + 1, both uniforms of counter j.
  const int64_t pairs = (n + 1) / 2;
  ParallelFor(pool, pairs, 1 << 13, [&](int64_t j0, int64_t j1) {
    // Whole blocks first (the last pair is left out when n is odd: it has one element).
    const int64_t blocks = (std::min(j1, n / 2) - j0) / kPairs;
    if (blocks > 0) {
      if constexpr (std::is_same_v<T, float>)
        DropoutBlocksF32(key, threshold, scale, j0, blocks, x, y, mask);
      else
        DropoutBlocksF64(key, threshold, scale, j0, blocks, x, y, mask);
    }
    for (int64_t j = j0 + std::max<int64_t>(blocks, 0) * kPairs; j < j1; ++j) {
      uint64_t m[2];
      PhiloxBitsPair(key, static_cast<uint64_t>(j), &m[0], &m[1]);
      for (int h = 0; h < 2 && 2 * j + h < n; ++h) {
        const int64_t i = 2 * j + h;
        const bool keep = m[h] >= threshold;
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
