// What BatchNormalization and its gradient make of their node and inputs (providers/), for the
// CPU and CUDA providers alike: the mode, epsilon and momentum, and X viewed as [N, C, S].
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"

namespace cleave::providers {

struct BatchNormAttrs {
  float epsilon = 1e-5f;
  float momentum = 0.9f;
  // Training mode normalises by the batch's statistics (each channel's mean and biased
  // variance over N and the spatial dims) and outputs the running ones; otherwise by
  // input_mean and input_var.
  bool training = false;
};

// The node's attributes. Before version 14 a node with outputs beyond Y asks for the old
// training outputs (saved mean and variance), which cleave does not implement: Unimplemented
// naming the node. ai.cleave.BatchNormalizationGrad carries training_mode as version 14's.
absl::StatusOr<BatchNormAttrs> BatchNormAttrsOf(const graph::Node& n, int version);

struct BatchNormShape {
  int64_t N = 0, C = 0, S = 1;  // X [N, C, S...], S the product of the spatial dims
};

// X [N, C, ...] (rank >= 2) and the per-channel operands [C] (null ones skipped);
// InvalidArgument naming the operand that disagrees.
using ChannelOperand = std::pair<const char*, const TensorView*>;
absl::StatusOr<BatchNormShape> PlanBatchNorm(const TensorView& x, std::initializer_list<ChannelOperand> per_channel);

}  // namespace cleave::providers
