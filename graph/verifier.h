// The IR verifier (graph/): checks the invariants graph.h promises. Runs after every pass
// in debug builds and once at session load; a failure here after a pass is a bug in that
// pass, so its message names the pass.
#pragma once

#include "absl/status/status.h"
#include "graph/graph.h"

namespace cleave::graph {

// Checks: producer/consumer links agree with node inputs/outputs; each value has at most
// one producer; every node input is defined (graph input, initializer or node output);
// graph outputs are defined; the graph is acyclic. With `require_types`, every value that
// a node reads or writes also has a dtype.
absl::Status Verify(const Graph& g, bool require_types = false);

}  // namespace cleave::graph
