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

namespace {

bool IsCast(const Node* n) { return n && n->domain().empty() && n->op_type() == "Cast"; }

// One autocast of a graph: the rewrites in the order Run makes them, and each value's cast to
// the low type (made once, shared by every reader).
class Autocast {
 public:
  Autocast(graph::Graph& g, Precision p)
      : g_(g),
        low_(p == Precision::kFp16 ? DataType::kFloat16 : DataType::kBFloat16),
        op_(p == Precision::kFp16 ? "MatMulF16" : "MatMulBf16"),
        suffix_(p == Precision::kFp16 ? "/fp16" : "/bf16") {}

  absl::StatusOr<int> Run() {
    const std::vector<Node*> products = Products();
    std::vector<Node*> attention, grads;
    FindAttention(&attention, &grads);
    for (Node* n : products) RewriteProduct(n);
    RewriteAttention(attention, grads);
    Prune();
    while (HoistNarrowing()) {}
    while (SinkWidening()) {}
    CancelRoundTrips();
    Prune();
    const size_t rewritten = products.size() + attention.size() + grads.size();
    if (rewritten > 0) {
      g_.opset_imports()[graph::kCleaveDomain] = 1;
      g_.RemoveUnusedValues();
      RETURN_IF_ERROR(g_.SortTopologically());
    }
    return static_cast<int>(rewritten);
  }

 private:
  // The fp32 MatMul / bias-free FusedMatMul nodes of static shapes whose batch dims agree.
  std::vector<Node*> Products() const {
    std::vector<Node*> products;
    for (const auto& n : g_.nodes()) {
      const bool mm = n->domain().empty() && n->op_type() == "MatMul";
      const bool fused = n->domain() == graph::kCleaveDomain && n->op_type() == "FusedMatMul" &&
                         n->num_inputs() == 2 && n->AttrString("activation", "").empty();
      if (!mm && !fused) continue;
      const Value *a = n->input(0), *b = n->input(1);
      if (!a || !b || a->dtype() != DataType::kFloat32 || b->dtype() != DataType::kFloat32) continue;
      if (!a->shape().is_static() || !b->shape().is_static()) continue;
      const int ra = a->shape().rank(), rb = b->shape().rank();
      if (ra < 2 || (rb != 2 && rb != ra)) continue;
      bool same = true;
      for (int i = 0; rb == ra && i < ra - 2; ++i) same &= a->shape()[i].value == b->shape()[i].value;
      if (same) products.push_back(n.get());  // broadcast batch dims stay fp32
    }
    return products;
  }

  // The fused attention and its gradient over fp32 operands of static shapes.
  void FindAttention(std::vector<Node*>* fwd, std::vector<Node*>* bwd) const {
    for (const auto& n : g_.nodes()) {
      if (n->domain() != graph::kCleaveDomain) continue;
      const bool f = n->op_type() == "Attention", b = n->op_type() == "AttentionGrad";
      if (!f && !b) continue;
      bool fits = true;
      for (int i = 0; i < n->num_inputs(); ++i) {
        const Value* x = n->input(i);
        fits &= x && x->shape().is_static() && ((b && i == 5) || x->dtype() == DataType::kFloat32);  // 5: lse
      }
      for (int i = 0; i < n->num_outputs(); ++i) fits &= n->output(i) != nullptr || f;
      if (fits) (f ? fwd : bwd)->push_back(n.get());
    }
  }

  // The low value that the fp32 value v widens, or null.
  Value* WidenedFrom(const Value* v) const {
    const Node* w = v ? v->producer() : nullptr;
    if (!IsCast(w) || v->dtype() != DataType::kFloat32) return nullptr;
    return w->input(0)->dtype() == low_ ? w->input(0) : nullptr;
  }

  // v in the low type, made once.
  Value* Cast(Value* v, const Node* reader) {
    if (auto it = casts_.find(v); it != casts_.end()) return it->second;
    if (Value* was = WidenedFrom(v)) return was;  // narrows back to what it was, exactly
    Value* out = LowTwin(v);
    // A Reshape of a value already cast (the backward's 2-D view of a forward activation for
    // dW) reshapes that cast instead of casting again.
    const Node* r = v->producer();
    Node* c;
    if (r && r->domain().empty() && r->op_type() == "Reshape" && r->num_inputs() == 2 && casts_.count(r->input(0))) {
      c = g_.AddNode("Reshape", {casts_.at(r->input(0)), r->input(1)}, {out}, g_.UniqueName(r->name() + suffix_));
      for (const auto& [key, attr] : r->attributes()) c->SetAttr(key, attr);
    } else {
      c = g_.AddNode("Cast", {v}, {out}, g_.UniqueName(v->name() + "/cast" + suffix_));
      c->SetAttr("to", graph::Attribute::Int(static_cast<int64_t>(low_)));
    }
    c->metadata() = reader->metadata();
    c->metadata().erase("param");
    casts_[v] = out;
    return out;
  }

  // The fp32 value y now holds the low value widened.
  void Widen(Value* low_value, Value* y, const Node* like) {
    Node* c = g_.AddNode("Cast", {low_value}, {y}, g_.UniqueName(y->name() + "/cast/fp32"));
    c->SetAttr("to", graph::Attribute::Int(static_cast<int64_t>(DataType::kFloat32)));
    c->metadata() = like->metadata();
  }

  Value* LowTwin(const Value* y) {
    Value* t = g_.CreateUniqueValue(y->name() + suffix_);
    t->set_dtype(low_);
    t->set_shape(y->shape());
    return t;
  }

  void Forget(const Value* v) {
    for (auto it = casts_.begin(); it != casts_.end();) it = it->first == v || it->second == v ? casts_.erase(it) : ++it;
  }

  void RewriteProduct(Node* n) {
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
    Value* ca = Cast(a, n);
    Value* cb = Cast(b, n);
    Value* y = n->output(0);
    const std::string name = n->name();
    const auto meta = n->metadata();
    g_.RemoveNode(n);
    // (A product read only by a Transpose, a weight gradient, is swapped by the sessions'
    // TransformerFusion, as for fp32.)
    Node* m = g_.AddNode(op_, {ca, cb}, {y}, name, graph::kCleaveDomain);
    if (ta) m->SetAttr("transA", graph::Attribute::Int(1));
    if (tb) m->SetAttr("transB", graph::Attribute::Int(1));
    m->metadata() = meta;
  }

  // Attention in low precision (cuDNN's fused flash attention takes bf16 and fp16, not fp32):
  // q, k and v cast once for the forward and the gradient alike, the output returned in low
  // precision for the gradient and widened for everything else; lse stays fp32.
  void RewriteAttention(const std::vector<Node*>& attention, const std::vector<Node*>& grads) {
    std::map<const Value*, Value*> low_out;  // an Attention output -> its low-precision twin
    for (Node* n : attention) {
      std::vector<Value*> in = {Cast(n->input(0), n), Cast(n->input(1), n), Cast(n->input(2), n)};
      Value* y = n->output(0);
      std::vector<Value*> out = n->outputs();
      Value* y_low = y ? LowTwin(y) : nullptr;
      out[0] = y_low;
      Node* m = g_.RebuildNode(n, in, out);
      if (y) {
        Widen(y_low, y, m);
        low_out[y] = y_low;
      }
    }
    for (Node* n : grads) {
      Value* o = n->input(4);
      Value* o_low = low_out.count(o) ? low_out.at(o) : Cast(o, n);
      std::vector<Value*> in = {Cast(n->input(0), n), Cast(n->input(1), n), Cast(n->input(2), n),
                                Cast(n->input(3), n), o_low, n->input(5)};
      std::vector<Value*> wide = n->outputs(), out;
      for (Value* w : wide) out.push_back(LowTwin(w));
      Node* m = g_.RebuildNode(n, in, out);
      for (size_t i = 0; i < out.size(); ++i) Widen(out[i], wide[i], m);
    }
  }

  // Casts and layout ops the rewrites left without readers (the fp32 2-D views of activations
  // that the dW products read before they read the cast's).
  void Prune() {
    for (bool removed = true; removed;) {
      removed = false;
      for (const auto& n : g_.nodes()) {
        const std::string& t = n->op_type();
        if (!n->domain().empty() || (t != "Cast" && t != "Reshape" && t != "Transpose")) continue;
        if (!n->output(0)->consumers().empty() || n->output(0)->is_graph_output()) continue;
        Forget(n->output(0));
        g_.RemoveNode(n.get());
        removed = true;
        break;
      }
    }
  }

  // One narrowing cast moved above the Reshape or Transpose that only it reads (readers of
  // its shape follow it), which then moves half the bytes; its cast of a widened value cancels.
  // The attention output goes to the projection in low precision this way. False: none left.
  bool HoistNarrowing() {
    for (const auto& node : g_.nodes()) {
      Node* c = node.get();
      if (!IsCast(c) || c->output(0)->dtype() != low_) continue;
      Value* x = c->input(0);
      Node* layout = x->producer();
      if (!layout || !layout->domain().empty() || x->is_graph_output()) continue;
      if (layout->op_type() != "Transpose" && layout->op_type() != "Reshape") continue;
      std::vector<Node*> shape_readers;
      bool only_shapes = true;
      for (const auto& [r, slot] : x->consumers()) {
        if (r == c) continue;
        if (r->domain().empty() && r->op_type() == "Shape") shape_readers.push_back(r);
        else only_shapes = false;
      }
      if (!only_shapes) continue;
      std::vector<Value*> in = layout->inputs();
      in[0] = Cast(in[0], c);
      Value* y = c->output(0);
      Forget(x);
      Forget(y);
      g_.RemoveNode(c);
      g_.RebuildNode(layout, in, {y});
      for (Node* r : shape_readers) g_.SetNodeInput(r, 0, y);
      return true;
    }
    return false;
  }

  // One widening cast moved below the Reshape, Transpose or Concat that only widened values
  // feed: the gradient of attention's q, k and v is laid out and concatenated in low precision
  // and widened once, for the bias gradient. False: none left.
  bool SinkWidening() {
    for (const auto& node : g_.nodes()) {
      Node* layout = node.get();
      const std::string& t = layout->op_type();
      if (!layout->domain().empty() || (t != "Transpose" && t != "Reshape" && t != "Concat")) continue;
      std::vector<Value*> in = layout->inputs();
      const int data_inputs = t == "Concat" ? layout->num_inputs() : 1;
      bool widened = data_inputs > 0;
      for (int i = 0; i < data_inputs && widened; ++i) {
        Value* x = layout->input(i);
        widened = x && x->consumers().size() == 1 && !x->is_graph_output() && WidenedFrom(x);
        if (widened) in[i] = WidenedFrom(x);
      }
      if (!widened) continue;
      Value* y = layout->output(0);
      Value* y_low = LowTwin(y);
      Node* moved = g_.RebuildNode(layout, in, {y_low});
      Widen(y_low, y, moved);
      return true;
    }
    return false;
  }

  // A cast to the low type of a value widened from it reads the low value itself.
  void CancelRoundTrips() {
    std::vector<Node*> round_trips;
    for (const auto& n : g_.nodes())
      if (IsCast(n.get()) && n->output(0)->dtype() == low_ && !n->output(0)->is_graph_output() &&
          WidenedFrom(n->input(0)))
        round_trips.push_back(n.get());
    for (Node* c : round_trips) {
      Value* y = c->output(0);
      Value* src = WidenedFrom(c->input(0));
      for (auto& [from, to] : casts_)
        if (to == y) to = src;
      g_.RemoveNode(c);
      g_.ReplaceAllUsesWith(y, src);
    }
  }

  graph::Graph& g_;
  const DataType low_;
  const char* op_;
  const char* suffix_;
  std::map<const Value*, Value*> casts_;
};

}  // namespace

absl::StatusOr<int> ApplyAutocast(graph::Graph& g, Precision precision) {
  if (precision == Precision::kFp32) return 0;
  return Autocast(g, precision).Run();
}

}  // namespace cleave::trainer
