// The pooling kernels' plans (providers/pool_plan.h).
#include "providers/pool_plan.h"

#include "base/status.h"

namespace cleave::providers {

absl::StatusOr<PoolPlan> PlanPool(std::span<const int64_t> x, const graph::PoolAttrs& a) {
  const int r = static_cast<int>(x.size());
  if (r < 3 || r > 2 + kernels::kPoolMaxSpatial)
    return InvalidArgument("expected X [N, C, spatial...] of rank 3 to ", 2 + kernels::kPoolMaxSpatial, ", got ",
                           DimsToString(x));
  ASSIGN_OR_RETURN(const graph::PoolGeometry g, graph::PlanPoolGeometry(x.subspan(2), a));
  PoolPlan p;
  kernels::PoolLayout& l = p.layout;
  l.spatial = g.spatial;
  l.count_include_pad = a.count_include_pad;
  p.planes = x[0] * x[1];
  p.out = {x[0], x[1]};
  for (int d = 0; d < g.spatial; ++d) {
    l.in[d] = x[2 + d];
    l.out[d] = g.out[d];
    l.kernel[d] = g.kernel[d];
    l.stride[d] = g.stride[d];
    l.dilation[d] = g.dilation[d];
    l.pad_begin[d] = g.pad_begin[d];
    l.pad_end[d] = g.pad_end[d];
    l.in_size *= l.in[d];
    l.out_size *= l.out[d];
    p.out.push_back(g.out[d]);
  }
  return p;
}

absl::StatusOr<PoolPlan> PlanPoolGrad(std::span<const int64_t> x, std::span<const int64_t> dy,
                                      const graph::PoolAttrs& a) {
  ASSIGN_OR_RETURN(PoolPlan p, PlanPool(x, a));
  if (DimVector(dy) != p.out)
    return InvalidArgument("expected dY ", DimsToString(p.out.span()), " (the output pooling X ", DimsToString(x),
                           " gives), got ", DimsToString(dy));
  return p;
}

absl::StatusOr<DimVector> PoolInputDims(const TensorView& shape) {
  if (shape.dtype != DataType::kInt64 || shape.rank != 1 || shape.numel() > kMaxRank)
    return InvalidArgument("expected X's shape as int64 [rank <= ", kMaxRank, "], got ", DataTypeName(shape.dtype),
                           " ", DimsToString(shape.dim_span()));
  DimVector dims;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const int64_t v = shape.as<int64_t>()[i];
    if (v < 0) return InvalidArgument("X's shape has a negative dim: ", v);
    dims.push_back(v);
  }
  return dims;
}

}  // namespace cleave::providers
