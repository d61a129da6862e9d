// What the pooling kernels make of their inputs (providers/), for the CPU and CUDA providers
// alike: the plane layout (kernels/pool_window.h) from X's dims and the node's attributes
// (graph/pool_geometry.h), and the output's dims.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "base/fixed_vector.h"
#include "base/tensor.h"
#include "graph/pool_geometry.h"
#include "kernels/pool_window.h"

namespace cleave::providers {

struct PoolPlan {
  kernels::PoolLayout layout;
  int64_t planes = 0;  // N * C
  DimVector out;       // [N, C, out...]
};

// X [N, C, spatial...] of rank 3 to 8; InvalidArgument saying what disagrees.
absl::StatusOr<PoolPlan> PlanPool(std::span<const int64_t> x, const graph::PoolAttrs& a);

// The plan of a pooling gradient: X's dims and dY's, which must be the forward's output.
absl::StatusOr<PoolPlan> PlanPoolGrad(std::span<const int64_t> x, std::span<const int64_t> dy,
                                      const graph::PoolAttrs& a);

// X's dims from ai.cleave.AveragePoolGrad's shape input (int64, one value per dim).
absl::StatusOr<DimVector> PoolInputDims(const TensorView& shape);

}  // namespace cleave::providers
