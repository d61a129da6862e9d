// What Pad and Tile make of their inputs (providers/), for the CPU and CUDA providers' kernels
// alike: the mode, each dim's padding before, and the output's dims, every input checked.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "base/fixed_vector.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "kernels/pad_coord.h"

namespace cleave::providers {

// Pad's mode attribute (wrap from version 19); InvalidArgument naming the node otherwise.
absl::StatusOr<kernels::PadMode> PadModeOf(const graph::Node& n, int version);

struct PadPlan {
  int64_t before[kMaxRank] = {};  // per dim (negative: cropped, constant mode only)
  DimVector out;
};
// Pad(x, pads[, constant_value][, axes]): pads holds the begins then the ends of the dims `axes`
// names (negative ones from the end; all dims when null).
absl::StatusOr<PadPlan> PlanPad(const TensorView& x, const TensorView& pads, const TensorView* axes,
                                kernels::PadMode mode);

// Tile(x, repeats): x's dims times the repeats.
absl::StatusOr<DimVector> PlanTile(const TensorView& x, const TensorView& repeats);

}  // namespace cleave::providers
