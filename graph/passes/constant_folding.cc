// Constant folding and shape folding (graph/passes/).
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

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

// The one int64 output of a shape-arithmetic node whose elements are all known numbers by the
// dims values (graph/dims_value.h), as a constant: Gather(Shape(x), 2) of x [batch, seq, 768]
// is 768 whatever batch and seq are, so what an export computes from it (the head size,
// 768 / 12) folds too.
std::optional<Tensor> FoldKnownDims(const Node& n) {
  const Value* out = n.num_outputs() == 1 ? n.output(0) : nullptr;
  if (!out || out->dtype() != DataType::kInt64 || !out->dims_value() || !out->shape().is_static() ||
      out->shape().rank() > 1)
    return std::nullopt;
  const std::vector<Dim>& dims = *out->dims_value();
  if (static_cast<int64_t>(dims.size()) != out->shape().NumElements()) return std::nullopt;
  std::vector<int64_t> values;
  for (const Dim& d : dims) {
    if (!d.is_static()) return std::nullopt;
    values.push_back(d.value);
  }
  if (out->shape().rank() == 0) return Tensor::Scalar<int64_t>(values[0]);
  return Tensor::FromVector<int64_t>(values, {static_cast<int64_t>(values.size())});
}

// A Reshape whose target is computed at run time (an export's Shape -> Gather -> Concat over a
// dynamic batch) but known symbolically: a constant target of the same meaning, element by
// element. A number or -1 stays; a named dim is the input's dim at the same axis, so it becomes
// 0 (copy it). Nothing is done where an element is unknown or a named dim is not the input's
// own at that axis, or where a literal 0 is zero (allowzero = 1). The shape arithmetic that
// computed the target is left to dead-code elimination.
bool FoldReshapeTarget(Graph* g, Node* n) {
  if (!IsOnnxOp(n, "Reshape") || n->num_inputs() < 2) return false;
  Value* target = n->input(1);
  const Value* in = n->input(0);
  if (!target || !in || target->is_initializer() || !target->dims_value() || !in->shape().has_rank()) return false;
  const bool zero_copies = n->AttrInt("allowzero", 0) == 0;
  std::vector<int64_t> elements;
  for (size_t j = 0; j < target->dims_value()->size(); ++j) {
    const Dim& d = (*target->dims_value())[j];
    if (d.is_static()) {
      elements.push_back(d.value);
    } else if (d.symbol == "-1") {
      elements.push_back(-1);
    } else if (zero_copies && static_cast<int>(j) < in->shape().rank() && SameDim(in->shape()[j], d)) {
      elements.push_back(0);
    } else {
      return false;
    }
  }
  const int64_t len = static_cast<int64_t>(elements.size());
  Value* constant =
      g->AddInitializer(g->UniqueName(n->name() + "/target"), Tensor::FromVector<int64_t>(elements, {len}));
  g->SetNodeInput(n, 1, constant);
  return true;
}

}  // namespace

absl::StatusOr<bool> ConstantFolding::Run(Graph* g) {
  bool changed = false;
  ASSIGN_OR_RETURN(std::vector<Node*> order, g->TopologicalOrder());
  for (Node* n : order) {
    if (FoldReshapeTarget(g, n)) {
      changed = true;
      continue;
    }
    if (!IsFoldable(*n)) continue;
    std::vector<Tensor> outs;
    if (n->op_type() == "Shape") {
      std::optional<Tensor> t = FoldShape(*n);
      if (!t) continue;
      outs.push_back(std::move(*t));
    } else if (n->op_type() == "Size" && n->input(0) && n->input(0)->shape().is_static()) {
      outs.push_back(Tensor::Scalar<int64_t>(n->input(0)->shape().NumElements()));
    } else if (std::optional<Tensor> known = InputsConstant(*n, keep_variable_) ? std::nullopt : FoldKnownDims(*n)) {
      outs.push_back(std::move(*known));
    } else {
      if (!InputsConstant(*n, keep_variable_)) continue;
      int64_t bytes = 0;
      for (const Value* o : n->outputs()) {
        if (!o || !o->shape().is_static()) continue;
        const std::vector<int64_t> dims = o->shape().StaticDims();
        const int64_t b = DenseBytes(o->dtype(), dims);
        bytes = b < 0 || b > max_output_bytes_ - bytes ? max_output_bytes_ + 1 : bytes + b;
      }
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
