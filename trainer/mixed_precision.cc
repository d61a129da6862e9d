// Mixed precision (trainer/): see mixed_precision.h.
#include "trainer/mixed_precision.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::trainer {

namespace {

using graph::Node;
using graph::Value;

// Whether `n` is a Transpose that swaps only the last two axes.
bool SwapsLastTwo(const Node* n) {
  if (!n || !n->domain().empty() || n->op_type() != "Transpose" || !n->input(0)) return false;
  const Value* x = n->input(0);
  if (!x->shape().has_rank() || x->shape().rank() < 2) return false;
  const int r = x->shape().rank();
  std::vector<int64_t> perm = n->AttrInts("perm");
  if (perm.empty()) return r == 2;
  if (static_cast<int>(perm.size()) != r) return false;
  for (int i = 0; i < r - 2; ++i)
    if (perm[i] != i) return false;
  return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
}

}  // namespace

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return InvalidArgument("--precision '", name, "': expected fp32, bf16 or fp16");
}

const char* PrecisionName(Precision p) {
  return p == Precision::kBf16 ? "bf16" : p == Precision::kFp16 ? "fp16" : "fp32";
}

absl::Status AddLossScaleInput(graph::Graph& g, const std::string& loss) {
  Value* seed = g.FindValue(loss + "_grad");
  if (!seed || !seed->is_initializer() || seed->dtype() != DataType::kFloat32)
    return InvalidArgument("loss scaling: the graph has no float32 backward seed '", loss, "_grad'");
  if (g.FindValue(kLossScale)) return absl::OkStatus();
  std::vector<std::pair<Node*, int>> readers = seed->consumers();
  Value* scale = g.AddInput(kLossScale, DataType::kFloat32, Shape::Scalar());
  Value* scaled = g.CreateUniqueValue(loss + "_grad/scaled");
  scaled->set_dtype(DataType::kFloat32);
  scaled->set_shape(seed->shape());
  Node* m = g.AddNode("Mul", {seed, scale}, {scaled}, scaled->name());
  m->metadata()["role"] = "bwd";
  m->metadata()["grad_of"] = loss;
  for (auto [n, i] : readers) g.SetNodeInput(n, i, scaled);
  return g.SortTopologically();
}

absl::StatusOr<int> ApplyAutocast(graph::Graph& g, Precision precision) {
  if (precision == Precision::kFp32) return 0;
  const DataType low = precision == Precision::kFp16 ? DataType::kFloat16 : DataType::kBFloat16;
  const char* op = precision == Precision::kFp16 ? "MatMulF16" : "MatMulBf16";
  const char* suffix = precision == Precision::kFp16 ? "/fp16" : "/bf16";
  std::vector<Node*> products;
  for (const auto& n : g.nodes()) {
    const bool mm = n->domain().empty() && n->op_type() == "MatMul";
    const bool fused = n->domain() == graph::kCleaveDomain && n->op_type() == "FusedMatMul" &&
                       n->num_inputs() == 2 && n->AttrString("activation", "").empty();
    if (!mm && !fused) continue;
    const Value *a = n->input(0), *b = n->input(1);
    if (!a || !b || a->dtype() != DataType::kFloat32 || b->dtype() != DataType::kFloat32) continue;
    if (!a->shape().is_static() || !b->shape().is_static()) continue;
    const int ra = a->shape().rank(), rb = b->shape().rank();
    if (ra < 2 || (rb != 2 && rb != ra)) continue;
    if (rb == ra && rb > 2) {
      bool same = true;
      for (int i = 0; i < ra - 2; ++i) same &= a->shape()[i].value == b->shape()[i].value;
      if (!same) continue;  // broadcast batch dims stay fp32
    }
    products.push_back(n.get());
  }
  // The fused attention and its gradient (over fp32 operands of static shapes).
  std::vector<Node*> attention, attention_grads;
  for (const auto& n : g.nodes()) {
    if (n->domain() != graph::kCleaveDomain) continue;
    const bool fwd = n->op_type() == "Attention", bwd = n->op_type() == "AttentionGrad";
    if (!fwd && !bwd) continue;
    bool fits = true;
    for (int i = 0; i < n->num_inputs(); ++i) {
      const Value* x = n->input(i);
      const bool lse = bwd && i == 5;
      fits &= x && x->shape().is_static() && (lse || x->dtype() == DataType::kFloat32);
    }
    for (int i = 0; i < n->num_outputs(); ++i) fits &= n->output(i) != nullptr || fwd;
    if (fits) (fwd ? attention : attention_grads).push_back(n.get());
  }
  std::map<const Value*, Value*> casts;  // each value cast to bf16 once
  auto cast = [&](Value* v, const Node* reader) {
    if (auto it = casts.find(v); it != casts.end()) return it->second;
    // A value widened from this low type narrows back to what it was, exactly.
    if (const Node* w = v->producer(); w && w->domain().empty() && w->op_type() == "Cast" &&
                                        v->dtype() == DataType::kFloat32 && w->input(0)->dtype() == low)
      return w->input(0);
    Value* out = g.CreateUniqueValue(v->name() + suffix);
    out->set_dtype(low);
    out->set_shape(v->shape());
    // A Reshape of a value already cast (the backward's 2-D view of a forward activation for
    // dW) reshapes that cast instead of casting again.
    const Node* r = v->producer();
    if (r && r->domain().empty() && r->op_type() == "Reshape" && r->num_inputs() == 2 && casts.count(r->input(0))) {
      Node* c = g.AddNode("Reshape", {casts.at(r->input(0)), r->input(1)}, {out}, g.UniqueName(r->name() + suffix));
      for (const auto& [key, attr] : r->attributes()) c->SetAttr(key, attr);
      c->metadata() = reader->metadata();
      c->metadata().erase("param");
      casts[v] = out;
      return out;
    }
    Node* c = g.AddNode("Cast", {v}, {out}, g.UniqueName(v->name() + "/cast" + suffix));
    c->SetAttr("to", graph::Attribute::Int(static_cast<int64_t>(low)));
    c->metadata() = reader->metadata();
    c->metadata().erase("param");
    casts[v] = out;
    return out;
  };
  // A low-precision result `low` that the fp32 value `y` now holds widened.
  auto widen = [&](Value* low_value, Value* y, const Node* like) {
    Node* c = g.AddNode("Cast", {low_value}, {y}, g.UniqueName(y->name() + "/cast/fp32"));
    c->SetAttr("to", graph::Attribute::Int(static_cast<int64_t>(DataType::kFloat32)));
    c->metadata() = like->metadata();
  };
  auto low_twin = [&](const Value* y) {
    Value* t = g.CreateUniqueValue(y->name() + suffix);
    t->set_dtype(low);
    t->set_shape(y->shape());
    return t;
  };
  for (Node* n : products) {
    bool ta = n->AttrInt("transA", 0) != 0, tb = n->AttrInt("transB", 0) != 0;
    Value* a = n->input(0);
    Value* b = n->input(1);
    // A transposed operand is read through the flag instead (the Transpose stays for other
    // readers), through every such Transpose: the backward's dX = dY (W^T)^T reads W itself.
    while (SwapsLastTwo(a->producer())) {
      a = a->producer()->input(0);
      ta = !ta;
    }
    while (SwapsLastTwo(b->producer()) && (b->producer()->input(0)->shape().rank() == 2 ||
                                           b->producer()->input(0)->shape().rank() == a->shape().rank())) {
      b = b->producer()->input(0);
      tb = !tb;
    }
    Value* ca = cast(a, n);
    Value* cb = cast(b, n);
    Value* y = n->output(0);
    const std::string name = n->name();
    const auto meta = n->metadata();
    g.RemoveNode(n);
    // A product read only by a Transpose of its last two axes (the gradient of a weight that
    // the forward read transposed) writes the transposed result itself: (A B)^T = B^T A^T.
    Node* t = y->consumers().size() == 1 ? y->consumers()[0].first : nullptr;
    if (t && !y->is_graph_output() && SwapsLastTwo(t) && ca->shape().rank() == cb->shape().rank()) {
      y = t->output(0);
      g.RemoveNode(t);
      std::swap(ca, cb);
      std::swap(ta, tb);
      ta = !ta;
      tb = !tb;
    }
    Node* m = g.AddNode(op, {ca, cb}, {y}, name, graph::kCleaveDomain);
    if (ta) m->SetAttr("transA", graph::Attribute::Int(1));
    if (tb) m->SetAttr("transB", graph::Attribute::Int(1));
    m->metadata() = meta;
  }
  // Attention in low precision (cuDNN's fused flash attention takes bf16 and fp16, not fp32):
  // q, k and v cast once for the forward and the gradient alike, the output returned in low
  // precision for the gradient and widened for everything else; lse stays fp32.
  std::map<const Value*, Value*> low_out;  // an Attention output -> its low-precision twin
  for (Node* n : attention) {
    std::vector<Value*> in = {cast(n->input(0), n), cast(n->input(1), n), cast(n->input(2), n)};
    Value* y = n->output(0);
    std::vector<Value*> out;
    for (int i = 0; i < n->num_outputs(); ++i) out.push_back(n->output(i));
    Value* y_low = y ? low_twin(y) : nullptr;
    out[0] = y_low;
    Node* m = g.RebuildNode(n, in, out);
    if (y) {
      widen(y_low, y, m);
      low_out[y] = y_low;
    }
  }
  for (Node* n : attention_grads) {
    Value* o = n->input(4);
    Value* o_low = low_out.count(o) ? low_out.at(o) : cast(o, n);
    std::vector<Value*> in = {cast(n->input(0), n), cast(n->input(1), n), cast(n->input(2), n),
                              cast(n->input(3), n), o_low, n->input(5)};
    std::vector<Value*> wide, out;
    for (int i = 0; i < n->num_outputs(); ++i) {
      wide.push_back(n->output(i));
      out.push_back(low_twin(n->output(i)));
    }
    Node* m = g.RebuildNode(n, in, out);
    for (size_t i = 0; i < out.size(); ++i) widen(out[i], wide[i], m);
  }
  // Casts and layout ops that the rewrites above left without readers (the fp32 2-D views of
  // activations that the dW products read before they read the cast's).
  auto prune = [&] {
    for (bool removed = true; removed;) {
      removed = false;
      for (const auto& n : g.nodes()) {
        const std::string& t = n->op_type();
        if (!n->domain().empty() || (t != "Cast" && t != "Reshape" && t != "Transpose")) continue;
        if (!n->output(0)->consumers().empty() || n->output(0)->is_graph_output()) continue;
        for (auto it = casts.begin(); it != casts.end();)
          it = it->second == n->output(0) || it->first == n->output(0) ? casts.erase(it) : ++it;
        g.RemoveNode(n.get());
        removed = true;
        break;
      }
    }
  };
  prune();
  // Casts move above the layout ops that only they read (Reshape, Transpose), which then move
  // half the bytes, and a cast that reaches a widened low value cancels: the attention output
  // goes to the projection in low precision, without the round trip through fp32.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& node : g.nodes()) {
      Node* c = node.get();
      if (!c->domain().empty() || c->op_type() != "Cast" || c->output(0)->dtype() != low) continue;
      Value* x = c->input(0);
      Node* layout = x->producer();
      if (!layout || !layout->domain().empty() || x->is_graph_output()) continue;
      // Readers of x other than c may only want its shape, which the cast's output shares.
      std::vector<Node*> shape_readers;
      bool only_shapes = true;
      for (const auto& [r, slot] : x->consumers()) {
        if (r == c) continue;
        if (r->domain().empty() && r->op_type() == "Shape") shape_readers.push_back(r);
        else only_shapes = false;
      }
      if (!only_shapes) continue;
      if (layout->op_type() != "Transpose" && layout->op_type() != "Reshape") continue;
      std::vector<Value*> in;
      for (int i = 0; i < layout->num_inputs(); ++i) in.push_back(layout->input(i));
      in[0] = cast(in[0], c);
      Value* y = c->output(0);
      for (auto it = casts.begin(); it != casts.end();) it = it->second == y || it->first == x ? casts.erase(it) : ++it;
      g.RemoveNode(c);
      g.RebuildNode(layout, in, {y});
      for (Node* r : shape_readers) g.SetNodeInput(r, 0, y);
      changed = true;
      break;  // the node list changed
    }
  }
  // Widening casts move below the Reshapes, Transposes and Concats that only they feed, and a
  // cast back to the low type cancels: the gradient of attention's q, k and v is laid out and
  // concatenated in low precision, widened once for the bias gradient, and reaches the qkv
  // products without a round trip.
  auto widened_from = [&](const Value* v) -> Value* {  // the low value that v widens, or null
    const Node* w = v ? v->producer() : nullptr;
    if (!w || !w->domain().empty() || w->op_type() != "Cast" || v->dtype() != DataType::kFloat32) return nullptr;
    return w->input(0)->dtype() == low ? w->input(0) : nullptr;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& node : g.nodes()) {
      Node* layout = node.get();
      const std::string& t = layout->op_type();
      if (!layout->domain().empty() || (t != "Transpose" && t != "Reshape" && t != "Concat")) continue;
      std::vector<Value*> in = layout->inputs();
      const int data_inputs = t == "Concat" ? layout->num_inputs() : 1;
      bool widened = data_inputs > 0;
      for (int i = 0; i < data_inputs && widened; ++i) {
        Value* x = layout->input(i);
        widened = x && x->consumers().size() == 1 && !x->is_graph_output() && widened_from(x);
        if (widened) in[i] = widened_from(x);
      }
      if (!widened) continue;
      Value* y = layout->output(0);
      Value* y_low = low_twin(y);
      Node* moved = g.RebuildNode(layout, in, {y_low});
      widen(y_low, y, moved);
      changed = true;
      break;  // the node list changed
    }
  }
  std::vector<Node*> round_trips;
  for (const auto& n : g.nodes())
    if (n->domain().empty() && n->op_type() == "Cast" && n->output(0)->dtype() == low &&
        !n->output(0)->is_graph_output() && widened_from(n->input(0)))
      round_trips.push_back(n.get());
  for (Node* c : round_trips) {
    Value* y = c->output(0);
    Value* src = widened_from(c->input(0));
    for (auto& [from, to] : casts)
      if (to == y) to = src;
    g.RemoveNode(c);
    g.ReplaceAllUsesWith(y, src);
  }
  prune();
  const size_t rewritten = products.size() + attention.size() + attention_grads.size();
  if (rewritten > 0) {
    g.opset_imports()[graph::kCleaveDomain] = 1;
    g.RemoveUnusedValues();
    RETURN_IF_ERROR(g.SortTopologically());
  }
  return static_cast<int>(rewritten);
}

}  // namespace cleave::trainer
