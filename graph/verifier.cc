// IR invariant checks (graph/).
#include "graph/verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cleave::graph {

namespace {

bool Defined(const Value* v) {
  return v->producer() || v->is_initializer() || v->is_graph_input();
}

absl::Status VerifyNode(const Node& n, bool require_types) {
  for (int i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (!v) continue;
    if (!Defined(v))
      return InvalidArgument(n.Describe(), ": input ", i, " '", v->name(), "' is undefined");
    const auto& c = v->consumers();
    if (std::find(c.begin(), c.end(), std::make_pair(const_cast<Node*>(&n), i)) == c.end())
      return Internal(n.Describe(), ": input '", v->name(), "' does not list the node as consumer");
    if (require_types && v->dtype() == DataType::kUndefined)
      return Internal(n.Describe(), ": input '", v->name(), "' has no dtype");
  }
  for (int i = 0; i < n.num_outputs(); ++i) {
    const Value* v = n.output(i);
    if (!v) continue;
    if (v->producer() != &n || v->producer_output() != i)
      return Internal(n.Describe(), ": output '", v->name(), "' names another producer");
    if (v->is_initializer() || v->is_graph_input())
      return InvalidArgument(n.Describe(), ": output '", v->name(),
                             "' is also a graph input or initializer");
    if (require_types && v->dtype() == DataType::kUndefined)
      return Internal(n.Describe(), ": output '", v->name(), "' has no dtype");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const Graph& g, bool require_types) {
  for (const auto& n : g.nodes()) RETURN_IF_ERROR(VerifyNode(*n, require_types));
  for (const Value* v : g.AllValues()) {
    for (const auto& [c, idx] : v->consumers())
      if (c->input(idx) != v)
        return Internal("value '", v->name(), "' lists a stale consumer ", c->Describe());
  }
  for (const Value* v : g.outputs())
    if (!Defined(v)) return InvalidArgument("graph output '", v->name(), "' is not produced");
  return g.TopologicalOrder().status();
}

}  // namespace cleave::graph
