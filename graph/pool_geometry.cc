// The pooling window geometry (graph/pool_geometry.h).
#include "graph/pool_geometry.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::graph {

PoolAttrs PoolAttrsOf(const Node& n) {
  PoolAttrs a;
  a.global = n.op_type().rfind("Global", 0) == 0 || n.AttrInt("global", 0) != 0;
  a.auto_pad = n.AttrString("auto_pad", "NOTSET");
  a.kernel_shape = n.AttrInts("kernel_shape");
  a.strides = n.AttrInts("strides");
  a.dilations = n.AttrInts("dilations");
  a.pads = n.AttrInts("pads");
  a.ceil_mode = n.AttrInt("ceil_mode", 0) != 0;
  a.count_include_pad = n.AttrInt("count_include_pad", 0) != 0;
  a.storage_order = n.AttrInt("storage_order", 0);
  return a;
}

absl::StatusOr<PoolGeometry> PlanPoolGeometry(std::span<const int64_t> in, const PoolAttrs& a) {
  PoolGeometry g;
  const int s = static_cast<int>(in.size());
  if (s < 1 || s > kMaxRank - 2)
    return InvalidArgument("expected 1 to ", kMaxRank - 2, " spatial dims, got ", s);
  g.spatial = s;
  // Bounds that keep every product below in int64 (no real pooling comes near them).
  constexpr int64_t kLimit = int64_t{1} << 31;
  for (int d = 0; d < s; ++d)
    if (in[d] < 1 || in[d] >= kLimit)
      return InvalidArgument("spatial dim ", d, " is ", in[d], "; expected 1 to 2^31 - 1");
  if (a.global) {
    for (int d = 0; d < s; ++d) {
      g.kernel[d] = in[d];
      g.stride[d] = g.dilation[d] = g.out[d] = 1;
    }
    return g;
  }
  if (static_cast<int>(a.kernel_shape.size()) != s)
    return InvalidArgument("expected kernel_shape of ", s, " values (the spatial dims), got [",
                           absl::StrJoin(a.kernel_shape, ","), "]");
  auto list = [&](const std::vector<int64_t>& v, const char* name, int64_t* out) -> absl::Status {
    if (!v.empty() && static_cast<int>(v.size()) != s)
      return InvalidArgument("expected ", s, " ", name, ", got [", absl::StrJoin(v, ","), "]");
    for (int d = 0; d < s; ++d) {
      out[d] = v.empty() ? 1 : v[d];
      if (out[d] < 1 || out[d] >= kLimit) return InvalidArgument(name, " must be 1 to 2^31 - 1, got ", out[d]);
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(list(a.kernel_shape, "kernel_shape", g.kernel));
  RETURN_IF_ERROR(list(a.strides, "strides", g.stride));
  RETURN_IF_ERROR(list(a.dilations, "dilations", g.dilation));
  if (a.auto_pad != "NOTSET" && a.auto_pad != "VALID" && a.auto_pad != "SAME_UPPER" && a.auto_pad != "SAME_LOWER")
    return InvalidArgument("expected auto_pad NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '", a.auto_pad, "'");
  const bool explicit_pads = a.auto_pad == "NOTSET" && !a.pads.empty();
  if (explicit_pads && static_cast<int>(a.pads.size()) != 2 * s)
    return InvalidArgument("expected ", 2 * s, " pads, got [", absl::StrJoin(a.pads, ","), "]");
  for (int d = 0; d < s; ++d) {
    const int64_t span = g.dilation[d] * (g.kernel[d] - 1) + 1;
    if (a.auto_pad == "SAME_UPPER" || a.auto_pad == "SAME_LOWER") {
      g.out[d] = (in[d] + g.stride[d] - 1) / g.stride[d];
      const int64_t total = std::max<int64_t>(0, (g.out[d] - 1) * g.stride[d] + span - in[d]);
      g.pad_begin[d] = a.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pad_end[d] = total - g.pad_begin[d];
      continue;
    }
    if (explicit_pads) {
      g.pad_begin[d] = a.pads[d];
      g.pad_end[d] = a.pads[s + d];
      if (g.pad_begin[d] < 0 || g.pad_end[d] < 0 || g.pad_begin[d] >= kLimit || g.pad_end[d] >= kLimit)
        return InvalidArgument("pads must be 0 to 2^31 - 1, got [", absl::StrJoin(a.pads, ","), "]");
    }
    const int64_t padded = in[d] + g.pad_begin[d] + g.pad_end[d];
    if (padded < span)
      return InvalidArgument("spatial dim ", d, " of ", in[d], " (padded to ", padded, ") is smaller than the ", span,
                             " the dilated kernel spans");
    g.out[d] = (padded - span) / g.stride[d] + 1;
    if (a.ceil_mode && (padded - span) % g.stride[d] != 0) {
      ++g.out[d];
      // The last window must start inside the input or its begin padding.
      if ((g.out[d] - 1) * g.stride[d] >= in[d] + g.pad_begin[d]) --g.out[d];
    }
  }
  return g;
}

UnpoolSize UnpoolSizeOf(const Node& n) {
  const std::vector<int64_t> kernel = n.AttrInts("kernel_shape");
  const size_t spatial = kernel.size();
  std::vector<int64_t> strides = n.AttrInts("strides"), pads = n.AttrInts("pads");
  strides.resize(spatial, 1);
  pads.resize(2 * spatial, 0);
  UnpoolSize u{{1, 1}, {0, 0}};
  for (size_t d = 0; d < spatial; ++d) {
    u.scale.push_back(strides[d]);
    u.shift.push_back(kernel[d] - strides[d] - pads[d] - pads[spatial + d]);
  }
  return u;
}

}  // namespace cleave::graph
