// What the graph passes' pattern rewrites share (graph/passes/): tests of a value's uses and of a
// node's op, and the driver that applies a node rewrite until it applies nowhere.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "graph/op_table.h"

namespace cleave::graph {

// v has exactly one reader and is not a graph output.
inline bool SoleUse(const Value* v) { return v && v->consumers().size() == 1 && !v->is_graph_output(); }

inline Node* SoleConsumer(const Value* v) { return SoleUse(v) ? v->consumers()[0].first : nullptr; }

inline bool IsOnnxOp(const Node* n, const char* op) { return n && n->domain().empty() && n->op_type() == op; }

inline bool IsCleaveOp(const Node* n, const char* op) {
  return n && n->domain() == kCleaveDomain && n->op_type() == op;
}

// Whether two dims are known to be equal: the same number, or the same named symbol (two
// unknown dims may differ; a literal negative element of a shape value, such as Reshape's -1,
// names no size).
inline bool SameDim(const Dim& a, const Dim& b) {
  if (a.is_static()) return b.is_static() && a.value == b.value;
  return !a.symbol.empty() && a.symbol[0] != '-' && a.symbol == b.symbol;
}

// Applies `rewrite` (true: it changed the graph at that node) until it applies at no node; each
// rewrite may delete nodes, so the scan restarts after it. Then sorts the graph if anything
// changed, which it returns.
absl::StatusOr<bool> RewriteToFixedPoint(Graph* g, const std::function<bool(Graph*, Node*)>& rewrite);

}  // namespace cleave::graph
