// Dead-code elimination (graph/passes/): a node is live when a graph output depends on it.
#include <unordered_set>

#include "graph/passes/pass.h"

namespace cleave::graph {

absl::StatusOr<bool> DeadCodeElimination::Run(Graph* g) {
  std::unordered_set<const Node*> live;
  std::vector<const Value*> work(g->outputs().begin(), g->outputs().end());
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    const Node* p = v->producer();
    if (!p || !live.insert(p).second) continue;
    for (const Value* in : p->inputs())
      if (in) work.push_back(in);
  }
  std::vector<Node*> dead;
  for (const auto& n : g->nodes())
    if (!live.count(n.get())) dead.push_back(n.get());
  for (Node* n : dead) g->RemoveNode(n);
  bool changed = !dead.empty();
  // Initializers nothing reads any more.
  for (Value* v : g->Initializers()) {
    if (v->consumers().empty() && !v->is_graph_output() && !v->is_graph_input()) {
      g->ClearInitializer(v);  // the value itself is dropped below
      changed = true;
    }
  }
  g->RemoveUnusedValues();
  return changed;
}

}  // namespace cleave::graph
