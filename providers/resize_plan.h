// What Resize and its gradient make of their roi, scales and sizes inputs (providers/), for the
// CPU and CUDA providers alike: the dims of graph/resize_geometry.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/resize_geometry.h"
#include "providers/kernel.h"

namespace cleave::providers {

// The roi (float32), scales (float32) and sizes (int64) inputs from input `first` on, each absent
// or empty for none, read on the host; InvalidArgument saying what disagrees.
absl::StatusOr<std::vector<graph::ResizeDim>> PlanResizeInputs(const KernelContext& ctx, int first,
                                                               std::span<const int64_t> in,
                                                               const graph::ResizeAttrs& a);

}  // namespace cleave::providers
