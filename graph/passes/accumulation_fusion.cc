// The training graph's gradient accumulations folded into what forms the gradients
// (graph/passes/pass.h): GradientAccumulationFusion (a weight gradient's product accumulates
// into its buffer) and EmbeddingGradientAccumulation (an embedding's rows scatter into theirs).
#include <vector>

#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

// InPlaceAccumulator(buffer, dW, reset) whose dW is a float32 MatMulBf16 / MatMulF16 product
// (no bias) that nothing else reads -> the product accumulates into the buffer itself (its
// inputs 3 and 4; cuBLASLt's epilogue adds the buffer with beta = 1), as Megatron's gradient
// accumulation fusion does: the float32 [out, in] gradient is never stored apart.
bool FoldGradientAccumulation(Graph* g, Node* acc) {
  if (!IsCleaveOp(acc, "InPlaceAccumulator") || acc->num_inputs() != 3) return false;
  Value* grad = acc->input(1);
  Node* p = grad->producer();
  if ((!IsCleaveOp(p, "MatMulBf16") && !IsCleaveOp(p, "MatMulF16")) || p->HasAttr("to") || p->num_inputs() > 2 ||
      !SoleUse(grad) || grad->dtype() != DataType::kFloat32)
    return false;
  Value* buffer = acc->input(0);
  if (!buffer->shape().is_static() || buffer->shape() != grad->shape() || grad->shape().rank() != 2 ||
      p->input(0)->shape().rank() != 2 || p->input(1)->shape().rank() != 2)
    return false;
  Value* out = acc->output(0);
  Value* reset = acc->input(2);
  g->RemoveNode(acc);
  std::vector<Value*> outs = p->outputs();  // a dbias output (BiasGradientFusion) stays
  outs[0] = out;
  g->RebuildNode(p, {p->input(0), p->input(1), nullptr, buffer, reset}, outs);
  return true;
}

// A GatherGrad (an embedding's gradient) that neither starts from a base nor resets.
bool IsPlainScatter(const Node* n) {
  return IsCleaveOp(n, "GatherGrad") &&
         (n->num_inputs() < 4 || (!n->input(3) && (n->num_inputs() < 5 || !n->input(4))));
}

// InPlaceAccumulator(buffer, GatherGrad(shape, ids, dY), reset) -> GatherGrad(shape, ids, dY,
// buffer, reset): the lookup's rows are scattered into the accumulation itself instead of into
// a table of zeros that is then added to it. And a tied embedding's InPlaceAccumulator(buffer,
// Add(dW, GatherGrad(...)), reset), dW the head's part -> the accumulation of dW alone (which
// GradientAccumulationFusion folds into dW's product), then GatherGrad(..., base = that): the
// rows added to the accumulated head gradient, without the zero table and the separate sum.
bool FoldEmbeddingGradient(Graph* g, Node* acc) {
  if (!IsCleaveOp(acc, "InPlaceAccumulator") || acc->num_inputs() != 3) return false;
  Value* buffer = acc->input(0);
  Value* grad = acc->input(1);
  Value* reset = acc->input(2);
  Value* out = acc->output(0);
  Node* p = grad->producer();
  if (!SoleUse(grad) || grad->dtype() != DataType::kFloat32 || !buffer->shape().is_static() ||
      buffer->shape() != grad->shape())
    return false;
  if (IsPlainScatter(p)) {
    g->RemoveNode(acc);
    g->RebuildNode(p, {p->input(0), p->input(1), p->input(2), buffer, reset}, {out});
    return true;
  }
  if (!IsOnnxOp(p, "Add")) return false;
  for (int side : {0, 1}) {
    Value* scattered = p->input(side);
    Value* rest = p->input(1 - side);
    Node* scatter = scattered->producer();
    if (!IsPlainScatter(scatter) || !SoleUse(scattered) || scattered->shape() != buffer->shape() ||
        rest->shape() != buffer->shape() || rest->dtype() != DataType::kFloat32)
      continue;
    Value* partial = g->CreateUniqueValue(out->name() + "/head");
    partial->set_dtype(DataType::kFloat32);
    partial->set_shape(buffer->shape());
    Node* head = g->AddNode("InPlaceAccumulator", {buffer, rest, reset}, {partial},
                            g->UniqueName(acc->name() + "/head"), kCleaveDomain);
    head->metadata() = acc->metadata();
    g->RemoveNode(acc);
    g->RemoveNode(p);
    g->RebuildNode(scatter, {scatter->input(0), scatter->input(1), scatter->input(2), partial}, {out});
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> GradientAccumulationFusion::Run(Graph* g) {
  return RewriteToFixedPoint(g, FoldGradientAccumulation);
}

absl::StatusOr<bool> EmbeddingGradientAccumulation::Run(Graph* g) {
  return RewriteToFixedPoint(g, FoldEmbeddingGradient);
}

}  // namespace cleave::graph
