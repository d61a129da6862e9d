// The strided-copy engine behind Transpose, Slice and Expand (kernels/cpu/).
// Every output element is read from exactly one source offset; axes are first simplified
// (size-1 axes dropped, neighbours that walk the source contiguously merged) so that the
// common cases become long memcpy runs, broadcast fills, or a cache-tiled 2-D transpose.
#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "base/status.h"
#include "kernels/cpu/shape.h"

namespace cleave::kernels::cpu {

namespace {

// Below this many bytes per thread, waking the pool costs more than the copy.
constexpr int64_t kParallelBytes = 32 * 1024;
// Transpose tile edge: 32x32 elements keeps one tile's source lines (32 lines) and its
// destination rows in L1 for every element size up to 8 bytes.
constexpr int64_t kTile = 32;

struct Axes {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};      // source strides, elements
  int64_t dst_strides[kMaxRank] = {};  // dense destination strides, elements
};

// Drops size-1 axes and merges an outer axis into its inner neighbour when the outer stride
// equals inner stride * inner dim (the pair walks the source as one axis). Destination
// strides are dense, so merging never breaks the destination side.
Axes Simplify(const StridedCopyParams& p) {
  Axes s;
  for (int k = 0; k < p.rank; ++k) {
    if (p.dims[k] == 1) continue;
    if (s.rank > 0 && s.strides[s.rank - 1] == p.src_strides[k] * p.dims[k]) {
      s.dims[s.rank - 1] *= p.dims[k];
      s.strides[s.rank - 1] = p.src_strides[k];
    } else {
      s.dims[s.rank] = p.dims[k];
      s.strides[s.rank] = p.src_strides[k];
      ++s.rank;
    }
  }
  int64_t d = 1;
  for (int k = s.rank - 1; k >= 0; --k) {
    s.dst_strides[k] = d;
    d *= s.dims[k];
  }
  return s;
}

// Walks a subset of axes in row-major order and tracks the source and destination offsets,
// so stepping to the next index costs an add rather than a division per axis.
class Cursor {
 public:
  Cursor(const Axes& s, const int* axes, int n, int64_t linear) : s_(s), axes_(axes), n_(n) {
    for (int i = n_ - 1; i >= 0; --i) {
      int64_t d = s_.dims[axes_[i]];
      idx_[i] = linear % d;
      linear /= d;
      src_ += idx_[i] * s_.strides[axes_[i]];
      dst_ += idx_[i] * s_.dst_strides[axes_[i]];
    }
  }
  int64_t src() const { return src_; }
  int64_t dst() const { return dst_; }
  void Next() {
    for (int i = n_ - 1; i >= 0; --i) {
      int a = axes_[i];
      src_ += s_.strides[a];
      dst_ += s_.dst_strides[a];
      if (++idx_[i] < s_.dims[a]) return;
      src_ -= s_.strides[a] * s_.dims[a];
      dst_ -= s_.dst_strides[a] * s_.dims[a];
      idx_[i] = 0;
    }
  }

 private:
  const Axes& s_;
  const int* axes_;
  int n_;
  int64_t idx_[kMaxRank] = {};
  int64_t src_ = 0, dst_ = 0;
};

int64_t Grain(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kParallelBytes / std::max<int64_t>(1, bytes_per_item));
}

// Innermost source stride 1: each destination row is one memcpy of a contiguous run.
void CopyRuns(const Axes& s, const char* src, char* dst, size_t esize, ThreadPool* pool) {
  int outer[kMaxRank];
  for (int k = 0; k + 1 < s.rank; ++k) outer[k] = k;
  int64_t run = s.dims[s.rank - 1];
  int64_t rows = 1;
  for (int k = 0; k + 1 < s.rank; ++k) rows *= s.dims[k];
  size_t run_bytes = static_cast<size_t>(run) * esize;
  if (rows == 1) return CopyBytes(dst, src, run_bytes, pool);  // the whole copy is one run
  ParallelFor(pool, rows, Grain(run_bytes), [&](int64_t begin, int64_t end) {
    Cursor c(s, outer, s.rank - 1, begin);
    for (int64_t r = begin; r < end; ++r, c.Next())
      std::memcpy(dst + c.dst() * esize, src + c.src() * esize, run_bytes);
  });
}

// Innermost stride 0 (Expand along the last axis) or any other stride: a typed loop.
template <typename T>
void CopyRowsStrided(const Axes& s, const T* src, T* dst, ThreadPool* pool) {
  int outer[kMaxRank];
  for (int k = 0; k + 1 < s.rank; ++k) outer[k] = k;
  int64_t run = s.dims[s.rank - 1], stride = s.strides[s.rank - 1];
  int64_t rows = 1;
  for (int k = 0; k + 1 < s.rank; ++k) rows *= s.dims[k];
  ParallelFor(pool, rows, Grain(run * sizeof(T)), [&](int64_t begin, int64_t end) {
    Cursor c(s, outer, s.rank - 1, begin);
    for (int64_t r = begin; r < end; ++r, c.Next()) {
      const T* in = src + c.src();
      T* out = dst + c.dst();
      if (stride == 0) {
        std::fill(out, out + run, *in);
      } else {
        for (int64_t j = 0; j < run; ++j) out[j] = in[j * stride];
      }
    }
  });
}

// out[i * ldo + j] = in[i + j * ldi] for i < m, j < n: one tile of a transpose.
template <typename T>
void TransposeBlock(const T* in, int64_t ldi, T* out, int64_t ldo, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) out[i * ldo + j] = in[i + j * ldi];
}

#if defined(__SSE2__)
// 4-byte elements: 4x4 blocks transposed in SSE registers (baseline on x86-64), so each
// source row and destination row moves as one 16-byte load or store.
template <>
void TransposeBlock<uint32_t>(const uint32_t* in, int64_t ldi, uint32_t* out, int64_t ldo,
                              int64_t m, int64_t n) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      const float* s = reinterpret_cast<const float*>(in + i + j * ldi);
      __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + ldi);
      __m128 r2 = _mm_loadu_ps(s + 2 * ldi), r3 = _mm_loadu_ps(s + 3 * ldi);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      float* d = reinterpret_cast<float*>(out + i * ldo + j);
      _mm_storeu_ps(d, r0);
      _mm_storeu_ps(d + ldo, r1);
      _mm_storeu_ps(d + 2 * ldo, r2);
      _mm_storeu_ps(d + 3 * ldo, r3);
    }
    for (; i < m; ++i)
      for (int64_t jj = j; jj < j + 4; ++jj) out[i * ldo + jj] = in[i + jj * ldi];
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t jj = j; jj < n; ++jj) out[i * ldo + jj] = in[i + jj * ldi];
}
#endif

// A true transpose: the destination's innermost axis `a` strides through the source while
// some other axis `b` is contiguous in the source. Copy kTile x kTile tiles so that both the
// reads (along b) and the writes (along a) stay within a few cache lines.
template <typename T>
void CopyTiled(const Axes& s, int b, const T* src, T* dst, ThreadPool* pool) {
  const int a = s.rank - 1;
  int outer[kMaxRank], n_outer = 0;
  int64_t outer_count = 1;
  for (int k = 0; k < s.rank; ++k) {
    if (k == a || k == b) continue;
    outer[n_outer++] = k;
    outer_count *= s.dims[k];
  }
  const int64_t na = s.dims[a], nb = s.dims[b], sa = s.strides[a], db = s.dst_strides[b];
  const int64_t b_tiles = (nb + kTile - 1) / kTile;
  ParallelFor(pool, outer_count * b_tiles, Grain(kTile * na * sizeof(T)),
              [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      Cursor c(s, outer, n_outer, w / b_tiles);
      int64_t b0 = (w % b_tiles) * kTile, b1 = std::min(nb, b0 + kTile);
      for (int64_t a0 = 0; a0 < na; a0 += kTile) {
        int64_t a1 = std::min(na, a0 + kTile);
        TransposeBlock(src + c.src() + b0 + a0 * sa, sa, dst + c.dst() + b0 * db + a0, db,
                       b1 - b0, a1 - a0);
      }
    }
  });
}

template <typename T>
void CopyTyped(const Axes& s, const void* src, void* dst, ThreadPool* pool) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  if (s.strides[s.rank - 1] != 0) {
    for (int b = 0; b + 1 < s.rank; ++b)
      if (s.strides[b] == 1) return CopyTiled<T>(s, b, in, out, pool);
  }
  CopyRowsStrided<T>(s, in, out, pool);
}

}  // namespace

void StridedCopy(const StridedCopyParams& p, const void* src, void* dst, ThreadPool* pool) {
  for (int k = 0; k < p.rank; ++k)
    if (p.dims[k] == 0) return;
  const size_t esize = p.elem_size;
  const char* base = static_cast<const char*>(src) + p.src_offset * static_cast<int64_t>(esize);
  Axes s = Simplify(p);
  if (s.rank == 0) {  // a single element
    std::memcpy(dst, base, esize);
    return;
  }
  if (s.strides[s.rank - 1] == 1) return CopyRuns(s, base, static_cast<char*>(dst), esize, pool);
  ForElementSize(esize, [&](auto u) { CopyTyped<decltype(u)>(s, base, dst, pool); });
}

void CopyBytes(void* dst, const void* src, size_t bytes, ThreadPool* pool) {
  if (dst == src || bytes == 0) return;
  // Chunks of 256 KB: big enough that each memcpy runs at full bandwidth.
  constexpr int64_t kChunk = 256 * 1024;
  int64_t chunks = (static_cast<int64_t>(bytes) + kChunk - 1) / kChunk;
  ParallelFor(pool, chunks, 4, [&](int64_t begin, int64_t end) {
    size_t lo = begin * kChunk, hi = std::min<size_t>(bytes, end * kChunk);
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  });
}

void DenseStrides(std::span<const int64_t> dims, int64_t* strides) {
  int64_t s = 1;
  for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) {
    strides[k] = s;
    s *= dims[k];
  }
}

void Transpose(const TensorView& x, std::span<const int> perm, TensorView& y, ThreadPool* pool) {
  int64_t xs[kMaxRank];
  DenseStrides(x.dim_span(), xs);
  StridedCopyParams p;
  p.rank = x.rank;
  p.elem_size = ElementSize(x.dtype);
  for (int k = 0; k < x.rank; ++k) {
    p.dims[k] = x.dims[perm[k]];
    p.src_strides[k] = xs[perm[k]];
  }
  StridedCopy(p, x.data, y.data, pool);
}

void Slice(const TensorView& x, const SliceParams& sp, TensorView& y, ThreadPool* pool) {
  int64_t xs[kMaxRank];
  DenseStrides(x.dim_span(), xs);
  StridedCopyParams p;
  p.rank = x.rank;
  p.elem_size = ElementSize(x.dtype);
  for (int k = 0; k < x.rank; ++k) {
    p.dims[k] = sp.out_dims[k];
    p.src_strides[k] = sp.steps[k] * xs[k];
    p.src_offset += sp.starts[k] * xs[k];
  }
  StridedCopy(p, x.data, y.data, pool);
}

void Expand(const TensorView& x, TensorView& y, ThreadPool* pool) {
  int64_t xs[kMaxRank];
  DenseStrides(x.dim_span(), xs);
  StridedCopyParams p;
  p.rank = y.rank;
  p.elem_size = ElementSize(x.dtype);
  const int lead = y.rank - x.rank;  // x is right-aligned against y
  for (int k = 0; k < y.rank; ++k) {
    int j = k - lead;
    p.dims[k] = y.dims[k];
    p.src_strides[k] = (j < 0 || x.dims[j] == 1) ? 0 : xs[j];
  }
  StridedCopy(p, x.data, y.data, pool);
}

}  // namespace cleave::kernels::cpu
