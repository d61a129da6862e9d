// CUDA convolution lowering (kernels/cuda/): im2col, which lays the patches of a chunk of
// images out as the columns of one product per group, and col2im, its adjoint, which sums a
// product's columns back into the images' gradient (or, for ConvTranspose, into its output,
// with the bias). The products themselves run through
// cuBLASLt (providers/cuda/cuda_conv_kernels.cc). col2im gathers (one thread per input
// element, over the patch positions that read it) rather than scattering with atomics, so its
// sums are formed in one fixed order.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

template <typename T>
__global__ void Im2ColKernel(ConvGeometry g, const T* x, T* col, int64_t images, int64_t total) {
  const int64_t K = g.kernel_size, O = g.out_size, I = g.in_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i % O, n = i / O % images, r = i / (O * images);
    const int64_t c = r / K;
    int64_t k = r % K, q = o, offset = 0;
    // The patch element's position along each spatial dim, last dim fastest in k and o alike.
    int64_t pos[kMaxRank];
    bool inside = true;
    for (int d = g.spatial - 1; d >= 0; --d) {
      const int64_t kd = k % g.kernel[d], od = q % g.out[d];
      k /= g.kernel[d];
      q /= g.out[d];
      pos[d] = od * g.stride[d] - g.pad_begin[d] + kd * g.dilation[d];
      inside = inside && pos[d] >= 0 && pos[d] < g.in[d];
    }
    if (inside)
      for (int d = 0; d < g.spatial; ++d) offset = offset * g.in[d] + pos[d];
    col[i] = inside ? x[(n * g.C + c) * I + offset] : FromFloat<T>(0.f);
  }
}

template <typename T>
__global__ void Col2ImKernel(ConvGeometry g, const float* col, const T* bias, T* dx, int64_t images, int64_t total) {
  const int64_t K = g.kernel_size, O = g.out_size, I = g.in_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i % I, c = i / I % g.C, n = i / (I * g.C);
    int64_t pos[kMaxRank];
    for (int64_t rest = s, d = g.spatial - 1; d >= 0; --d) {
      pos[d] = rest % g.in[d];
      rest /= g.in[d];
    }
    float acc = bias ? ToFloat(bias[c]) : 0.f;
    for (int64_t k = 0; k < K; ++k) {
      // The output position whose patch reads this element at kernel position k, if any.
      int64_t rest = k, o = 0, scale = 1;
      bool reads = true;
      for (int d = g.spatial - 1; d >= 0 && reads; --d) {
        const int64_t kd = rest % g.kernel[d];
        rest /= g.kernel[d];
        const int64_t t = pos[d] + g.pad_begin[d] - kd * g.dilation[d];
        reads = t >= 0 && t % g.stride[d] == 0 && t / g.stride[d] < g.out[d];
        o += (t / g.stride[d]) * scale;
        scale *= g.out[d];
      }
      if (reads) acc += col[((c * K + k) * images + n) * O + o];
    }
    dx[i] = FromFloat<T>(acc);
  }
}

template <typename T>
__global__ void ConvOutputKernel(const float* product, const T* bias, T* y, int64_t images, int64_t M, int64_t O,
                                 int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i % O, m = i / O % M, n = i / (O * M);
    const float v = product[(m * images + n) * O + o];
    y[i] = FromFloat<T>(bias ? v + ToFloat(bias[m]) : v);
  }
}

}  // namespace

int ConvOutput(Dt dt, const float* product, const void* bias, void* y, int64_t images, int64_t M, int64_t O,
               void* stream) {
  const int64_t total = images * M * O;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    ConvOutputKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(product, static_cast<const T*>(bias),
                                                                        static_cast<T*>(y), images, M, O, total);
  });
  return static_cast<int>(cudaGetLastError());
}

int Im2Col(Dt dt, const ConvGeometry& g, const void* x, void* col, int64_t images, void* stream) {
  if (g.spatial < 1 || g.spatial > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = g.C * g.kernel_size * images * g.out_size;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    Im2ColKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(g, static_cast<const T*>(x), static_cast<T*>(col),
                                                                    images, total);
  });
  return static_cast<int>(cudaGetLastError());
}

int Col2Im(Dt dt, const ConvGeometry& g, const float* col, const void* bias, void* dx, int64_t images, void* stream) {
  if (g.spatial < 1 || g.spatial > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t total = images * g.C * g.in_size;
  if (total == 0) return 0;
  DISPATCH_DT(dt, T, {
    Col2ImKernel<T><<<Blocks(total), kThreads, 0, Stream(stream)>>>(g, col, static_cast<const T*>(bias),
                                                                    static_cast<T*>(dx), images, total);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
