// CUDA provider skeleton: device discovery through the runtime API (providers/cuda/).
#include "providers/cuda/cuda_provider.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace cleave::providers {

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return absl::UnavailableError(absl::StrCat("CUDA unavailable: ", cudaGetErrorString(err)));
  if (n == 0) return absl::UnavailableError("CUDA unavailable: no device");
  return n;
}

}  // namespace cleave::providers
