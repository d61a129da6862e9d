// Reverse-mode autodiff over the IR (trainer/). BuildBackward appends to a graph the nodes
// that compute d(loss)/d(value) for the requested values, from one table of gradient rules
// (gradient_rules.cc). Every node it adds carries metadata role=bwd and grad_of=<the forward
// value whose gradient it helps compute>; forward nodes on the path get role=fwd. The
// partitioner reads only that metadata. Gradients of a value with several readers are summed;
// integer and shape inputs stop the gradient.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::trainer {

// Gradient value names follow ONNX Runtime: "<name>_grad".
std::string GradName(const std::string& value);

// Adds the backward graph for a scalar `loss` and returns, for each value in `wrt`, the value
// holding its gradient (a graph value named <name>_grad). Shapes must be inferred first. Fails
// listing every op on the gradient path that has no rule. A value with no differentiable path
// to the loss gets a zero gradient and, when `unreached` is given, its name is appended there.
absl::StatusOr<std::map<std::string, graph::Value*>> BuildBackward(
    graph::Graph& g, graph::Value* loss, const std::vector<graph::Value*>& wrt,
    std::vector<std::string>* unreached = nullptr);

// True when a gradient rule exists for the op.
bool HasGradientRule(const std::string& domain, const std::string& op);

}  // namespace cleave::trainer
