// DOT output for the IR (graph/).
#include "graph/dot.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace cleave::graph {

namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string TypeLabel(const Value* v) {
  return absl::StrCat(DataTypeName(v->dtype()), v->shape().ToString());
}

}  // namespace

std::string GraphToDot(const Graph& g, const std::string& title) {
  std::string out = absl::StrCat("digraph \"", Escape(title), "\" {\n  rankdir=TB;\n",
                                 "  node [fontname=\"Helvetica\", fontsize=10];\n",
                                 "  edge [fontname=\"Helvetica\", fontsize=8, color=gray40];\n");
  std::unordered_map<const Node*, int> id;
  for (const auto& n : g.nodes()) id[n.get()] = static_cast<int>(id.size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    absl::StrAppend(&out, "  in", i, " [shape=ellipse, style=filled, fillcolor=\"#d5f5d5\", label=\"",
                    Escape(g.inputs()[i]->name()), "\\n", TypeLabel(g.inputs()[i]), "\"];\n");
  for (size_t i = 0; i < g.outputs().size(); ++i)
    absl::StrAppend(&out, "  out", i, " [shape=ellipse, style=filled, fillcolor=\"#fde2c8\", label=\"",
                    Escape(g.outputs()[i]->name()), "\\n", TypeLabel(g.outputs()[i]), "\"];\n");
  for (const auto& n : g.nodes()) {
    std::string weights;
    for (const Value* v : n->inputs())
      if (v && v->is_initializer())
        absl::StrAppend(&weights, "\\n", Escape(v->name()), " ", TypeLabel(v));
    bool cleave_op = n->domain() == "ai.cleave";
    const std::string& op = n->op_type();
    // Collectives and point-to-point messages in red, other ai.cleave ops in blue.
    const bool comm = cleave_op && (op == "AllReduce" || op == "AllGather" || op == "ReduceScatter" ||
                                    op == "AllToAll" || op == "Send" || op == "Recv");
    absl::StrAppend(&out, "  n", id[n.get()], " [shape=box, style=\"rounded,filled\", fillcolor=\"",
                    comm ? "#f8b4b4" : cleave_op ? "#cfe3fb" : "#f2f2f2", "\", label=\"",
                    cleave_op ? "ai.cleave." : "", n->op_type(), "\\n", Escape(n->name()), weights,
                    "\"];\n");
  }
  auto source = [&](const Value* v) -> std::string {
    if (v->producer()) return absl::StrCat("n", id[v->producer()]);
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i] == v) return absl::StrCat("in", i);
    return "";
  };
  for (const auto& n : g.nodes())
    for (const Value* v : n->inputs()) {
      if (!v || v->is_initializer()) continue;
      std::string from = source(v);
      if (!from.empty())
        absl::StrAppend(&out, "  ", from, " -> n", id[n.get()], " [label=\"", TypeLabel(v), "\"];\n");
    }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    std::string from = source(g.outputs()[i]);
    if (!from.empty()) absl::StrAppend(&out, "  ", from, " -> out", i, ";\n");
  }
  return out + "}\n";
}

}  // namespace cleave::graph
