// GridSample's attributes and shapes as the layout of kernels/grid_sample.h (providers/).
#include "providers/grid_sample_plan.h"

#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::providers {

absl::StatusOr<kernels::GridSampleLayout> GridSampleAttrsOf(const graph::Node& n) {
  kernels::GridSampleLayout l;
  // Version 16 spells the modes bilinear and bicubic; 20 on, linear and cubic.
  const std::string mode = n.AttrString("mode", "linear");
  if (mode == "linear" || mode == "bilinear") l.mode = kernels::GridMode::kLinear;
  else if (mode == "nearest") l.mode = kernels::GridMode::kNearest;
  else if (mode == "cubic" || mode == "bicubic") l.mode = kernels::GridMode::kCubic;
  else return InvalidArgument(n.Describe(), ": mode \"", mode, "\"; expected linear, nearest or cubic");
  const std::string padding = n.AttrString("padding_mode", "zeros");
  if (padding == "zeros") l.padding = kernels::GridPadding::kZeros;
  else if (padding == "border") l.padding = kernels::GridPadding::kBorder;
  else if (padding == "reflection") l.padding = kernels::GridPadding::kReflection;
  else return InvalidArgument(n.Describe(), ": padding_mode \"", padding, "\"; expected zeros, border or reflection");
  const int64_t align = n.AttrInt("align_corners", 0);
  if (align != 0 && align != 1) return InvalidArgument(n.Describe(), ": align_corners ", align, "; expected 0 or 1");
  l.align_corners = align == 1;
  return l;
}

absl::StatusOr<kernels::GridSampleLayout> PlanGridSample(kernels::GridSampleLayout l, std::span<const int64_t> x,
                                                         std::span<const int64_t> grid) {
  const auto dims = [](std::span<const int64_t> d) { return absl::StrCat("[", absl::StrJoin(d, ", "), "]"); };
  if (x.size() < 3) return InvalidArgument("expected X [N, C, spatial...] of rank >= 3, got ", dims(x));
  if (grid.size() != x.size())
    return InvalidArgument("expected a grid of X's rank ", x.size(), " ([N, out..., ", x.size() - 2, "]), got ",
                           dims(grid));
  const int axes = static_cast<int>(x.size()) - 2;
  if (axes > kernels::kMaxGridAxes)
    return Unimplemented(axes, " spatial axes (X ", dims(x), "); at most ", kernels::kMaxGridAxes, " are supported");
  if (grid[0] != x[0]) return InvalidArgument("grid ", dims(grid), " and X ", dims(x), " differ in the batch");
  if (grid.back() != axes)
    return InvalidArgument("grid ", dims(grid), " ends in ", grid.back(), "; expected ", axes,
                           " (one coordinate per spatial axis of X ", dims(x), ")");
  l.axes = axes;
  l.batch = x[0];
  l.channels = x[1];
  l.out_points = 1;
  for (int d = 0; d < axes; ++d) {
    l.in[d] = x[static_cast<size_t>(d) + 2];
    l.out_points *= grid[static_cast<size_t>(d) + 1];
  }
  if (GridInPoints(l) == 0 && l.batch * l.channels * l.out_points > 0)
    return InvalidArgument("cannot sample X ", dims(x), ", whose spatial dims hold no element, at grid ", dims(grid));
  return l;
}

std::vector<int64_t> GridSampleOutputDims(const kernels::GridSampleLayout& l, std::span<const int64_t> grid) {
  std::vector<int64_t> y = {l.batch, l.channels};
  y.insert(y.end(), grid.begin() + 1, grid.end() - 1);
  return y;
}

}  // namespace cleave::providers
