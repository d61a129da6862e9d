// Attention fusion (graph/passes/): the scaled scores of q and k, an optional additive bias and
// causal mask, the Softmax and the product with v -> one ai.cleave.Attention. The masks may be
// constants or computed from the sequence length as exporters emit them.
#include <cstdint>
#include <optional>
#include <vector>

#include "graph/passes/fusion_match.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

bool Is(const Node* n, const char* op) { return IsOnnxOp(n, op); }

// Whether the constant `mask` (dims [..., T, S], leading dims 1) marks exactly the causally
// hidden positions (j > i + S - T) when `hidden` is true there, or exactly the visible ones
// when `hidden` is false. Bool masks compare as is; float masks (added to the scores) count
// as hiding where they are <= -1e4.
bool IsCausalMask(const Value* mask, int64_t T, int64_t S, bool hidden) {
  if (!mask || !mask->initializer()) return false;
  const Tensor& m = *mask->initializer();
  const auto dims = m.dims();
  if (dims.size() < 2 || dims[dims.size() - 2] != T || dims[dims.size() - 1] != S || m.numel() != T * S) return false;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < S; ++j) {
      const int64_t e = i * S + j;
      bool flag;
      if (m.dtype() == DataType::kBool) flag = m.data<bool>()[e];
      else if (IsFloat(m.dtype())) flag = m.DoubleAt(e) <= -1e4;
      else return false;
      if (flag != (hidden == (j > i + S - T))) return false;
    }
  return true;
}

// Whether `mask` is computed in the graph as the causal pattern that exporters emit for a
// sequence length known only at run time: Trilu(ConstantOfShape(shape) of a nonzero value, k,
// upper), then any Nots, Identities and Casts to bool. The block of ones must be [..., T, S]
// (leading dims 1) by shape inference, and the Trilu's diagonal the causal one: k = S - T for
// the lower triangle (j <= i + k kept), S - T + 1 for the upper (j >= i + k kept), where T and
// S are the same dim or both static. `hidden` as for IsCausalMask. `additive`: the mask is added
// to the scores, so the fill must be <= -1e4 (-inf, say), behind Identities alone, and hide.
bool IsComputedCausalMask(const Value* mask, const Dim& T, const Dim& S, bool hidden, bool additive = false) {
  const Node* n = mask ? mask->producer() : nullptr;
  bool flip = false;
  while (n && (Is(n, "Identity") ||
               (!additive && (Is(n, "Not") || (Is(n, "Cast") && n->AttrInt("to", 0) ==
                                                                    static_cast<int64_t>(DataType::kBool)))))) {
    if (Is(n, "Not")) flip = !flip;
    n = n->input(0)->producer();
  }
  if (!Is(n, "Trilu")) return false;
  int64_t k = 0;
  if (n->num_inputs() > 1 && n->input(1)) {
    const Value* kv = n->input(1);
    if (!kv->initializer() || kv->initializer()->numel() != 1 || kv->dtype() != DataType::kInt64) return false;
    k = kv->initializer()->data<int64_t>()[0];
  }
  const bool upper = n->AttrInt("upper", 1) != 0;
  const Value* ones = n->input(0);
  const Node* fill = ones->producer();
  if (!Is(fill, "ConstantOfShape")) return false;
  const Attribute* value = fill->FindAttr("value");
  if (!value || value->type != AttrType::kTensor || value->t.numel() != 1 || value->t.DoubleAt(0) == 0) return false;
  if (additive && !(value->t.DoubleAt(0) <= -1e4)) return false;
  const Shape& shape = ones->shape();
  if (!shape.has_rank() || shape.rank() < 2) return false;
  const int r = shape.rank();
  for (int d = 0; d < r - 2; ++d)
    if (!(shape[d].is_static() && shape[d].value == 1)) return false;
  if (!SameDim(shape[r - 2], T) || !SameDim(shape[r - 1], S)) return false;
  int64_t offset;  // S - T
  if (SameDim(T, S)) offset = 0;
  else if (T.is_static() && S.is_static()) offset = S.value - T.value;
  else return false;
  if (k != (upper ? offset + 1 : offset)) return false;
  // The lower triangle keeps the visible keys, the upper the hidden ones.
  return flip == (upper ? !hidden : hidden);
}

bool IsLargeNegative(const Value* v) {
  std::optional<double> c = ScalarConst(v);
  return c && *c <= -1e4;
}

// Whether v is a (Fused)MatMul's product, or within `depth` elementwise steps (Mul, Div, Add,
// Where) of one: the scores' side of an Add, not the bias'.
bool ReachesProduct(const Value* v, int depth) {
  const Node* n = v ? v->producer() : nullptr;
  if (!n) return false;
  if (Is(n, "MatMul") || (n->domain() == kCleaveDomain && n->op_type() == "FusedMatMul")) return true;
  if (depth == 0 || !(Is(n, "Mul") || Is(n, "Div") || Is(n, "Add") || Is(n, "Where"))) return false;
  for (const Value* in : n->inputs())
    if (ReachesProduct(in, depth - 1)) return true;
  return false;
}

// Whether `bias` can be Attention's additive bias over the scores x [lead..., T, S]: float32 or
// x's type, and dims that broadcast to x's (each 1 or known equal to x's), of the lead dims
// before the last either all 1 or all x's (kernels/cpu/attention.h).
bool IsAttentionBias(const Value* bias, const Value* x) {
  if (bias->dtype() != DataType::kFloat32 && bias->dtype() != x->dtype()) return false;
  const Shape &b = bias->shape(), &s = x->shape();
  if (!b.has_rank() || b.rank() > s.rank()) return false;
  const int R = s.rank(), off = R - b.rank();
  const auto dim = [&](int d) { return d < off ? Dim(int64_t{1}) : b[d - off]; };
  const auto one = [&](int d) { return dim(d).is_static() && dim(d).value == 1; };
  bool some = false, whole = true;
  for (int d = 0; d < R; ++d) {
    if (!one(d) && !SameDim(dim(d), s[d])) return false;
    if (d + 3 < R) {
      some |= !one(d);
      whole &= SameDim(dim(d), s[d]);
    }
  }
  return !some || whole;
}

}  // namespace

// softmax(scale * q k^T [+ bias] [+ causal mask]) v over the last two axes ->
// ai.cleave.Attention, at the Softmax: its input is the scaled scores, optionally masked by
// Where(hidden, -inf, scores), Where(visible, scores, -inf) with a causal mask that is a
// constant or computed from the sequence length (IsComputedCausalMask), or Add(scores, mask)
// with a constant one or a computed -inf triangle; and, inside or outside that mask, optionally
// Add(scores, bias) with a bias that IsAttentionBias (a padding mask, a learned position bias),
// which becomes the op's;
// q, k and v may have symbolic dims where the same symbols show them equal. The scaled scores are Mul/Div of MatMul(q, Transpose(k)) (or FusedMatMul(q, k, transB = 1) with
// no bias or activation) by a scalar constant, or the product itself; the probabilities'
// one reader is MatMul(p, v). Every intermediate must have no other reader, so a training
// graph whose backward reads them is left alone (fuse before autodiff instead).
bool FuseAttention(Graph* g, Node* softmax) {
  const Value* x = softmax->input(0);
  if (g->OpsetFor("") < 13 || !x->shape().has_rank()) return false;
  const int r = x->shape().rank();
  if (r < 2) return false;
  int64_t axis = softmax->AttrInt("axis", -1);
  if (axis < 0) axis += r;
  if (axis != r - 1) return false;
  if (x->dtype() != DataType::kFloat32 && x->dtype() != DataType::kFloat64) return false;
  const Dim T = x->shape()[r - 2], S = x->shape()[r - 1];
  std::vector<Node*> pattern = {softmax};
  // The reader: MatMul(p, v).
  Node* pv = SoleConsumer(softmax->output(0));
  if (!Is(pv, "MatMul") || pv->input(0) != softmax->output(0)) return false;
  Value* v = pv->input(1);
  // The mask: a constant, or one the graph computes (left to dead-code elimination).
  auto causal_mask = [&](const Value* mask, bool hidden) {
    return (T.is_static() && S.is_static() && IsCausalMask(mask, T.value, S.value, hidden)) ||
           IsComputedCausalMask(mask, T, S, hidden);
  };
  bool causal = false;
  Value* scaled = softmax->input(0);
  Value* bias = nullptr;
  // The masks, outermost first: a causal one and an additive bias, in either order.
  for (Node* m = scaled->producer(); m && SoleUse(scaled) && !(causal && bias); m = scaled->producer()) {
    Value* inner = nullptr;  // the scores under m's mask
    Value* added = nullptr;  // m's bias
    if (!causal && Is(m, "Where") && IsLargeNegative(m->input(1)) && causal_mask(m->input(0), true)) {
      inner = m->input(2);
    } else if (!causal && Is(m, "Where") && IsLargeNegative(m->input(2)) && causal_mask(m->input(0), false)) {
      inner = m->input(1);
    } else if (Is(m, "Add")) {
      for (int i : {1, 0}) {  // the mask on either side
        Value* mask = m->input(i);
        if (!causal && ((T.is_static() && S.is_static() && IsCausalMask(mask, T.value, S.value, true)) ||
                        IsComputedCausalMask(mask, T, S, true, /*additive=*/true))) {
          inner = m->input(1 - i);
          break;
        }
        if (!bias && !ReachesProduct(mask, 3) && IsAttentionBias(mask, x)) {
          added = mask;
          inner = m->input(1 - i);
          break;
        }
      }
    }
    if (!inner) break;
    if (added) bias = added;
    else causal = true;
    pattern.push_back(m);
    scaled = inner;
  }
  // The scale.
  double scale = 1.0;
  Value* scores = scaled;
  Node* sc = scaled->producer();
  if (sc && SoleUse(scaled) && (Is(sc, "Mul") || Is(sc, "Div"))) {
    const bool first_const = Is(sc, "Mul") && ScalarConst(sc->input(0)).has_value();
    const std::optional<double> c = ScalarConst(sc->input(first_const ? 0 : 1));
    if (c && *c != 0) {
      scale = Is(sc, "Mul") ? *c : 1.0 / *c;
      scores = sc->input(first_const ? 1 : 0);
      pattern.push_back(sc);
    }
  }
  // The product q k^T.
  Node* qk = scores->producer();
  if (!qk || !SoleUse(scores)) return false;
  Value* q = qk->input(0);
  Value* k = nullptr;
  // k^T made by one Transpose of some x (exporters merge the heads transpose with the last-two
  // swap, perm [0, 2, 3, 1]): k is x under that perm with its last two entries swapped.
  Node* kt = qk->input(1)->producer();
  std::vector<int64_t> k_perm;
  if (Is(qk, "MatMul") && Is(kt, "Transpose") && SoleUse(qk->input(1)) && kt->input(0)->shape().has_rank() &&
      kt->input(0)->shape().rank() == r) {
    k_perm = kt->AttrInts("perm", {});
    if (k_perm.empty())
      for (int d = r - 1; d >= 0; --d) k_perm.push_back(d);
    if (static_cast<int>(k_perm.size()) != r) return false;
    std::swap(k_perm[r - 2], k_perm[r - 1]);
    k = kt->input(0);  // replaced below when k_perm is not the identity
    pattern.push_back(kt);
  } else if (qk->domain() == kCleaveDomain && qk->op_type() == "FusedMatMul" && qk->num_inputs() == 2 &&
             qk->AttrInt("transB", 0) == 1 && qk->AttrInt("transA", 0) == 0 &&
             qk->AttrString("activation", "").empty()) {
    k = qk->input(1);
  } else {
    return false;
  }
  pattern.push_back(qk);
  bool k_permuted = false;
  for (int d = 0; d < static_cast<int>(k_perm.size()); ++d) k_permuted |= k_perm[d] != d;
  // Same leading dims for q, k and v, known equal (no broadcasting inside the fused op); with
  // a sequence length known only at run time they are the same symbols.
  for (const Value* t : {q, k, v})
    if (!t->shape().has_rank() || t->shape().rank() != r || t->dtype() != x->dtype()) return false;
  std::vector<Dim> k_dims;
  if (k_permuted)
    for (int64_t d : k_perm) k_dims.push_back(k->shape()[static_cast<int>(d)]);
  const Shape k_shape = k_permuted ? Shape(k_dims) : k->shape();
  const Shape &q_shape = q->shape(), &v_shape = v->shape();
  if (!SameDim(q_shape[r - 1], k_shape[r - 1]) || !SameDim(k_shape[r - 2], v_shape[r - 2]) ||
      !SameDim(q_shape[r - 2], T) || !SameDim(k_shape[r - 2], S))
    return false;
  for (int d = 0; d < r - 2; ++d)
    if (!SameDim(q_shape[d], k_shape[d]) || !SameDim(q_shape[d], v_shape[d])) return false;
  pattern.push_back(pv);
  if (k_permuted) {
    // The keys in [..., S, D] layout, from the same source.
    Value* kv = g->GetOrCreateValue(g->UniqueName(kt->output(0)->name() + "/keys"));
    kv->set_dtype(k->dtype());
    kv->set_shape(k_shape);
    Node* t = g->AddNode("Transpose", {k}, {kv}, g->UniqueName(kt->name() + "/keys"));
    t->SetAttr("perm", Attribute::Ints(k_perm));
    t->metadata() = kt->metadata();
    k = kv;
  }
  std::vector<Value*> inputs = {q, k, v};
  if (bias) inputs.push_back(bias);
  Node* fused = Replace(g, pattern, "Attention", inputs, pv->output(0));
  fused->SetAttr("scale", Attribute::Float(static_cast<float>(scale)));
  fused->SetAttr("causal", Attribute::Int(causal ? 1 : 0));
  return true;
}

}  // namespace cleave::graph
