// Shared device helpers of the CUDA kernels (kernels/cuda/): launch sizes, storage-type
// conversions and block reductions. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {

inline constexpr int kThreads = 256;

// A grid-stride launch: enough blocks to cover n, at most 65535 * 4 of them.
inline unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 262140 ? (b > 0 ? b : 1) : 262140);
}

inline cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

// How a sum over the rows of [rows, cols] into [cols] splits its rows (blocks of 32 columns,
// each over a chunk of rows, partial sums combined in a second pass): enough blocks to fill the
// device (about 1024), each over 64 rows or more. Returns the number of chunks, *chunk their rows.
inline int64_t ColumnChunks(int64_t rows, int64_t cols, int64_t* chunk) {
  const int64_t column_blocks = cols > 0 ? (cols + 31) / 32 : 1;
  const int64_t want = (1024 + column_blocks - 1) / column_blocks, most = (rows + 63) / 64;
  int64_t chunks = want < most ? want : most;
  if (chunks < 1) chunks = 1;
  *chunk = (rows + chunks - 1) / chunks;
  return *chunk > 0 ? (rows + *chunk - 1) / *chunk : 1;
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) of v over the block; every thread gets the result. `shared` holds 32 floats.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : 0.f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

// P consecutive elements of T moved as one access (16 bytes at most: 4 float32 or 8 bf16 values).
template <typename T, int P>
struct alignas(sizeof(T) * P) Vec {
  T v[P];
};

// Elements per access of a kernel over types of these sizes: one 16-byte access of the widest.
constexpr int VecWidth(size_t a, size_t b) { return static_cast<int>(16 / (a > b ? a : b)); }

inline bool AlignedTo(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Runs the body (the trailing arguments) with T the storage type of dt.
#define DISPATCH_DT(dt, T, ...)                 \
  switch (dt) {                                  \
    case ::cleave::kernels::cuda::Dt::kF32: {    \
      using T = float;                           \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case ::cleave::kernels::cuda::Dt::kBf16: {   \
      using T = __nv_bfloat16;                   \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
    case ::cleave::kernels::cuda::Dt::kF16: {    \
      using T = __half;                          \
      __VA_ARGS__;                               \
      break;                                     \
    }                                            \
  }

// f(E{}) for E the unsigned word of elem_bytes (1, 2, 4 or 8 bytes): the kernels that only move
// elements take them as words; other sizes are cudaErrorInvalidValue.
template <typename F>
int WithWord(int elem_bytes, F&& f) {
  switch (elem_bytes) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    case 8: return f(uint64_t{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

// The first out-of-range index a kernel meets, into the device words `bad` (when given):
// {tag, the index, its position, the size it indexes}, claimed by whichever thread sets the tag
// first.
__device__ inline void RecordBadIndex(const BadIndex& bad, int64_t index, int64_t position, int64_t size) {
  if (!bad.words) return;
  unsigned long long* w = reinterpret_cast<unsigned long long*>(bad.words);
  if (atomicCAS(w, 0ull, static_cast<unsigned long long>(bad.tag)) != 0ull) return;
  bad.words[1] = index;
  bad.words[2] = position;
  bad.words[3] = size;
}

}  // namespace cleave::kernels::cuda
