// The CUDA execution provider (providers/cuda/).
//
// One provider per device. It owns a stream (every kernel and copy of the provider is
// enqueued on it, so device buffers can be reused in stream order), a cuBLASLt handle with its
// workspace, and a caching arena (providers/arena_allocator.h) over cudaMalloc, so steady-state
// steps make no cudaMalloc. CopyTensor moves tensors between host and device on the stream: a
// copy to the device (a step's token ids) goes through a page-locked buffer and returns without
// waiting for the device, a copy to the host waits for it.
//
// The kernel table claims fp32/bf16/fp16 elementwise ops with broadcasting, MatMul and
// FusedMatMul (cuBLASLt, bias and GELU epilogues), Softmax and LogSoftmax, LayerNormalization
// and its gradient, Gelu and GeluGrad, Cast, Gather and GatherGrad, Transpose, the shape ops
// (Reshape, Flatten, Squeeze, Unsqueeze, Identity), SoftmaxCrossEntropyLoss and its gradient,
// AdamW, SquaredNorm and IsAllFinite, the reductions, Where, Concat and Split, and fused
// Attention with its gradient (cuDNN's fused flash attention for the bf16/fp16 shapes it takes,
// own flash-style kernels otherwise); other nodes fall back to the CPU provider with copies at
// the boundaries.
//
// Errors are Status values naming the kernel (node) and the CUDA error.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "providers/arena_allocator.h"
#include "providers/execution_provider.h"

namespace cleave::providers {

// Number of visible CUDA devices, or an error naming why none can be used (no driver, a
// driver older than the runtime this build needs, no device).
absl::StatusOr<int> CudaDeviceCount();

struct CudaProviderOptions {
  // The arena never takes more than this (0: as much as the device has).
  size_t memory_limit_bytes = 0;
  size_t cublas_workspace_bytes = size_t{32} << 20;
  // Conv and ConvGrad lay out the patches of as many images at a time as keep their scratch
  // under this (one image at least).
  size_t conv_chunk_bytes = size_t{256} << 20;
};

class CudaExecutionProvider : public ExecutionProvider {
 public:
  // The provider of device `device`, or why it cannot be made (see CudaDeviceCount; an
  // index out of range names the devices there are).
  static absl::StatusOr<std::unique_ptr<ExecutionProvider>> Create(int device, CudaProviderOptions options = {});
  // A provider with the kernel table and no device: answers GetCapability (what would run on
  // CUDA) on any machine; its kernels must not be created.
  static std::unique_ptr<CudaExecutionProvider> ForCapabilityQueries();
  ~CudaExecutionProvider() override;

  std::string name() const override { return "CUDAExecutionProvider"; }
  DeviceKind device() const override { return DeviceKind::kCuda; }
  Allocator* allocator() override { return arena_.get(); }
  absl::Status CopyTensor(const TensorView& src, TensorView& dst) const override;
  // cudaMemsetAsync on the stream: no host buffer, no wait.
  absl::Status Zero(TensorView& dst) const override;
  // CUDA events on the stream (timing enabled), for the profiler's device track.
  std::unique_ptr<StreamTimer> MakeStreamTimer() const override;

  int device_index() const { return device_; }
  void* stream() const { return stream_; }          // cudaStream_t
  void* cublaslt() const { return cublaslt_; }      // cublasLtHandle_t
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  size_t conv_chunk_bytes() const { return conv_chunk_bytes_; }
  // Device scratch of one double for reductions (valid for the provider's lifetime).
  double* reduction_scratch() const { return reduction_scratch_; }
  const ArenaAllocator& arena() const { return *arena_; }
  // Waits for everything enqueued on the stream; the error names `what`, or else the first
  // index a kernel found out of range since the last wait (see IndexCheckTag).
  absl::Status Synchronize(const std::string& what) const;
  // Out-of-range indices found on the device (Gather, GatherGrad): a kernel records the first
  // one in these 4 words of device memory (null without a device) under its tag, and the next
  // wait on the stream reports it as an error naming `what` (the node), then clears the words.
  // The kernels write zeros (or add nothing) for such an index meanwhile, so nothing faults.
  int64_t* bad_index_words() const { return bad_index_; }
  int64_t IndexCheckTag(const std::string& what) const;
  // cuDNN's fused attention on this provider's stream, made on first use; null when cuDNN
  // cannot be had (cudnn_attention_unavailable() says why), and the kernels use their own.
  class CudnnAttention* cudnn_attention() const;
  const std::string& cudnn_attention_unavailable() const { return cudnn_why_; }

 private:
  CudaExecutionProvider() = default;
  void RegisterKernels();

  int device_ = 0;
  std::unique_ptr<ArenaAllocator> arena_;
  void* stream_ = nullptr;
  void* cublaslt_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  size_t conv_chunk_bytes_ = size_t{256} << 20;
  double* reduction_scratch_ = nullptr;
  int64_t* bad_index_ = nullptr;       // device memory, written by kernels
  int64_t* bad_index_seen_ = nullptr;  // page-locked: their copy at the last wait
  mutable std::mutex checks_mu_;
  mutable std::vector<std::string> checks_;  // tag - 1 -> what
  mutable std::once_flag cudnn_once_;
  mutable std::unique_ptr<class CudnnAttention> cudnn_;
  mutable std::string cudnn_why_;
  mutable std::once_flag uploads_once_;
  mutable std::unique_ptr<class PinnedUploads> uploads_;  // host-to-device copies that do not wait
};

// Registers the collective and Send/Recv kernels (cuda_collectives.cc); they claim nodes only
// while the provider's communicator moves device memory.
void RegisterCudaCollectives(KernelRegistry& r, CudaExecutionProvider* p);

// A Status from a CUDA runtime error code: "<what>: <error name> (<description>)"; OK for 0.
absl::Status CudaStatus(int error, const std::string& what);

}  // namespace cleave::providers
