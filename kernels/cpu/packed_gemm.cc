// Packed-weight fp32 GEMM (kernels/cpu/): packing and the AVX-512 register-tile kernel.
// A tile is up to kMaxRows rows x one 32-column panel held in 2 * kMaxRows zmm
// accumulators over a K block (the panel's slice is read from L1, A's elements are
// broadcast), started from the bias or from C, so each output sees the one summation
// order k = 0, 1, ..., K-1 whatever the thread split.
#include "kernels/cpu/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"

namespace cleave::kernels::cpu {

void PackedB::AlignedFree::operator()(float* p) const { std::free(p); }

bool PackedGemmAvailable() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool ok = __builtin_cpu_supports("avx512f") != 0;
  return ok;
#else
  return false;
#endif
}

bool PackedGemmPreferred(int64_t M) { return M <= 512 || !GemmBackendIsAvx512(); }

PackedB PackB(const float* B, int64_t K, int64_t N, bool trans_b) {
  constexpr int64_t W = PackedB::kPanelWidth;
  PackedB pb;
  pb.K_ = K;
  pb.N_ = N;
  // Whole 64-byte lines (aligned_alloc wants a multiple of the alignment), at least one.
  size_t bytes = static_cast<size_t>(std::max<int64_t>(1, pb.panels() * K * W)) * sizeof(float);
  bytes = (bytes + 63) / 64 * 64;
  pb.data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
  std::memset(pb.data_.get(), 0, bytes);  // the padding columns of the last panel stay 0
  for (int64_t p = 0; p < pb.panels(); ++p) {
    float* dst = pb.data_.get() + p * K * W;
    const int64_t n0 = p * W, cols = std::min(W, N - n0);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < cols; ++j)
        dst[k * W + j] = trans_b ? B[(n0 + j) * K + k] : B[k * N + n0 + j];
  }
  return pb;
}

#if defined(__x86_64__) && defined(__GNUC__)

namespace {

constexpr int kMaxRows = 12;  // 24 accumulators + 2 B registers + 1 broadcast of 32 zmm
// K steps per pass over a row block: the panel's kKBlock x 32 slice (32 KiB) stays in L1
// while every tile of the block reads it; C tiles are reloaded once per pass.
constexpr int64_t kKBlock = 256;
// Rows per sweep: the A slice a sweep shares across panels (kRowBlock x kKBlock) stays in L2.
constexpr int64_t kRowBlock = 240;  // a multiple of kMaxRows
constexpr int64_t kPanelGroup = 16;  // 512 columns

// Columns of one panel that exist, as the masks of its two 16-lane halves.
struct PanelMask {
  __mmask16 lo, hi;
};

// C[0..MR, panel] = start + A[0..MR, 0..K) @ panel[0..K), for MR rows starting at a, where
// start is C itself when `accumulate` (a later K block) and else the bias (or 0).
template <int MR>
__attribute__((target("avx512f,avx512vl,fma"))) void Tile(int64_t K, const float* a, int64_t lda,
                                                            const float* b, const float* bias,
                                                            PanelMask mask, float* c, int64_t ldc,
                                                            bool accumulate, const float* next) {
  __m512 lo[MR], hi[MR];
  if (accumulate) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      lo[i] = _mm512_maskz_loadu_ps(mask.lo, c + i * ldc);
      hi[i] = _mm512_maskz_loadu_ps(mask.hi, c + i * ldc + 16);
    }
  } else {
    const __m512 init_lo = bias ? _mm512_maskz_loadu_ps(mask.lo, bias) : _mm512_setzero_ps();
    const __m512 init_hi = bias ? _mm512_maskz_loadu_ps(mask.hi, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      lo[i] = init_lo;
      hi[i] = init_hi;
    }
  }
  // Row i is read as base[i / 3][(i % 3) * lda]: x86 addressing scales lda by 4 or 8, so
  // four advancing pointers and lda itself reach all twelve rows without spilling.
  const float* base[(MR + 2) / 3];
#pragma GCC unroll 16
  for (int q = 0; q < (MR + 2) / 3; ++q) base[q] = a + 3 * q * lda;
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b_lo = _mm512_load_ps(b);
    const __m512 b_hi = _mm512_load_ps(b + 16);
    // Weights usually come from DRAM (a model's do not fit in cache): fetch the slice the
    // next pass will read into L2 while this one computes, one K step (2 lines) per step.
    _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(next + 16), _MM_HINT_T1);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(base[i / 3][(i % 3) * lda]);
      lo[i] = _mm512_fmadd_ps(av, b_lo, lo[i]);
      hi[i] = _mm512_fmadd_ps(av, b_hi, hi[i]);
    }
#pragma GCC unroll 16
    for (int q = 0; q < (MR + 2) / 3; ++q) ++base[q];
    b += PackedB::kPanelWidth;
    next += PackedB::kPanelWidth;
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, mask.lo, lo[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, mask.hi, hi[i]);
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, const float*, PanelMask,
                        float*, int64_t, bool, const float*);

template <int... I>
constexpr auto MakeTiles(std::integer_sequence<int, I...>) {
  return std::array<TileFn, sizeof...(I)>{&Tile<I + 1>...};
}
constexpr auto kTiles = MakeTiles(std::make_integer_sequence<int, kMaxRows>{});

// One product, as every block of its work sees it.
struct Job {
  const float* A;
  int64_t lda;
  const PackedB* B;
  const float* bias;
  Activation act;
  float* C;
  int64_t ldc;
};

// Adds A[m0..m1, k0..k0+kc) @ panels p0..p1 (the same K rows) into C, or writes bias + that
// product when k0 = 0. Each panel's slice stays in L1 while every tile of the rows reads it.
void KBlockPass(const Job& j, int64_t m0, int64_t m1, int64_t p0, int64_t p1, int64_t k0,
                int64_t kc) {
  constexpr int64_t W = PackedB::kPanelWidth;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * W;
    const int cols = static_cast<int>(std::min(W, j.B->N() - n0));
    PanelMask mask;
    mask.lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    mask.hi = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols > 16 ? (1u << (cols - 16)) - 1 : 0);
    const float* b = j.B->panel(p) + k0 * W;
    const float* bias = j.bias ? j.bias + n0 : nullptr;
    // The slice after this one (the next panel, or the first panel of the next K block;
    // past the end this points back at b), prefetched by the first tile.
    const float* next = p + 1 < p1                  ? j.B->panel(p + 1) + k0 * W
                        : k0 + kc < j.B->K() ? j.B->panel(p0) + (k0 + kc) * W
                                             : b;
    for (int64_t m = m0; m < m1; m += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m1 - m));
      kTiles[rows - 1](kc, j.A + m * j.lda + k0, j.lda, b, bias, mask, j.C + m * j.ldc + n0,
                       j.ldc, k0 > 0, m == m0 ? next : b);
    }
  }
}

// C[m0..m1, panels p0..p1) in full: row blocks of kRowBlock, split into groups of
// kPanelGroup panels, each group swept in K blocks. A sweep's A slice (kRowBlock x kKBlock)
// stays in L2 across the group's panels and the group's C block (kRowBlock x 512) stays in
// L2 across the K blocks; the activation then runs over that block while it is cached.
void Block(const Job& j, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const int64_t K = j.B->K();
  for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
    const int64_t r1 = std::min(m1, r0 + kRowBlock);
    for (int64_t g0 = p0; g0 < p1; g0 += kPanelGroup) {
      const int64_t g1 = std::min(p1, g0 + kPanelGroup);
      int64_t k0 = 0;
      do {  // at least once, so that K = 0 still writes the bias
        const int64_t kc = std::min(kKBlock, K - k0);
        KBlockPass(j, r0, r1, g0, g1, k0, kc);
        k0 += kc;
      } while (k0 < K);
      if (j.act == Activation::kNone) continue;
      const int64_t n0 = g0 * PackedB::kPanelWidth;
      const int64_t n1 = std::min(j.B->N(), g1 * PackedB::kPanelWidth);
      for (int64_t m = r0; m < r1; ++m) {
        float* c = j.C + m * j.ldc + n0;
        if (j.act == Activation::kGelu) GeluF32(c, c, n1 - n0);
        else GeluTanhF32(c, c, n1 - n0);
      }
    }
  }
}

}  // namespace

void GemmPacked(int64_t M, const float* A, int64_t lda, const PackedB& B, const float* bias,
                Activation act, float* C, int64_t ldc, ThreadPool* pool) {
  const int64_t panels = B.panels();
  if (M <= 0 || panels == 0) return;
  const Job j{A, lda, &B, bias, act, C, ldc};
  const int threads = pool ? pool->num_threads() : 1;
  // Multiply-adds per panel. A block of work below about 8M of them (~100 us) costs less
  // than waking a pool thread for it, so small products stay on fewer threads.
  const int64_t panel_macs = M * std::max<int64_t>(B.K(), 1) * PackedB::kPanelWidth;
  constexpr int64_t kMinBlockMacs = int64_t{1} << 23;
  if (panels >= 4 * threads) {
    // Threads take contiguous runs of panels: each output column has one owner, and every
    // thread streams only its share of B.
    const int64_t grain = std::max<int64_t>(1, kMinBlockMacs / panel_macs);
    ParallelFor(pool, panels, grain, [&](int64_t p0, int64_t p1) { Block(j, 0, M, p0, p1); });
    return;
  }
  // Few panels: split the rows too, as (row block, panel) items.
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  const int64_t grain =
      std::max<int64_t>(1, kMinBlockMacs / (panel_macs / row_blocks + 1));
  ParallelFor(pool, row_blocks * panels, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = t / panels * kRowBlock, p = t % panels;
      Block(j, m0, std::min(M, m0 + kRowBlock), p, p + 1);
    }
  });
}

#else

void GemmPacked(int64_t, const float*, int64_t, const PackedB&, const float*, Activation, float*,
                int64_t, ThreadPool*) {
  std::abort();  // unreachable: PackedGemmAvailable() is false
}

#endif

}  // namespace cleave::kernels::cpu
