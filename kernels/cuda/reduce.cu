// CUDA reductions and selection (kernels/cuda/): ReduceSum/Mean/Max over any set of axes (one
// thread per output element walks its reduced elements) and Where with broadcasting.
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

template <typename T>
__global__ void ReduceKernel(ReduceOp op, const T* x, T* y, int64_t outputs, ReducePlan p) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = o, base = 0;
    for (int d = p.kept_rank - 1; d >= 0; --d) {
      base += (rest % p.kept_dims[d]) * p.kept_strides[d];
      rest /= p.kept_dims[d];
    }
    float acc = op == ReduceOp::kMax ? -INFINITY : 0.f;
    for (int64_t r = 0; r < p.red_count; ++r) {
      int64_t q = r, off = base;
      for (int d = p.red_rank - 1; d >= 0; --d) {
        off += (q % p.red_dims[d]) * p.red_strides[d];
        q /= p.red_dims[d];
      }
      const float v = ToFloat(x[off]);
      acc = op == ReduceOp::kMax ? fmaxf(acc, v) : acc + v;
    }
    if (op == ReduceOp::kMean) acc /= static_cast<float>(p.red_count);
    y[o] = FromFloat<T>(acc);
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

int Reduce(ReduceOp op, Dt dt, const void* x, void* y, int rank, const int64_t* x_dims, const bool* reduce,
           void* stream) {
  if (rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  ReducePlan p;
  int64_t stride = 1, outputs = 1;
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
      outputs *= x_dims[d];
    }
  }
  if (outputs == 0) return 0;
  DISPATCH_DT(dt, T, {
    ReduceKernel<T><<<Blocks(outputs), kThreads, 0, Stream(stream)>>>(op, static_cast<const T*>(x),
                                                                      static_cast<T*>(y), outputs, p);
  });
  return static_cast<int>(cudaGetLastError());
}

int Where(int elem_bytes, const bool* cond, const void* a, const void* b, void* y, int64_t n, const Broadcast3& bc,
          void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  switch (elem_bytes) {
    case 1:
      WhereKernel<uint8_t><<<Blocks(n), kThreads, 0, s>>>(cond, static_cast<const uint8_t*>(a),
                                                          static_cast<const uint8_t*>(b), static_cast<uint8_t*>(y), n, bc);
      break;
    case 2:
      WhereKernel<uint16_t><<<Blocks(n), kThreads, 0, s>>>(cond, static_cast<const uint16_t*>(a),
                                                           static_cast<const uint16_t*>(b), static_cast<uint16_t*>(y), n,
                                                           bc);
      break;
    case 4:
      WhereKernel<uint32_t><<<Blocks(n), kThreads, 0, s>>>(cond, static_cast<const uint32_t*>(a),
                                                           static_cast<const uint32_t*>(b), static_cast<uint32_t*>(y), n,
                                                           bc);
      break;
    case 8:
      WhereKernel<uint64_t><<<Blocks(n), kThreads, 0, s>>>(cond, static_cast<const uint64_t*>(a),
                                                           static_cast<const uint64_t*>(b), static_cast<uint64_t*>(y), n,
                                                           bc);
      break;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
