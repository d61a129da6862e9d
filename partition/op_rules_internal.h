// What the sharding rules' files share (partition/op_rules.cc, op_rules_indexing.cc,
// op_rules_spatial.cc): static dims and a replicated operand, and the rules kept in the other
// files, which op_rules.cc's RuleFor dispatches to.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "partition/op_rules.h"

namespace cleave::partition::internal {

// v's static dims, or an error naming the node: partitioning needs static shapes.
absl::StatusOr<std::vector<int64_t>> Dims(const graph::Node& n, const graph::Value* v);
// An operand every rank holds whole.
OperandFactors Replicate();

// op_rules_indexing.cc: Pad and Tile (and PadGrad), GatherElements and ScatterElements, TopK,
// GatherND and ScatterND.
absl::StatusOr<FactorRule> PadOrTile(const graph::Node& n);
absl::StatusOr<FactorRule> ElementIndexing(const graph::Node& n);
absl::StatusOr<FactorRule> TopKRule(const graph::Node& n);
absl::StatusOr<FactorRule> NdIndexing(const graph::Node& n);

// op_rules_spatial.cc: Conv and ConvTranspose (and their gradients), BatchNormalization and
// InstanceNormalization (and theirs), Resize (and ResizeGrad), the pools (and theirs),
// GridSample (and GridSampleGrad).
absl::StatusOr<FactorRule> Convolution(const graph::Node& n);
absl::StatusOr<FactorRule> BatchNorm(const graph::Node& n);
absl::StatusOr<FactorRule> ResizeRule(const graph::Node& n);
absl::StatusOr<FactorRule> Pooling(const graph::Node& n);
absl::StatusOr<FactorRule> GridSampleRule(const graph::Node& n);

}  // namespace cleave::partition::internal
