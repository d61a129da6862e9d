// The CUDA runtime calls of the provider (providers/cuda/) over the emulated device of
// cuda_emu.h: device memory is host memory; each stream is a thread that runs its work in
// order; events complete when their stream reaches them.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cuda_emu.h"

namespace {

struct Memory {
  std::mutex mu;
  std::map<const char*, size_t> blocks;  // by base address
  size_t used = 0;
};
Memory& Mem() {
  static Memory* m = new Memory;
  return *m;
}
Memory& Pinned() {  // cudaMallocHost's blocks (`used` unused)
  static Memory* m = new Memory;
  return *m;
}

bool In(Memory& m, const void* p) {
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.upper_bound(static_cast<const char*>(p));
  if (it == m.blocks.begin()) return false;
  --it;
  return static_cast<const char*>(p) < it->first + it->second;
}
// Whether `p` is in an allocation of the emulated device (otherwise it is host memory,
// page-locked when cudaMallocHost made it, which the copies treat as the runtime does).
bool OnDevice(const void* p) { return In(Mem(), p); }
bool IsPinned(const void* p) { return In(Pinned(), p); }

}  // namespace

struct CUstream_st {
  unsigned int flags = 0;
  std::thread::id owner;  // the host thread (device context) that made it
  std::chrono::microseconds lag{0};  // waited before each piece of work (SetNewStreamLag)
  std::mutex mu;
  std::condition_variable cv;  // work queued, work done, or the stream stopping
  std::deque<std::function<void()>> queue;
  bool running = false, stop = false;
  std::thread worker;

  void Work() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> w = std::move(queue.front());
      queue.pop_front();
      running = true;
      lock.unlock();
      if (lag.count() > 0) std::this_thread::sleep_for(lag);
      w();
      w = nullptr;
      lock.lock();
      running = false;
      cv.notify_all();
    }
  }
  void Push(std::function<void()> w) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(w));
    cv.notify_all();
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    return queue.empty() && !running;
  }
  void Drain() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return queue.empty() && !running; });
  }
};

// An event's completion, shared with the work that completes it (which may outlive the event,
// as the runtime lets an event be destroyed while its record is pending).
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;  // records asked for, and reached by their stream
  std::chrono::steady_clock::time_point at;
};
struct CUevent_st {
  unsigned int flags = 0;
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace {

struct Streams {
  std::mutex mu;
  std::set<CUstream_st*> live;
};
Streams& AllStreams() {
  static Streams* s = new Streams;
  return *s;
}

// Waits for the calling thread's streams: its blocking ones (what the default stream
// synchronises with) or all of them.
// (Outside the registry's lock: another thread's stream may wait on this one's.)
void DrainOwn(bool blocking_only) {
  std::vector<CUstream_st*> own;
  {
    Streams& all = AllStreams();
    std::lock_guard<std::mutex> lock(all.mu);
    const std::thread::id me = std::this_thread::get_id();
    for (CUstream_st* s : all.live)
      if (s->owner == me && (!blocking_only || !(s->flags & cudaStreamNonBlocking))) own.push_back(s);
  }
  for (CUstream_st* s : own) s->Drain();
}

}  // namespace

static thread_local std::chrono::microseconds g_new_stream_lag{0};

namespace cleave::cuda_emu {

HostCalls& ThisThreadCalls() {
  static thread_local HostCalls calls;
  return calls;
}

void SetNewStreamLag(std::chrono::microseconds lag) { g_new_stream_lag = lag; }

void Enqueue(cudaStream_t stream, std::function<void()> work) {
  if (stream) {
    stream->Push(std::move(work));
    return;
  }
  DrainOwn(/*blocking_only=*/true);
  work();
}

}  // namespace cleave::cuda_emu

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
  ++cleave::cuda_emu::ThisThreadCalls().mallocs;
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
  m.blocks[static_cast<const char*>(q)] = rounded;
  m.used += rounded;
  *p = q;
  return cudaSuccess;
}

// As the runtime's, a synchronisation: the calling thread's streams finish first.
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  ++cleave::cuda_emu::ThisThreadCalls().frees;
  DrainOwn(/*blocking_only=*/false);
  Memory& m = Mem();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(static_cast<const char*>(p));
  if (it == m.blocks.end()) return cudaErrorInvalidValue;
  m.used -= it->second;
  m.blocks.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* q = std::aligned_alloc(256, rounded > 0 ? rounded : 256);
  *p = q;
  if (!q) return cudaErrorMemoryAllocation;
  Memory& m = Pinned();
  std::lock_guard<std::mutex> lock(m.mu);
  m.blocks[static_cast<const char*>(q)] = rounded;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  ++cleave::cuda_emu::ThisThreadCalls().frees;
  DrainOwn(/*blocking_only=*/false);
  Memory& m = Pinned();
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.blocks.erase(static_cast<const char*>(p))) return cudaErrorInvalidValue;
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

// As the runtime copies host memory: from pageable memory, the source is staged before the
// call returns; from page-locked memory, the stream reads it when it reaches the copy; into
// pageable memory, the call returns once the copy (and the stream's work before it) is done,
// and into page-locked memory on a stream, at once.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  if (!bytes) return cudaSuccess;
  const bool to_device = OnDevice(dst), from_device = OnDevice(src);
  if (to_device && !from_device && !IsPinned(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    cleave::cuda_emu::Enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  cleave::cuda_emu::Enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  if (to_device || (stream && IsPinned(dst))) return cudaSuccess;
  ++cleave::cuda_emu::ThisThreadCalls().copies_to_host;
  if (stream)
    stream->Drain();
  else
    DrainOwn(/*blocking_only=*/true);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  if (!OnDevice(dst) || !OnDevice(src)) {  // the provider's are device to device; others run in order, at once
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) return e;
    stream = nullptr;
  }
  cleave::cuda_emu::Enqueue(stream, [=] {
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes) cleave::cuda_emu::Enqueue(stream, [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  auto* st = new CUstream_st;
  st->flags = flags;
  st->owner = std::this_thread::get_id();
  st->lag = g_new_stream_lag;
  st->worker = std::thread([st] { st->Work(); });
  Streams& all = AllStreams();
  std::lock_guard<std::mutex> lock(all.mu);
  all.live.insert(st);
  *s = st;
  return cudaSuccess;
}
// The stream's queued work finishes first (the runtime lets it finish after the call).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  {
    Streams& all = AllStreams();
    std::lock_guard<std::mutex> lock(all.mu);
    all.live.erase(s);
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  s->worker.join();
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  ++cleave::cuda_emu::ThisThreadCalls().stream_syncs;
  if (s)
    s->Drain();
  else
    DrainOwn(/*blocking_only=*/true);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return !s || s->Idle() ? cudaSuccess : cudaErrorNotReady; }
cudaError_t cudaDeviceSynchronize() {
  ++cleave::cuda_emu::ThisThreadCalls().device_syncs;
  DrainOwn(/*blocking_only=*/false);
  return cudaSuccess;
}
// The stream's later work waits for the event's latest record as it stands now (none: nothing
// to wait for).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventState> st = e->state;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    target = st->recorded;
  }
  if (target == 0) return cudaSuccess;
  cleave::cuda_emu::Enqueue(s, [st, target] {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->completed >= target; });
  });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  *e = new CUevent_st;
  (*e)->flags = flags;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::shared_ptr<EventState> st = e->state;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    target = ++st->recorded;
  }
  cleave::cuda_emu::Enqueue(s, [st, target] {
    std::lock_guard<std::mutex> lock(st->mu);
    st->completed = std::max(st->completed, target);
    st->at = std::chrono::steady_clock::now();
    st->cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  ++cleave::cuda_emu::ThisThreadCalls().event_syncs;
  EventState& st = *e->state;
  std::unique_lock<std::mutex> lock(st.mu);
  const uint64_t target = st.recorded;
  st.cv.wait(lock, [&] { return st.completed >= target; });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return cudaErrorInvalidResourceHandle;
  std::lock_guard<std::mutex> lock(e->state->mu);
  return e->state->completed >= e->state->recorded ? cudaSuccess : cudaErrorNotReady;
}
// As the runtime: both events recorded and reached, neither made without timing.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  std::chrono::steady_clock::time_point at[2];
  cudaEvent_t both[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    EventState& st = *both[i]->state;
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.recorded == 0) return cudaErrorInvalidResourceHandle;
    if (st.completed < st.recorded) return cudaErrorNotReady;
    at[i] = st.at;
  }
  *ms = std::chrono::duration<float, std::milli>(at[1] - at[0]).count();
  return cudaSuccess;
}
