// Attention over the q/k/v products' own layouts (graph/passes/pass.h: AttentionLayoutFusion):
// the head transposes around ai.cleave.Attention and its gradient fold into layout "bshd", and
// then the q/k/v Split and the gradients' Concat into layout "bs3hd".
#include <algorithm>
#include <array>
#include <vector>

#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

// A Transpose(perm = [0, 2, 1, 3]): the swap of the sequence and heads axes.
bool IsSeqHeadsSwap(const Node* t) {
  return IsOnnxOp(t, "Transpose") && t->AttrInts("perm") == std::vector<int64_t>{0, 2, 1, 3};
}

// The [B, T, H, D] value that such a swap of v turns into [B, H, T, D], or null where v is not
// such a swap.
Value* SeqMajorSource(const Value* v) {
  Node* t = v ? v->producer() : nullptr;
  return IsSeqHeadsSwap(t) ? t->input(0) : nullptr;
}

// The one reader of v, a swap of the sequence and heads axes, or null.
Node* SoleSeqMajorTranspose(const Value* v) {
  Node* t = SoleConsumer(v);
  return IsSeqHeadsSwap(t) ? t : nullptr;
}


// Attention over q, k, v that Transposes swap from [B, T, H, D] (the q/k/v products' layout)
// into [B, H, T, D], whose output a Transpose swaps back, and its AttentionGrads (whose dOut is
// such a swap and whose dq, dk, dv are each swapped back) -> the same ops with layout "bshd",
// reading and writing [B, T, H, D] themselves: cuDNN takes the strides, and the eight
// transposes of a layer's attention (forward and backward) go. Only where those Transposes
// have no other readers.
bool FoldAttentionLayout(Graph* g, Node* f) {
  if (!IsCleaveOp(f, "Attention") || f->HasAttr("layout") || f->num_inputs() < 3) return false;
  Value* bias = f->num_inputs() > 3 ? f->input(3) : nullptr;  // over [B, H, T, S] in both layouts
  Value* out = f->output(0);
  Value* lse = f->output(1);
  if (!out || out->is_graph_output() || !out->shape().has_rank() || out->shape().rank() != 4) return false;
  Value* src[3];
  for (int i = 0; i < 3; ++i)
    if (!(src[i] = SeqMajorSource(f->input(i)))) return false;
  Node* out_swap = nullptr;
  std::vector<Node*> grads;
  for (const auto& [reader, slot] : out->consumers()) {
    if (IsCleaveOp(reader, "AttentionGrad") && slot == 4) {
      grads.push_back(reader);
    } else if (!out_swap && IsSeqHeadsSwap(reader)) {
      out_swap = reader;
    } else {
      return false;
    }
  }
  if (!out_swap) return false;
  // Each grad: the forward's inputs and lse, a swapped dOut, and dq, dk, dv each swapped back.
  std::vector<Value*> grad_dout;
  std::vector<std::array<Node*, 3>> grad_swaps;
  for (Node* grad : grads) {
    if (grad->num_inputs() != (bias ? 7 : 6) || grad->num_outputs() < 3 || grad->num_outputs() > 4 || !lse ||
        grad->input(5) != lse ||
        (bias && grad->input(6) != bias) ||
        grad->AttrFloat("scale", 1.f) != f->AttrFloat("scale", 1.f) ||
        grad->AttrInt("causal", 0) != f->AttrInt("causal", 0) || grad->HasAttr("layout"))
      return false;
    for (int i = 0; i < 3; ++i)
      if (grad->input(1 + i) != f->input(i)) return false;
    Value* dout = SeqMajorSource(grad->input(0));
    if (!dout || !SoleUse(grad->input(0))) return false;
    std::array<Node*, 3> swaps;
    for (int i = 0; i < 3; ++i) {
      Value* d = grad->output(i);
      if (!d || !(swaps[i] = SoleSeqMajorTranspose(d))) return false;
    }
    grad_dout.push_back(dout);
    grad_swaps.push_back(swaps);
  }
  // The swapped q, k, v: read only by f and its grads.
  for (int i = 0; i < 3; ++i) {
    const Value* swapped = f->input(i);
    if (swapped->is_graph_output()) return false;
    for (const auto& [reader, slot] : swapped->consumers())
      if (reader != f && std::find(grads.begin(), grads.end(), reader) == grads.end()) return false;
  }

  const Attribute bshd = Attribute::String("bshd");
  // The op writes the swapped-back value itself (its name stays, a graph output's too).
  Value* swapped_back = out_swap->output(0);
  g->RemoveNode(out_swap);
  std::vector<Value*> outputs = f->outputs();
  outputs[0] = swapped_back;
  const auto with_bias = [&](std::vector<Value*> inputs) {
    if (bias) inputs.push_back(bias);
    return inputs;
  };
  Node* nf = g->RebuildNode(f, with_bias({src[0], src[1], src[2]}), outputs);
  nf->SetAttr("layout", bshd);
  for (size_t j = 0; j < grads.size(); ++j) {
    std::vector<Value*> outs;
    for (Node* swap : grad_swaps[j]) {
      outs.push_back(swap->output(0));
      g->RemoveNode(swap);
    }
    if (grads[j]->num_outputs() > 3) outs.push_back(grads[j]->output(3));  // dbias: [B, H, T, S] either way
    Node* ng = g->RebuildNode(grads[j], with_bias({grad_dout[j], src[0], src[1], src[2], swapped_back, lse}), outs);
    ng->SetAttr("layout", bshd);
  }
  return true;
}

// Whether axis (of a rank-3 value) is its last.
bool IsLastOfThree(int64_t axis) { return axis == 2 || axis == -1; }

// Whether s has rank dims.size() and each of its dims is known to be the one of `dims`.
bool SameDims(const Shape& s, const std::vector<Dim>& dims) {
  if (!s.has_rank() || s.rank() != static_cast<int>(dims.size())) return false;
  for (size_t i = 0; i < dims.size(); ++i)
    if (!SameDim(s[i], dims[i])) return false;
  return true;
}

// A Reshape's shape operand for `dims`, whose symbolic leading dims are copied from the input
// (ONNX's 0), which has them at the same axes.
std::vector<int64_t> ReshapeTarget(const std::vector<Dim>& dims) {
  std::vector<int64_t> out;
  for (const Dim& d : dims) out.push_back(d.is_static() ? d.value : 0);
  return out;
}

// An int64 shape constant.
Value* ShapeConstant(Graph* g, const std::string& hint, const std::vector<int64_t>& dims) {
  return g->AddInitializer(g->UniqueName(hint),
                           Tensor::FromVector<int64_t>(dims, {static_cast<int64_t>(dims.size())}));
}

// Attention {layout "bshd"} over q, k, v that are Reshapes to [B, T, H, D] of the three equal
// parts of one Split of the q/k/v product [B, T, 3 C] along its last axis, and its AttentionGrads
// whose dq, dk, dv are each reshaped back to [B, T, C] and concatenated (in that order) along the
// last axis -> layout "bs3hd" over the product reshaped to [B, T, 3, H, D]: cuDNN reads q, k and
// v out of it through their strides and writes dq, dk and dv into one packed gradient, so the
// Split and the Concat (a [B, T, 3 C] copy each way) go.
bool FoldPackedQkv(Graph* g, Node* f) {
  if (!IsCleaveOp(f, "Attention") || f->AttrString("layout", "") != "bshd" || f->num_inputs() < 3) return false;
  Value* bias = f->num_inputs() > 3 ? f->input(3) : nullptr;
  Node* split = nullptr;
  for (int i = 0; i < 3; ++i) {
    Node* r = f->input(i)->producer();
    if (!IsOnnxOp(r, "Reshape") || !SoleUse(r->input(0))) return false;
    Node* sp = r->input(0)->producer();
    if (!IsOnnxOp(sp, "Split") || sp->num_outputs() != 3 || r->input(0) != sp->output(i)) return false;
    if (split && sp != split) return false;
    split = sp;
  }
  Value* qkv = split->input(0);
  // B and T may be symbolic (an inference graph's batch and sequence), H and D are numbers.
  const Shape& qs = f->input(0)->shape();
  if (!qs.has_rank() || qs.rank() != 4 || !qs[2].is_static() || !qs[3].is_static() ||
      !IsLastOfThree(split->AttrInt("axis", 0)))
    return false;
  const Dim B = qs[0], T = qs[1];
  const int64_t H = qs[2].value, D = qs[3].value;
  if (!SameDims(qkv->shape(), {B, T, 3 * H * D})) return false;
  for (int i = 0; i < 3; ++i)
    if (!SameDims(f->input(i)->shape(), {B, T, H, D}) || !SameDims(split->output(i)->shape(), {B, T, H * D}))
      return false;
  // The grads: the forward's q, k, v, their gradients reshaped back and concatenated in order.
  std::vector<Node*> grads, concats;
  for (const auto& [reader, slot] : f->output(0)->consumers()) {
    if (!IsCleaveOp(reader, "AttentionGrad") || slot != 4) continue;
    if (reader->AttrString("layout", "") != "bshd" || reader->num_outputs() < 3 || reader->num_outputs() > 4 ||
        reader->num_inputs() != (bias ? 7 : 6) || (bias && reader->input(6) != bias))
      return false;
    Node* cat = nullptr;
    for (int i = 0; i < 3; ++i) {
      if (reader->input(1 + i) != f->input(i)) return false;
      Node* back = SoleConsumer(reader->output(i));
      if (!IsOnnxOp(back, "Reshape") || !SameDims(back->output(0)->shape(), {B, T, H * D})) return false;
      Node* c = SoleConsumer(back->output(0));
      if (!IsOnnxOp(c, "Concat") || c->num_inputs() != 3 || c->input(i) != back->output(0) ||
          !IsLastOfThree(c->AttrInt("axis", 0)) || (cat && c != cat))
        return false;
      cat = c;
    }
    grads.push_back(reader);
    concats.push_back(cat);
  }
  for (int i = 0; i < 3; ++i)
    for (const auto& [reader, slot] : f->input(i)->consumers())
      if (reader != f && std::find(grads.begin(), grads.end(), reader) == grads.end()) return false;

  const Attribute packed = Attribute::String("bs3hd");
  Value* qkv5 = g->CreateUniqueValue(qkv->name() + "/packed");
  Value* shape5 = ShapeConstant(g, qkv->name() + "/packed_shape", ReshapeTarget({B, T, 3, H, D}));
  Node* r5 = g->AddNode("Reshape", {qkv, shape5}, {qkv5}, g->UniqueName(qkv->name() + "/packed"));
  r5->metadata() = f->metadata();
  std::vector<Value*> f_ins = {qkv5, nullptr, nullptr};
  if (bias) f_ins.push_back(bias);
  Node* nf = g->RebuildNode(f, f_ins, f->outputs());
  nf->SetAttr("layout", packed);
  for (size_t j = 0; j < grads.size(); ++j) {
    Node* grad = grads[j];
    Value* dqkv = concats[j]->output(0);
    std::vector<Value*> ins = {grad->input(0), qkv5, nullptr, nullptr, grad->input(4), grad->input(5)};
    if (grad->num_inputs() > 6) ins.push_back(grad->input(6));
    auto metadata = grad->metadata();
    const std::string name = grad->name();
    // dq, dk, dv's Reshapes and the Concat go; the grad writes the packed [B, T, 3, H, D].
    std::vector<Node*> dead = {concats[j]};
    for (int i = 0; i < 3; ++i) dead.push_back(SoleConsumer(grad->output(i)));
    for (Node* n : dead) g->RemoveNode(n);
    Value* dqkv5 = g->CreateUniqueValue(dqkv->name() + "/packed");
    std::vector<Value*> outs = {dqkv5};
    if (grad->num_outputs() > 3) outs.insert(outs.end(), {nullptr, nullptr, grad->output(3)});
    Node* ng = g->RebuildNode(grad, ins, outs);
    ng->SetAttr("layout", packed);
    Value* shape3 = ShapeConstant(g, dqkv->name() + "/shape", ReshapeTarget({B, T, 3 * H * D}));
    Node* back = g->AddNode("Reshape", {dqkv5, shape3}, {dqkv}, g->UniqueName(name + "/packed_grad"));
    back->metadata() = metadata;
  }
  return true;
}

}  // namespace

absl::StatusOr<bool> AttentionLayoutFusion::Run(Graph* g) {
  return RewriteToFixedPoint(
      g, [](Graph* graph, Node* n) { return FoldAttentionLayout(graph, n) || FoldPackedQkv(graph, n); });
}

}  // namespace cleave::graph
