// Graphviz pictures of the IR (graph/): one box per node, graph inputs and outputs as
// ellipses, edges labelled with each value's dtype and shape. Initializers are listed in
// their reader's box rather than drawn, so a transformer stays readable; ops of the
// ai.cleave domain (fused ops, later collectives) are filled so they stand out.
#pragma once

#include <string>

#include "graph/graph.h"

namespace cleave::graph {

std::string GraphToDot(const Graph& g, const std::string& title);

}  // namespace cleave::graph
