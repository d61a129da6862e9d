// What a GridSample node and its gradient ai.cleave.GridSampleGrad make of their attributes and
// the shapes of X and the grid (providers/), for the CPU and CUDA providers alike: the layout of
// kernels/grid_sample.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "kernels/grid_sample.h"

namespace cleave::providers {

// The node's mode (linear / bilinear, nearest, cubic / bicubic), padding_mode (zeros, border,
// reflection) and align_corners; InvalidArgument naming the attribute and its value otherwise.
absl::StatusOr<kernels::GridSampleLayout> GridSampleAttrsOf(const graph::Node& n);

// `attrs` completed for X of dims `x` [N, C, in...] and a grid of dims `grid` [N, out..., axes]:
// InvalidArgument saying what disagrees (the ranks, the batch, the grid's last dim), or
// Unimplemented past kMaxGridAxes spatial axes.
absl::StatusOr<kernels::GridSampleLayout> PlanGridSample(kernels::GridSampleLayout attrs,
                                                         std::span<const int64_t> x,
                                                         std::span<const int64_t> grid);

// Y's dims [N, C, out...] for a planned layout and the grid's dims [N, out..., axes].
std::vector<int64_t> GridSampleOutputDims(const kernels::GridSampleLayout& l, std::span<const int64_t> grid);

}  // namespace cleave::providers
