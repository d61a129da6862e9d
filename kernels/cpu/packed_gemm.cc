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

bool PackedGemmPreferred(int64_t M) {
  GemmParams p;
  p.M = M;
  return M <= 512 || UseAvx512Gemm(p);
}

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
// The most a thread packs of a raw B at once: a group's panels over the whole K.
constexpr int64_t kPackedGroupBytes = int64_t{4} << 20;

// Columns of one panel that exist, as the masks of its two 16-lane halves.
struct PanelMask {
  __mmask16 lo, hi;
};

// C[0..MR, panel] = start + A[0..MR, 0..K) @ panel[0..K), for MR rows starting at a, where
// start is C itself when `accumulate` (a later K block, or a product added to C) and else the
// bias (or 0). Row i of A is a[i * lda + k] or, with kTransA (A stored [K, M]), a[k * lda + i].
template <int MR, bool kTransA>
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
  // Row-major A: row i is read as base[i / 3][(i % 3) * lda] (x86 addressing scales lda by 4 or
  // 8, so four advancing pointers and lda itself reach all twelve rows without spilling).
  // Transposed A: a step's MR values are contiguous at a, which advances by lda.
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
      const __m512 av = _mm512_set1_ps(kTransA ? a[i] : base[i / 3][(i % 3) * lda]);
      lo[i] = _mm512_fmadd_ps(av, b_lo, lo[i]);
      hi[i] = _mm512_fmadd_ps(av, b_hi, hi[i]);
    }
    if constexpr (kTransA) {
      a += lda;
    } else {
#pragma GCC unroll 16
      for (int q = 0; q < (MR + 2) / 3; ++q) ++base[q];
    }
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

template <bool kTransA, int... I>
constexpr auto MakeTiles(std::integer_sequence<int, I...>) {
  return std::array<TileFn, sizeof...(I)>{&Tile<I + 1, kTransA>...};
}
// By row count - 1, for A row-major [0] and stored transposed [1].
constexpr std::array<TileFn, kMaxRows> kTiles[2] = {
    MakeTiles<false>(std::make_integer_sequence<int, kMaxRows>{}),
    MakeTiles<true>(std::make_integer_sequence<int, kMaxRows>{})};

// One product, as every block of its work sees it. op(B) is either packed once (packed) or read
// from b_raw ([K, N] row-major with row stride ldb, or [N, K] when trans_b), whose slices
// each thread packs as it reaches them.
struct Job {
  const float* A;
  int64_t lda;
  bool trans_a;
  int64_t K, N;
  const PackedB* packed;
  const float* b_raw;
  int64_t ldb;
  bool trans_b;
  const float* bias;
  Activation act;
  float* C;
  int64_t ldc;
  bool add_to_c;  // C += A @ op(B) (no bias, no activation)
  int64_t panels() const { return (N + PackedB::kPanelWidth - 1) / PackedB::kPanelWidth; }
  const float* a(int64_t m, int64_t k) const { return trans_a ? A + k * lda + m : A + m * lda + k; }
};

// Columns [n0, n0 + 32) of op(B) rows [k0, k0 + kc) packed as a PackedB panel's slice (zero
// past N) into dst.
void PackSlice(const Job& j, int64_t n0, int64_t k0, int64_t kc, float* dst) {
  constexpr int64_t W = PackedB::kPanelWidth;
  const int64_t cols = std::min(W, j.N - n0);
  if (j.trans_b) {
    // Row c of B (column c of op(B)) is contiguous: read it along, write down the slice.
    for (int64_t c = 0; c < cols; ++c) {
      const float* src = j.b_raw + (n0 + c) * j.ldb + k0;
      for (int64_t k = 0; k < kc; ++k) dst[k * W + c] = src[k];
    }
  } else {
    for (int64_t k = 0; k < kc; ++k) std::memcpy(dst + k * W, j.b_raw + (k0 + k) * j.ldb + n0, cols * sizeof(float));
  }
  if (cols < W)
    for (int64_t k = 0; k < kc; ++k) std::fill(dst + k * W + cols, dst + (k + 1) * W, 0.f);
}

// The calling thread's scratch for packed slices of op(B): 64-byte aligned, kept between calls.
float* SliceBuffer(size_t floats) {
  struct Buffer {
    float* data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buf;
  if (buf.size < floats) {
    std::free(buf.data);
    buf.data = static_cast<float*>(std::aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64));
    buf.size = floats;
  }
  return buf.data;
}

// Adds A[m0..m1, k0..k0+kc) @ panels p0..p1 (the same K rows) into C, or writes bias + that
// product when k0 = 0 (and C is not added to). Panel p's row k is at slice(p, k); each
// panel's slice stays in L1 while every tile of the rows reads it, and the first tile fetches
// the next one into L2 (the next panel's, or with `later_k` the first panel's next K block).
template <typename SliceFn>
void KBlockPass(const Job& j, int64_t m0, int64_t m1, int64_t p0, int64_t p1, int64_t k0, int64_t kc,
                SliceFn slice, bool later_k) {
  constexpr int64_t W = PackedB::kPanelWidth;
  const std::array<TileFn, kMaxRows>& tiles = kTiles[j.trans_a ? 1 : 0];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * W;
    const int cols = static_cast<int>(std::min(W, j.N - n0));
    PanelMask mask;
    mask.lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
    mask.hi = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols > 16 ? (1u << (cols - 16)) - 1 : 0);
    const float* b = slice(p, k0);
    const float* bias = j.bias ? j.bias + n0 : nullptr;
    // The slice after this one (past the end this points back at b).
    const float* next = p + 1 < p1                  ? slice(p + 1, k0)
                        : later_k && k0 + kc < j.K ? slice(p0, k0 + kc)
                                                   : b;
    for (int64_t m = m0; m < m1; m += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, m1 - m));
      tiles[rows - 1](kc, j.a(m, k0), j.lda, b, bias, mask, j.C + m * j.ldc + n0, j.ldc, k0 > 0 || j.add_to_c,
                      m == m0 ? next : b);
    }
  }
}

// The activation over C[r0..r1, panels g0..g1).
void Activate(const Job& j, int64_t r0, int64_t r1, int64_t g0, int64_t g1) {
  if (j.act == Activation::kNone) return;
  const int64_t n0 = g0 * PackedB::kPanelWidth;
  const int64_t n1 = std::min(j.N, g1 * PackedB::kPanelWidth);
  for (int64_t m = r0; m < r1; ++m) {
    float* c = j.C + m * j.ldc + n0;
    if (j.act == Activation::kGelu) GeluF32(c, c, n1 - n0);
    else GeluTanhF32(c, c, n1 - n0);
  }
}

// C[m0..m1, panels p0..p1) in full.
// With B packed: row blocks of kRowBlock, split into groups of kPanelGroup panels, each group
// swept in K blocks. A sweep's A slice (kRowBlock x kKBlock) stays in L2 across the group's
// panels and the group's C block (kRowBlock x 512) stays in L2 across the K blocks; the
// activation then runs over that block while it is cached.
void Block(const Job& j, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t W = PackedB::kPanelWidth;
  if (j.packed) {
    for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
      const int64_t r1 = std::min(m1, r0 + kRowBlock);
      for (int64_t g0 = p0; g0 < p1; g0 += kPanelGroup) {
        const int64_t g1 = std::min(p1, g0 + kPanelGroup);
        int64_t k0 = 0;
        do {  // at least once, so that K = 0 still writes the bias
          const int64_t kc = std::min(kKBlock, j.K - k0);
          KBlockPass(j, r0, r1, g0, g1, k0, kc, [&](int64_t p, int64_t k) { return j.packed->panel(p) + k * W; },
                     true);
          k0 += kc;
        } while (k0 < j.K);
        Activate(j, r0, r1, g0, g1);
      }
    }
    return;
  }
  // Raw B: while a group's panels over the whole K fit kPackedGroupBytes (in L3), each group is
  // packed once and swept like a packed B (fewer panels a group for a longer K); past that, each
  // group's K block is packed once (kPanelGroup x kKBlock x 32 floats, 512 KiB) and swept over
  // every row block before the next is packed.
  const int64_t panel_bytes = std::max<int64_t>(j.K, 1) * W * static_cast<int64_t>(sizeof(float));
  if (panel_bytes <= kPackedGroupBytes) {
    const int64_t group = std::min(kPanelGroup, kPackedGroupBytes / panel_bytes);
    float* buf = SliceBuffer(static_cast<size_t>(group * std::max<int64_t>(j.K, 1) * W));
    for (int64_t g0 = p0; g0 < p1; g0 += group) {
      const int64_t g1 = std::min(p1, g0 + group);
      for (int64_t p = g0; p < g1; ++p) PackSlice(j, p * W, 0, j.K, buf + (p - g0) * j.K * W);
      auto slice = [&](int64_t p, int64_t k) { return buf + ((p - g0) * j.K + k) * W; };
      for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock) {
        const int64_t r1 = std::min(m1, r0 + kRowBlock);
        int64_t k0 = 0;
        do {  // at least once, so that K = 0 still writes C
          const int64_t kc = std::min(kKBlock, j.K - k0);
          KBlockPass(j, r0, r1, g0, g1, k0, kc, slice, true);
          k0 += kc;
        } while (k0 < j.K);
      }
    }
    return;
  }
  float* buf = SliceBuffer(static_cast<size_t>(kPanelGroup * kKBlock * W));
  for (int64_t g0 = p0; g0 < p1; g0 += kPanelGroup) {
    const int64_t g1 = std::min(p1, g0 + kPanelGroup);
    for (int64_t k0 = 0; k0 < j.K; k0 += kKBlock) {
      const int64_t kc = std::min(kKBlock, j.K - k0);
      for (int64_t p = g0; p < g1; ++p) PackSlice(j, p * W, k0, kc, buf + (p - g0) * kc * W);
      auto slice = [&](int64_t p, int64_t k) { return buf + ((p - g0) * kc + k - k0) * W; };
      for (int64_t r0 = m0; r0 < m1; r0 += kRowBlock)
        KBlockPass(j, r0, std::min(m1, r0 + kRowBlock), g0, g1, k0, kc, slice, false);
    }
  }
}

// Splits the product's blocks over the pool.
void Run(const Job& j, int64_t M, ThreadPool* pool) {
  const int64_t panels = j.panels();
  if (M <= 0 || panels == 0) return;
  const int threads = pool ? pool->num_threads() : 1;
  // Multiply-adds per panel. A block of work below about 8M of them (~100 us) costs less
  // than waking a pool thread for it, so small products stay on fewer threads.
  const int64_t panel_macs = M * std::max<int64_t>(j.K, 1) * PackedB::kPanelWidth;
  constexpr int64_t kMinBlockMacs = int64_t{1} << 23;
  if (panels >= 4 * threads) {
    // Threads take contiguous runs of panels: each output column has one owner, and every
    // thread streams (or packs) only its share of B.
    const int64_t grain = std::max<int64_t>(1, kMinBlockMacs / panel_macs);
    ParallelFor(pool, panels, grain, [&](int64_t p0, int64_t p1) { Block(j, 0, M, p0, p1); });
    return;
  }
  // Few panels: split the rows too, as (row block, panel) items.
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  const int64_t grain = std::max<int64_t>(1, kMinBlockMacs / (panel_macs / row_blocks + 1));
  ParallelFor(pool, row_blocks * panels, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t m0 = t / panels * kRowBlock, p = t % panels;
      Block(j, m0, std::min(M, m0 + kRowBlock), p, p + 1);
    }
  });
}

}  // namespace

void GemmPacked(int64_t M, const float* A, int64_t lda, const PackedB& B, const float* bias,
                Activation act, float* C, int64_t ldc, ThreadPool* pool) {
  const Job j{A, lda, false, B.K(), B.N(), &B, nullptr, 0, false, bias, act, C, ldc, false};
  Run(j, M, pool);
}

void GemmAvx512(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool) {
  const int64_t lda = p.lda ? p.lda : (p.trans_a ? p.M : p.K);
  const int64_t ldb = p.ldb ? p.ldb : (p.trans_b ? p.K : p.N);
  const int64_t ldc = p.ldc ? p.ldc : p.N;
  const Job j{A, lda, p.trans_a, p.K, p.N, nullptr, B, ldb, p.trans_b, nullptr, Activation::kNone, C, ldc,
              p.beta == 1.f};
  Run(j, p.M, pool);
}

#else

void GemmPacked(int64_t, const float*, int64_t, const PackedB&, const float*, Activation, float*,
                int64_t, ThreadPool*) {
  std::abort();  // unreachable: PackedGemmAvailable() is false
}

void GemmAvx512(const GemmParams&, const float*, const float*, float*, ThreadPool*) {
  std::abort();  // unreachable: PackedGemmAvailable() is false
}

#endif

}  // namespace cleave::kernels::cpu
