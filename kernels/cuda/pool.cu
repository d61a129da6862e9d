// CUDA pooling (kernels/cuda/): MaxPool and AveragePool (the global pools are their one-window
// case) forward, one thread per output element, and their gradients, one thread per input
// element gathering from the windows that read it (kernels/pool_window.h), so each sum is formed
// in one fixed order without atomics. bf16 and fp16 compare and sum in float32. Resize's
// resampling along one dim, and its adjoint, gathered the same way.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/pool_window.h"

namespace cleave::kernels::cuda {
namespace {

struct FloatLess {
  __device__ bool operator()(float a, float b) const { return a < b; }
};
struct FloatIsNan {
  __device__ bool operator()(float v) const { return v != v; }
};

// The plane offset of output i's chosen tap (-1: the window lies in the padding).
template <typename T>
__device__ int64_t ArgMaxOf(const PoolLayout& l, const T* x, int64_t i) {
  const T* plane = x + i / l.out_size * l.in_size;
  return PoolArgMax(
      l, i % l.out_size, [plane](int64_t k) { return ToFloat(plane[k]); }, FloatLess{}, FloatIsNan{});
}

template <typename T>
__global__ void MaxPoolKernel(PoolLayout l, const T* x, T* y, int64_t* indices, bool column_major, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t a = ArgMaxOf(l, x, i), base = i / l.out_size * l.in_size;
    y[i] = a < 0 ? FromFloat<T>(-INFINITY) : x[base + a];
    if (indices) indices[i] = a < 0 ? -1 : base + (column_major ? PoolColumnMajor(l, a) : a);
  }
}

template <typename T>
__global__ void AveragePoolKernel(PoolLayout l, const T* x, T* y, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* plane = x + i / l.out_size * l.in_size;
    const int64_t o = i % l.out_size;
    float sum = 0.f;
    PoolVisitWindow(l, o, [&](int64_t k) { sum += ToFloat(plane[k]); });
    const int64_t count = PoolDivisor(l, o);
    y[i] = FromFloat<T>(count > 0 ? sum / static_cast<float>(count) : 0.f);
  }
}

template <typename T>
__global__ void ArgMaxKernel(PoolLayout l, const T* x, int64_t* arg, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    arg[i] = ArgMaxOf(l, x, i);
}

// dx [planes, in_size]: max (arg non-null) sums the dy of the windows that chose the element,
// average the dy / divisor of every window that reads it.
template <typename T>
__global__ void PoolGradKernel(PoolLayout l, const T* dy, const int64_t* arg, T* dx, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t plane = i / l.in_size, k = i % l.in_size;
    const T* g = dy + plane * l.out_size;
    float sum = 0.f;
    if (arg) {
      const int64_t* a = arg + plane * l.out_size;
      PoolVisitReaders(l, k, [&](int64_t o) {
        if (a[o] == k) sum += ToFloat(g[o]);
      });
    } else {
      PoolVisitReaders(l, k, [&](int64_t o) { sum += ToFloat(g[o]) / static_cast<float>(PoolDivisor(l, o)); });
    }
    dx[i] = FromFloat<T>(sum);
  }
}

bool Valid(const PoolLayout& l) { return l.spatial >= 1 && l.spatial <= kPoolMaxSpatial; }

}  // namespace

int MaxPool(Dt dt, const PoolLayout& l, int64_t planes, const void* x, void* y, int64_t* indices, bool column_major,
            void* stream) {
  if (!Valid(l)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = planes * l.out_size;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    MaxPoolKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(x), static_cast<T*>(y),
                                                                     indices, column_major, total);
  });
  return static_cast<int>(cudaGetLastError());
}

int AveragePool(Dt dt, const PoolLayout& l, int64_t planes, const void* x, void* y, void* stream) {
  if (!Valid(l)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = planes * l.out_size;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    AveragePoolKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(x),
                                                                         static_cast<T*>(y), total);
  });
  return static_cast<int>(cudaGetLastError());
}

int MaxPoolGrad(Dt dt, const PoolLayout& l, int64_t planes, const void* dy, const void* x, int64_t* arg, void* dx,
                void* stream) {
  if (!Valid(l)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t outs = planes * l.out_size, ins = planes * l.in_size;
  if (ins == 0) return 0;
  DISPATCH_DT(dt, T, {
    if (outs > 0)
      ArgMaxKernel<T><<<Blocks(outs), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(x), arg, outs);
    PoolGradKernel<T><<<Blocks(ins), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(dy), arg,
                                                                    static_cast<T*>(dx), ins);
  });
  return static_cast<int>(cudaGetLastError());
}

namespace {

template <typename T>
__global__ void ResampleKernel(const int64_t* offsets, const int64_t* index, const float* weight, const T* x, T* y,
                               int64_t in, int64_t out, int64_t inner, float extrapolation, int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = e % inner, o = e / inner % out, b = e / (inner * out);
    const int64_t t0 = offsets[o], t1 = offsets[o + 1];
    if (index[t0] < 0) {
      y[e] = FromFloat<T>(extrapolation);
      continue;
    }
    float acc = ToFloat(x[(b * in + index[t0]) * inner + k]) * weight[t0];
    for (int64_t t = t0 + 1; t < t1; ++t) acc += ToFloat(x[(b * in + index[t]) * inner + k]) * weight[t];
    y[e] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void ResampleGradKernel(const int64_t* offsets, const int64_t* outputs, const float* weights, const T* dy,
                                   T* dx, int64_t in, int64_t out, int64_t inner, int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = e % inner, i = e / inner % in, b = e / (inner * in);
    float acc = 0.f;
    for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) acc += ToFloat(dy[(b * out + outputs[j]) * inner + k]) * weights[j];
    dx[e] = FromFloat<T>(acc);
  }
}

}  // namespace

int Resample(Dt dt, const int64_t* offsets, const int64_t* index, const float* weight, const void* x, void* y,
             int64_t outer, int64_t in, int64_t out, int64_t inner, float extrapolation, void* stream) {
  const int64_t total = outer * out * inner;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    ResampleKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(offsets, index, weight,
                                                                      static_cast<const T*>(x), static_cast<T*>(y),
                                                                      in, out, inner, extrapolation, total);
  });
  return static_cast<int>(cudaGetLastError());
}

int ResampleGrad(Dt dt, const int64_t* offsets, const int64_t* outputs, const float* weights, const void* dy, void* dx,
                 int64_t outer, int64_t in, int64_t out, int64_t inner, void* stream) {
  const int64_t total = outer * in * inner;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    ResampleGradKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
        offsets, outputs, weights, static_cast<const T*>(dy), static_cast<T*>(dx), in, out, inner, total);
  });
  return static_cast<int>(cudaGetLastError());
}

int AveragePoolGrad(Dt dt, const PoolLayout& l, int64_t planes, const void* dy, void* dx, void* stream) {
  if (!Valid(l)) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t ins = planes * l.in_size;
  if (ins == 0) return 0;
  DISPATCH_DT(dt, T, {
    PoolGradKernel<T><<<Blocks(ins), kThreads, 0, Stream(stream)>>>(l, static_cast<const T*>(dy), nullptr,
                                                                    static_cast<T*>(dx), ins);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
