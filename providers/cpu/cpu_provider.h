// The CPU execution provider (providers/cpu/): the reference provider and the fallback for
// every other. Its kernel table is filled by the Register*Kernels functions below, one per
// family of ops, each defined next to those kernels.
#pragma once

#include <memory>

#include "providers/execution_provider.h"

namespace cleave::providers {

void RegisterElementwiseKernels(KernelRegistry& r);  // cpu/elementwise_ops.cc
void RegisterNnKernels(KernelRegistry& r);           // cpu/nn_ops.cc
void RegisterShapeKernels(KernelRegistry& r);        // cpu/shape_ops.cc
void RegisterGradKernels(KernelRegistry& r);         // cpu/grad_ops.cc
void RegisterSwiGluKernels(KernelRegistry& r);       // cpu/swiglu_ops.cc
void RegisterRotaryKernels(KernelRegistry& r);       // cpu/rotary_ops.cc
void RegisterAxisKernels(KernelRegistry& r);         // cpu/axis_ops.cc
void RegisterNdIndexKernels(KernelRegistry& r);      // cpu/nd_index_ops.cc
void RegisterSelectionKernels(KernelRegistry& r);    // cpu/selection_ops.cc
void RegisterPadTileKernels(KernelRegistry& r);      // cpu/pad_tile_ops.cc
void RegisterConvKernels(KernelRegistry& r);         // cpu/conv_ops.cc
void RegisterPoolKernels(KernelRegistry& r);         // cpu/pool_ops.cc
void RegisterResizeKernels(KernelRegistry& r);       // cpu/resize_ops.cc
void RegisterGridSampleKernels(KernelRegistry& r);   // cpu/grid_sample_ops.cc
void RegisterRandomKernels(KernelRegistry& r);       // cpu/random_ops.cc
void RegisterSpectralKernels(KernelRegistry& r);     // cpu/spectral_ops.cc
void RegisterRoiAlignKernels(KernelRegistry& r);     // cpu/roi_align_ops.cc
void RegisterLinalgKernels(KernelRegistry& r);       // cpu/linalg_ops.cc
void RegisterBatchNormKernels(KernelRegistry& r);    // cpu/batch_norm_ops.cc
void RegisterOptimizerKernels(KernelRegistry& r);    // cpu/optimizer_ops.cc
void RegisterCollectiveKernels(KernelRegistry& r);   // cpu/collective_ops.cc
// bf16/fp16 twins of some float32 kernels above, so it runs after them.
void RegisterLowPrecisionKernels(KernelRegistry& r);  // cpu/low_precision_ops.cc

class CpuAllocator : public Allocator {
 public:
  void* Allocate(size_t bytes) override;
  void Free(void* p) override;
  DeviceKind device() const override { return DeviceKind::kCpu; }
};

class CpuExecutionProvider : public ExecutionProvider {
 public:
  // num_threads: intra-op threads including the caller (0 = CLEAVE_NUM_THREADS or all cores).
  explicit CpuExecutionProvider(int num_threads = 0);
  ~CpuExecutionProvider() override;
  std::string name() const override { return "CPUExecutionProvider"; }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  Allocator* allocator() override { return &allocator_; }
  absl::Status CopyTensor(const TensorView& src, TensorView& dst) const override;
  absl::Status Zero(TensorView& dst) const override;
  ThreadPool* thread_pool() const override { return pool_; }

 private:
  CpuAllocator allocator_;
  std::unique_ptr<ThreadPool> owned_pool_;
  ThreadPool* pool_;
};

}  // namespace cleave::providers
