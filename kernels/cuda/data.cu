// CUDA data-movement kernels (kernels/cuda/): gather along an axis (the embedding lookup) and
// its scatter-add gradient, a general transpose, strided copies both ways (Slice, Expand,
// SliceGrad), and the value makers Fill (ConstantOfShape), Range and Trilu.
#include <cstring>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

// The table row of ids[k] (negative ids count from the end), or -1 when out of range.
template <typename Id>
__device__ inline int64_t RowOf(const Id* ids, int64_t k, int64_t rows) {
  const int64_t id = static_cast<int64_t>(ids[k]);
  const int64_t r = id < 0 ? id + rows : id;
  return r >= 0 && r < rows ? r : -1;
}

// out [outer, num_ids, inner] from table [outer, rows, inner]: element i of the output is
// (o, k, e), read from (o, ids[k], e).
template <typename E, typename Id>
__global__ void GatherKernel(const E* table, const Id* ids, E* out, int64_t outer, int64_t num_ids, int64_t rows,
                             int64_t inner, BadIndex bad) {
  const int64_t total = outer * num_ids * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % inner, ok = i / inner, k = ok % num_ids, o = ok / num_ids;
    const int64_t r = RowOf(ids, k, rows);
    out[i] = r >= 0 ? table[(o * rows + r) * inner + e] : E{};
    if (r < 0 && e == 0) RecordBadIndex(bad, static_cast<int64_t>(ids[k]), k, rows);
  }
}

template <typename Id>
__global__ void ScatterAdd(const float* dy, const Id* ids, float* dtable, int64_t outer, int64_t num_ids,
                           int64_t rows, int64_t inner, BadIndex bad) {
  const int64_t total = outer * num_ids * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % inner, ok = i / inner, k = ok % num_ids, o = ok / num_ids;
    const int64_t r = RowOf(ids, k, rows);
    if (r >= 0) atomicAdd(dtable + (o * rows + r) * inner + e, dy[i]);
    else if (e == 0) RecordBadIndex(bad, static_cast<int64_t>(ids[k]), k, rows);
  }
}

struct Perm {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t in_strides[kMaxRank];  // the input stride of each output dim
};

// One thread per output element, its source found by index arithmetic in I (32-bit where the
// tensor allows: 64-bit division costs several times the copy itself); with Scatter the inverse
// walk, element i of the contiguous x written at the offset its index gives in y.
// (The dims are read from the parameter space as they are needed: a local copy indexed by d
// would live in local memory.)
template <typename E, typename I, bool Scatter>
__global__ void TransposeKernel(const E* x, E* y, I n, Perm p) {
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < n; i += step) {
    I rest = i, at = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      const I size = static_cast<I>(p.out_dims[d]);
      const I q = rest / size;
      at += (rest - q * size) * static_cast<I>(p.in_strides[d]);
      rest = q;
    }
    if constexpr (Scatter) y[at] = x[i];
    else y[i] = x[at];
  }
}

template <typename E, typename Id>
int LaunchGather(const void* table, const Id* ids, void* out, int64_t outer, int64_t num_ids, int64_t rows,
                 int64_t inner, const BadIndex& bad, cudaStream_t s) {
  GatherKernel<E, Id><<<Blocks(outer * num_ids * inner), kThreads, 0, s>>>(
      static_cast<const E*>(table), ids, static_cast<E*>(out), outer, num_ids, rows, inner, bad);
  return static_cast<int>(cudaGetLastError());
}

template <typename Id>
int GatherOf(int elem_bytes, const void* table, const Id* ids, void* out, int64_t outer, int64_t num_ids,
             int64_t rows, int64_t inner, const BadIndex& bad, cudaStream_t s) {
  return WithWord(elem_bytes, [&](auto word) {
    return LaunchGather<decltype(word)>(table, ids, out, outer, num_ids, rows, inner, bad, s);
  });
}

// The permuted copy of n elements of E (or with `scatter` the inverse: x contiguous, y walked),
// in 32-bit index arithmetic where `narrow` (every offset forward and under 2^31), else in
// 64-bit signed.
template <typename E>
int LaunchTranspose(const void* x, void* y, int64_t n, const Perm& p, cudaStream_t s, bool narrow,
                    bool scatter = false) {
  const E* in = static_cast<const E*>(x);
  E* out = static_cast<E*>(y);
  const uint32_t n32 = static_cast<uint32_t>(n);
  if (scatter && narrow) TransposeKernel<E, uint32_t, true><<<Blocks(n), kThreads, 0, s>>>(in, out, n32, p);
  else if (scatter) TransposeKernel<E, int64_t, true><<<Blocks(n), kThreads, 0, s>>>(in, out, n, p);
  else if (narrow) TransposeKernel<E, uint32_t, false><<<Blocks(n), kThreads, 0, s>>>(in, out, n32, p);
  else TransposeKernel<E, int64_t, false><<<Blocks(n), kThreads, 0, s>>>(in, out, n, p);
  return static_cast<int>(cudaGetLastError());
}

int LaunchTransposeOf(int elem_bytes, const void* x, void* y, int64_t n, const Perm& p, cudaStream_t s, bool narrow,
                      bool scatter = false) {
  return WithWord(elem_bytes,
                  [&](auto word) { return LaunchTranspose<decltype(word)>(x, y, n, p, s, narrow, scatter); });
}

// The walk of a strided copy or scatter: the dims of `dims` other than 1 with their strides in
// *p; n the elements, *narrow whether 32-bit offsets reach every one (all strides forward).
int64_t StridedWalk(int rank, const int64_t* dims, const int64_t* strides, Perm* p, bool* narrow) {
  *p = Perm{};
  int64_t n = 1, reach = 0;  // elements; the farthest offset
  bool backwards = false;    // a negative step: offsets below the base, signed arithmetic
  for (int d = 0; d < rank; ++d) {
    if (dims[d] == 1) continue;
    p->out_dims[p->rank] = dims[d];
    p->in_strides[p->rank++] = strides[d];
    n *= dims[d];
    backwards = backwards || strides[d] < 0;
    reach += (dims[d] - 1) * (strides[d] < 0 ? -strides[d] : strides[d]);
  }
  *narrow = !backwards && n < (int64_t{1} << 31) && reach < (int64_t{1} << 31);
  return n;
}

}  // namespace

int Gather(int elem_bytes, const void* table, const void* ids, bool ids_int32, void* out, int64_t outer,
           int64_t num_ids, int64_t rows, int64_t inner, void* stream, BadIndex bad) {
  if (outer * num_ids * inner == 0) return 0;
  cudaStream_t s = Stream(stream);
  return ids_int32
             ? GatherOf(elem_bytes, table, static_cast<const int32_t*>(ids), out, outer, num_ids, rows, inner, bad, s)
             : GatherOf(elem_bytes, table, static_cast<const int64_t*>(ids), out, outer, num_ids, rows, inner, bad, s);
}

int GatherGrad(const float* dy, const void* ids, bool ids_int32, float* dtable, int64_t outer, int64_t num_ids,
               int64_t rows, int64_t inner, void* stream, const float* base, BadIndex bad) {
  cudaStream_t s = Stream(stream);
  const size_t bytes = static_cast<size_t>(outer * rows * inner) * sizeof(float);
  cudaError_t e = !base            ? cudaMemsetAsync(dtable, 0, bytes, s)
                  : base != dtable ? cudaMemcpyAsync(dtable, base, bytes, cudaMemcpyDeviceToDevice, s)
                                   : cudaSuccess;
  const int64_t total = outer * num_ids * inner;
  if (e != cudaSuccess || total == 0) return static_cast<int>(e);
  if (ids_int32)
    ScatterAdd<<<Blocks(total), kThreads, 0, s>>>(dy, static_cast<const int32_t*>(ids), dtable, outer, num_ids, rows,
                                                  inner, bad);
  else
    ScatterAdd<<<Blocks(total), kThreads, 0, s>>>(dy, static_cast<const int64_t*>(ids), dtable, outer, num_ids, rows,
                                                  inner, bad);
  return static_cast<int>(cudaGetLastError());
}

namespace {

// A strided copy (scatter false) or scatter of the dims' elements.
int Strided(int elem_bytes, const void* x, void* y, int rank, const int64_t* dims, const int64_t* strides,
            void* stream, bool scatter) {
  if (rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  Perm p;
  bool narrow = false;
  const int64_t n = StridedWalk(rank, dims, strides, &p, &narrow);
  if (n == 0) return 0;
  return LaunchTransposeOf(elem_bytes, x, y, n, p, Stream(stream), narrow, scatter);
}

}  // namespace

int StridedCopy(int elem_bytes, const void* x, void* y, int rank, const int64_t* out_dims, const int64_t* in_strides,
                void* stream) {
  return Strided(elem_bytes, x, y, rank, out_dims, in_strides, stream, false);
}

int StridedScatter(int elem_bytes, const void* x, void* y, int rank, const int64_t* x_dims, const int64_t* out_strides,
                   void* stream) {
  return Strided(elem_bytes, x, y, rank, x_dims, out_strides, stream, true);
}

int Transpose(int elem_bytes, const void* x, void* y, int rank, const int64_t* x_dims, const int64_t* perm,
              void* stream) {
  if (rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  Perm p{};
  p.rank = rank;
  int64_t strides[kMaxRank];
  int64_t n = 1;
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = n;
    n *= x_dims[d];
  }
  if (n == 0) return 0;
  // Output dims of 1 dropped, and neighbours that are neighbours in x too merged: attention's
  // [B, T, H, D] -> [B, H, T, D] stays rank 4, a batched 2-D transpose loses its batch dims.
  p.rank = 0;
  for (int d = 0; d < rank; ++d) {
    const int64_t size = x_dims[perm[d]], stride = strides[perm[d]];
    if (size == 1) continue;
    if (p.rank > 0 && p.in_strides[p.rank - 1] == stride * size) {
      p.out_dims[p.rank - 1] *= size;
      p.in_strides[p.rank - 1] = stride;
      continue;
    }
    p.out_dims[p.rank] = size;
    p.in_strides[p.rank++] = stride;
  }
  cudaStream_t s = Stream(stream);
  if (p.rank <= 1) {  // a copy
    const cudaError_t e = cudaMemcpyAsync(y, x, static_cast<size_t>(n) * elem_bytes, cudaMemcpyDeviceToDevice, s);
    return static_cast<int>(e);
  }
  // Where the innermost dim stays innermost, whole runs of it move as 16-, 8- or 4-byte words.
  if (p.in_strides[p.rank - 1] == 1) {
    const int64_t run = p.out_dims[p.rank - 1] * elem_bytes;
    const uintptr_t at = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y);
    for (int w : {16, 8, 4}) {
      if (w <= elem_bytes || run % w != 0 || at % w != 0) continue;
      const int64_t vec = w / elem_bytes;
      bool whole = true;
      for (int d = 0; d + 1 < p.rank; ++d) whole = whole && p.in_strides[d] % vec == 0;
      if (!whole) continue;
      Perm v = p;
      v.out_dims[v.rank - 1] /= vec;
      for (int d = 0; d + 1 < v.rank; ++d) v.in_strides[d] /= vec;
      const int64_t words = n / vec;
      const bool narrow = words < (int64_t{1} << 31);  // a permutation reaches no farther than its count
      if (w == 16) return LaunchTranspose<uint4>(x, y, words, v, s, narrow);
      if (w == 8) return LaunchTranspose<uint2>(x, y, words, v, s, narrow);
      return LaunchTranspose<uint32_t>(x, y, words, v, s, narrow);
    }
  }
  return LaunchTransposeOf(elem_bytes, x, y, n, p, s, n < (int64_t{1} << 31));
}

namespace {

template <typename E>
__global__ void FillKernel(E value, E* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = value;
}

template <typename T, typename Wide>
__global__ void RangeKernel(Wide start, Wide delta, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = static_cast<T>(start + static_cast<Wide>(i) * delta);
}

template <typename E>
__global__ void TriluKernel(const E* x, E* y, int64_t total, int64_t rows, int64_t cols, int64_t k, bool upper) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % cols, r = i / cols % rows;
    const bool keep = upper ? c >= r + k : c <= r + k;
    y[i] = keep ? x[i] : E{};
  }
}

}  // namespace

int Fill(int elem_bytes, uint64_t value, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    E fill;
    memcpy(&fill, &value, sizeof fill);  // the low bytes (little-endian)
    FillKernel<E><<<Blocks(n), kThreads, 0, s>>>(fill, static_cast<E*>(y), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int Range(Elem t, int64_t start_i, int64_t delta_i, double start_f, double delta_f, void* y, int64_t n,
          void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  const int blocks = Blocks(n);
  if (t == Elem::kI64)
    RangeKernel<int64_t, int64_t><<<blocks, kThreads, 0, s>>>(start_i, delta_i, static_cast<int64_t*>(y), n);
  else if (t == Elem::kI32)
    RangeKernel<int32_t, int64_t><<<blocks, kThreads, 0, s>>>(start_i, delta_i, static_cast<int32_t*>(y), n);
  else if (t == Elem::kF32)
    RangeKernel<float, double><<<blocks, kThreads, 0, s>>>(start_f, delta_f, static_cast<float*>(y), n);
  else
    return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaGetLastError());
}

int Trilu(int elem_bytes, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
          void* stream) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return 0;
  // Beyond these bounds each row is kept or zeroed whole; clamped, r + k cannot overflow.
  k = k < -rows - 1 ? -rows - 1 : k > cols + 1 ? cols + 1 : k;
  cudaStream_t s = Stream(stream);
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    TriluKernel<E><<<Blocks(total), kThreads, 0, s>>>(static_cast<const E*>(x), static_cast<E*>(y), total, rows,
                                                      cols, k, upper);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace cleave::kernels::cuda
