// bf16 scaled dot-product attention on the CPU (kernels/cpu/): the float32 kernels' blocks of
// query rows (attention.cc), with each block product a bf16 x bf16 -> float32 product on
// AVX-512 BF16 dot products (vdpbf16ps). Such a product sums pairs along the reduced
// dimension, so its right operand is packed as rows of pairs (two bf16 in 32 bits, the
// even-indexed one low): K and V once per slice, dOut and q once per block. The left operand
// is read in pairs as it lies (q, dOut and the probabilities along a row) or from rows of
// pairs (the probabilities and the scores' gradient, transposed, for dV and dK).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/thread_buffer.h"

namespace cleave::kernels::cpu {

#if defined(__x86_64__) && defined(__GNUC__)

#define CLEAVE_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace {
using namespace attention_rows;

// Two bf16 elements k and k + 1 (k even), k in the low half.
typedef uint32_t __attribute__((may_alias)) Pair;

constexpr int kTileRows = 8;
constexpr int64_t kTileCols = 32;  // two vectors of 16 float32 results
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The left operand: pair kk of row m at a[m * row + kk * step].
struct PairRows {
  const Pair* a;
  int64_t row, step;
};

CLEAVE_BF16_TARGET inline __mmask16 Lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Rows [0, R) of a tile of 32 columns: c = alpha a b (+ c), the columns past the masks left alone.
template <int R>
CLEAVE_BF16_TARGET inline void Tile(PairRows a, const Pair* b, int64_t ldb, int64_t k2, float alpha, bool accumulate,
                                    float* c, int64_t ldc, __mmask16 m0, __mmask16 m1) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k2; ++kk) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kk * ldb);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kk * ldb + 16);
    const Pair* ak = a.a + kk * a.step;
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(static_cast<int>(ak[r * a.row]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], ar, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], ar, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(acc0[r], va), v1 = _mm512_mul_ps(acc1[r], va);
    if (accumulate) {
      v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, cr));
      v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, v0);
    _mm512_mask_storeu_ps(cr + 16, m1, v1);
  }
}

// c [M, N] (ldc) = alpha a b (+ c when accumulate): a, M rows of k2 pairs; b, k2 rows of N
// packed pairs, ldb apart, readable up to RoundUp(N, 32).
CLEAVE_BF16_TARGET void Product(int64_t M, int64_t N, int64_t k2, PairRows a, const Pair* b, int64_t ldb, float alpha,
                                bool accumulate, float* c, int64_t ldc) {
  for (int64_t n0 = 0; n0 < N; n0 += kTileCols) {
    const __mmask16 m0 = Lanes(N - n0), m1 = Lanes(N - n0 - 16);
    for (int64_t m = 0; m < M; m += kTileRows) {
      const PairRows at{a.a + m * a.row, a.row, a.step};
      float* ct = c + m * ldc + n0;
      const Pair* bt = b + n0;
      switch (std::min<int64_t>(kTileRows, M - m)) {
        case 8: Tile<8>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 7: Tile<7>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 6: Tile<6>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 5: Tile<5>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 4: Tile<4>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 3: Tile<3>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        case 2: Tile<2>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
        default: Tile<1>(at, bt, ldb, k2, alpha, accumulate, ct, ldc, m0, m1); break;
      }
    }
  }
}

// Transposed pairs of columns: out[dd * ldo + j] = (x[j][2dd], x[j][2dd + 1]) for the rows
// j < rows (cols even), zeros from there to ldo.
void PackColumnPairs(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, Pair* out, int64_t ldo) {
  const int64_t pairs = cols / 2;
  for (int64_t j = 0; j < rows; ++j) {
    const Pair* xr = reinterpret_cast<const Pair*>(x + j * ld);
    for (int64_t dd = 0; dd < pairs; ++dd) out[dd * ldo + j] = xr[dd];
  }
  for (int64_t dd = 0; dd < pairs; ++dd) std::fill(out + dd * ldo + rows, out + (dd + 1) * ldo, Pair{0});
}

// The two index vectors that interleave 16 elements of a with 16 of b (b's at 32 + i).
CLEAVE_BF16_TARGET inline void InterleaveIndices(__m512i* lo, __m512i* hi) {
  alignas(64) uint16_t l[32], h[32];
  for (int i = 0; i < 16; ++i) {
    l[2 * i] = static_cast<uint16_t>(i), l[2 * i + 1] = static_cast<uint16_t>(32 + i);
    h[2 * i] = static_cast<uint16_t>(16 + i), h[2 * i + 1] = static_cast<uint16_t>(48 + i);
  }
  *lo = _mm512_load_si512(l);
  *hi = _mm512_load_si512(h);
}

// Pairs of rows: out[rr * ldo + c] = (x[2rr][c], x[2rr + 1][c]) for the columns c < cols (an
// odd last row paired with zeros) and zeros from cols up to RoundUp(cols, 32), which ldo is at
// least, so a product reads whole tiles; RoundUp(rows, 2) / 2 rows of out.
CLEAVE_BF16_TARGET void PackRowPairs(const uint16_t* x, int64_t ld, int64_t rows, int64_t cols, Pair* out,
                                     int64_t ldo) {
  __m512i lo, hi;
  InterleaveIndices(&lo, &hi);
  for (int64_t rr = 0; 2 * rr < rows; ++rr) {
    const uint16_t* r0 = x + 2 * rr * ld;
    const uint16_t* r1 = 2 * rr + 1 < rows ? r0 + ld : nullptr;
    Pair* o = out + rr * ldo;
    for (int64_t c = 0; c < cols; c += 32) {
      const int64_t left = cols - c;
      const __mmask32 m = left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1);
      const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + c);
      const __m512i b = r1 ? _mm512_maskz_loadu_epi16(m, r1 + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(o + c, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(o + c + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// The same pairs of rows from float32 rows, rounded to bf16 (to nearest even).
CLEAVE_BF16_TARGET void RoundRowPairs(const float* x, int64_t ld, int64_t rows, int64_t cols, Pair* out, int64_t ldo) {
  alignas(64) uint16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<uint16_t>(i), idx[2 * i + 1] = static_cast<uint16_t>(16 + i);
  const __m512i interleave = _mm512_load_si512(idx);
  for (int64_t rr = 0; 2 * rr < rows; ++rr) {
    const float* r0 = x + 2 * rr * ld;
    const float* r1 = 2 * rr + 1 < rows ? r0 + ld : nullptr;
    Pair* o = out + rr * ldo;
    for (int64_t c = 0; c < RoundUp(cols, kTileCols); c += 16) {
      const __mmask16 m = Lanes(cols - c);
      const __m512 a = _mm512_maskz_loadu_ps(m, r0 + c);
      const __m512 b = r1 ? _mm512_maskz_loadu_ps(m, r1 + c) : _mm512_setzero_ps();
      // Words 0..15 from a, 16..31 from b, then interleaved.
      const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
      _mm512_storeu_si512(o + c, _mm512_permutexvar_epi16(interleave, w));
    }
  }
}

// Rows of float32, each times scale[r] (1 where scale is null), rounded to bf16:
// out[r * ldo + c] for c < cols, then zeros up to width.
CLEAVE_BF16_TARGET void RoundRows(const float* x, int64_t ld, int64_t rows, int64_t cols, const float* scale,
                                  uint16_t* out, int64_t ldo, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 s = _mm512_set1_ps(scale ? scale[r] : 1.f);
    uint16_t* o = out + r * ldo;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m = Lanes(cols - c);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + r * ld + c), s);
      _mm256_mask_storeu_epi16(o + c, m, (__m256i)_mm512_cvtneps_pbh(v));
    }
    std::fill(o + cols, o + width, uint16_t{0});
  }
}

CLEAVE_BF16_TARGET inline __m512 Widen16(const uint16_t* x, __mmask16 m) {
  // The masked forms throughout: GCC 12's unmasked ones read an undefined vector it warns of.
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_maskz_loadu_epi16(m, x));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, w, 16));
}

// sum_c a[c] b[c] of two bf16 rows, in float32.
CLEAVE_BF16_TARGET float RowDot(const uint16_t* a, const uint16_t* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = Lanes(n - c);
    acc = _mm512_fmadd_ps(Widen16(a + c, m), Widen16(b + c, m), acc);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float sum = 0;
  for (float x : lanes) sum += x;
  return sum;
}

// One thread's scratch of `bytes` (the sum of the parts' Bytes), carved into 64-byte aligned
// parts from its ThreadBuffer.
class Carver {
 public:
  explicit Carver(size_t bytes) {
    char* raw = reinterpret_cast<char*>(ThreadBuffer(0, (bytes + 64) / sizeof(float) + 1));
    next_ = raw + (64 - reinterpret_cast<uintptr_t>(raw) % 64) % 64;
    end_ = next_ + bytes;
  }
  template <typename T>
  T* Take(int64_t n) {
    T* p = reinterpret_cast<T*>(next_);
    next_ += Bytes<T>(n);
    CLEAVE_CHECK(next_ <= end_);  // a part that was not counted
    return p;
  }
  template <typename T>
  static size_t Bytes(int64_t n) {
    return static_cast<size_t>(RoundUp(n * static_cast<int64_t>(sizeof(T)), 64));
  }

 private:
  char *next_, *end_;
};

const Pair* Pairs(const uint16_t* x) { return reinterpret_cast<const Pair*>(x); }

}  // namespace

bool Bf16AttentionSupported(const AttentionParams& p) {
  static const bool cpu = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  // Pairs are read 32 bits at a time, so every row, head and slice starts on an even element.
  auto even = [](const AttentionStrides& s) { return s.batch % 2 == 0 && s.head % 2 == 0 && s.row % 2 == 0; };
  return cpu && p.D > 0 && p.Dv > 0 && p.D % 2 == 0 && p.Dv % 2 == 0 && even(p.q) && even(p.k) && even(p.v) &&
         even(p.o);
}

void AttentionForwardBf16(const AttentionParams& p, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                          uint16_t* out, float* lse, ThreadPool* pool) {
  const int64_t br = BlockRows(p), blocks = (p.T + br - 1) / br;
  const int64_t Sp = RoundUp(p.S, kTileCols), S2 = RoundUp(p.S, 2), Dvp = RoundUp(p.Dv, kTileCols);
  const size_t bytes = Carver::Bytes<float>(br * p.S) + Carver::Bytes<uint16_t>(br * S2) +
                       Carver::Bytes<Pair>(p.D / 2 * Sp) + Carver::Bytes<Pair>(S2 / 2 * Dvp) +
                       Carver::Bytes<float>(br * p.Dv);
  // As the float32 kernel: one task per (slice, block of query rows). A thread's tasks are
  // consecutive, so it packs K and V once for each slice it meets.
  ParallelFor(pool, p.batch * blocks, 1, [&](int64_t t0, int64_t t1) {
    Carver c(bytes);
    float* s = c.Take<float>(br * p.S);
    uint16_t* p16 = c.Take<uint16_t>(br * S2);
    Pair* kt = c.Take<Pair>(p.D / 2 * Sp);
    Pair* vr = c.Take<Pair>(S2 / 2 * Dvp);
    float* o32 = c.Take<float>(br * p.Dv);
    int64_t packed = -1;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = (t % blocks) * br, rows = std::min(br, p.T - i0);
      const int64_t n = Visible(p, i0 + rows - 1);
      uint16_t* o = out ? out + p.At(p.o, b, i0) : nullptr;
      float* l = lse ? lse + b * p.T + i0 : nullptr;
      if (n == 0) {
        if (o) ZeroRows(o, rows, p.Dv, p.o.row);
        if (l) std::fill(l, l + rows, kNegInfF);
        continue;
      }
      if (b != packed) {
        PackColumnPairs(k + p.At(p.k, b, 0), p.k.row, p.S, p.D, kt, Sp);
        if (o) PackRowPairs(v + p.At(p.v, b, 0), p.v.row, p.S, p.Dv, vr, Dvp);
        packed = b;
      }
      Product(rows, n, p.D / 2, {Pairs(q + p.At(p.q, b, i0)), p.q.row / 2, 1}, kt, Sp, static_cast<float>(p.scale),
              false, s, n);
      float inv[kMaxBlockRows];
      for (int64_t r = 0; r < rows; ++r) {
        AddBias(p, b, i0 + r, 0, s + r * n, n);
        float m;
        const double sum = ExpRow(s + r * n, Visible(p, i0 + r), n, &m);
        inv[r] = sum > 0 ? static_cast<float>(1.0 / sum) : 0.f;
        if (l) l[r] = sum > 0 ? static_cast<float>(m + std::log(sum)) : kNegInfF;
      }
      if (!o) continue;
      const int64_t n2 = RoundUp(n, 2);
      RoundRows(s, n, rows, n, nullptr, p16, n2, n2);
      Product(rows, p.Dv, n2 / 2, {Pairs(p16), n2 / 2, 1}, vr, Dvp, 1.f, false, o32, p.Dv);
      RoundRows(o32, p.Dv, rows, p.Dv, inv, o, p.o.row, p.Dv);
    }
  });
}

void AttentionBackwardBf16(const AttentionParams& p, const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const uint16_t* out, const float* lse, uint16_t* dq, uint16_t* dk,
                           uint16_t* dv, ThreadPool* pool) {
  const int64_t br = BlockRows(p), br2 = RoundUp(br, 2) / 2;
  const KeyChunks ch = PlanKeyChunks(p);
  const int64_t W = ch.widest, Wp = RoundUp(W, kTileCols), W2 = RoundUp(W, 2);
  const int64_t Dp = RoundUp(p.D, kTileCols), Dvp = RoundUp(p.Dv, kTileCols);
  const BackwardRowStats stats(
      p, lse, dq || dk || p.dscores, pool, [&](int64_t at) { return RowDot(dout + at, out + at, p.Dv); },
      [&](float* into) { AttentionForwardBf16(p, q, k, v, nullptr, into, pool); });
  std::optional<QueryGradPartials> partials;
  if (dq && ch.count > 1) partials.emplace(p, ch);
  if (p.dscores) ZeroScoreGrads(p, pool);
  const size_t bytes = 2 * Carver::Bytes<float>(br * W) + Carver::Bytes<uint16_t>(br * W2) +
                       Carver::Bytes<Pair>(br2 * Wp) + Carver::Bytes<Pair>(p.D / 2 * Wp) +
                       Carver::Bytes<Pair>(p.Dv / 2 * Wp) + Carver::Bytes<Pair>(W2 / 2 * Dp) +
                       Carver::Bytes<float>(W * p.D) + Carver::Bytes<float>(W * p.Dv) +
                       Carver::Bytes<Pair>(br2 * Dvp) + Carver::Bytes<Pair>(br2 * Dp) + Carver::Bytes<float>(br * p.D);
  // As the float32 kernel: one task per (slice, chunk of w keys from j0), over the blocks of
  // query rows that see it:
  //   dV[j0:j0+n] += P^T dO,  dS = P * (dO V[j0:j0+n]^T - delta) * scale,
  //   dQ (the chunk's part) = dS K[j0:j0+n],  dK[j0:j0+n] += dS^T Q,
  // with dK and dV summed in float32 over the blocks and dQ over the chunks, each rounded once.
  ParallelFor(pool, p.batch * ch.count, 1, [&](int64_t t0, int64_t t1) {
    Carver c(bytes);
    float* s = c.Take<float>(br * W);
    float* ds = c.Take<float>(br * W);
    uint16_t* ds16 = c.Take<uint16_t>(br * W2);
    Pair* pairs = c.Take<Pair>(br2 * Wp);  // P, then dS, in pairs of rows
    Pair* kt = c.Take<Pair>(p.D / 2 * Wp);
    Pair* vt = c.Take<Pair>(p.Dv / 2 * Wp);
    Pair* kr = c.Take<Pair>(W2 / 2 * Dp);
    float* dk32 = c.Take<float>(W * p.D);
    float* dv32 = c.Take<float>(W * p.Dv);
    Pair* dor = c.Take<Pair>(br2 * Dvp);
    Pair* qr = c.Take<Pair>(br2 * Dp);
    float* dq32 = c.Take<float>(br * p.D);
    for (int64_t t = t0; t < t1; ++t) {
      const auto [b, chunk, j0, w, first] = ch.Task(t);
      const uint16_t* kc = k + p.At(p.k, b, j0);
      const uint16_t* vc = v + p.At(p.v, b, j0);
      PackColumnPairs(kc, p.k.row, w, p.D, kt, Wp);
      if (dq || dk || p.dscores) PackColumnPairs(vc, p.v.row, w, p.Dv, vt, Wp);
      if (dq) PackRowPairs(kc, p.k.row, w, p.D, kr, Dp);
      if (dk) std::fill(dk32, dk32 + w * p.D, 0.f);
      if (dv) std::fill(dv32, dv32 + w * p.Dv, 0.f);
      if (dq && !partials) ZeroRows(dq + p.At(p.q, b, 0), first, p.D, p.q.row);  // rows that see no key
      for (int64_t i0 = first; i0 < p.T; i0 += br) {
        const int64_t rows = std::min(br, p.T - i0), row0 = b * p.T + i0, rows2 = RoundUp(rows, 2) / 2;
        const int64_t n = SeenOf(p, i0 + rows - 1, j0, w), n2 = RoundUp(n, 2);
        const uint16_t* qb = q + p.At(p.q, b, i0);
        const uint16_t* dob = dout + p.At(p.o, b, i0);
        Product(rows, n, p.D / 2, {Pairs(qb), p.q.row / 2, 1}, kt, Wp, static_cast<float>(p.scale), false, s, n);
        for (int64_t r = 0; r < rows; ++r) {
          AddBias(p, b, i0 + r, j0, s + r * n, n);
          ProbabilityRow(s + r * n, SeenOf(p, i0 + r, j0, n), n, stats.lse(row0 + r));
        }
        if (dv) {
          RoundRowPairs(s, n, rows, n, pairs, Wp);
          PackRowPairs(dob, p.o.row, rows, p.Dv, dor, Dvp);
          Product(n, p.Dv, rows2, {pairs, 1, Wp}, dor, Dvp, 1.f, true, dv32, p.Dv);
        }
        if (!dq && !dk && !p.dscores) continue;
        Product(rows, n, p.Dv / 2, {Pairs(dob), p.o.row / 2, 1}, vt, Wp, 1.f, false, ds, n);
        const float scale = static_cast<float>(p.scale);
        for (int64_t r = 0; r < rows; ++r) {
          float* dsr = ds + r * n;
          ScoreGradRow(s + r * n, dsr, n, stats.delta(row0 + r), p.dscores ? 1.f : scale);
          if (p.dscores) StoreScoreGrads(p, b, i0 + r, j0, dsr, n, scale);
        }
        if (dq) {
          RoundRows(ds, n, rows, n, nullptr, ds16, n2, n2);
          float* dst = partials ? partials->Row(chunk, b, i0) : dq32;
          Product(rows, p.D, n2 / 2, {Pairs(ds16), n2 / 2, 1}, kr, Dp, 1.f, false, dst, p.D);
          if (!partials) RoundRows(dq32, p.D, rows, p.D, nullptr, dq + p.At(p.q, b, i0), p.q.row, p.D);
        }
        if (dk) {
          RoundRowPairs(ds, n, rows, n, pairs, Wp);
          PackRowPairs(qb, p.q.row, rows, p.D, qr, Dp);
          Product(n, p.D, rows2, {pairs, 1, Wp}, qr, Dp, 1.f, true, dk32, p.D);
        }
      }
      if (dk) RoundRows(dk32, p.D, w, p.D, nullptr, dk + p.At(p.k, b, j0), p.k.row, p.D);
      if (dv) RoundRows(dv32, p.Dv, w, p.Dv, nullptr, dv + p.At(p.v, b, j0), p.v.row, p.Dv);
    }
  });
  if (partials)
    partials->Sum(pool, [&](int64_t b, int64_t i, const float* sum) {
      RoundRows(sum, p.D, 1, p.D, nullptr, dq + p.At(p.q, b, i), p.q.row, p.D);
    });
}

#else  // not x86-64: the callers widen to float32

bool Bf16AttentionSupported(const AttentionParams&) { return false; }
void AttentionForwardBf16(const AttentionParams&, const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, float*,
                          ThreadPool*) {}
void AttentionBackwardBf16(const AttentionParams&, const uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*,
                           const uint16_t*, const float*, uint16_t*, uint16_t*, uint16_t*, ThreadPool*) {}

#endif

}  // namespace cleave::kernels::cpu
