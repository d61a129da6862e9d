// CUDA draws of the random ops (kernels/cuda/): element i of RandomUniform, RandomNormal or
// Bernoulli from kernels/random_draw.h, in double, one thread per element, the numbers the CPU
// kernels draw for the same key.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/random_draw.h"

namespace cleave::kernels::cuda {
namespace {

__global__ void RandomDrawKernel(RandomKind kind, uint64_t key, double a, double b, const double* p, double* y,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = RandomDrawAt(kind, key, i, a, b, p ? p[i] : 0.0);
}

}  // namespace

int RandomDraw(RandomKind kind, uint64_t key, double a, double b, const double* p, double* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  RandomDrawKernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(kind, key, a, b, p, y, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
