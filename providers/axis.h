// An axis attribute resolved against a rank, and products of dims, for the kernels of every
// provider (providers/).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "base/shape.h"
#include "base/status.h"
#include "base/tensor.h"

namespace cleave::providers {

// axis in [-rank, rank) as a dim index, or InvalidArgument naming both. With scalar_as_one, a
// 0-D input counts as one element along axis 0 (Softmax, LayerNormalization and their
// gradients accept it).
inline absl::StatusOr<int> ResolveAxis(int64_t axis, int rank, bool scalar_as_one = false) {
  const int r = scalar_as_one && rank == 0 ? 1 : rank;
  if (axis < -r || axis >= r) return InvalidArgument("axis ", axis, " is out of range for an input of rank ", rank);
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

// The product of x's dims [begin, end) (those that exist).
inline int64_t DimProduct(const TensorView& x, int begin, int end) {
  int64_t n = 1;
  for (int k = begin; k < end && k < x.rank; ++k) n *= x.dims[k];
  return n;
}

// x viewed as [outer, len, inner] around dim `axis` (resolved).
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};
inline AxisView ViewAround(const TensorView& x, int axis) {
  return {DimProduct(x, 0, axis), x.dims[axis], DimProduct(x, axis + 1, x.rank)};
}

// TopK's k: the attribute (TopK 1: k_attr >= 0) or the one-element K input (k_attr < 0),
// between 0 and the length of the axis (`axis` of x's dims).
inline absl::StatusOr<int64_t> TopKCount(int64_t k_attr, const TensorView* k_input, const TensorView& x, int axis) {
  int64_t k = k_attr;
  if (k < 0) {
    if (!k_input || k_input->numel() != 1 || k_input->dtype != DataType::kInt64)
      return InvalidArgument("expected K, a one-element int64 tensor");
    k = k_input->as<int64_t>()[0];
  }
  if (k < 0 || k > x.dims[axis])
    return InvalidArgument("k is ", k, "; expected 0 <= k <= ", x.dims[axis], " (axis ", axis, " of ",
                           DimsToString(x.dim_span()), ")");
  return k;
}

// x around a softmax's axis (a 0-D x counts as one element): [outer, len, inner] along the
// axis (Softmax from version 13 and the gradients), or with `flatten` (Softmax before version
// 13) [outer, the product of the dims from the axis on, 1]. InvalidArgument for an axis out of
// range.
inline absl::StatusOr<AxisView> SoftmaxView(const TensorView& x, int64_t axis, bool flatten) {
  ASSIGN_OR_RETURN(const int a, ResolveAxis(axis, x.rank, /*scalar_as_one=*/true));
  if (x.rank == 0) return AxisView{};
  if (flatten) return AxisView{DimProduct(x, 0, a), DimProduct(x, a, x.rank), 1};
  return ViewAround(x, a);
}

// GatherElements' and ScatterElements' indices against their data: the axis resolved, and idx of
// x's rank (>= 1) with no dim larger than x's except along the axis; InvalidArgument otherwise.
inline absl::StatusOr<int> ElementIndicesAxis(const TensorView& x, const TensorView& idx, int64_t axis) {
  if (x.rank == 0) return InvalidArgument("expected data of rank >= 1, got a scalar");
  ASSIGN_OR_RETURN(const int a, ResolveAxis(axis, x.rank));
  if (idx.rank != x.rank)
    return InvalidArgument("expected indices of the data's rank ", x.rank, ", got ", DimsToString(idx.dim_span()));
  for (int k = 0; k < x.rank; ++k)
    if (k != a && idx.dims[k] > x.dims[k])
      return InvalidArgument("indices ", DimsToString(idx.dim_span()), " exceed the data ", DimsToString(x.dim_span()),
                             " at dim ", k);
  return a;
}

}  // namespace cleave::providers
