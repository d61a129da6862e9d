// What Pad and Tile make of their inputs (providers/), for the CPU and CUDA providers' kernels
// alike: the mode, each dim's padding before, and the output's dims, every input checked.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "base/fixed_vector.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "kernels/pad_coord.h"

namespace cleave::providers {

// Pad's mode attribute (wrap from version 19); InvalidArgument naming the node otherwise.
// ai.cleave.PadGrad takes every mode: kPadGradEveryMode as its version.
absl::StatusOr<kernels::PadMode> PadModeOf(const graph::Node& n, int version);
inline constexpr int kPadGradEveryMode = 19;

struct PadPlan {
  int64_t before[kMaxRank] = {};  // per dim (negative: cropped, constant mode only)
  DimVector out;
};
// Pad(x, pads[, constant_value][, axes]): pads holds the begins then the ends of the dims `axes`
// names (negative ones from the end; all dims when null).
absl::StatusOr<PadPlan> PlanPad(const TensorView& x, const TensorView& pads, const TensorView* axes,
                                kernels::PadMode mode);

// ai.cleave.PadGrad(dY, pads) {mode}: dX of x's dims (dY's less the pads, which give the begins
// then the ends of every dim, none negative), and each dim's preimages (kernels/pad_coord.h) in
// `index`, which `layout.pre` points into (host memory; a device kernel needs them copied).
struct PadGradPlan {
  DimVector x_dims;
  std::vector<int64_t> index;
  kernels::PadGradLayout layout;
  // Where dim d's offsets and coords start in `index`.
  int64_t offsets_at[kMaxRank] = {}, coords_at[kMaxRank] = {};
};
absl::StatusOr<PadGradPlan> PlanPadGrad(const TensorView& dy, const TensorView& pads, kernels::PadMode mode);

// Tile(x, repeats): x's dims times the repeats.
absl::StatusOr<DimVector> PlanTile(const TensorView& x, const TensorView& repeats);

}  // namespace cleave::providers
