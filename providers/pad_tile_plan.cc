// Pad's and Tile's input checks and output dims (providers/).
#include "providers/pad_tile_plan.h"

#include <string>

#include "base/status.h"
#include "providers/axis.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

using kernels::PadMode;

absl::StatusOr<PadMode> PadModeOf(const graph::Node& n, int version) {
  const std::string m = n.AttrString("mode", "constant");
  if (m == "constant") return PadMode::kConstant;
  if (m == "reflect") return PadMode::kReflect;
  if (m == "edge") return PadMode::kEdge;
  if (m == "wrap" && version >= 19) return PadMode::kWrap;
  return InvalidArgument(n.Describe(), ": expected mode constant, reflect, edge", version >= 19 ? " or wrap" : "",
                         ", got '", m, "'");
}

absl::StatusOr<PadPlan> PlanPad(const TensorView& x, const TensorView& pads, const TensorView* axes_in,
                                PadMode mode) {
  const int r = x.rank;
  // The dims padded: `axes` (negative ones from the end), or all.
  int axes[kMaxRank];
  int naxes = r;
  for (int k = 0; k < r; ++k) axes[k] = k;
  if (axes_in) {
    naxes = static_cast<int>(axes_in->numel());
    if (naxes > r) return InvalidArgument("expected at most ", r, " axes, got ", naxes);
    bool seen[kMaxRank] = {};
    for (int j = 0; j < naxes; ++j) {
      ASSIGN_OR_RETURN(const int a, ResolveAxis(IntAt(*axes_in, j), r));
      if (seen[a]) return InvalidArgument("axis ", a, " appears more than once");
      seen[a] = true;
      axes[j] = a;
    }
  }
  if (pads.numel() != 2 * naxes)
    return InvalidArgument("expected ", 2 * naxes, " pads (begins then ends of ", naxes, " dims), got ", pads.numel());
  PadPlan p;
  int64_t after[kMaxRank] = {};
  for (int j = 0; j < naxes; ++j) {
    p.before[axes[j]] = IntAt(pads, j);
    after[axes[j]] = IntAt(pads, naxes + j);
  }
  for (int k = 0; k < r; ++k) {
    int64_t d = 0;
    if (__builtin_add_overflow(x.dims[k], p.before[k], &d) || __builtin_add_overflow(d, after[k], &d))
      return InvalidArgument("pads ", p.before[k], " and ", after[k], " of dim ", k, " overflow int64");
    if (d < 0)
      return InvalidArgument("pads ", p.before[k], " and ", after[k], " crop dim ", k, " of ", x.dims[k], " below 0");
    if (mode != PadMode::kConstant && (p.before[k] < 0 || after[k] < 0))
      return InvalidArgument("negative pads crop only in constant mode");
    if (mode != PadMode::kConstant && x.dims[k] == 0 && d > 0)
      return InvalidArgument("dim ", k, " is empty: nothing to pad it with in this mode");
    p.out.push_back(d);
  }
  return p;
}

absl::StatusOr<PadGradPlan> PlanPadGrad(const TensorView& dy, const TensorView& pads, PadMode mode) {
  const int r = dy.rank;
  if (r > kernels::kPadGradMaxRank) return Unimplemented("rank ", r, " over ", kernels::kPadGradMaxRank);
  if (pads.numel() != 2 * r)
    return InvalidArgument("expected ", 2 * r, " pads (begins then ends of every dim), got ", pads.numel());
  PadGradPlan p;
  int64_t before[kMaxRank], size = 0;
  for (int k = 0; k < r; ++k) {
    before[k] = IntAt(pads, k);
    const int64_t after = IntAt(pads, r + k);
    if (before[k] < 0 || after < 0 || before[k] > dy.dims[k] || after > dy.dims[k] - before[k])
      return InvalidArgument("pads ", before[k], " and ", after, " of dim ", k, " do not fit dY's ", dy.dims[k]);
    const int64_t len = dy.dims[k] - before[k] - after;
    if (len == 0 && dy.dims[k] > 0 && mode != PadMode::kConstant)
      return InvalidArgument("dim ", k, " of the input is empty: nothing was padded with it in this mode");
    p.x_dims.push_back(len);
    p.offsets_at[k] = size;
    p.coords_at[k] = size + len + 1;
    size += len + 1 + dy.dims[k];
  }
  p.index.resize(static_cast<size_t>(size));
  kernels::PadGradLayout& l = p.layout;
  l.rank = r;
  int64_t stride = 1;
  for (int k = r - 1; k >= 0; --k) {
    l.x_dims[k] = p.x_dims[k];
    l.y_strides[k] = stride;
    stride *= dy.dims[k];
  }
  for (int k = 0; k < r; ++k) {
    int64_t* offsets = p.index.data() + p.offsets_at[k];
    int64_t* coords = p.index.data() + p.coords_at[k];
    if (p.x_dims[k] > 0) kernels::BuildPadPreimages(before[k], p.x_dims[k], dy.dims[k], mode, offsets, coords);
    else offsets[0] = 0;
    l.pre[k] = {offsets, coords};
  }
  return p;
}

absl::StatusOr<DimVector> PlanTile(const TensorView& x, const TensorView& rep) {
  const int r = x.rank;
  if (rep.numel() != r) return InvalidArgument("expected ", r, " repeats (one per dim), got ", rep.numel());
  if (r == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
  DimVector out;
  for (int k = 0; k < r; ++k) {
    const int64_t n = IntAt(rep, k);
    if (n < 0) return InvalidArgument("repeat ", n, " of dim ", k, " is negative");
    int64_t d = 0;
    if (__builtin_mul_overflow(x.dims[k], n, &d))
      return InvalidArgument("repeat ", n, " of dim ", k, " (", x.dims[k], ") overflows int64");
    out.push_back(d);
  }
  return out;
}

}  // namespace cleave::providers
