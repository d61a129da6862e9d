// The CUDA runtime calls of the provider (providers/cuda/) over the emulated device of
// cuda_emu.h: device memory is host memory, streams run their work as it is enqueued, events
// record the host clock.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "cuda_emu.h"

namespace {

struct Memory {
  std::mutex mu;
  std::unordered_map<void*, size_t> blocks;
  size_t used = 0;
};
Memory& Mem() {
  static Memory* m = new Memory;
  return *m;
}

}  // namespace

struct CUstream_st {
  unsigned int flags = 0;
};
struct CUevent_st {
  unsigned int flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaDriverGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* q = rounded <= kEmulatedDeviceBytes - m.used ? std::aligned_alloc(256, rounded > 0 ? rounded : 256) : nullptr;
  if (!q) {
    *p = nullptr;
    cleave::cuda_emu::SetLastError(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  std::memset(q, 0xff, rounded);  // a read before any write is NaN, as garbage would be
  m.blocks[q] = rounded;
  m.used += rounded;
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(p);
  if (it == m.blocks.end()) return cudaErrorInvalidValue;
  m.used -= it->second;
  m.blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  *free_bytes = kEmulatedDeviceBytes - m.used;
  *total_bytes = kEmulatedDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  *s = new CUstream_st{flags};
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int) {
  return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  *e = new CUevent_st{flags, false, {}};
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return cudaErrorInvalidResourceHandle;
  e->recorded = true;
  e->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidResourceHandle; }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidResourceHandle; }
// As the runtime: both events recorded, neither made without timing.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->recorded || !end->recorded) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}
