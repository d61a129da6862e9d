// CUDA elementwise kernels (kernels/cuda/): the first device kernels; the CUDA provider
// wires them in a later step. Built for sm_80 and sm_90 whenever nvcc is present.
#include "kernels/cuda/elementwise.h"

namespace cleave::kernels::cuda {

__global__ void AddF32Kernel(const float* a, const float* b, float* c, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

void AddF32(const float* a, const float* b, float* c, int64_t n, void* stream) {
  int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  AddF32Kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, c, n);
}

}  // namespace cleave::kernels::cuda
