// Symbolic values of shape tensors (graph/). Exporters compute reshape targets at run time:
// Shape(x) -> Gather -> Unsqueeze -> Concat -> Reshape. Shape inference alone cannot see
// through that, so it records, for each such int64 tensor, its elements as dims (static or
// named) and lets Reshape, Expand and ConstantOfShape read them: a dynamic-batch export then
// keeps [batch, seq, 12, 64] instead of [?, ?, ?, ?]. Values are recomputed by every
// shape-inference run; nothing here changes a graph's meaning.
#pragma once

#include <optional>
#include <vector>

#include "graph/graph.h"

namespace cleave::graph {

// Input i's elements as dims: from a small integer constant, or the value's dims_value. A
// literal negative element (Reshape's -1) is the symbol "-1", since Dim(-1) means unknown.
std::optional<std::vector<Dim>> InputDimsValue(const Node& n, int i);

// Runs after the node's own shape inference: sets the dims value of a shape-arithmetic
// node's output (Shape, Gather, Unsqueeze, Squeeze, Concat, Slice, Cast, Identity), and
// refines the output shape of Reshape, Expand and ConstantOfShape from their inputs' dims
// values where inference left dims unknown.
void PropagateDimsValues(Node& n, int version);

}  // namespace cleave::graph
