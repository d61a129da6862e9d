// Constant folding and shape folding (graph/passes/).
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/passes/pass.h"

namespace cleave::graph {

namespace {

// Ops whose outputs are not a function of their inputs alone.
bool IsFoldable(const Node& n) {
  static const std::unordered_set<std::string> kNever = {
      "Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
      "Multinomial", "Bernoulli"};
  return n.domain().empty() && !kNever.count(n.op_type());
}

bool InputsConstant(const Node& n, const std::function<bool(const Value*)>& keep_variable) {
  for (const Value* v : n.inputs()) {
    if (!v) continue;
    if (!v->is_initializer() || v->is_graph_input()) return false;
    if (keep_variable && keep_variable(v)) return false;
  }
  return true;
}

// Shape of a static-shaped value, honouring Shape-15's start/end.
std::optional<Tensor> FoldShape(const Node& n) {
  const Value* in = n.input(0);
  if (!in || !in->shape().is_static()) return std::nullopt;
  std::vector<int64_t> dims = in->shape().StaticDims();
  int64_t rank = static_cast<int64_t>(dims.size());
  auto clamp = [&](int64_t a) {
    if (a < 0) a += rank;
    return std::max<int64_t>(0, std::min(a, rank));
  };
  int64_t start = clamp(n.AttrInt("start", 0));
  int64_t end = n.HasAttr("end") ? clamp(n.AttrInt("end", rank)) : rank;
  std::vector<int64_t> out;
  for (int64_t i = start; i < end; ++i) out.push_back(dims[i]);
  int64_t len = static_cast<int64_t>(out.size());
  return Tensor::FromVector<int64_t>(out, {len});
}

}  // namespace

absl::StatusOr<bool> ConstantFolding::Run(Graph* g) {
  bool changed = false;
  ASSIGN_OR_RETURN(std::vector<Node*> order, g->TopologicalOrder());
  for (Node* n : order) {
    if (!IsFoldable(*n)) continue;
    std::vector<Tensor> outs;
    if (n->op_type() == "Shape") {
      std::optional<Tensor> t = FoldShape(*n);
      if (!t) continue;
      outs.push_back(std::move(*t));
    } else if (n->op_type() == "Size" && n->input(0) && n->input(0)->shape().is_static()) {
      outs.push_back(Tensor::Scalar<int64_t>(n->input(0)->shape().NumElements()));
    } else {
      if (!InputsConstant(*n, keep_variable_)) continue;
      int64_t bytes = 0;
      for (const Value* o : n->outputs())
        if (o) bytes += o->shape().is_static() ? o->shape().NumElements() * ElementSize(o->dtype()) : 0;
      if (bytes > max_output_bytes_) continue;
      auto result = eval_(*n);
      if (absl::IsUnimplemented(result.status())) continue;  // no kernel: leave it to run time
      if (!result.ok()) return result.status();
      outs = std::move(*result);
    }
    std::vector<Value*> results(n->outputs().begin(), n->outputs().end());
    g->RemoveNode(n);
    for (size_t i = 0; i < results.size() && i < outs.size(); ++i)
      if (results[i]) g->SetInitializer(results[i], std::move(outs[i]));
    changed = true;
  }
  return changed;
}

}  // namespace cleave::graph
