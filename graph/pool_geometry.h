// The window geometry of MaxPool, AveragePool and the global pools (graph/): each spatial dim's
// kernel, stride, dilation, padding and output size from the node's attributes and the input's
// spatial dims. Shape inference and both providers' kernels read it from here, so that the
// output a graph declares is the one its kernels write.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"

namespace cleave::graph {

struct PoolAttrs {
  bool global = false;  // GlobalAveragePool / GlobalMaxPool: one window over every spatial dim
  std::string auto_pad = "NOTSET";  // NOTSET, SAME_UPPER, SAME_LOWER, VALID
  std::vector<int64_t> kernel_shape, strides, dilations, pads;  // empty: the defaults
  bool ceil_mode = false;
  bool count_include_pad = false;  // AveragePool
  int64_t storage_order = 0;       // MaxPool's Indices: 0 row-major, 1 column-major
};

// The attributes of a MaxPool, AveragePool, GlobalMaxPool or GlobalAveragePool node, or of their
// gradients ai.cleave.MaxPoolGrad / AveragePoolGrad (which carry the forward's, and `global`).
PoolAttrs PoolAttrsOf(const Node& n);

struct PoolGeometry {
  int spatial = 0;
  int64_t kernel[kMaxRank] = {}, stride[kMaxRank] = {}, dilation[kMaxRank] = {};
  int64_t pad_begin[kMaxRank] = {}, pad_end[kMaxRank] = {}, out[kMaxRank] = {};
};

// The geometry for input spatial dims `in` (each >= 1). The output size of a dim is
// floor((in + pads - dilated kernel) / stride) + 1, or with ceil_mode the ceiling, less one
// when the last window would start in the end padding (PyTorch's rule); SAME_UPPER and
// SAME_LOWER give ceil(in / stride), the odd pad at the end or the beginning. InvalidArgument
// naming the attribute or dim that is out of range.
absl::StatusOr<PoolGeometry> PlanPoolGeometry(std::span<const int64_t> in, const PoolAttrs& a);

// MaxUnpool's default output: per dim of X [N, C, spatial...], the size out = in * scale[d] +
// shift[d] that the pool's input had, (in - 1) * stride - pads + kernel (scale 1 and shift 0 for
// N and C). Shape inference and the decomposition read it from here.
struct UnpoolSize {
  std::vector<int64_t> scale, shift;  // [2 + spatial]
};
UnpoolSize UnpoolSizeOf(const Node& n);

}  // namespace cleave::graph
