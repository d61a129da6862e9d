// CUDA elementwise kernels (kernels/cuda/): host-callable launchers over device pointers.
#pragma once

#include <cstdint>

namespace cleave::kernels::cuda {

// c[i] = a[i] + b[i] on `stream` (a cudaStream_t, or nullptr for the default stream).
void AddF32(const float* a, const float* b, float* c, int64_t n, void* stream);

}  // namespace cleave::kernels::cuda
