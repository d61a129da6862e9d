// Mixed precision (trainer/): see mixed_precision.h.
#include "trainer/mixed_precision.h"

#include <algorithm>
#include <map>
#include <numeric>
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
    const std::vector<Node*> convolutions = Convolutions();
    for (Node* n : products) RewriteProduct(n);
    RewriteAttention(attention, grads);
    RewriteConvolutions(convolutions);
    // Between the products, narrowing casts move up (to the products, which then write the low
    // type) and widening casts down, until none moves.
    for (Prune(); HoistNarrowing() || LowGeluGrad() || NarrowProduct() || SinkWidening() || CancelRoundTrips();) {
      moved_ = true;
      Prune();
    }
    const size_t rewritten = products.size() + attention.size() + grads.size() + convolutions.size();
    if (rewritten > 0 || moved_) {
      g_.opset_imports()[graph::kCleaveDomain] = 1;
      g_.RemoveUnusedValues();
      RETURN_IF_ERROR(g_.SortTopologically());
    }
    return static_cast<int>(rewritten);
  }

 private:
  // Whether n is a Gemm the low product can take: alpha 1, and no C or a float32 C of [N] added
  // once (torch's Linear on a 2-D input: it becomes the product's bias).
  static bool LinearGemm(const Node& n) {
    if (!n.domain().empty() || n.op_type() != "Gemm" || n.AttrFloat("alpha", 1.f) != 1.f) return false;
    const Value* c = n.num_inputs() > 2 ? n.input(2) : nullptr;
    if (!c) return true;
    const Value* y = n.output(0);
    return n.AttrFloat("beta", 1.f) == 1.f && c->dtype() == DataType::kFloat32 && y && y->shape().is_static() &&
           c->shape().is_static() && c->shape().rank() == 1 && y->shape().rank() == 2 &&
           c->shape()[0].value == y->shape()[1].value;
  }

  // The fp32 MatMul / bias-free FusedMatMul nodes of static shapes whose batch dims agree, and
  // the 2-D Gemms of LinearGemm.
  std::vector<Node*> Products() const {
    std::vector<Node*> products;
    for (const auto& n : g_.nodes()) {
      const bool mm = n->domain().empty() && n->op_type() == "MatMul";
      const bool fused = n->domain() == graph::kCleaveDomain && n->op_type() == "FusedMatMul" &&
                         n->num_inputs() == 2 && n->AttrString("activation", "").empty();
      const bool gemm = LinearGemm(*n);
      if (!mm && !fused && !gemm) continue;
      const Value *a = n->input(0), *b = n->input(1);
      if (!a || !b || a->dtype() != DataType::kFloat32 || b->dtype() != DataType::kFloat32) continue;
      if (!a->shape().is_static() || !b->shape().is_static()) continue;
      const int ra = a->shape().rank(), rb = b->shape().rank();
      if (ra < 2 || (rb != 2 && rb != ra) || (gemm && ra != 2)) continue;
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

  // Conv, ConvTranspose and their gradients (ai.cleave ConvGrad, ConvTransposeGrad) over fp32
  // operands: products too, which PyTorch's autocast runs in low precision.
  std::vector<Node*> Convolutions() const {
    std::vector<Node*> convs;
    for (const auto& n : g_.nodes()) {
      const std::string& t = n->op_type();
      const bool onnx = n->domain().empty() && (t == "Conv" || t == "ConvTranspose");
      const bool grad = n->domain() == graph::kCleaveDomain && (t == "ConvGrad" || t == "ConvTransposeGrad");
      if (!onnx && !grad) continue;
      bool fp32 = true;
      for (int i = 0; i < n->num_inputs(); ++i) fp32 &= !n->input(i) || n->input(i)->dtype() == DataType::kFloat32;
      if (fp32) convs.push_back(n.get());
    }
    return convs;
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
    // A Gemm's C (LinearGemm: [N], beta 1) is the product's bias.
    Value* bias = n->op_type() == "Gemm" && n->num_inputs() > 2 ? n->input(2) : nullptr;
    const std::string name = n->name();
    const auto meta = n->metadata();
    g_.RemoveNode(n);
    // (A product read only by a Transpose, a weight gradient, is swapped by the sessions'
    // TransformerFusion, as for fp32.)
    std::vector<Value*> in = {ca, cb};
    if (bias) in.push_back(bias);
    Node* m = g_.AddNode(op_, in, {y}, name, graph::kCleaveDomain);
    if (ta) m->SetAttr("transA", graph::Attribute::Int(1));
    if (tb) m->SetAttr("transB", graph::Attribute::Int(1));
    m->metadata() = meta;
  }

  // Attention in low precision (cuDNN's fused flash attention takes bf16 and fp16, not fp32):
  // q, k and v cast once for the forward and the gradient alike, the output returned in low
  // precision for the gradient and widened for everything else; lse and a bias stay fp32.
  void RewriteAttention(const std::vector<Node*>& attention, const std::vector<Node*>& grads) {
    std::map<const Value*, Value*> low_out;  // an Attention output -> its low-precision twin
    for (Node* n : attention) {
      std::vector<Value*> in = {Cast(n->input(0), n), Cast(n->input(1), n), Cast(n->input(2), n)};
      if (n->num_inputs() > 3) in.push_back(n->input(3));  // the bias, fp32
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
      if (n->num_inputs() > 6) in.push_back(n->input(6));
      std::vector<Value*> wide = n->outputs(), out;
      for (size_t i = 0; i < wide.size(); ++i) out.push_back(i < 3 ? LowTwin(wide[i]) : wide[i]);  // dbias: fp32
      Node* m = g_.RebuildNode(n, in, out);
      for (size_t i = 0; i < out.size() && i < 3; ++i) Widen(out[i], wide[i], m);
    }
  }

  // Each convolution over its operands cast once to the low type (the bias too), its outputs
  // (Y; or dX, dW, dB) written in the low type and widened for their readers: the kernels
  // accumulate in float32 and round each result once.
  void RewriteConvolutions(const std::vector<Node*>& convs) {
    for (Node* n : convs) {
      std::vector<Value*> in;
      for (int i = 0; i < n->num_inputs(); ++i) in.push_back(n->input(i) ? Cast(n->input(i), n) : nullptr);
      std::vector<Value*> wide = n->outputs(), out;
      for (Value* w : wide) out.push_back(w ? LowTwin(w) : nullptr);
      Node* m = g_.RebuildNode(n, in, out);
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i]) Widen(out[i], wide[i], m);
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

  // Whether v has a low-precision twin already (a cast, or the value it was widened from).
  bool HasLow(const Value* v) const { return casts_.count(v) || WidenedFrom(v); }

  // Whether v is the result of a float32-result product that only `reader` reads (a cast of it
  // for that reader folds into the product: NarrowProduct).
  bool ProductFor(const Value* v, const Node* reader) const {
    const Node* p = v->producer();
    return p && p->domain() == graph::kCleaveDomain && p->op_type() == op_ && !p->FindAttr("to") &&
           p->num_inputs() == 2 && !v->is_graph_output() && v->consumers().size() == 1 &&
           v->consumers()[0].first == reader;
  }

  // The inputs of f that move to the low type with its outputs, or empty if f does not move:
  // the layout ops, Split and AllGather move their data, Gelu its input, and an Add both operands where
  // one is cheap to narrow (a bias, broadcast; a product, whose cast folds into it; a value
  // narrowed already). The casts it adds then move fewer bytes in all than the fp32 Add and the
  // cast of its result did, even when the other operand is a full-size fp32 value.
  std::vector<int> MovingInputs(const Node* f) const {
    const std::string& t = f->op_type();
    const bool onnx = f->domain().empty(), cleave = f->domain() == graph::kCleaveDomain;
    if (onnx && (t == "Transpose" || t == "Reshape" || t == "Split")) return {0};
    if ((onnx || cleave) && t == "Gelu") return {0};
    // A tensor (or sequence) parallel gather of a product's operand gathers it in the low type:
    // half the bytes on the wire, as Megatron gathers in bf16.
    if (cleave && t == "AllGather") return {0};
    if (!onnx || t != "Add" || f->num_inputs() != 2) return {};
    const Value* y = f->output(0);
    if (!y->shape().is_static()) return {};
    for (int i = 0; i < 2; ++i) {
      const Value* x = f->input(i);
      if (!x || x->dtype() != DataType::kFloat32 || !x->shape().is_static()) return {};
    }
    for (int i = 0; i < 2; ++i) {
      const Value* x = f->input(i);
      if (x->shape().NumElements() < y->shape().NumElements() || HasLow(x) || ProductFor(x, f)) return {0, 1};
    }
    return {};
  }

  // One op whose every output only narrowing casts (and Shape) read rebuilt in
  // the low type over casts of its inputs: it then moves half the bytes, and its casts of
  // products fold into them. Attention's output goes to the projection in low precision this
  // way, and a layer's product + bias + GELU, or + bias + the q/k/v Split, write low precision
  // throughout. False: none left.
  bool HoistNarrowing() {
    for (const auto& node : g_.nodes()) {
      Node* f = node.get();
      const std::vector<int> moving = MovingInputs(f);
      if (moving.empty() || f->num_outputs() == 0) continue;
      std::vector<Value*> out;
      std::vector<Node*> casts;
      std::vector<std::pair<Node*, int>> shape_readers;  // and the output each reads
      bool narrowed = true;
      for (int i = 0; narrowed && i < f->num_outputs(); ++i) {
        Value* x = f->output(i);
        narrowed = x && !x->is_graph_output() && x->dtype() == DataType::kFloat32;
        Value* twin = nullptr;
        for (const auto& [r, slot] : narrowed ? x->consumers() : std::vector<std::pair<Node*, int>>{}) {
          if (IsCast(r) && r->output(0)->dtype() == low_ && !r->output(0)->is_graph_output()) {
            if (!twin) twin = r->output(0);
            casts.push_back(r);
          } else if (r->domain().empty() && r->op_type() == "Shape") {
            shape_readers.emplace_back(r, i);
          } else {
            narrowed = false;
          }
        }
        narrowed = narrowed && twin;
        out.push_back(twin);
      }
      if (!narrowed) continue;
      std::vector<Value*> in = f->inputs();
      for (int i : moving) in[i] = Cast(in[i], casts[0]);
      std::vector<std::pair<Value*, Value*>> same;  // a second cast of one output -> the twin
      for (Node* c : casts) {
        Value* y = c->output(0);
        Value* twin = out[c->input(0)->producer_output()];
        Forget(c->input(0));
        Forget(y);
        g_.RemoveNode(c);
        if (y != twin) same.emplace_back(y, twin);
      }
      g_.RebuildNode(f, in, out);
      for (auto [y, twin] : same) g_.ReplaceAllUsesWith(y, twin);
      for (auto [r, i] : shape_readers) g_.SetNodeInput(r, 0, out[i]);
      return true;
    }
    return false;
  }

  // A GeluGrad whose forward input has a low twin (its Gelu moved) computes in the low type too,
  // from a gradient cheap to narrow, and its result is widened for readers that keep fp32 (the
  // casts for the products cancel with it, and the bias gradient's sum sinks it). False: none.
  bool LowGeluGrad() {
    for (const auto& node : g_.nodes()) {
      Node* gg = node.get();
      if (gg->domain() != graph::kCleaveDomain || gg->op_type() != "GeluGrad" || gg->num_inputs() != 2) continue;
      Value* dy = gg->input(0);
      Value* h = gg->input(1);
      Value* dx = gg->output(0);
      if (!dy || !h || !dx || dy->dtype() != DataType::kFloat32 || h->dtype() != DataType::kFloat32 ||
          dx->is_graph_output() || !HasLow(h) || !(HasLow(dy) || ProductFor(dy, gg)))
        continue;
      std::vector<Value*> in = {Cast(dy, gg), Cast(h, gg)};
      Value* dx_low = LowTwin(dx);
      Node* m = g_.RebuildNode(gg, in, {dx_low});
      Widen(dx_low, dx, m);
      return true;
    }
    return false;
  }

  // A float32-result product that only narrowing casts read writes the low type itself (`to`),
  // rounded once from its float32 accumulation. False: none left.
  bool NarrowProduct() {
    for (const auto& node : g_.nodes()) {
      Node* m = node.get();
      if (m->domain() != graph::kCleaveDomain || m->op_type() != op_ || m->FindAttr("to") || m->num_inputs() != 2)
        continue;
      Value* y = m->output(0);
      if (!y || y->is_graph_output() || y->consumers().empty()) continue;
      bool narrowed = true;
      for (const auto& [r, slot] : y->consumers())
        narrowed &= IsCast(r) && r->output(0)->dtype() == low_ && !r->output(0)->is_graph_output();
      if (!narrowed) continue;
      std::vector<Node*> casts;
      for (const auto& [r, slot] : y->consumers()) casts.push_back(r);
      Value* low = casts[0]->output(0);
      Forget(y);
      std::vector<Value*> same;
      for (Node* c : casts) {
        if (c->output(0) != low) same.push_back(c->output(0));
        g_.RemoveNode(c);
      }
      Node* n = g_.RebuildNode(m, m->inputs(), {low});
      n->SetAttr("to", graph::Attribute::Int(static_cast<int64_t>(low_)));
      for (Value* v : same) g_.ReplaceAllUsesWith(v, low);
      return true;
    }
    return false;
  }

  // Whether a ReduceSum is a bias gradient: a backward node summing every axis but the last
  // (PyTorch sums those in the low type too); other sums (forward ones, a loss, a norm) stay fp32.
  static bool BiasGradientSum(const Node* n) {
    auto role = n->metadata().find("role");
    if (role == n->metadata().end() || role->second != "bwd") return false;
    const Value* x = n->input(0);
    const Value* y = n->output(0);
    if (!x || !y || !x->shape().is_static() || !y->shape().is_static() || x->shape().rank() < 2) return false;
    const int r = x->shape().rank();
    // The axes (an input from version 13, else the attribute): exactly 0 .. r-2.
    std::vector<int64_t> axes = n->AttrInts("axes");
    if (n->num_inputs() > 1 && n->input(1)) {
      const Tensor* t = graph::ConstantInput(*n, 1);
      if (!t || t->dtype() != DataType::kInt64) return false;
      axes.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
    }
    for (int64_t& a : axes) a = a < 0 ? a + r : a;
    std::sort(axes.begin(), axes.end());
    std::vector<int64_t> leading(r - 1);
    std::iota(leading.begin(), leading.end(), 0);
    return axes == leading && y->shape().NumElements() == x->shape()[r - 1].value;
  }

  // One widening cast moved below the Reshape, Transpose, Concat or ReduceSum that only widened
  // values feed: the gradient of attention's q, k and v is laid out and concatenated in low
  // precision, and the bias gradients sum low-precision gradients (accumulating in fp32, rounding
  // the [N] result once) and are widened. False: none left.
  bool SinkWidening() {
    for (const auto& node : g_.nodes()) {
      Node* layout = node.get();
      const std::string& t = layout->op_type();
      if (!layout->domain().empty() || (t != "Transpose" && t != "Reshape" && t != "Concat" && t != "ReduceSum"))
        continue;
      if (t == "ReduceSum" && !BiasGradientSum(layout)) continue;
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

  // A cast to the low type of a value widened from it reads the low value itself. False: none.
  bool CancelRoundTrips() {
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
    return !round_trips.empty();
  }

  graph::Graph& g_;
  const DataType low_;
  const char* op_;
  const char* suffix_;
  std::map<const Value*, Value*> casts_;
  bool moved_ = false;  // a cast moved (around casts the graph had, too)
};

}  // namespace

absl::StatusOr<int> ApplyAutocast(graph::Graph& g, Precision precision) {
  if (precision == Precision::kFp32) return 0;
  return Autocast(g, precision).Run();
}

}  // namespace cleave::trainer
