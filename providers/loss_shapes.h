// The class-axis losses' operands checked against each other (providers/), for the CPU and CUDA
// providers' SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss and their gradients alike.
#pragma once

#include "absl/status/status.h"
#include "base/shape.h"
#include "base/status.h"
#include "base/tensor.h"

namespace cleave::providers {

// `what` (scores, log-probabilities) [N, C, d1, ...] against labels [N, d1, ...] and weights [C]
// of what's dtype (null: none); InvalidArgument naming what differs.
inline absl::Status CheckClassShapes(const char* what, const TensorView& in, const TensorView& labels,
                                     const TensorView* weights) {
  bool ok = in.rank >= 2 && labels.rank == in.rank - 1;
  for (int k = 0; ok && k < labels.rank; ++k) ok = labels.dims[k] == in.dims[k == 0 ? 0 : k + 1];
  if (!ok)
    return InvalidArgument("expected ", what, " [N, C, d1, ...] and labels [N, d1, ...], got ", what, " ",
                           DimsToString(in.shape()), " and labels ", DimsToString(labels.shape()));
  if (weights && (weights->rank != 1 || weights->dims[0] != in.dims[1] || weights->dtype != in.dtype))
    return InvalidArgument("expected weights [", in.dims[1], "] of ", DataTypeName(in.dtype), ", got ",
                           DataTypeName(weights->dtype), DimsToString(weights->shape()));
  return absl::OkStatus();
}

}  // namespace cleave::providers
