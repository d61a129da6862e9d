// CUDA kernels along an axis or over padded dims (kernels/cuda/): Pad (and Tile, its wrap mode),
// CumSum, ArgMax / ArgMin, TopK, GatherElements and ScatterElements, GatherND and ScatterND. The running and combining ones
// give each line along the axis to one thread, which walks it in the order the CPU kernels do:
// the same sums in the same order, and ScatterElements' duplicate indices combined in index
// order without atomics (its updates land only on their own line).
#include <cstring>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/pad_coord.h"
#include "kernels/nd_index.h"
#include "kernels/topk_order.h"

namespace cleave::kernels::cuda {
namespace {

// Runs f(T{}) with T the element type of t.
template <typename F>
int WithElem(Elem t, F&& f) {
  switch (t) {
    case Elem::kF32: return f(float{});
    case Elem::kBf16: return f(__nv_bfloat16{});
    case Elem::kF16: return f(__half{});
    case Elem::kI64: return f(int64_t{});
    case Elem::kI32: return f(int32_t{});
    default: break;  // bool, and the types only CastElem takes
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// The arithmetic of a running sum or a combination: floats in float32, rounded to the storage
// type at each step as the storage holds it; integers wrap (computed unsigned).
template <typename T>
struct Arith {
  __device__ static T Add(T a, T b) { return FromFloat<T>(ToFloat(a) + ToFloat(b)); }
  __device__ static T Mul(T a, T b) { return FromFloat<T>(ToFloat(a) * ToFloat(b)); }
  __device__ static bool Less(T a, T b) { return ToFloat(a) < ToFloat(b); }
  __device__ static bool IsNan(T a) { return ToFloat(a) != ToFloat(a); }
  __device__ static T Zero() { return FromFloat<T>(0.f); }
};
// Integers wrap: computed in their unsigned twin.
template <typename I>
struct IntArith {
  using U = std::make_unsigned_t<I>;
  __device__ static I Add(I a, I b) { return static_cast<I>(static_cast<U>(a) + static_cast<U>(b)); }
  __device__ static I Mul(I a, I b) { return static_cast<I>(static_cast<U>(a) * static_cast<U>(b)); }
  __device__ static bool Less(I a, I b) { return a < b; }
  __device__ static bool IsNan(I) { return false; }
  __device__ static I Zero() { return 0; }
};
template <>
struct Arith<int64_t> : IntArith<int64_t> {};
template <>
struct Arith<int32_t> : IntArith<int32_t> {};

template <typename E>
__global__ void PadKernel(PadLayout l, PadMode mode, const E* x, E* y, E fill, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, offset = 0, stride = 1;
    bool inside = true;
    for (int d = l.rank - 1; d >= 0; --d) {
      const int64_t o = rest % l.out_dims[d];
      rest /= l.out_dims[d];
      const int64_t s = PadSourceCoord(o, l.before[d], l.in_dims[d], mode);
      inside = inside && s >= 0;
      offset += s * stride;
      stride *= l.in_dims[d];
    }
    y[i] = inside ? x[offset] : fill;
  }
}

template <typename T>
__global__ void PadGradKernel(PadGradLayout l, const T* dy, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = FromFloat<T>(PadGradGather<float>(l, i, [dy](int64_t o) { return ToFloat(dy[o]); }));
}

// One thread per (outer, inner) line of [outer, len, inner].
template <typename T>
__global__ void CumSumKernel(const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool exclusive,
                             bool reverse) {
  for (int64_t line = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; line < outer * inner;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = line / inner * len * inner + line % inner;
    T sum = Arith<T>::Zero(), prev_x = Arith<T>::Zero();
    for (int64_t s = 0; s < len; ++s) {
      const int64_t at = base + (reverse ? len - 1 - s : s) * inner;
      const T xv = x[at];
      sum = Arith<T>::Add(sum, exclusive ? prev_x : xv);
      prev_x = xv;
      y[at] = sum;
    }
  }
}

// The CPU's rule: a replaces the best so far b when strictly more extreme, or equal with `last`;
// a NaN beats every number and, once taken, only a later NaN (with `last`) does.
template <typename T>
__global__ void ArgExtremeKernel(const T* x, int64_t* y, int64_t outer, int64_t len, int64_t inner, bool max,
                                 bool last) {
  for (int64_t line = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; line < outer * inner;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* col = x + line / inner * len * inner + line % inner;
    int64_t best = 0;
    T b = col[0];
    for (int64_t k = 1; k < len; ++k) {
      const T a = col[k * inner];
      bool beats;
      if (Arith<T>::IsNan(b)) beats = last && Arith<T>::IsNan(a);
      else if (Arith<T>::IsNan(a)) beats = true;
      else if (!Arith<T>::Less(a, b) && !Arith<T>::Less(b, a)) beats = last;
      else beats = max ? Arith<T>::Less(b, a) : Arith<T>::Less(a, b);
      if (beats) {
        best = k;
        b = a;
      }
    }
    y[line] = best;
  }
}

// Whether candidate (a, ia) is preferred to (b, ib), each the extreme of some of a line's
// elements: the order ArgExtremeKernel's scan keeps (a NaN first, then the larger (max) or smaller
// value, then the first index, or with `last` the last), so combining candidates in any order
// gives the scan's answer.
template <typename T>
__device__ __forceinline__ bool Preferred(T a, int64_t ia, T b, int64_t ib, bool max, bool last) {
  const bool na = Arith<T>::IsNan(a), nb = Arith<T>::IsNan(b);
  if (na != nb) return na;
  if (!na && (Arith<T>::Less(a, b) || Arith<T>::Less(b, a))) return max ? Arith<T>::Less(b, a) : Arith<T>::Less(a, b);
  return last ? ia > ib : ia < ib;
}

struct PreferredOrder {
  bool max, last;
  template <typename T>
  __device__ bool operator()(T a, int64_t ia, T b, int64_t ib) const { return Preferred(a, ia, b, ib, max, last); }
};

// Each thread's candidate (a value and its index, -1 for none) combined in shared memory into
// vals[0] and idx[0], `first(a, ia, b, ib)` saying which of two to keep. Every thread of the
// block calls it.
template <typename T, typename First>
__device__ void PickAcrossBlock(T* vals, int64_t* idx, T b, int64_t best, First first) {
  vals[threadIdx.x] = b;
  idx[threadIdx.x] = best;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      const int o = threadIdx.x + half;
      if (idx[o] >= 0 && (idx[threadIdx.x] < 0 || first(vals[o], idx[o], vals[threadIdx.x], idx[threadIdx.x]))) {
        vals[threadIdx.x] = vals[o];
        idx[threadIdx.x] = idx[o];
      }
    }
    __syncthreads();
  }
}

// The same along long contiguous lines (inner 1, an argmax over a vocabulary): a block of
// kThreads per line, each thread scanning every kThreads-th element, their candidates combined
// in shared memory.
template <typename T>
__global__ void ArgExtremeRowsKernel(const T* x, int64_t* y, int64_t outer, int64_t len, bool max, bool last) {
  __shared__ T vals[kThreads];
  __shared__ int64_t idx[kThreads];
  for (int64_t line = blockIdx.x; line < outer; line += gridDim.x) {  // uniform over the block
    const T* row = x + line * len;
    int64_t best = -1;
    T b{};
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x)
      if (best < 0 || Preferred(row[k], k, b, best, max, last)) {
        best = k;
        b = row[k];
      }
    PickAcrossBlock(vals, idx, b, best, PreferredOrder{max, last});
    if (threadIdx.x == 0) y[line] = idx[0];
    __syncthreads();  // vals and idx are reused by the next line
  }
}

// Less for TopKBefore, in the element type's arithmetic.
template <typename T>
struct ArithLess {
  __device__ bool operator()(T a, T b) const { return Arith<T>::Less(a, b); }
};

template <typename T>
__device__ __forceinline__ bool TopKFirst(T a, int64_t ia, T b, int64_t ib, bool largest) {
  return TopKBefore(a, Arith<T>::IsNan(a), ia, b, Arith<T>::IsNan(b), ib, largest, ArithLess<T>{});
}

struct TopKOrder {
  bool largest;
  template <typename T>
  __device__ bool operator()(T a, int64_t ia, T b, int64_t ib) const { return TopKFirst(a, ia, b, ib, largest); }
};

// TopK: a block per line of x [outer, len, inner], in k rounds, each taking the first element in
// TopKBefore's order among those after the previous round's pick (so each is taken once): every
// thread scans every blockDim-th element, the candidates meet in shared memory. O(k len /
// threads) per line, for the small k of routing (MoE) and sampling; values and indices
// [outer, k, inner] in that order.
template <typename T>
__global__ void TopKKernel(const T* x, T* values, int64_t* indices, int64_t lines, int64_t len, int64_t inner, int64_t k,
                           bool largest) {
  __shared__ T vals[kThreads];
  __shared__ int64_t idx[kThreads];
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {  // uniform over the block
    const T* col = x + line / inner * len * inner + line % inner;
    const int64_t out = line / inner * k * inner + line % inner;
    T prev{};
    int64_t prev_i = -1;
    for (int64_t r = 0; r < k; ++r) {
      int64_t best = -1;
      T b{};
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const T a = col[j * inner];
        if (prev_i >= 0 && !TopKFirst(prev, prev_i, a, j, largest)) continue;  // taken in an earlier round
        if (best < 0 || TopKFirst(a, j, b, best, largest)) {
          best = j;
          b = a;
        }
      }
      PickAcrossBlock(vals, idx, b, best, TopKOrder{largest});
      prev = vals[0];
      prev_i = idx[0];
      if (threadIdx.x == 0) {
        values[out + r * inner] = prev;
        indices[out + r * inner] = prev_i;
      }
      __syncthreads();  // vals and idx are reused by the next round
    }
  }
}

// Position p of the indices (of idx_dims) as its element offset into the data (of x_dims), the
// axis's coordinate replaced by the index there; -1 (and the first such recorded in `bad`) when
// the index is outside [-len, len).
template <typename Id>
__device__ inline int64_t ElementOffset(const ElementsLayout& l, const Id* idx, int64_t p, const BadIndex& bad) {
  const int64_t len = l.x_dims[l.axis];
  int64_t id = static_cast<int64_t>(idx[p]);
  if (id < -len || id >= len) {
    RecordBadIndex(bad, id, p, len);
    return -1;
  }
  if (id < 0) id += len;
  int64_t rest = p, offset = 0, stride = 1;
  for (int d = l.rank - 1; d >= 0; --d) {
    const int64_t c = rest % l.idx_dims[d];
    rest /= l.idx_dims[d];
    offset += (d == l.axis ? id : c) * stride;
    stride *= l.x_dims[d];
  }
  return offset;
}

template <typename E, typename Id>
__global__ void GatherElementsKernel(ElementsLayout l, const E* x, const Id* idx, E* y, int64_t total, BadIndex bad) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < total;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = ElementOffset(l, idx, p, bad);
    y[p] = at < 0 ? E{} : x[at];
  }
}

// One thread per line of the indices along the axis, its updates applied in index order: written
// (kNone, any element type as bytes) or combined by r.
template <typename T>
__device__ inline void Combine(ScatterReduction r, T& o, T u) {
  if constexpr (sizeof(T) == 1 || std::is_unsigned_v<T>) {
    o = u;  // plain writes only: bytes of any type
  } else {
    switch (r) {
      case ScatterReduction::kNone: o = u; break;
      case ScatterReduction::kAdd: o = Arith<T>::Add(o, u); break;
      case ScatterReduction::kMul: o = Arith<T>::Mul(o, u); break;
      case ScatterReduction::kMax: o = Arith<T>::Less(o, u) ? u : o; break;
      case ScatterReduction::kMin: o = Arith<T>::Less(u, o) ? u : o; break;
    }
  }
}

template <typename T, typename Id>
__global__ void ScatterElementsKernel(ElementsLayout l, ScatterReduction r, const Id* idx, const T* upd, T* y,
                                      int64_t lines, BadIndex bad) {
  const int64_t len = l.idx_dims[l.axis];
  int64_t inner = 1;
  for (int d = l.axis + 1; d < l.rank; ++d) inner *= l.idx_dims[d];
  for (int64_t line = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; line < lines;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = line / inner * len * inner + line % inner;
    for (int64_t k = 0; k < len; ++k) {
      const int64_t p = first + k * inner;
      const int64_t at = ElementOffset(l, idx, p, bad);
      if (at >= 0) Combine(r, y[at], upd[p]);
    }
  }
}

int64_t Elements(const int64_t* dims, int rank) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= dims[d];
  return n;
}

// GatherND: one thread per output element [batch, tuple, slice element]; a tuple out of range
// reads zeros and is reported (its coordinate, at its flat position among the indices).
template <typename E>
__global__ void GatherNdKernel(NdIndexLayout l, const E* x, const int64_t* idx, E* y, int64_t total, BadIndex bad) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / l.slice, s = e % l.slice;
    int j = 0;
    const int64_t at = NdSlice(l, idx + t * l.k, &j);
    if (at < 0) {
      RecordBadIndex(bad, idx[t * l.k + j], t * l.k + j, l.dims[j]);
      y[e] = E{};
      continue;
    }
    y[e] = x[(t / l.tuples * l.block + at) * l.slice + s];
  }
}

// ScatterND without a reduction: one thread per update element (duplicate tuples write in no
// set order, as the spec leaves them).
template <typename E>
__global__ void ScatterNdWriteKernel(NdIndexLayout l, const int64_t* idx, const E* upd, E* y, int64_t total,
                                     BadIndex bad) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / l.slice;
    int j = 0;
    const int64_t at = NdSlice(l, idx + t * l.k, &j);
    if (at < 0) {
      RecordBadIndex(bad, idx[t * l.k + j], t * l.k + j, l.dims[j]);
      continue;
    }
    y[at * l.slice + e % l.slice] = upd[e];
  }
}

// ScatterND with a reduction: one thread per slice element, combining the tuples in their order
// (as the CPU does, without atomics): parallel over the slice, serial over the tuples.
template <typename T>
__global__ void ScatterNdCombineKernel(NdIndexLayout l, ScatterReduction r, const int64_t* idx, const T* upd, T* y,
                                       BadIndex bad) {
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < l.slice;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t t = 0; t < l.tuples; ++t) {
      int j = 0;
      const int64_t at = NdSlice(l, idx + t * l.k, &j);
      if (at < 0) {
        if (s == 0) RecordBadIndex(bad, idx[t * l.k + j], t * l.k + j, l.dims[j]);
        continue;
      }
      Combine(r, y[at * l.slice + s], upd[t * l.slice + s]);
    }
  }
}

}  // namespace

int Pad(int elem_bytes, PadMode mode, const PadLayout& l, const void* x, void* y, uint64_t fill, void* stream) {
  if (l.rank < 1 || l.rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = Elements(l.out_dims, l.rank);
  if (total == 0) return 0;
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    E f;
    memcpy(&f, &fill, sizeof f);  // the low bytes (little-endian)
    PadKernel<E><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, mode, static_cast<const E*>(x), static_cast<E*>(y),
                                                                 f, total);
    return static_cast<int>(cudaGetLastError());
  });
}

int CumSum(Elem t, const void* x, void* y, int64_t outer, int64_t len, int64_t inner, bool exclusive, bool reverse,
           void* stream) {
  if (outer * inner == 0 || len == 0) return 0;
  return WithElem(t, [&](auto v) {
    using T = decltype(v);
    CumSumKernel<T><<<Blocks(outer * inner), kThreads, 0, Stream(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(y), outer, len, inner, exclusive, reverse);
    return static_cast<int>(cudaGetLastError());
  });
}

int ArgExtreme(Elem t, bool max, bool last, const void* x, int64_t* y, int64_t outer, int64_t len, int64_t inner,
               void* stream) {
  if (len < 1) return static_cast<int>(cudaErrorInvalidValue);
  if (outer * inner == 0) return 0;
  return WithElem(t, [&](auto v) {
    using T = decltype(v);
    if (inner == 1 && len >= 1024) {
      const unsigned grid = static_cast<unsigned>(outer < (int64_t{1} << 20) ? outer : (int64_t{1} << 20));
      ArgExtremeRowsKernel<T><<<grid, kThreads, 0, Stream(stream)>>>(static_cast<const T*>(x), y, outer, len, max,
                                                                     last);
    } else {
      ArgExtremeKernel<T><<<Blocks(outer * inner), kThreads, 0, Stream(stream)>>>(static_cast<const T*>(x), y, outer,
                                                                                   len, inner, max, last);
    }
    return static_cast<int>(cudaGetLastError());
  });
}

int TopK(Elem t, bool largest, const void* x, void* values, int64_t* indices, int64_t outer, int64_t len,
         int64_t inner, int64_t k, void* stream) {
  if (k < 0 || k > len) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t lines = outer * inner;
  if (lines == 0 || k == 0) return 0;
  // A warp for short lines (a router's experts), else a full block.
  int threads = 32;
  while (threads < kThreads && threads < len) threads *= 2;
  const unsigned grid = static_cast<unsigned>(lines < (int64_t{1} << 20) ? lines : (int64_t{1} << 20));
  return WithElem(t, [&](auto v) {
    using T = decltype(v);
    TopKKernel<T><<<grid, threads, 0, Stream(stream)>>>(static_cast<const T*>(x), static_cast<T*>(values), indices,
                                                        lines, len, inner, k, largest);
    return static_cast<int>(cudaGetLastError());
  });
}

int PadGrad(Dt dt, const PadGradLayout& l, const void* dy, void* dx, int64_t n, void* stream) {
  if (n == 0) return 0;
  if (l.rank < 1 || l.rank > kernels::kPadGradMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  DISPATCH_DT(dt, T, {
    PadGradKernel<T><<<Blocks(n), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(dy), static_cast<T*>(dx), n);
  });
  return static_cast<int>(cudaGetLastError());
}

int GatherElements(int elem_bytes, const ElementsLayout& l, const void* x, const void* idx, bool idx_int32, void* y,
                   void* stream, BadIndex bad) {
  if (l.rank < 1 || l.rank > kMaxRank || l.axis < 0 || l.axis >= l.rank) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = Elements(l.idx_dims, l.rank);
  if (total == 0) return 0;
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    if (idx_int32)
      GatherElementsKernel<E, int32_t><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
          l, static_cast<const E*>(x), static_cast<const int32_t*>(idx), static_cast<E*>(y), total, bad);
    else
      GatherElementsKernel<E, int64_t><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
          l, static_cast<const E*>(x), static_cast<const int64_t*>(idx), static_cast<E*>(y), total, bad);
    return static_cast<int>(cudaGetLastError());
  });
}

int ScatterElements(Elem t, int elem_bytes, ScatterReduction r, const ElementsLayout& l, const void* idx,
                    bool idx_int32, const void* upd, void* y, void* stream, BadIndex bad) {
  if (l.rank < 1 || l.rank > kMaxRank || l.axis < 0 || l.axis >= l.rank) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t len = l.idx_dims[l.axis];
  const int64_t lines = len > 0 ? Elements(l.idx_dims, l.rank) / len : 0;
  if (lines == 0) return 0;
  auto launch = [&](auto v) {
    using T = decltype(v);
    if (idx_int32)
      ScatterElementsKernel<T, int32_t><<<Blocks(lines), kThreads, 0, Stream(stream)>>>(
          l, r, static_cast<const int32_t*>(idx), static_cast<const T*>(upd), static_cast<T*>(y), lines, bad);
    else
      ScatterElementsKernel<T, int64_t><<<Blocks(lines), kThreads, 0, Stream(stream)>>>(
          l, r, static_cast<const int64_t*>(idx), static_cast<const T*>(upd), static_cast<T*>(y), lines, bad);
    return static_cast<int>(cudaGetLastError());
  };
  // Plain writes move bytes of any size; the reductions need the arithmetic of t.
  if (r == ScatterReduction::kNone) return WithWord(elem_bytes, launch);
  return WithElem(t, launch);
}

int GatherND(int elem_bytes, const NdIndexLayout& l, const void* x, const int64_t* idx, void* y, void* stream,
             BadIndex bad) {
  const int64_t total = l.batches * l.tuples * l.slice;
  if (total == 0) return 0;
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    GatherNdKernel<E><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, static_cast<const E*>(x), idx,
                                                                       static_cast<E*>(y), total, bad);
    return static_cast<int>(cudaGetLastError());
  });
}

int ScatterND(Elem t, int elem_bytes, ScatterReduction r, const NdIndexLayout& l, const int64_t* idx, const void* upd,
              void* y, void* stream, BadIndex bad) {
  if (l.batches != 1) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = l.tuples * l.slice;
  if (total == 0) return 0;
  if (r == ScatterReduction::kNone)
    return WithWord(elem_bytes, [&](auto word) {
      using E = decltype(word);
      ScatterNdWriteKernel<E><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, idx, static_cast<const E*>(upd),
                                                                             static_cast<E*>(y), total, bad);
      return static_cast<int>(cudaGetLastError());
    });
  return WithElem(t, [&](auto v) {
    using T = decltype(v);
    ScatterNdCombineKernel<T><<<Blocks(l.slice), kThreads, 0, Stream(stream)>>>(l, r, idx, static_cast<const T*>(upd),
                                                                              static_cast<T*>(y), bad);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace cleave::kernels::cuda
