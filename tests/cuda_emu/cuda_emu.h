// The CUDA thread model on the CPU, so that the provider's own kernels (kernels/cuda/*.cu) run
// in the test suite on machines without a GPU. The .cu files are compiled as C++ with this
// header standing in for cuda_runtime.h, cuda_bf16.h and cuda_fp16.h; a translation step
// (translate.cc) turns each `kernel<<<grid, block, shared, stream>>>(args)` into a call of
// Launch and each `extern __shared__` array into the launch's dynamic shared memory.
//
// A launch runs its blocks one after another. The threads of a block are fibers on the calling
// thread, switched only at __syncthreads and at warp shuffles, in an order the test chooses
// (SetOrder): a kernel whose result depends on that order has a race. The emulator also
// reports, as a launch error, what the hardware would leave undefined or reject: a barrier not
// every thread reaches (a deadlock here), a full-mask shuffle over a warp with lanes missing,
// and launch configurations the device refuses (no blocks, more than 1024 threads, gridDim.y or
// .z over 65535, more than 227 KiB of dynamic shared memory). Shared memory starts as NaN bytes.
//
// Arithmetic is the host's: expf and friends are glibc's, not libdevice's, and nothing is
// contracted into FMAs, so results match the GPU's to rounding, not bit for bit.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>  // the real headers bring it; data.cu loops over a braced list
#include <type_traits>

// ---- Types of the CUDA runtime -------------------------------------------------------------
struct uint3 {
  unsigned int x, y, z;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
};

struct CUstream_st;
typedef CUstream_st* cudaStream_t;

struct CUevent_st;
typedef CUevent_st* cudaEvent_t;

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError cudaError_t;

constexpr unsigned int cudaStreamNonBlocking = 0x01;
constexpr unsigned int cudaEventDisableTiming = 0x02;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

// ---- bf16 and fp16 storage types ----------------------------------------------------------
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}
inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.bits, sizeof v);
  return static_cast<float>(v);
}
inline __half __float2half_rn(float f) {
  const _Float16 v = static_cast<_Float16>(f);
  __half h;
  std::memcpy(&h.bits, &v, sizeof v);
  return h;
}

// ---- Qualifiers ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time, so one static array per declaration is the block's shared memory.
#define __shared__ static

namespace cleave::cuda_emu {

// What a kernel reads as threadIdx, blockIdx, blockDim and gridDim: the scheduler sets them
// before it resumes a thread.
struct ThreadCoords {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim;
  dim3 grid_dim;
};
extern ThreadCoords g_coords;

void SyncThreads();
// Lane `src` of the calling thread's warp's value (all lanes of `mask` exchange at once).
uint64_t WarpExchange(unsigned mask, uint64_t value, int src_lane);
int LaneId();
void* DynamicSharedMemory();

// The fibers' order: ascending thread index, descending, a seeded shuffle, or warps running
// ahead (the last warp first, each resumed until it waits on another: a warp then overwrites
// shared memory other warps have not read yet where a barrier is missing).
enum class Order { kAscending, kDescending, kShuffled, kWarpsAhead };
void SetOrder(Order order, uint64_t seed = 0);

// Runs `body` once per thread of every block. Launch errors are kept for cudaGetLastError.
void LaunchErased(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, void (*run)(void*), void* body);
template <typename F>
void Launch(const char* kernel, F&& body, dim3 grid, dim3 block, size_t shared_bytes = 0, cudaStream_t = nullptr) {
  using Body = std::remove_reference_t<F>;
  LaunchErased(kernel, grid, block, shared_bytes, [](void* f) { (*static_cast<Body*>(f))(); }, &body);
}

// The last launch's kernel as its source names it ("Map1<P>"); the message of the first launch
// error since ClearFault ("" when none).
const char* LastKernel();
const char* LastFault();
void ClearFault();
// Sets what cudaGetLastError returns next (the last error, as the runtime keeps it).
void SetLastError(cudaError_t e);

template <typename T>
T* DynamicShared() {
  return static_cast<T*>(DynamicSharedMemory());
}

template <typename T>
T Shuffle(unsigned mask, T v, int src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  bits = WarpExchange(mask, bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace cleave::cuda_emu

#define threadIdx (::cleave::cuda_emu::g_coords.thread_idx)
#define blockIdx (::cleave::cuda_emu::g_coords.block_idx)
#define blockDim (::cleave::cuda_emu::g_coords.block_dim)
#define gridDim (::cleave::cuda_emu::g_coords.grid_dim)

// ---- Device functions ---------------------------------------------------------------------
inline void __syncthreads() { ::cleave::cuda_emu::SyncThreads(); }
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::cleave::cuda_emu::LaneId();
  const int src = lane ^ lane_mask;
  return ::cleave::cuda_emu::Shuffle(mask, v, src / width == lane / width ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::cleave::cuda_emu::LaneId();
  const int src = lane + static_cast<int>(delta);
  return ::cleave::cuda_emu::Shuffle(mask, v, src / width == lane / width ? src : lane);
}
// One host thread runs every fiber, and fibers switch only at barriers: a read-modify-write
// is atomic as it stands.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }

// ---- Runtime functions --------------------------------------------------------------------
// The device is the host: one device of kEmulatedDeviceBytes, allocations are host memory
// (256-byte aligned, filled with 0xff bytes, so a read before a write shows as NaN), every
// stream runs its work at once on the calling thread, and events are always complete.
inline constexpr size_t kEmulatedDeviceBytes = size_t{16} << 30;
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t e);
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream = nullptr);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t = nullptr) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t = nullptr) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int value) {
  return value >= 0 ? cudaSuccess : cudaErrorInvalidValue;
}
