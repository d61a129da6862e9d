// Padding of a vocabulary-sized class dimension to an aligned width (graph/passes/pass.h).
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

// Two-byte elements per 16 bytes: the row pitch cuBLASLt's TMA kernels need.
constexpr int64_t kAlign = 8;
// Smaller class counts are left alone: their products are small, and padding them adds more.
constexpr int64_t kMinClasses = 1024;

bool IsLowProduct(const Node* n) { return IsCleaveOp(n, "MatMulBf16") || IsCleaveOp(n, "MatMulF16"); }

int64_t StaticLastDim(const Value* v) {
  if (!v || !v->shape().is_static() || v->shape().rank() < 1) return -1;
  return v->shape()[v->shape().rank() - 1].value;
}

// V rounded up to a multiple of 128 (a whole tile) where that adds at most 1%, else of 8.
int64_t PaddedClasses(int64_t v) {
  const int64_t tile = (v + 127) / 128 * 128;
  if ((tile - v) * 100 <= v) return tile;
  return (v + kAlign - 1) / kAlign * kAlign;
}

// A Reshape whose input and output both end in the V classes and whose shape is a constant
// ending in V or -1 (or 0, copying the input's last dim, where the ranks agree): the classes
// stay the last axis, so padding them pads that axis.
bool KeepsClassAxis(const Node* r, int64_t classes) {
  const Value* shape = r->input(1);
  if (!shape || !shape->initializer() || shape->dtype() != DataType::kInt64 || shape->initializer()->numel() < 1)
    return false;
  const int64_t last = shape->initializer()->data<int64_t>()[shape->initializer()->numel() - 1];
  if (StaticLastDim(r->input(0)) != classes || StaticLastDim(r->output(0)) != classes) return false;
  if (last == 0) return r->input(0)->shape().rank() == r->output(0)->shape().rank();
  return last == classes || last == -1;
}

// The readers of v, through Reshapes that keep the class axis last (appended to `reshapes`),
// into `readers`; false where v or one of the reshaped values is a graph output.
bool ReadersThroughReshapes(Value* v, int64_t classes, std::vector<Node*>& reshapes,
                            std::vector<std::pair<Node*, int>>& readers) {
  if (v->is_graph_output()) return false;
  for (const auto& [reader, slot] : v->consumers()) {
    if (IsOnnxOp(reader, "Reshape") && slot == 0) {
      if (!KeepsClassAxis(reader, classes)) return false;
      reshapes.push_back(reader);
      if (!ReadersThroughReshapes(reader->output(0), classes, reshapes, readers)) return false;
    } else {
      readers.emplace_back(reader, slot);
    }
  }
  return true;
}

bool HasInput(const Node* n, int i) { return n->num_inputs() > i && n->input(i); }
bool OutputRead(const Node* n, int i) {
  const Value* v = n->output(i);
  return v && (v->is_graph_output() || !v->consumers().empty());
}

// The cross-entropy over the scores: the forward loss (no weights, no log_prob read) or the
// from-scores gradient over one vocabulary (no weights, no class_offset / num_classes).
bool IsPlainCrossEntropy(const Node* n, int slot) {
  // [N, C] scores: the classes are their last axis (a spatial loss has them on axis 1).
  const Value* scores = n->input(slot);
  if (!scores || !scores->shape().has_rank() || scores->shape().rank() != 2) return false;
  if (IsOnnxOp(n, "SoftmaxCrossEntropyLoss")) return slot == 0 && !HasInput(n, 2) && !OutputRead(n, 1);
  return IsCleaveOp(n, "SoftmaxCrossEntropyLossGrad") && slot == 1 && n->AttrInt("from_scores", 0) == 1 &&
         !n->HasAttr("class_offset") && !n->HasAttr("num_classes") && !HasInput(n, 3);
}

// Every entry of an initializer-to-be of `dtype`, [count], set to `value` (0 or -inf).
Tensor Filled(DataType dtype, std::vector<int64_t> dims, float value) {
  Tensor t(dtype, std::move(dims));
  const int64_t n = t.numel();
  if (value == 0.f) return t;
  if (dtype == DataType::kFloat32) {
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = value;
  } else {
    const uint16_t bits = dtype == DataType::kBFloat16 ? FloatToBFloat16(value) : FloatToHalf(value);
    for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = bits;
  }
  return t;
}

Value* Constant(Graph* g, const std::string& hint, Tensor t) {
  return g->AddInitializer(g->UniqueName(hint), std::move(t));
}

// A new value of `dtype` and static `dims`.
Value* NewValue(Graph* g, const std::string& hint, DataType dtype, const std::vector<int64_t>& dims) {
  Value* v = g->CreateUniqueValue(hint);
  v->set_dtype(dtype);
  v->set_shape(Shape::FromDims(dims));
  return v;
}

// out = Concat(a, b) along axis 0 ([rows, ...]), with the metadata of `like`.
Value* Concat0(Graph* g, Value* a, Value* b, const std::string& hint, int64_t rows, const Node* like) {
  std::vector<int64_t> dims = a->shape().StaticDims();
  dims[0] = rows;
  Value* out = NewValue(g, hint, a->dtype(), dims);
  Node* c = g->AddNode("Concat", {a, b}, {out}, g->UniqueName(hint), "");
  c->SetAttr("axis", Attribute::Int(0));
  c->metadata() = like->metadata();
  return out;
}

// The logits product y = h · Wᵀ (MatMulBf16 / MatMulF16, transB = 1, W a static [V, C] with
// V >= kMinClasses not a multiple of 8) and its gradient products, padded to Vp classes; false
// (nothing changed) where the pattern does not hold whole.
bool PadClasses(Graph* g, Node* p) {
  if (!IsLowProduct(p) || p->AttrInt("transB", 0) != 1 || p->AttrInt("transA", 0) != 0) return false;
  Value* w = p->input(1);
  const Shape& ws = w->shape();
  if (!ws.is_static() || ws.rank() != 2) return false;
  const int64_t classes = ws[0].value, width = ws[1].value;
  if (classes < kMinClasses || classes % kAlign == 0) return false;
  if (StaticLastDim(p->output(0)) != classes) return false;
  if (HasInput(p, 2) && !p->input(2)->shape().is_static()) return false;

  std::vector<Node*> reshapes;
  std::vector<std::pair<Node*, int>> readers;
  if (!ReadersThroughReshapes(p->output(0), classes, reshapes, readers) || readers.empty()) return false;
  std::vector<Node*> input_grads, weight_grads;
  for (const auto& [reader, slot] : readers) {
    if (!IsPlainCrossEntropy(reader, slot)) return false;
    if (!IsCleaveOp(reader, "SoftmaxCrossEntropyLossGrad") || !reader->output(0)) continue;
    std::vector<std::pair<Node*, int>> grad_readers;
    if (!ReadersThroughReshapes(reader->output(0), classes, reshapes, grad_readers)) return false;
    for (const auto& [q, qslot] : grad_readers) {
      if (!IsLowProduct(q) || qslot != 0 || q->AttrInt("transB", 0) != 0 || HasInput(q, 2)) return false;
      if (q->AttrInt("transA", 0) == 0 && q->input(1) == w) {
        input_grads.push_back(q);  // dh = dy · W: the classes are the reduction
      } else if (q->AttrInt("transA", 0) == 1 && q->input(0)->shape().rank() == 2 && !q->HasAttr("rows") &&
                 q->output(0)->shape().is_static() &&
                 q->output(0)->shape().rank() == 2 && q->output(0)->shape()[0].value == classes) {
        weight_grads.push_back(q);  // dW = dyᵀ · h: one row per class
      } else {
        return false;
      }
    }
  }

  const int64_t padded = PaddedClasses(classes), extra = padded - classes;
  const DataType result = p->output(0)->dtype();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // W gains zero rows; the padded classes' scores get -inf, so the softmax gives them 0.
  Value* zeros = Constant(g, w->name() + "/class_padding", Filled(w->dtype(), {extra, width}, 0.f));
  Value* w_padded = Concat0(g, w, zeros, w->name() + "/padded", padded, p);
  Value* bias = nullptr;
  if (HasInput(p, 2)) {
    Value* tail = Constant(g, p->name() + "/padded_classes", Filled(result, {extra}, neg_inf));
    bias = Concat0(g, p->input(2), tail, p->input(2)->name() + "/padded", padded, p);
  } else {
    Tensor mask = Filled(result, {padded}, 0.f);
    Tensor tail = Filled(result, {extra}, neg_inf);
    std::memcpy(static_cast<char*>(mask.raw()) + classes * ElementSize(result), tail.raw(),
                extra * ElementSize(result));
    bias = Constant(g, p->name() + "/class_mask", std::move(mask));
  }
  g->RebuildNode(p, {p->input(0), w_padded, bias}, p->outputs());
  for (Node* r : reshapes) {
    Tensor s = r->input(1)->initializer()->Clone();
    int64_t& last = s.data<int64_t>()[s.numel() - 1];
    if (last == classes) last = padded;
    g->SetNodeInput(r, 1, Constant(g, r->input(1)->name() + "/padded", std::move(s)));
  }
  for (Node* q : input_grads) g->SetNodeInput(q, 1, w_padded);
  // dW = dyᵀ · h reads the padded dy [N, Vp] but forms only the V real classes' rows: the
  // padding's rows (0) are never written, and dW keeps its [V, C] shape.
  for (Node* q : weight_grads) q->SetAttr("rows", Attribute::Int(classes));
  return true;
}

}  // namespace

absl::StatusOr<bool> ClassPadding::Run(Graph* g) { return RewriteToFixedPoint(g, PadClasses); }

}  // namespace cleave::graph
