// Graphviz pictures of the IR (graph/): one box per node, graph inputs and outputs as
// ellipses, edges labelled with each value's dtype and shape. Initializers are listed in
// their reader's box rather than drawn, so a transformer stays readable; ops of the
// ai.cleave domain are filled so they stand out: collectives and Send/Recv in red, the
// others in blue.
#pragma once

#include <string>

#include "graph/graph.h"

namespace cleave::graph {

std::string GraphToDot(const Graph& g, const std::string& title);

}  // namespace cleave::graph
