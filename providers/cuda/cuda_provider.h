// The CUDA execution provider (providers/cuda/): skeleton. It reports the devices it sees
// and claims no nodes yet, so every node falls back to the CPU provider.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "providers/execution_provider.h"

namespace cleave::providers {

// Number of visible CUDA devices, or an error naming why none can be used (no driver,
// driver too old, no device).
absl::StatusOr<int> CudaDeviceCount();

}  // namespace cleave::providers
