// CUDA reductions and selection (kernels/cuda/): the Reduce ops over any set of axes and Where
// with broadcasting. Sums and products accumulate in double, as the CPU kernels do, and a max
// propagates NaN as the CPU's does. Two layouts get kernels of their own, since a training step
// is full of them: reducing the leading axes (bias gradients: [rows, C] to [C], each block
// reading 32 columns coalesced over a chunk of the rows, the chunks' results combined in a
// second pass) and reducing the trailing axes (one block or warp per output reading its
// contiguous row; LogSumExp too); any other set of axes takes one thread per output.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

struct ReducePlan {
  int kept_rank = 0, red_rank = 0;
  int64_t kept_dims[kMaxRank] = {}, kept_strides[kMaxRank] = {};
  int64_t red_dims[kMaxRank] = {}, red_strides[kMaxRank] = {};
  int64_t red_count = 1;
};

__device__ __forceinline__ double Start(ReduceOp op) {
  return op == ReduceOp::kMax ? -INFINITY : op == ReduceOp::kMin ? INFINITY : op == ReduceOp::kProd ? 1.0 : 0.0;
}
// Partial results combine by their sum, product (Prod), or Max and Min (which propagate NaN).
__device__ __forceinline__ double Combine(ReduceOp op, double acc, double v) {
  if (op == ReduceOp::kProd) return acc * v;
  if (op != ReduceOp::kMax && op != ReduceOp::kMin) return acc + v;
  if (v != v || acc != acc) return v != v ? v : acc;
  return op == ReduceOp::kMax ? fmax(acc, v) : fmin(acc, v);
}
// An element joins the result as itself, or its magnitude (L1) or square (SumSquare, L2).
__device__ __forceinline__ double Add(ReduceOp op, double acc, double v) {
  if (op == ReduceOp::kL1) v = fabs(v);
  else if (op == ReduceOp::kSumSquare || op == ReduceOp::kL2) v *= v;
  return Combine(op, acc, v);
}
template <typename T>
__device__ __forceinline__ T Result(ReduceOp op, double acc, int64_t count) {
  const double r = op == ReduceOp::kMean ? acc / static_cast<double>(count)
                 : op == ReduceOp::kL2   ? sqrt(acc)
                 : op == ReduceOp::kLogSum ? log(acc)
                                         : acc;
  return FromFloat<T>(static_cast<float>(r));
}

// Where output o's elements start in x, and where its r-th reduced element lies.
__device__ __forceinline__ int64_t KeptOffset(const ReducePlan& p, int64_t o) {
  int64_t base = 0;
  for (int d = p.kept_rank - 1; d >= 0; --d) {
    base += (o % p.kept_dims[d]) * p.kept_strides[d];
    o /= p.kept_dims[d];
  }
  return base;
}
__device__ __forceinline__ int64_t ReducedOffset(const ReducePlan& p, int64_t base, int64_t r) {
  for (int d = p.red_rank - 1; d >= 0; --d) {
    base += (r % p.red_dims[d]) * p.red_strides[d];
    r /= p.red_dims[d];
  }
  return base;
}

template <typename T>
__global__ void ReduceKernel(ReduceOp op, const T* x, T* y, int64_t outputs, ReducePlan p) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = KeptOffset(p, o);
    double acc = Start(op);
    for (int64_t r = 0; r < p.red_count; ++r) acc = Add(op, acc, ToFloat(x[ReducedOffset(p, base, r)]));
    y[o] = Result<T>(op, acc, p.red_count);
  }
}

// LogSumExp, one thread per output: the maximum first, then log(sum exp(x - max)) + max (a max
// that is not finite, from an empty or infinite set, shifts by 0), as the CPU's.
template <typename T>
__global__ void ReduceLogSumExpKernel(const T* x, T* y, int64_t outputs, ReducePlan p) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = KeptOffset(p, o);
    double mx = -INFINITY, sum = 0.0;
    for (int pass = 0; pass < 2; ++pass) {
      const double shift = isfinite(mx) ? mx : 0.0;
      for (int64_t r = 0; r < p.red_count; ++r) {
        const double v = ToFloat(x[ReducedOffset(p, base, r)]);
        if (pass == 0) mx = Combine(ReduceOp::kMax, mx, v);
        else sum += exp(v - shift);
      }
    }
    y[o] = FromFloat<T>(static_cast<float>(log(sum) + (isfinite(mx) ? mx : 0.0)));
  }
}

// x [R, C] -> y [C]: block (32, 8) owns 32 columns; its 8 rows of threads stride down R and
// their partial results are combined in a fixed order.
template <typename T>
__global__ void ReduceColumns(ReduceOp op, const T* x, T* y, int64_t R, int64_t C) {
  __shared__ double part[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  double acc = Start(op);
  if (c < C)
    for (int64_t r = threadIdx.y; r < R; r += 8) acc = Add(op, acc, ToFloat(x[r * C + c]));
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < 8; ++k) acc = Combine(op, acc, part[k][threadIdx.x]);
  y[c] = Result<T>(op, acc, R);
}

// The same over many rows: block (bx, by) reduces rows [by * chunk, (by + 1) * chunk) of its 32
// columns into part[by][c]; ReduceColumnParts then combines each column's parts in order. A
// bias gradient has few columns (C / 32 blocks would leave most of the device idle).
template <typename T>
__global__ void ReduceColumnChunks(ReduceOp op, const T* x, double* part, int64_t R, int64_t C, int64_t chunk) {
  __shared__ double sh[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * chunk, r1 = r0 + chunk < R ? r0 + chunk : R;
  double acc = Start(op);
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc = Add(op, acc, ToFloat(x[r * C + c]));
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 1; k < 8; ++k) acc = Combine(op, acc, sh[k][threadIdx.x]);
  part[blockIdx.y * C + c] = acc;
}

template <typename T>
__global__ void ReduceColumnParts(ReduceOp op, const double* part, T* y, int64_t parts, int64_t C, int64_t R) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = Start(op);
    for (int64_t k = 0; k < parts; ++k) acc = Combine(op, acc, part[k * C + c]);
    y[c] = Result<T>(op, acc, R);
  }
}

// The block's W partial results combined (warps by shuffles, then their results in order
// through `part`); the answer is thread 0's. Every thread of the block must call it.
template <int W>
__device__ __forceinline__ double BlockCombine(ReduceOp op, double acc, double* part) {
  for (int off = 16; off > 0; off >>= 1) acc = Combine(op, acc, __shfl_down_sync(0xffffffffu, acc, off));
  if (W > 32) {
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0)
      for (int k = 1; k < W / 32; ++k) acc = Combine(op, acc, part[k]);
    __syncthreads();  // part is reused by the next combination
  }
  return acc;
}

// x [O, R] -> y [O]: a block of W threads (a warp, or 256 for long rows) per output.
template <typename T, int W>
__global__ void ReduceRows(ReduceOp op, const T* x, T* y, int64_t O, int64_t R) {
  __shared__ double part[W / 32];
  for (int64_t o = blockIdx.x; o < O; o += gridDim.x) {  // uniform over the block
    const T* row = x + o * R;
    double acc = Start(op);
    for (int64_t r = threadIdx.x; r < R; r += W) acc = Add(op, acc, ToFloat(row[r]));
    acc = BlockCombine<W>(op, acc, part);
    if (threadIdx.x == 0) y[o] = Result<T>(op, acc, R);
  }
}

// LogSumExp over the trailing axes (a row of logits): a block of W threads per output, the
// row's maximum first (shared with the block), then the sum of exp(x - max), as
// ReduceLogSumExpKernel forms them.
template <typename T, int W>
__global__ void ReduceRowsLogSumExp(const T* x, T* y, int64_t O, int64_t R) {
  __shared__ double part[W / 32];
  __shared__ double row_max;
  for (int64_t o = blockIdx.x; o < O; o += gridDim.x) {  // uniform over the block
    const T* row = x + o * R;
    double mx = -INFINITY;
    for (int64_t r = threadIdx.x; r < R; r += W) mx = Combine(ReduceOp::kMax, mx, ToFloat(row[r]));
    mx = BlockCombine<W>(ReduceOp::kMax, mx, part);
    if (threadIdx.x == 0) row_max = mx;
    __syncthreads();
    const double shift = isfinite(row_max) ? row_max : 0.0;
    double sum = 0.0;
    for (int64_t r = threadIdx.x; r < R; r += W) sum += exp(ToFloat(row[r]) - shift);
    sum = BlockCombine<W>(ReduceOp::kSum, sum, part);
    if (threadIdx.x == 0) y[o] = FromFloat<T>(static_cast<float>(log(sum) + shift));
    __syncthreads();  // row_max is reused by the next output
  }
}

template <typename E>
__global__ void WhereKernel(const bool* cond, const E* a, const E* b, E* y, int64_t n, Broadcast3 bc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, ic = 0, ia = 0, ib = 0;
    for (int d = bc.rank - 1; d >= 0; --d) {
      const int64_t c = rest % bc.out_dims[d];
      rest /= bc.out_dims[d];
      ic += c * bc.strides[0][d];
      ia += c * bc.strides[1][d];
      ib += c * bc.strides[2][d];
    }
    y[i] = cond[ic] ? a[ia] : b[ib];
  }
}

}  // namespace

namespace {

// How a reduction runs: its plan, the layout, and for leading axes into columns, how many row
// chunks (1: one pass).
struct ReduceLayout {
  ReducePlan p;
  int64_t outputs = 1;
  bool leading = true, trailing = true;
  int64_t chunks = 1, chunk = 0;
};

ReduceLayout PlanReduce(int rank, const int64_t* x_dims, const bool* reduce) {
  ReduceLayout l;
  ReducePlan& p = l.p;
  int64_t stride = 1;
  int64_t strides[kMaxRank];
  for (int d = rank - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= x_dims[d];
  }
  for (int d = 0; d < rank; ++d) {
    if (reduce[d]) {
      p.red_dims[p.red_rank] = x_dims[d];
      p.red_strides[p.red_rank++] = strides[d];
      p.red_count *= x_dims[d];
    } else {
      p.kept_dims[p.kept_rank] = x_dims[d];
      p.kept_strides[p.kept_rank++] = strides[d];
      l.outputs *= x_dims[d];
    }
  }
  // Ignoring dims of 1: are the reduced axes all before the kept ones, or all after?
  bool kept_seen = false, red_seen = false;
  for (int d = 0; d < rank; ++d) {
    if (x_dims[d] == 1) continue;
    if (reduce[d]) {
      l.leading = l.leading && !kept_seen;
      red_seen = true;
    } else {
      l.trailing = l.trailing && !red_seen;
      kept_seen = true;
    }
  }
  const int64_t R = p.red_count;
  if (l.outputs > 0 && R > 0 && l.leading && !l.trailing) l.chunks = ColumnChunks(R, l.outputs, &l.chunk);
  return l;
}

}  // namespace

int64_t ReduceScratch(int rank, const int64_t* x_dims, const bool* reduce) {
  if (rank > kMaxRank) return 0;
  const ReduceLayout l = PlanReduce(rank, x_dims, reduce);
  return l.chunks > 1 ? l.chunks * l.outputs : 0;
}

int Reduce(ReduceOp op, Dt dt, const void* x, void* y, int rank, const int64_t* x_dims, const bool* reduce,
           double* scratch, void* stream) {
  if (rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  const ReduceLayout l = PlanReduce(rank, x_dims, reduce);
  const ReducePlan& p = l.p;
  const int64_t outputs = l.outputs;
  if (outputs == 0) return 0;
  const int64_t R = p.red_count;
  cudaStream_t s = Stream(stream);
  DISPATCH_DT(dt, T, {
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (op == ReduceOp::kLogSumExp && l.trailing && R > 0) {
      const unsigned grid = static_cast<unsigned>(outputs < (int64_t{1} << 20) ? outputs : (int64_t{1} << 20));
      if (R >= 2048) ReduceRowsLogSumExp<T, 256><<<grid, 256, 0, s>>>(xt, yt, outputs, R);
      else ReduceRowsLogSumExp<T, 32><<<grid, 32, 0, s>>>(xt, yt, outputs, R);
    } else if (op == ReduceOp::kLogSumExp) {
      ReduceLogSumExpKernel<T><<<Blocks(outputs), kThreads, 0, s>>>(xt, yt, outputs, p);
    } else if (R == 0 || (!l.leading && !l.trailing)) {
      ReduceKernel<T><<<Blocks(outputs), kThreads, 0, s>>>(op, xt, yt, outputs, p);
    } else if (l.trailing) {  // also a whole reduction to one value
      const unsigned grid = static_cast<unsigned>(outputs < (int64_t{1} << 20) ? outputs : (int64_t{1} << 20));
      if (R >= 2048) ReduceRows<T, 256><<<grid, 256, 0, s>>>(op, xt, yt, outputs, R);
      else ReduceRows<T, 32><<<grid, 32, 0, s>>>(op, xt, yt, outputs, R);
    } else if (l.chunks > 1 && scratch) {
      const dim3 grid(static_cast<unsigned>((outputs + 31) / 32), static_cast<unsigned>(l.chunks));
      ReduceColumnChunks<T><<<grid, dim3(32, 8), 0, s>>>(op, xt, scratch, R, outputs, l.chunk);
      ReduceColumnParts<T><<<Blocks(outputs), kThreads, 0, s>>>(op, scratch, yt, l.chunks, outputs, R);
    } else {
      const int64_t column_blocks = (outputs + 31) / 32;
      ReduceColumns<T><<<static_cast<unsigned>(column_blocks), dim3(32, 8), 0, s>>>(op, xt, yt, R, outputs);
    }
  });
  return static_cast<int>(cudaGetLastError());
}

int64_t ColumnSumsScratch(int64_t R, int64_t C) {
  if (R <= 0) return 0;
  int64_t chunk = 0;
  return C * ColumnChunks(R, C, &chunk);
}

int ColumnSums(Dt dt, const void* x, float* y, int64_t R, int64_t C, double* scratch, void* stream) {
  if (C == 0) return 0;
  cudaStream_t s = Stream(stream);
  if (R == 0) return static_cast<int>(cudaMemsetAsync(y, 0, static_cast<size_t>(C) * sizeof(float), s));
  if (!scratch) return static_cast<int>(cudaErrorInvalidValue);
  int64_t chunk = 0;
  const int64_t chunks = ColumnChunks(R, C, &chunk);
  DISPATCH_DT(dt, T, {
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    ReduceColumnChunks<T><<<grid, dim3(32, 8), 0, s>>>(ReduceOp::kSum, static_cast<const T*>(x), scratch, R, C, chunk);
  });
  ReduceColumnParts<float><<<Blocks(C), kThreads, 0, s>>>(ReduceOp::kSum, scratch, y, chunks, C, R);
  return static_cast<int>(cudaGetLastError());
}

int Where(int elem_bytes, const bool* cond, const void* a, const void* b, void* y, int64_t n, const Broadcast3& bc,
          void* stream) {
  if (n == 0) return 0;
  return WithWord(elem_bytes, [&](auto word) {
    using E = decltype(word);
    WhereKernel<E><<<Blocks(n), kThreads, 0, Stream(stream)>>>(cond, static_cast<const E*>(a), static_cast<const E*>(b),
                                                               static_cast<E*>(y), n, bc);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace cleave::kernels::cuda
