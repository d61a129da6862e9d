// Evaluates single nodes on constant inputs with the CPU provider's kernels (runtime/), for
// graph passes that fold constants. Folding with the execution kernels means a folded
// graph computes exactly what the unfolded one would.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/passes/pass.h"
#include "providers/execution_provider.h"

namespace cleave::runtime {

// Runs `node` (whose inputs are initializers, or which has none) and returns its outputs.
absl::StatusOr<std::vector<Tensor>> EvaluateNode(const graph::Graph& g, const graph::Node& node,
                                                 const providers::ExecutionProvider& cpu);

graph::ConstantEvaluator MakeConstantEvaluator(const graph::Graph& g,
                                               const providers::ExecutionProvider& cpu);

}  // namespace cleave::runtime
