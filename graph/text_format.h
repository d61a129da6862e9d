// A compact text form of the IR (graph/), for tests that write graphs as text and for
// printing graphs to people. One statement per line; '#' starts a comment.
//
//   opset 17                        # default-domain opset (ai.cleave is always 1)
//   input x: float32[batch,4]       # a graph input: dtype and dims (numbers or symbols)
//   init w: float32[4,3] = 1 0 0 0 1 0 0 0 1 1 1 1   # an initializer, every element
//   init b: float32[3] = fill 0.5   # ... or one value repeated
//   mm = MatMul(x, w)               # outputs = [domain.]Op(inputs) {attributes}
//   y, mask = Dropout(mm, _, t) {seed = 3}        # '_' is an omitted optional input
//   z = ai.cleave.Gelu(y) {approximate = "tanh"}  # ints, floats, "strings", [lists]
//   output z
//
// Node names default to the first output's name; `name: outs = Op(...)` sets one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::graph {

absl::StatusOr<std::unique_ptr<Graph>> ParseGraph(const std::string& text);
// Prints nodes in topological order in the syntax above (initializers as shapes only).
std::string PrintGraph(const Graph& g);

}  // namespace cleave::graph
