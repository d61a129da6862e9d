// CPU provider: kernel table assembly, host allocator, thread pool (providers/cpu/).
#include "providers/cpu/cpu_provider.h"

#include <cstdlib>
#include <cstring>

#include "base/status.h"
#include "kernels/cpu/gemm.h"

namespace cleave::providers {

void* CpuAllocator::Allocate(size_t bytes) {
  size_t rounded = ((bytes + 63) / 64) * 64;
  return std::aligned_alloc(64, rounded ? rounded : 64);
}

void CpuAllocator::Free(void* p) { std::free(p); }

CpuExecutionProvider::CpuExecutionProvider(int num_threads) {
  if (num_threads <= 0) {
    pool_ = ThreadPool::Default();
  } else {
    owned_pool_ = std::make_unique<ThreadPool>(num_threads);
    pool_ = owned_pool_.get();
  }
  kernels::cpu::SetGemmThreads(pool_->num_threads());
  RegisterElementwiseKernels(registry_);
  RegisterNnKernels(registry_);
  RegisterShapeKernels(registry_);
  RegisterGradKernels(registry_);
  RegisterSwiGluKernels(registry_);
  RegisterRotaryKernels(registry_);
  RegisterAxisKernels(registry_);
  RegisterNdIndexKernels(registry_);
  RegisterSelectionKernels(registry_);
  RegisterPadTileKernels(registry_);
  RegisterConvKernels(registry_);
  RegisterPoolKernels(registry_);
  RegisterResizeKernels(registry_);
  RegisterGridSampleKernels(registry_);
  RegisterRandomKernels(registry_);
  RegisterSpectralKernels(registry_);
  RegisterRoiAlignKernels(registry_);
  RegisterLinalgKernels(registry_);
  RegisterBatchNormKernels(registry_);
  RegisterOptimizerKernels(registry_);
  RegisterCollectiveKernels(registry_);
  RegisterLowPrecisionKernels(registry_);
}

CpuExecutionProvider::~CpuExecutionProvider() = default;

absl::Status CpuExecutionProvider::CopyTensor(const TensorView& src, TensorView& dst) const {
  if (src.nbytes() != dst.nbytes())
    return Internal("CopyTensor: size mismatch ", src.nbytes(), " vs ", dst.nbytes());
  if (src.nbytes()) std::memcpy(dst.data, src.data, src.nbytes());
  return absl::OkStatus();
}

absl::Status CpuExecutionProvider::Zero(TensorView& dst) const {
  if (dst.nbytes()) std::memset(dst.data, 0, dst.nbytes());
  return absl::OkStatus();
}

}  // namespace cleave::providers
