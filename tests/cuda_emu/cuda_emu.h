// The CUDA thread model on the CPU, so that the provider's own kernels (kernels/cuda/*.cu) run
// in the test suite on machines without a GPU. The .cu files are compiled as C++ with this
// header standing in for cuda_runtime.h, cuda_bf16.h and cuda_fp16.h; a translation step
// (translate.cc) turns each `kernel<<<grid, block, shared, stream>>>(args)` into a call of
// Launch and each `extern __shared__` array into the launch's dynamic shared memory.
//
// A launch runs its blocks one after another. The threads of a block are fibers on the thread
// that runs the launch, switched only at __syncthreads and at warp shuffles, in an order the test chooses
// (SetOrder): a kernel whose result depends on that order has a race. The emulator also
// reports, as a launch error, what the hardware would leave undefined or reject: a barrier not
// every thread reaches (a deadlock here), a full-mask shuffle over a warp with lanes missing,
// and launch configurations the device refuses (no blocks, more than 1024 threads, gridDim.y or
// .z over 65535, more than 227 KiB of dynamic shared memory). Shared memory starts as NaN bytes.
//
// Arithmetic is the host's: expf and friends are glibc's, not libdevice's, and nothing is
// contracted into FMAs, so results match the GPU's to rounding, not bit for bit.
#pragma once

#define CLEAVE_CUDA_EMULATED_DEVICE 1  // for tests that steer the emulation

#include <math.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
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

// Runs `body` once per thread of every block, now, on the calling thread. Launch errors are
// kept for cudaGetLastError.
void LaunchErased(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, void (*run)(void*), void* body);
// The launch configuration's error as the device would refuse it at the launch (recorded as
// the launch's fault and kept for cudaGetLastError); cudaSuccess when it is accepted.
cudaError_t CheckLaunch(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes);
// Queues `work` on `stream`, whose own thread runs its work in order (cudart.cc); the default
// stream runs it now, once the calling thread's blocking streams have drained.
void Enqueue(cudaStream_t stream, std::function<void()> work);

// Whether cuBLASLt refuses the bias-gradient epilogues (BGRADA, BGRADB) with
// CUBLAS_STATUS_NOT_SUPPORTED, as a library or a layout without such kernels does: at the
// heuristic, or only at the matmul call (neither by default). For tests of the caller's fallback.
enum class EpilogueRefusal { kNone, kAtHeuristic, kAtCall };
void SetBiasGradientEpilogueRefusal(EpilogueRefusal refusal);
// The same for the GELU epilogues that write or read the GELU input (GELU_AUX, GELU_AUX_BIAS,
// DGELU), as a library without them for a shape would.
void SetGeluAuxEpilogueRefusal(EpilogueRefusal refusal);

// What the calling host thread has asked of the emulated device: what a test counts to show
// that a step queues its work and runs ahead of the device, as it must to keep a GPU busy.
struct HostCalls {
  int64_t launches = 0;  // kernels (and cuBLASLt products) queued or run
  int64_t mallocs = 0;   // cudaMalloc calls
  // Calls that return only once device work has finished: stream, device and event
  // synchronisations, copies into host memory, and cudaFree and cudaFreeHost (which
  // synchronise).
  int64_t stream_syncs = 0, device_syncs = 0, event_syncs = 0, copies_to_host = 0, frees = 0;
  int64_t waits() const { return stream_syncs + device_syncs + event_syncs + copies_to_host + frees; }
};
HostCalls& ThisThreadCalls();

// Streams the calling thread makes from now on wait `lag` before each piece of their work (0:
// none), so that a test makes some streams fall behind others and the host: work that is not
// ordered after theirs by an event or a synchronisation then reads what they have not written.
void SetNewStreamLag(std::chrono::microseconds lag);

// A launch on a stream is queued with copies of its arguments, taken now (translate.cc makes
// `body` own them), as the device takes a kernel's parameters by value at the launch; its
// configuration is checked now. One on the default stream runs at once.
template <typename K, typename... A>
auto Bind(K kernel, A... args) {
  return [kernel, args...] { kernel(args...); };
}
template <typename Body>
void RunBody(void* body) {
  (*static_cast<Body*>(body))();
}
template <typename F>
void Launch(const char* kernel, F&& body, dim3 grid, dim3 block, size_t shared_bytes = 0,
            cudaStream_t stream = nullptr) {
  using Body = std::remove_cvref_t<F>;
  ++ThisThreadCalls().launches;
  if (!stream) {
    LaunchErased(kernel, grid, block, shared_bytes, &RunBody<Body>, &body);
    return;
  }
  if (CheckLaunch(kernel, grid, block, shared_bytes) != cudaSuccess) return;
  Enqueue(stream, [kernel, grid, block, shared_bytes, owned = Body(std::forward<F>(body))]() mutable {
    LaunchErased(kernel, grid, block, shared_bytes, &RunBody<Body>, &owned);
  });
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
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }

// ---- Runtime functions --------------------------------------------------------------------
// The device is the host: one device of kEmulatedDeviceBytes, allocations are host memory
// (256-byte aligned, filled with 0xff bytes, so a read before a write shows as NaN). Each
// stream is a thread that runs its work in order, apart from the host and from other streams,
// as the device's streams are: what is not ordered by events and synchronisation races here
// too. Events complete when their stream reaches them. Each host thread is its own device
// context: the default stream and cudaFree synchronise with the streams that thread made (the
// ranks of one process stand for processes, each with its own GPU).
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
// Page-locked host memory: a copy from it is not staged, so the copy reads it when its stream
// reaches the copy, as the device's DMA does. cudaFreeHost synchronises, as cudaFree does.
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
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
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
template <typename F>
cudaError_t cudaFuncSetAttribute(F*, cudaFuncAttribute, int value) {
  return value >= 0 ? cudaSuccess : cudaErrorInvalidValue;
}
