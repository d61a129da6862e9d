// The CUDA provider (providers/cuda/): device discovery, the stream, cuBLASLt, the caching
// arena over cudaMalloc, and host/device copies. Kernels are in cuda_kernels.cc.
#include "providers/cuda/cuda_provider.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "providers/cuda/cudnn_attention.h"

namespace cleave::providers {

absl::Status CudaStatus(int error, const std::string& what) {
  if (error == 0) return absl::OkStatus();
  const cudaError_t e = static_cast<cudaError_t>(error);
  const auto code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::StatusOr<int> CudaDeviceCount() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (driver == 0) return absl::UnavailableError("CUDA unavailable: no NVIDIA driver is loaded");
  if (driver < runtime)
    return absl::UnavailableError(absl::StrCat("CUDA unavailable: the driver supports CUDA ", driver / 1000, ".",
                                               (driver % 1000) / 10, " and this build needs ", runtime / 1000, ".",
                                               (runtime % 1000) / 10, "; update the NVIDIA driver"));
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return absl::UnavailableError(absl::StrCat("CUDA unavailable: ", cudaGetErrorName(err), " (",
                                               cudaGetErrorString(err), ")"));
  if (n == 0) return absl::UnavailableError("CUDA unavailable: no device");
  return n;
}

// Host-to-device copies through page-locked buffers, so that they are asynchronous: the source
// is copied into a buffer at the call (its caller may reuse it at once), the device reads the
// buffer in stream order, and an event recorded after that read must have completed before the
// buffer takes the next copy. The buffers are used in turn; by the time one comes round again
// its copy has long run (a step ends with a read of the loss), so the host rarely waits.
class PinnedUploads {
 public:
  // Copies above this size (initializer uploads at set-up) are left to the synchronous path,
  // to keep page-locked memory small.
  static constexpr size_t kMaxBytes = size_t{8} << 20;

  explicit PinnedUploads(int device) : device_(device) {}
  ~PinnedUploads() {
    cudaSetDevice(device_);
    for (Buffer& b : buffers_) {
      if (b.done) {
        cudaEventSynchronize(b.done);
        cudaEventDestroy(b.done);
      }
      if (b.host) cudaFreeHost(b.host);
    }
  }

  // Queues the copy of `bytes` from host `src` to device `dst` on `stream`; false when it is
  // not taken (too large, or no page-locked memory to be had), and the caller copies it itself.
  absl::StatusOr<bool> Upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    if (bytes > kMaxBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    Buffer& b = buffers_[next_];
    if (b.done && cudaEventQuery(b.done) != cudaSuccess)
      RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(b.done), "waiting for an earlier copy to the device"));
    if (b.bytes < bytes) {
      if (b.host) RETURN_IF_ERROR(CudaStatus(cudaFreeHost(b.host), "cudaFreeHost (upload buffer)"));
      b.host = nullptr;
      b.bytes = 0;
      size_t want = 4096;
      while (want < bytes) want *= 2;
      if (cudaMallocHost(&b.host, want) != cudaSuccess) {
        cudaGetLastError();
        b.host = nullptr;
        return false;
      }
      b.bytes = want;
    }
    if (!b.done)
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming), "cudaEventCreate (upload)"));
    std::memcpy(b.host, src, bytes);
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst, b.host, bytes, cudaMemcpyHostToDevice, stream),
                               absl::StrCat("copy of ", bytes, " bytes to the device")));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(b.done, stream), "cudaEventRecord (upload)"));
    next_ = (next_ + 1) % kBuffers;
    return true;
  }

 private:
  static constexpr int kBuffers = 4;
  struct Buffer {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the buffer's latest copy
  };
  int device_;
  std::mutex mu_;
  Buffer buffers_[kBuffers];
  int next_ = 0;
};

absl::StatusOr<std::unique_ptr<ExecutionProvider>> CudaExecutionProvider::Create(int device,
                                                                                 CudaProviderOptions options) {
  ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (device < 0 || device >= count)
    return InvalidArgument("CUDA device ", device, " does not exist: this machine has ", count, " (0..", count - 1, ")");
  std::unique_ptr<CudaExecutionProvider> p(new CudaExecutionProvider());
  p->device_ = device;
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  cudaStream_t stream;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  p->stream_ = stream;
  cublasLtHandle_t lt;
  if (cublasStatus_t s = cublasLtCreate(&lt); s != CUBLAS_STATUS_SUCCESS)
    return Internal("cublasLtCreate: ", cublasLtGetStatusName(s));
  p->cublaslt_ = lt;

  ArenaBackend b;
  b.device_name = absl::StrCat("cuda:", device);
  b.kind = DeviceKind::kCuda;
  b.allocate = [device](size_t bytes) -> void* {
    cudaSetDevice(device);
    void* q = nullptr;
    if (cudaMalloc(&q, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      return nullptr;
    }
    return q;
  };
  b.release = [device](void* q) {
    cudaSetDevice(device);
    cudaFree(q);
  };
  b.free_bytes = [device]() -> int64_t {
    cudaSetDevice(device);
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(free_b);
  };
  ArenaOptions ao;
  ao.min_region_bytes = size_t{64} << 20;
  ao.max_region_bytes = size_t{2} << 30;
  ao.limit_bytes = options.memory_limit_bytes;
  p->arena_ = std::make_unique<ArenaAllocator>(std::move(b), ao);
  p->workspace_bytes_ = options.cublas_workspace_bytes;
  p->conv_chunk_bytes_ = options.conv_chunk_bytes;
  ASSIGN_OR_RETURN(p->workspace_, p->arena_->TryAllocate(p->workspace_bytes_));
  ASSIGN_OR_RETURN(void* scratch, p->arena_->TryAllocate(sizeof(double)));
  p->reduction_scratch_ = static_cast<double*>(scratch);
  // The index checks' words: written by kernels in device memory (atomics on mapped host
  // memory are not atomic over PCIe), read through a page-locked copy at each wait.
  ASSIGN_OR_RETURN(void* words, p->arena_->TryAllocate(4 * sizeof(int64_t)));
  p->bad_index_ = static_cast<int64_t*>(words);
  RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(words, 0, 4 * sizeof(int64_t), stream), "zeroing the index checks"));
  void* seen = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&seen, 4 * sizeof(int64_t)), "cudaMallocHost (index checks)"));
  p->bad_index_seen_ = static_cast<int64_t*>(seen);
  p->RegisterKernels();
  return std::unique_ptr<ExecutionProvider>(std::move(p));
}

std::unique_ptr<CudaExecutionProvider> CudaExecutionProvider::ForCapabilityQueries() {
  std::unique_ptr<CudaExecutionProvider> p(new CudaExecutionProvider());
  p->RegisterKernels();
  return p;
}

CudaExecutionProvider::~CudaExecutionProvider() {
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  uploads_.reset();
  cudnn_.reset();
  if (arena_) {
    if (workspace_) arena_->Free(workspace_);
    if (reduction_scratch_) arena_->Free(reduction_scratch_);
    if (bad_index_) arena_->Free(bad_index_);
  }
  if (bad_index_seen_) cudaFreeHost(bad_index_seen_);
  if (cublaslt_) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublaslt_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

absl::Status CudaExecutionProvider::Zero(TensorView& dst) const {
  if (dst.nbytes() == 0) return absl::OkStatus();
  return CudaStatus(cudaMemsetAsync(dst.data, 0, dst.nbytes(), static_cast<cudaStream_t>(stream_)),
                    absl::StrCat("zeroing ", dst.nbytes(), " bytes"));
}

absl::Status CudaExecutionProvider::CopyTensor(const TensorView& src, TensorView& dst) const {
  if (src.nbytes() != dst.nbytes())
    return Internal("CopyTensor: size mismatch ", src.nbytes(), " vs ", dst.nbytes());
  if (src.nbytes() == 0) return absl::OkStatus();
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  const bool to_device = arena_->Owns(dst.data), from_device = arena_->Owns(src.data);
  if (to_device && !from_device) {  // host to device
    std::call_once(uploads_once_, [this] { uploads_ = std::make_unique<PinnedUploads>(device_); });
    ASSIGN_OR_RETURN(bool queued, uploads_->Upload(dst.data, src.data, src.nbytes(), s));
    if (queued) return absl::OkStatus();
  }
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, s),
                             absl::StrCat("CopyTensor of ", src.nbytes(), " bytes")));
  // Within this device's memory the stream orders the copy before whatever reads it next.
  if (to_device && from_device) return absl::OkStatus();
  // The host side must be complete when the copy returns: a host destination is read next, and
  // a host source (pageable) may be reused by the caller.
  return Synchronize(absl::StrCat("CopyTensor of ", src.nbytes(), " bytes"));
}

namespace {

// Timing events on the provider's stream, reused from round to round.
class CudaStreamTimer : public StreamTimer {
 public:
  CudaStreamTimer(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaStreamTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  absl::StatusOr<int> Mark() override {
    if (used_ == events_.size()) {
      cudaSetDevice(device_);
      cudaEvent_t e;
      RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "cudaEventCreate (profiling)"));
      events_.push_back(e);
    }
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events_[used_], stream_), "cudaEventRecord (profiling)"));
    return static_cast<int>(used_++);
  }

  absl::StatusOr<std::vector<double>> Collect() override {
    std::vector<double> us(used_, 0.0);
    const size_t n = std::exchange(used_, 0);
    if (n == 0) return us;
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(events_[n - 1]), "cudaEventSynchronize (profiling)"));
    for (size_t i = 1; i < n; ++i) {
      float ms = 0;
      RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, events_[0], events_[i]), "cudaEventElapsedTime"));
      us[i] = 1000.0 * ms;
    }
    return us;
  }

 private:
  int device_;
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<StreamTimer> CudaExecutionProvider::MakeStreamTimer() const {
  if (!stream_) return nullptr;
  return std::make_unique<CudaStreamTimer>(device_, static_cast<cudaStream_t>(stream_));
}

CudnnAttention* CudaExecutionProvider::cudnn_attention() const {
  std::call_once(cudnn_once_, [this] {
    if (stream_) cudnn_ = CudnnAttention::Create(stream_, &cudnn_why_);
    else cudnn_why_ = "no device";
  });
  return cudnn_.get();
}

absl::Status CudaExecutionProvider::Synchronize(const std::string& what) const {
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  constexpr size_t kWords = 4 * sizeof(int64_t);
  // The index checks' words come back with the work waited for: one wait for both.
  if (bad_index_)
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(bad_index_seen_, bad_index_, kWords, cudaMemcpyDeviceToHost, s), what));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), what));
  const int64_t* w = bad_index_seen_;
  if (!w || w[0] == 0) return absl::OkStatus();
  const int64_t tag = w[0], index = w[1], position = w[2], size = w[3];
  RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(bad_index_, 0, kWords, s), "clearing the index checks"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "clearing the index checks"));
  std::string node;
  {
    std::lock_guard<std::mutex> lock(checks_mu_);
    node = tag >= 1 && tag <= static_cast<int64_t>(checks_.size()) ? checks_[tag - 1] : "a kernel";
  }
  return NamingItsNode(InvalidArgument(node, ": index ", index, " at position ", position,
                                       " is out of range for an axis of size ", size, ": expected [", -size, ", ",
                                       size - 1, "] (found on the device; outputs of that run are not valid)"));
}

int64_t CudaExecutionProvider::IndexCheckTag(const std::string& what) const {
  std::lock_guard<std::mutex> lock(checks_mu_);
  checks_.push_back(what);
  return static_cast<int64_t>(checks_.size());
}

}  // namespace cleave::providers
