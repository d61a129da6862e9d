// GatherND and ScatterND planned against their operands (providers/): the kernels' addressing
// (kernels/nd_index.h) and the shapes the spec derives, checked once per run by every
// provider, with errors that say what was expected.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "base/fixed_vector.h"
#include "base/status.h"
#include "base/tensor.h"
#include "kernels/nd_index.h"

namespace cleave::providers {

// data [batch (b dims)..., indexed (k dims)..., slice...], int64 indices [batch..., tuples..., k].
inline absl::StatusOr<kernels::NdIndexLayout> PlanNdIndex(const TensorView& data, const TensorView& idx, int64_t b) {
  if (idx.dtype != DataType::kInt64) return InvalidArgument("expected int64 indices, got ", DataTypeName(idx.dtype));
  if (idx.rank < 1) return InvalidArgument("expected indices of rank >= 1, got a scalar");
  if (b < 0 || b >= std::min(data.rank, idx.rank))
    return InvalidArgument("batch_dims ", b, " must be below both ranks (data ", data.rank, ", indices ", idx.rank, ")");
  for (int d = 0; d < b; ++d)
    if (data.dims[d] != idx.dims[d])
      return InvalidArgument("batch dim ", d, " is ", data.dims[d], " in the data and ", idx.dims[d], " in the indices");
  const int64_t k = idx.dims[idx.rank - 1];
  if (k < 1 || k > data.rank - b || k > kernels::kNdMaxCoordinates)
    return InvalidArgument("the indices' last dim is ", k, "; expected 1 to ", data.rank - b,
                           " coordinates (the data's rank less batch_dims)");
  kernels::NdIndexLayout l;
  l.k = static_cast<int>(k);
  for (int d = 0; d < b; ++d) l.batches *= data.dims[d];
  for (int j = 0; j < l.k; ++j) {
    l.dims[j] = data.dims[b + j];
    l.block *= l.dims[j];
  }
  for (int d = static_cast<int>(b + k); d < data.rank; ++d) l.slice *= data.dims[d];
  for (int d = static_cast<int>(b); d < idx.rank - 1; ++d) l.tuples *= idx.dims[d];
  return l;
}

// GatherND's output (and ScatterND's updates): the indices' dims less the last, then the data's
// after the indexed ones.
inline DimVector NdGatheredDims(const TensorView& data, const TensorView& idx, int64_t b) {
  DimVector out(idx.dim_span().subspan(0, idx.rank - 1));
  for (int d = static_cast<int>(b + idx.dims[idx.rank - 1]); d < data.rank; ++d) out.push_back(data.dims[d]);
  return out;
}

}  // namespace cleave::providers
