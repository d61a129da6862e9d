// CLEAVE_HOST_DEVICE: a function the CPU kernels and the CUDA kernels (kernels/cuda/) share, so
// both sides compute one definition (kernels/).
#pragma once

#if defined(__CUDACC__)
#define CLEAVE_HOST_DEVICE __host__ __device__
#else
#define CLEAVE_HOST_DEVICE
#endif
