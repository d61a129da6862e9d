// A training graph's tanh-form GELU folded into the low-precision products around it
// (graph/passes/pass.h GeluEpilogueFusion): the forward's into the product that forms its input,
// the backward's into the product that forms its output gradient.
#include <string>
#include <vector>

#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

// The form a product's activation names: "gelu_tanh", "gelu", or "" where it may not fold.
std::string FoldedForm(const Node* n, bool erf_too) {
  if (!n || (!n->domain().empty() && n->domain() != kCleaveDomain)) return "";
  const std::string a = n->AttrString("approximate", "none");
  return a == "tanh" ? "gelu_tanh" : a == "none" && erf_too ? "gelu" : "";
}

// A MatMulBf16 / MatMulF16 with nothing of its own in its epilogue yet: no activation, gradient
// accumulation, bias gradient or row limit. `bias_ok`: it may have a bias.
bool IsPlainLowProduct(const Node* p, bool bias_ok) {
  if (!IsCleaveOp(p, "MatMulBf16") && !IsCleaveOp(p, "MatMulF16")) return false;
  if (p->HasAttr("activation") || p->HasAttr("activation_grad") || p->HasAttr("rows")) return false;
  for (int i = 1; i < p->num_outputs(); ++i)
    if (p->output(i)) return false;
  for (int i = bias_ok ? 3 : 2; i < p->num_inputs(); ++i)
    if (p->input(i)) return false;
  return true;
}

// y = Gelu(x) {tanh}, x = MatMulBf16(A, B[, bias]) -> MatMulBf16(A, B[, bias]) {activation =
// gelu_tanh} -> y (erf_too: the erf form too, as "gelu"), with x as output 2 where anything else reads it (the GeluGrad).
bool FoldForward(Graph* g, Node* gelu, bool erf_too) {
  const std::string form = FoldedForm(gelu, erf_too);
  if (gelu->op_type() != "Gelu" || form.empty() || gelu->num_inputs() != 1) return false;
  Value* x = gelu->input(0);
  Node* p = x->producer();
  if (!IsPlainLowProduct(p, true)) return false;
  Value* y = gelu->output(0);
  if (y->dtype() != x->dtype()) return false;
  const bool keep_x = !SoleUse(x);
  std::vector<Value*> inputs = p->inputs();
  g->RemoveNode(gelu);
  Node* fused = g->RebuildNode(p, inputs, keep_x ? std::vector<Value*>{y, nullptr, x} : std::vector<Value*>{y});
  fused->SetAttr("activation", Attribute::String(form));
  return true;
}

// dx = GeluGrad(dy, x) {tanh}, dy = MatMulBf16(A, B) read by nothing else -> MatMulBf16(A, B, _, _,
// _, x) {activation_grad = gelu_tanh} -> dx.
bool FoldBackward(Graph* g, Node* grad, bool erf_too) {
  const std::string form = FoldedForm(grad, erf_too);
  if (!IsCleaveOp(grad, "GeluGrad") || form.empty() || grad->num_inputs() != 2) return false;
  Value* dy = grad->input(0);
  Value* x = grad->input(1);
  Value* dx = grad->output(0);
  Node* q = dy->producer();
  if (!IsPlainLowProduct(q, false) || !SoleUse(dy) || dy->dtype() != x->dtype() || dx->dtype() != dy->dtype() ||
      !dy->shape().is_static() || dy->shape() != x->shape())
    return false;
  Value* a = q->input(0);
  Value* b = q->input(1);
  g->RemoveNode(grad);
  Node* fused = g->RebuildNode(q, {a, b, nullptr, nullptr, nullptr, x}, {dx});
  fused->SetAttr("activation_grad", Attribute::String(form));
  return true;
}

}  // namespace

absl::StatusOr<bool> GeluEpilogueFusion::Run(Graph* g) {
  return RewriteToFixedPoint(
      g, [this](Graph* graph, Node* n) { return FoldForward(graph, n, erf_too_) || FoldBackward(graph, n, erf_too_); });
}

}  // namespace cleave::graph
