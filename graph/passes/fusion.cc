// Transformer fusions for the CPU provider (graph/passes/); attention's is in
// attention_fusion.cc, the rotary embedding's in rotary_fusion.cc.
// Each rewrite matches a pattern exporters emit, checks that the intermediate values have no
// other readers (so nothing observable changes), and replaces the pattern by one ai.cleave
// op. Constants are matched by value with a relative tolerance of 1e-3, since exporters
// write sqrt(2) and 0.5 as rounded float literals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/passes/fusion_match.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

std::optional<double> ScalarConst(const Value* v) {
  if (!v || !v->initializer() || v->initializer()->numel() != 1 || !IsFloat(v->dtype()))
    return std::nullopt;
  return v->initializer()->DoubleAt(0);
}

bool Near(std::optional<double> v, double want) {
  return v && std::fabs(*v - want) <= 1e-3 * std::fabs(want);
}

Value* Other(const Node* n, const Value* x) {
  if (n->input(0) == x) return n->input(1);
  if (n->input(1) == x) return n->input(0);
  return nullptr;
}

Node* Replace(Graph* g, const std::vector<Node*>& pattern, const std::string& op,
              const std::vector<Value*>& inputs, Value* output) {
  std::string name = pattern.back()->name() + "/fused";
  auto metadata = output->producer()->metadata();
  for (Node* n : pattern) g->RemoveNode(n);
  g->opset_imports()[kCleaveDomain] = 1;
  Node* fused = g->AddNode(op, inputs, {output}, name, kCleaveDomain);
  fused->metadata() = std::move(metadata);
  return fused;
}

bool SwapsLastTwo(const Node* t) {
  if (!IsOnnxOp(t, "Transpose") || !t->input(0)->shape().has_rank()) return false;
  const int r = t->input(0)->shape().rank();
  if (r < 2) return false;
  std::vector<int64_t> perm = t->AttrInts("perm", {});
  if (perm.empty()) return r == 2;  // the default reverses every axis
  if (static_cast<int>(perm.size()) != r) return false;
  for (int i = 0; i < r - 2; ++i)
    if (perm[i] != i) return false;
  return perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
}

namespace {

bool Is(const Node* n, const char* op) { return IsOnnxOp(n, op); }

// x * 0.5 * (1 + erf(x / sqrt(2))) in the two association orders exporters produce.
bool FuseErfGelu(Graph* g, Node* erf) {
  Node* scale = erf->input(0)->producer();
  if (!scale || !SoleUse(erf->input(0))) return false;
  Value* x = nullptr;
  if (Is(scale, "Div") && Near(ScalarConst(scale->input(1)), std::sqrt(2.0))) x = scale->input(0);
  if (Is(scale, "Mul") && Near(ScalarConst(scale->input(1)), 1 / std::sqrt(2.0))) x = scale->input(0);
  if (Is(scale, "Mul") && Near(ScalarConst(scale->input(0)), 1 / std::sqrt(2.0))) x = scale->input(1);
  if (!x) return false;
  Node* add = SoleConsumer(erf->output(0));
  if (!Is(add, "Add") || !Near(ScalarConst(Other(add, erf->output(0))), 1.0)) return false;
  Node* mul = SoleConsumer(add->output(0));
  if (!Is(mul, "Mul")) return false;
  Value* other = Other(mul, add->output(0));
  if (other == x) {  // (x * (1 + erf)) * 0.5
    Node* half = SoleConsumer(mul->output(0));
    if (!Is(half, "Mul") || !Near(ScalarConst(Other(half, mul->output(0))), 0.5)) return false;
    Replace(g, {scale, erf, add, mul, half}, "Gelu", {x}, half->output(0));
    return true;
  }
  Node* xh = other ? other->producer() : nullptr;  // (x * 0.5) * (1 + erf)
  if (!Is(xh, "Mul") || !SoleUse(other) || Other(xh, x) == nullptr ||
      !Near(ScalarConst(Other(xh, x)), 0.5))
    return false;
  Replace(g, {scale, erf, add, xh, mul}, "Gelu", {x}, mul->output(0));
  return true;
}

// True when v = x^3, written as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x); the
// nodes of the cube are appended to `nodes`.
bool IsCube(Value* v, Value* x, std::vector<Node*>& nodes) {
  Node* n = v->producer();
  if (!SoleUse(v) || !n) return false;
  if (Is(n, "Pow") && n->input(0) == x && Near(ScalarConst(n->input(1)), 3.0)) {
    nodes.push_back(n);
    return true;
  }
  if (!Is(n, "Mul")) return false;
  Value* sq = Other(n, x);
  Node* sqn = sq ? sq->producer() : nullptr;
  if (!Is(sqn, "Mul") || !SoleUse(sq) || sqn->input(0) != x || sqn->input(1) != x) return false;
  nodes.push_back(n);
  nodes.push_back(sqn);
  return true;
}

// The value `c * v` or `v * c` multiplies with the constant c, or nullptr.
Value* ScaledBy(Node* mul, double c) {
  if (!Is(mul, "Mul")) return nullptr;
  if (Near(ScalarConst(mul->input(1)), c)) return mul->input(0);
  if (Near(ScalarConst(mul->input(0)), c)) return mul->input(1);
  return nullptr;
}

// 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) -> Gelu(approximate = "tanh").
bool FuseTanhGelu(Graph* g, Node* tanh) {
  std::vector<Node*> nodes = {tanh};
  Node* scale = tanh->input(0)->producer();
  Value* inner = ScaledBy(scale, std::sqrt(2.0 / M_PI));
  if (!inner || !SoleUse(tanh->input(0)) || !SoleUse(inner)) return false;
  Node* add = inner->producer();
  if (!Is(add, "Add")) return false;
  nodes.insert(nodes.end(), {scale, add});
  Value* x = nullptr;
  for (int k = 0; k < 2 && !x; ++k) {
    Value* cubic = add->input(1 - k);
    Node* cm = cubic->producer();
    Value* cube = ScaledBy(cm, 0.044715);
    std::vector<Node*> cube_nodes;
    if (cube && SoleUse(cubic) && IsCube(cube, add->input(k), cube_nodes)) {
      x = add->input(k);
      nodes.push_back(cm);
      nodes.insert(nodes.end(), cube_nodes.begin(), cube_nodes.end());
    }
  }
  if (!x) return false;
  Node* plus1 = SoleConsumer(tanh->output(0));
  if (!Is(plus1, "Add") || !Near(ScalarConst(Other(plus1, tanh->output(0))), 1.0)) return false;
  Node* mul = SoleConsumer(plus1->output(0));
  if (!Is(mul, "Mul")) return false;
  nodes.insert(nodes.end(), {plus1, mul});
  Value* other = Other(mul, plus1->output(0));
  Value* out = nullptr;
  if (other == x) {  // 0.5 * (x * (1 + tanh))
    Node* half = SoleConsumer(mul->output(0));
    if (ScaledBy(half, 0.5) != mul->output(0)) return false;
    nodes.push_back(half);
    out = half->output(0);
  } else {  // (0.5 * x) * (1 + tanh)
    Node* xh = other ? other->producer() : nullptr;
    if (!SoleUse(other) || ScaledBy(xh, 0.5) != x) return false;
    nodes.push_back(xh);
    out = mul->output(0);
  }
  Node* gelu = Replace(g, nodes, "Gelu", {x}, out);
  gelu->SetAttr("approximate", Attribute::String("tanh"));
  return true;
}

// The reduction axes of a ReduceMean node if they are exactly the last axis.
bool ReducesLastAxis(const Node* n) {
  if (!Is(n, "ReduceMean") || n->AttrInt("keepdims", 1) != 1) return false;
  std::vector<int64_t> axes = n->AttrInts("axes");
  if (n->input(1)) {
    if (!n->input(1)->initializer()) return false;
    axes = n->input(1)->initializer()->ToInt64Vector();
  }
  const Shape& s = n->input(0)->shape();
  return axes.size() == 1 && (axes[0] == -1 || (s.has_rank() && axes[0] == s.rank() - 1));
}

// (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta over the last axis.
bool FuseLayerNorm(Graph* g, Node* mean) {
  if (!ReducesLastAxis(mean)) return false;
  Value* x = mean->input(0);
  Node* sub = SoleConsumer(mean->output(0));
  if (!Is(sub, "Sub") || sub->input(0) != x || sub->input(1) != mean->output(0)) return false;
  Value* d = sub->output(0);
  if (d->consumers().size() != 2 || d->is_graph_output()) return false;
  Node* pow = nullptr;
  Node* div = nullptr;
  for (auto [c, idx] : d->consumers()) {
    if (Is(c, "Pow") && idx == 0 && Near(ScalarConst(c->input(1)), 2.0)) pow = c;
    if (Is(c, "Div") && idx == 0) div = c;
  }
  if (!pow || !div) return false;
  Node* var = SoleConsumer(pow->output(0));
  if (!var || !ReducesLastAxis(var)) return false;
  Node* add_eps = SoleConsumer(var->output(0));
  if (!Is(add_eps, "Add")) return false;
  std::optional<double> eps = ScalarConst(Other(add_eps, var->output(0)));
  if (!eps) return false;
  Node* sqrt = SoleConsumer(add_eps->output(0));
  if (!Is(sqrt, "Sqrt") || div->input(1) != sqrt->output(0) || !SoleUse(sqrt->output(0))) return false;
  Node* mul = SoleConsumer(div->output(0));
  if (!Is(mul, "Mul")) return false;
  Value* gamma = Other(mul, div->output(0));
  Node* add = SoleConsumer(mul->output(0));
  if (!gamma || !gamma->initializer() || !Is(add, "Add")) return false;
  Value* beta = Other(add, mul->output(0));
  if (!beta || !beta->initializer()) return false;
  const Shape& xs = x->shape();
  if (!xs.has_rank() || !xs[xs.rank() - 1].is_static()) return false;
  int64_t c = xs[xs.rank() - 1].value;
  if (gamma->initializer()->numel() != c || beta->initializer()->numel() != c) return false;
  if (gamma->shape().rank() != 1 || beta->shape().rank() != 1) return false;
  Node* ln = Replace(g, {mean, sub, pow, var, add_eps, sqrt, div, mul, add}, "LayerNormalization",
                     {x, gamma, beta}, add->output(0));
  ln->SetAttr("axis", Attribute::Int(-1));
  ln->SetAttr("epsilon", Attribute::Float(static_cast<float>(*eps)));
  return true;
}

// x / sqrt(mean(x^2) + eps) * gamma over the last axis, as LLaMA's RMSNorm exports: the
// square as Pow(x, 2) or Mul(x, x); the division as Div(x, s), or x times Div(1, s) or
// Reciprocal(s); gamma a 1-D parameter on either side of the last Mul
// -> ai.cleave.RMSNormalization(x, gamma).
bool FuseRMSNorm(Graph* g, Node* var) {
  if (!ReducesLastAxis(var) || !SoleUse(var->input(0))) return false;
  Node* sq = var->input(0)->producer();
  Value* x = nullptr;
  if (Is(sq, "Pow") && Near(ScalarConst(sq->input(1)), 2.0)) x = sq->input(0);
  if (Is(sq, "Mul") && sq->input(0) == sq->input(1)) x = sq->input(0);
  if (!x || (x->dtype() != DataType::kFloat32 && x->dtype() != DataType::kFloat64)) return false;
  Node* add_eps = SoleConsumer(var->output(0));
  if (!Is(add_eps, "Add")) return false;
  std::optional<double> eps = ScalarConst(Other(add_eps, var->output(0)));
  Node* sqrt = SoleConsumer(add_eps->output(0));
  if (!eps || !Is(sqrt, "Sqrt")) return false;
  Value* s = sqrt->output(0);
  Node* step = SoleConsumer(s);
  if (!step) return false;
  std::vector<Node*> nodes = {sq, var, add_eps, sqrt, step};
  Value* normed = nullptr;
  if (Is(step, "Div") && step->input(0) == x && step->input(1) == s) {
    normed = step->output(0);
  } else if (Is(step, "Reciprocal") ||
             (Is(step, "Div") && step->input(1) == s && Near(ScalarConst(step->input(0)), 1.0))) {
    Node* mul = SoleConsumer(step->output(0));
    if (!Is(mul, "Mul") || Other(mul, step->output(0)) != x) return false;
    nodes.push_back(mul);
    normed = mul->output(0);
  }
  Node* scale = normed ? SoleConsumer(normed) : nullptr;
  if (!Is(scale, "Mul")) return false;
  Value* gamma = Other(scale, normed);
  const Shape& xs = x->shape();
  if (!gamma || !gamma->initializer() || gamma->dtype() != x->dtype() || gamma->shape().rank() != 1 ||
      !xs.has_rank() || xs.rank() == 0 || !xs[xs.rank() - 1].is_static() ||
      gamma->initializer()->numel() != xs[xs.rank() - 1].value)
    return false;
  nodes.push_back(scale);
  Node* rn = Replace(g, nodes, "RMSNormalization", {x, gamma}, scale->output(0));
  rn->SetAttr("axis", Attribute::Int(-1));
  rn->SetAttr("epsilon", Attribute::Float(static_cast<float>(*eps)));
  return true;
}

// gate * Sigmoid(gate) * up (silu(gate) * up, LLaMA's SwiGLU as exported), either operand order
// in each Mul, gate and up of one shape and float type -> ai.cleave.SwiGLU(gate, up).
bool FuseSwiGlu(Graph* g, Node* sigmoid) {
  Value* gate = sigmoid->input(0);
  Node* silu = SoleConsumer(sigmoid->output(0));
  if (!Is(silu, "Mul") || Other(silu, sigmoid->output(0)) != gate) return false;
  Node* mul = SoleConsumer(silu->output(0));
  if (!Is(mul, "Mul")) return false;
  Value* up = Other(mul, silu->output(0));
  if (!up || up == silu->output(0)) return false;
  const Shape &gs = gate->shape(), &us = up->shape();
  if ((gate->dtype() != DataType::kFloat32 && gate->dtype() != DataType::kFloat64) || up->dtype() != gate->dtype() ||
      !gs.has_rank() || !us.has_rank() || gs.rank() != us.rank())
    return false;
  for (int k = 0; k < gs.rank(); ++k)
    if (!SameDim(gs[k], us[k])) return false;
  Replace(g, {sigmoid, silu, mul}, "SwiGLU", {gate, up}, mul->output(0));
  return true;
}

// The 2-D transpose feeding only this MatMul as its B, if any: MatMul(A, Transpose(W)) is
// FusedMatMul(A, W, transB = 1), which reads W in place instead of copying it every step
// (the tied LM head of a GPT exported for training has exactly this shape).
Node* TransposedWeight(const Node* mm) {
  Value* b = mm->input(1);
  Node* t = b->producer();
  if (!Is(t, "Transpose") || !SoleUse(b) || t->input(0)->shape().rank() != 2) return nullptr;
  std::vector<int64_t> perm = t->AttrInts("perm", {1, 0});
  return perm == std::vector<int64_t>{1, 0} ? t : nullptr;
}

// MatMul(A, W) + b with W a 2-D float weight and b a [N] constant -> FusedMatMul(A, W, b);
// with W transposed, the transpose is folded in too (with or without a bias).
bool FuseMatMulBias(Graph* g, Node* mm) {
  Node* transpose = TransposedWeight(mm);
  Value* w = transpose ? transpose->input(0) : mm->input(1);
  if (!(transpose || w->initializer()) || w->shape().rank() != 2 || !IsFloat(w->dtype())) return false;
  if (!mm->input(0)->shape().has_rank() || mm->input(0)->shape().rank() < 2) return false;
  int64_t n = w->shape()[transpose ? 0 : 1].value;
  Node* add = SoleConsumer(mm->output(0));
  Value* b = Is(add, "Add") ? Other(add, mm->output(0)) : nullptr;
  bool has_bias = b && b->initializer() && b->shape().rank() == 1 && b->shape()[0].value == n;
  if (!has_bias && !transpose) return false;
  std::vector<Node*> pattern = {mm};
  if (transpose) pattern.insert(pattern.begin(), transpose);
  if (has_bias) pattern.push_back(add);
  std::vector<Value*> inputs = {mm->input(0), w};
  if (has_bias) inputs.push_back(b);
  Node* fused = Replace(g, pattern, "FusedMatMul", inputs, has_bias ? add->output(0) : mm->output(0));
  if (transpose) fused->SetAttr("transB", Attribute::Int(1));
  return true;
}

// (Fused)MatMul reading a last-two-axes Transpose as A or B -> FusedMatMul with transA or
// transB toggled, reading the Transpose's input in place. Each reader folds on its own, so a
// transpose shared by the forward and backward passes (a weight, an activation) stops being
// materialised once its last reader has folded it; dead-code elimination then drops it.
bool FoldTransposes(Graph* g, Node* mm) {
  const bool fused = mm->domain() == kCleaveDomain;
  Value* a = mm->input(0);
  Value* b = mm->input(1);
  if (!a->shape().has_rank() || !b->shape().has_rank() || a->shape().rank() < 2 || b->shape().rank() < 2)
    return false;
  if (a->dtype() != DataType::kFloat32 && a->dtype() != DataType::kFloat64) return false;
  Node* ta = a->producer();
  Node* tb = b->producer();
  const bool fold_a = SwapsLastTwo(ta), fold_b = SwapsLastTwo(tb);
  if (!fold_a && !fold_b) return false;
  bool trans_a = fused && mm->AttrInt("transA", 0) != 0;
  bool trans_b = fused && mm->AttrInt("transB", 0) != 0;
  std::vector<Value*> ins = mm->inputs();
  if (fold_a) {
    ins[0] = ta->input(0);
    trans_a = !trans_a;
  }
  if (fold_b) {
    ins[1] = tb->input(0);
    trans_b = !trans_b;
  }
  auto attrs = fused ? mm->attributes() : std::map<std::string, Attribute>{};
  auto metadata = mm->metadata();
  Value* out = mm->output(0);
  const std::string name = mm->name();
  g->RemoveNode(mm);
  Node* n = g->AddNode("FusedMatMul", ins, {out}, name, kCleaveDomain);
  for (auto& [k, v] : attrs) n->SetAttr(k, v);
  n->SetAttr("transA", Attribute::Int(trans_a ? 1 : 0));
  n->SetAttr("transB", Attribute::Int(trans_b ? 1 : 0));
  n->metadata() = metadata;
  return true;
}

// FusedMatMul (no bias, no activation) + Add of a [N] vector -> FusedMatMul with that bias;
// likewise MatMulBf16 / MatMulF16 (mixed precision) + Add of an [N] vector of the result's type.
// The bias may be any value (a parameter is a graph input in a training graph).
bool FuseFusedMatMulBias(Graph* g, Node* fmm) {
  if (fmm->num_inputs() > 2 || fmm->AttrString("activation", "") != "") return false;
  const Shape& y = fmm->output(0)->shape();
  if (!y.has_rank() || y.rank() < 1 || !y[y.rank() - 1].is_static()) return false;
  Node* add = SoleConsumer(fmm->output(0));
  Value* b = Is(add, "Add") ? Other(add, fmm->output(0)) : nullptr;
  if (!b || b->dtype() != fmm->output(0)->dtype() || !b->shape().has_rank() || b->shape().rank() != 1 ||
      !(b->shape()[0] == y[y.rank() - 1]) || b == fmm->output(0))
    return false;
  std::vector<Value*> ins = fmm->inputs();
  ins.push_back(b);
  auto attrs = fmm->attributes();
  auto metadata = fmm->metadata();
  Value* out = add->output(0);
  const std::string name = fmm->name(), op_type = fmm->op_type();
  g->RemoveNode(add);
  g->RemoveNode(fmm);
  Node* n = g->AddNode(op_type, ins, {out}, name, kCleaveDomain);
  for (auto& [k, v] : attrs) n->SetAttr(k, v);
  n->metadata() = metadata;
  return true;
}

// Transpose(last two axes) of a plain (Fused)MatMul's or MatMulBf16/F16's output read by nothing else:
// (op(A) op(B))^T = op(B)^T op(A)^T, so swap the operands and flip both transposes.
bool FoldTransposeOfMatMul(Graph* g, Node* t) {
  if (!SwapsLastTwo(t)) return false;
  Node* mm = t->input(0)->producer();
  if (!mm || !SoleUse(t->input(0))) return false;
  const bool cleave = mm->domain() == kCleaveDomain;
  const bool fused = cleave && mm->op_type() == "FusedMatMul";
  // Mixed precision's products (a weight gradient the forward read transposed).
  const bool low = cleave && (mm->op_type() == "MatMulBf16" || mm->op_type() == "MatMulF16");
  if (!fused && !low && !Is(mm, "MatMul")) return false;
  if (mm->num_inputs() > 2 || (fused && mm->AttrString("activation", "") != "")) return false;
  Value* a = mm->input(0);
  Value* b = mm->input(1);
  if (!a->shape().has_rank() || !b->shape().has_rank() || a->shape().rank() < 2 || b->shape().rank() < 2)
    return false;
  // A low-precision product's B is 2-D or of A's rank, so the swap needs equal ranks.
  if (low ? a->shape().rank() != b->shape().rank()
          : a->dtype() != DataType::kFloat32 && a->dtype() != DataType::kFloat64)
    return false;
  const bool trans_a = cleave && mm->AttrInt("transA", 0) != 0;
  const bool trans_b = cleave && mm->AttrInt("transB", 0) != 0;
  auto metadata = mm->metadata();
  const Attribute* to_attr = mm->FindAttr("to");  // a low-precision result stays one
  std::optional<Attribute> to;
  if (to_attr) to = *to_attr;
  Value* out = t->output(0);
  const std::string name = mm->name(), op = low ? mm->op_type() : "FusedMatMul";
  g->RemoveNode(t);
  g->RemoveNode(mm);
  Node* n = g->AddNode(op, {b, a}, {out}, name, kCleaveDomain);
  n->SetAttr("transA", Attribute::Int(trans_b ? 0 : 1));
  n->SetAttr("transB", Attribute::Int(trans_a ? 0 : 1));
  if (to) n->SetAttr("to", *to);
  n->metadata() = metadata;
  return true;
}

// Identity whose output is not a graph output: its readers read the input instead.
bool ElideIdentity(Graph* g, Node* id) {
  Value* out = id->output(0);
  if (out->is_graph_output() || !id->input(0)) return false;
  Value* in = id->input(0);
  g->RemoveNode(id);
  g->ReplaceAllUsesWith(out, in);
  return true;
}

// FusedMatMul followed by GELU -> FusedMatMul(activation = gelu | gelu_tanh).
bool FuseMatMulGelu(Graph* g, Node* fmm) {
  if (fmm->AttrString("activation", "") != "") return false;
  Node* gelu = SoleConsumer(fmm->output(0));
  if (!gelu || gelu->op_type() != "Gelu") return false;
  std::string approx = gelu->AttrString("approximate", "none");
  Value* out = gelu->output(0);
  g->RemoveNode(gelu);
  // Re-point the fused op's output at the Gelu output.
  std::vector<Value*> ins = fmm->inputs();
  auto attrs = fmm->attributes();
  std::string name = fmm->name();
  g->RemoveNode(fmm);
  Node* n = g->AddNode("FusedMatMul", ins, {out}, name, kCleaveDomain);
  for (auto& [k, v] : attrs) n->SetAttr(k, v);
  n->SetAttr("activation", Attribute::String(approx == "tanh" ? "gelu_tanh" : "gelu"));
  return true;
}

// Add(a, b) (same static shape, float32) read by a LayerNormalization over the last axis with
// scale and bias of that axis's size -> ai.cleave.SkipLayerNormalization(a, b, scale[, bias])
// whose outputs are the normalisation's (y, mean, inv_std_dev) and the sum; read by an
// RMSNormalization -> ai.cleave.SkipRMSNormalization(a, b, scale) (y, inv_std_dev, sum). The
// sum keeps its other readers (the residual stream goes on), so this fuses in training graphs
// too.
bool FuseSkipLayerNorm(Graph* g, Node* ln) {
  const bool cleave = ln->domain() == kCleaveDomain;
  const bool rms = IsCleaveOp(ln, "RMSNormalization");
  if (!(Is(ln, "LayerNormalization") || (cleave && ln->op_type() == "LayerNormalization") || rms)) return false;
  Value* x = ln->input(0);
  Node* add = x->producer();
  if (!Is(add, "Add") || x->dtype() != DataType::kFloat32 || !x->shape().is_static() || x->shape().rank() < 1)
    return false;
  if (ln->AttrInt("stash_type", 1) != 1) return false;
  const int r = x->shape().rank();
  int64_t axis = ln->AttrInt("axis", -1);
  if (axis < 0) axis += r;
  if (axis != r - 1) return false;
  Value* a = add->input(0);
  Value* b = add->input(1);
  if (!a->shape().is_static() || a->shape() != x->shape() || !b->shape().is_static() || b->shape() != x->shape())
    return false;
  const int64_t cols = x->shape()[r - 1].value;
  for (int i = 1; i < ln->num_inputs(); ++i) {
    const Value* v = ln->input(i);
    if (v && (!v->shape().is_static() || v->shape().NumElements() != cols || v->shape().rank() != 1)) return false;
  }
  std::vector<Value*> inputs = {a, b, ln->input(1)};
  if (ln->num_inputs() > 2 && ln->input(2)) inputs.push_back(ln->input(2));
  // The norm's outputs (y and its statistics: LayerNorm's mean and inv_std_dev, RMSNorm's
  // inv_std_dev), then the sum.
  std::vector<Value*> outputs(rms ? 3 : 4, nullptr);
  for (int o = 0; o < ln->num_outputs() && o + 1 < static_cast<int>(outputs.size()); ++o) outputs[o] = ln->output(o);
  outputs.back() = x;
  const float epsilon = ln->AttrFloat("epsilon", 1e-5f);
  const std::string name = ln->name() + "/skip_fused";
  auto metadata = ln->metadata();
  g->RemoveNode(ln);
  g->RemoveNode(add);
  g->opset_imports()[kCleaveDomain] = 1;
  Node* fused =
      g->AddNode(rms ? "SkipRMSNormalization" : "SkipLayerNormalization", inputs, outputs, name, kCleaveDomain);
  fused->SetAttr("epsilon", Attribute::Float(epsilon));
  fused->metadata() = std::move(metadata);
  return true;
}

// The Cast to bf16 / fp16 that alone reads the float32 value v (mixed precision's next product
// reads it so), or null: a producer can write that type itself (its `to`).
Node* SoleNarrowingCast(const Value* v) {
  Node* cast = v && v->dtype() == DataType::kFloat32 ? SoleConsumer(v) : nullptr;
  if (!Is(cast, "Cast")) return nullptr;
  const int64_t to = cast->AttrInt("to", 0);
  return to == static_cast<int64_t>(DataType::kBFloat16) || to == static_cast<int64_t>(DataType::kFloat16) ? cast
                                                                                                          : nullptr;
}

// SkipLayerNormalization or SkipRMSNormalization (float32) whose y only a Cast to bf16 / fp16
// reads (the next product's operand under mixed precision) -> it writes y in that type itself
// (to): one rounding of the same float32 value, and the float32 y is never stored.
bool FoldSkipLayerNormCast(Graph* g, Node* n) {
  if (!(IsCleaveOp(n, "SkipLayerNormalization") || IsCleaveOp(n, "SkipRMSNormalization")) || n->HasAttr("to"))
    return false;
  Value* y = n->output(0);
  if (!y || y->is_graph_output()) return false;
  Node* cast = SoleNarrowingCast(y);
  if (!cast) return false;
  const int64_t to = cast->AttrInt("to", 0);
  Value* low = cast->output(0);
  std::vector<Value*> outputs = n->outputs();
  outputs[0] = low;
  g->RemoveNode(cast);
  Node* m = g->RebuildNode(n, n->inputs(), outputs);
  m->SetAttr("to", Attribute::Int(to));
  return true;
}

bool DependsOn(const Value* v, const Node* target);

// Add(dX of a LayerNormalizationGrad or RMSNormalizationGrad that nothing else reads, another
// gradient of X's shape and type) -> the gradient op with that gradient as dX_add: the residual
// stream's gradient is summed as dX is written, in one pass instead of three tensors more.
bool FoldResidualGradIntoLayerNormGrad(Graph* g, Node* add) {
  if (!Is(add, "Add") || add->num_inputs() != 2) return false;
  for (int i = 0; i < 2; ++i) {
    Value* dx = add->input(i);
    Value* other = add->input(1 - i);
    Node* lng = dx ? dx->producer() : nullptr;
    const NormGradSlots slots = lng ? NormGradSlotsOf(*lng) : NormGradSlots{};
    if (!slots.dx_add || lng->num_inputs() != slots.dx_add || lng->output(0) != dx || !SoleUse(dx) || !other ||
        other == dx)
      continue;
    if (dx->dtype() != other->dtype() || !dx->shape().is_static() || dx->shape() != other->shape() ||
        add->output(0)->shape() != dx->shape())
      continue;
    if (DependsOn(other, lng)) continue;  // (its dScale or dBias) would make a cycle
    std::vector<Value*> ins = lng->inputs();
    ins.push_back(other);
    std::vector<Value*> outs = lng->outputs();
    outs[0] = add->output(0);
    g->RemoveNode(add);
    g->RebuildNode(lng, ins, outs);
    return true;
  }
  return false;
}

// SoftmaxCrossEntropyLoss (loss, log_prob) whose log_prob only SoftmaxCrossEntropyLossGrad
// nodes read -> the gradients read the scores (from_scores = 1) and the forward outputs the
// loss alone; a gradient read only by a Cast to bf16 / fp16 takes that Cast's type (to).
bool FuseSceFromScores(Graph* g, Node* fwd) {
  if (!Is(fwd, "SoftmaxCrossEntropyLoss") || fwd->num_outputs() != 2) return false;
  Value* lp = fwd->output(1);
  Value* scores = fwd->input(0);
  if (!lp || lp->is_graph_output() || lp->consumers().empty() || !scores) return false;
  std::vector<Node*> grads;
  for (const auto& [reader, slot] : lp->consumers()) {
    const bool grad = reader->domain() == kCleaveDomain && reader->op_type() == "SoftmaxCrossEntropyLossGrad";
    if (!grad || slot != 1 || reader->HasAttr("class_offset") || reader->HasAttr("num_classes") ||
        reader->AttrInt("from_scores", 0) != 0)
      return false;
    grads.push_back(reader);
  }
  for (Node* grad : grads) {
    std::vector<Value*> ins = grad->inputs();
    ins[1] = scores;
    Value* dx = grad->output(0);
    Node* cast = SoleNarrowingCast(dx);
    const int64_t to = cast ? cast->AttrInt("to", 0) : 0;
    Value* out = dx;
    if (to != 0) {
      out = cast->output(0);
      g->RemoveNode(cast);
    }
    Node* m = g->RebuildNode(grad, ins, {out});
    m->SetAttr("from_scores", Attribute::Int(1));
    if (to != 0) m->SetAttr("to", Attribute::Int(to));
  }
  g->RebuildNode(fwd, fwd->inputs(), {fwd->output(0)});
  return true;
}

// Whether `target` is among the nodes whose outputs v depends on.
bool DependsOn(const Value* v, const Node* target) {
  std::vector<const Node*> stack;
  std::set<const Node*> seen;
  if (v && v->producer()) stack.push_back(v->producer());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (n == target) return true;
    if (!seen.insert(n).second) continue;
    for (const Value* in : n->inputs())
      if (in && in->producer()) stack.push_back(in->producer());
  }
  return false;
}

// A from-scores SoftmaxCrossEntropyLossGrad and the forward SoftmaxCrossEntropyLoss (loss only)
// over the same scores and labels, reduction and ignore_index, without weights -> the gradient
// also outputs the loss: both form each row's log-sum-exp, so the forward's pass over the
// [N, C] scores goes. Not where the gradient's dY depends on the loss.
bool FoldSceLossIntoGrad(Graph* g, Node* grad) {
  if (grad->domain() != kCleaveDomain || grad->op_type() != "SoftmaxCrossEntropyLossGrad") return false;
  if (grad->AttrInt("from_scores", 0) == 0 || grad->HasAttr("class_offset") || grad->HasAttr("num_classes") ||
      (grad->num_inputs() > 3 && grad->input(3)) || (grad->num_outputs() > 1 && grad->output(1)))
    return false;
  Value* scores = grad->input(1);
  Value* labels = grad->input(2);
  Node* fwd = nullptr;
  for (const auto& [reader, slot] : scores->consumers())
    if (Is(reader, "SoftmaxCrossEntropyLoss") && slot == 0 && reader->input(1) == labels) fwd = reader;
  if (!fwd || (fwd->num_inputs() > 2 && fwd->input(2)) || (fwd->num_outputs() > 1 && fwd->output(1))) return false;
  if (fwd->AttrString("reduction", "mean") != grad->AttrString("reduction", "mean") ||
      fwd->HasAttr("ignore_index") != grad->HasAttr("ignore_index") ||
      fwd->AttrInt("ignore_index", 0) != grad->AttrInt("ignore_index", 0))
    return false;
  if (DependsOn(grad->input(0), fwd)) return false;
  Value* loss = fwd->output(0);
  Value* dx = grad->output(0);
  g->RemoveNode(fwd);
  g->RebuildNode(grad, grad->inputs(), {dx, loss});
  return true;
}

// Whether every reader of v, through Reshapes, is a from-scores SoftmaxCrossEntropyLossGrad
// reading it as its scores (without weights or a split vocabulary).
bool OnlyGradientsFromScoresRead(const Value* v) {
  if (v->is_graph_output() || v->consumers().empty()) return false;
  for (const auto& [reader, slot] : v->consumers()) {
    if (Is(reader, "Reshape") && slot == 0) {
      if (!OnlyGradientsFromScoresRead(reader->output(0))) return false;
      continue;
    }
    if (!IsCleaveOp(reader, "SoftmaxCrossEntropyLossGrad") || slot != 1 ||
        reader->AttrInt("from_scores", 0) == 0 || reader->HasAttr("class_offset") || reader->HasAttr("num_classes") ||
        (reader->num_inputs() > 3 && reader->input(3)))
      return false;
  }
  return true;
}

// Mixed precision's logits product (MatMulBf16 / MatMulF16 with float32 result and no bias)
// whose scores only from-scores cross-entropy gradients read (the forward loss folded into
// them) -> the product writes its operands' type (`to`), which the gradients read as float32,
// as PyTorch's autocast hands bf16 logits to the float32 cross-entropy: the [N, vocab] scores
// are written and read in half the bytes.
bool NarrowScores(Graph*, Node* p) {
  if ((!IsCleaveOp(p, "MatMulBf16") && !IsCleaveOp(p, "MatMulF16")) || p->HasAttr("to") ||
      (p->num_inputs() > 2 && p->input(2)))
    return false;
  Value* y = p->output(0);
  if (!y || y->dtype() != DataType::kFloat32 || !OnlyGradientsFromScoresRead(y)) return false;
  const DataType low = p->op_type() == "MatMulBf16" ? DataType::kBFloat16 : DataType::kFloat16;
  p->SetAttr("to", Attribute::Int(static_cast<int64_t>(low)));
  return true;
}

// The axes a ReduceSum sums (from its input from version 13, else the attribute), normalised
// and sorted; nullopt when they are not constant.
std::optional<std::vector<int64_t>> SummedAxes(const Node* n, int rank) {
  std::vector<int64_t> axes = n->AttrInts("axes");
  if (n->num_inputs() > 1 && n->input(1)) {
    const Tensor* t = ConstantInput(*n, 1);
    if (!t || t->dtype() != DataType::kInt64) return std::nullopt;
    axes.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
  }
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  return axes;
}

// The float32 [C] bias gradient that ReduceSum `sum` of x [..., C] over every axis but the last
// becomes, through Reshapes and at most one Cast to float32 that alone read each step; null
// when `sum` is not such a sum. `chain` gets the nodes from `sum` on.
Value* BiasGradientOf(Node* sum, const Value* x, std::vector<Node*>& chain) {
  if (!Is(sum, "ReduceSum") || sum->input(0) != x || !x->shape().is_static() || x->shape().rank() < 2) return nullptr;
  const int r = x->shape().rank();
  const int64_t C = x->shape()[r - 1].value;
  auto axes = SummedAxes(sum, r);
  std::vector<int64_t> leading(r - 1);
  std::iota(leading.begin(), leading.end(), 0);
  if (!axes || *axes != leading) return nullptr;
  chain = {sum};
  Value* v = sum->output(0);
  bool widened = false;
  while (v->dtype() != DataType::kFloat32 || !v->shape().is_static() || v->shape().rank() != 1) {
    Node* next = SoleConsumer(v);
    if (Is(next, "Reshape")) {
      if (next->input(0) != v) return nullptr;
    } else if (Is(next, "Cast") && !widened && next->AttrInt("to", 0) == static_cast<int64_t>(DataType::kFloat32)) {
      widened = true;
    } else {
      return nullptr;
    }
    chain.push_back(next);
    v = next->output(0);
  }
  return v->shape() == Shape({Dim(C)}) ? v : nullptr;
}

// MatMulBf16 / MatMulF16 dW = dzᵀ X (transA) or Xᵀ dz (dz as B), 2-D with a float32 result and
// no dbias yet, whose dz [K, C] is a Reshape of a value some ReduceSum sums into a bias
// gradient (that value, or the float32 value it rounds) -> the product also writes that bias
// gradient (dbias_operand names dz's side); the sum's chain goes.
bool FoldBiasGradient(Graph* g, Node* p) {
  if ((!IsCleaveOp(p, "MatMulBf16") && !IsCleaveOp(p, "MatMulF16")) || p->HasAttr("to") ||
      (p->num_outputs() > 1 && p->output(1)) || (p->num_inputs() > 2 && p->input(2)))
    return false;
  const Value* a = p->input(0);
  const Value* b = p->input(1);
  if (!a || !b || a->shape().rank() != 2 || b->shape().rank() != 2 || !a->shape().is_static() ||
      !b->shape().is_static() || p->output(0)->dtype() != DataType::kFloat32)
    return false;
  for (int side : {0, 1}) {
    const bool k_first = side == 0 ? p->AttrInt("transA", 0) != 0 : p->AttrInt("transB", 0) == 0;
    if (!k_first) continue;
    const Value* operand = side == 0 ? a : b;
    const int64_t C = operand->shape()[1].value;
    // dz as the product reads it and each value it reshapes, and the float32 value the first
    // of those rounds (a residual stream's gradient).
    std::vector<const Value*> sources = {operand};
    while (Is(sources.back()->producer(), "Reshape")) sources.push_back(sources.back()->producer()->input(0));
    if (const Node* c = sources.back()->producer(); Is(c, "Cast") && c->input(0)->dtype() == DataType::kFloat32)
      sources.push_back(c->input(0));
    for (const Value* x : sources) {
      if (!x->shape().is_static() || x->shape().NumElements() != operand->shape().NumElements() ||
          x->shape()[x->shape().rank() - 1].value != C)
        continue;
      for (const auto& [consumer, slot] : x->consumers()) {
        std::vector<Node*> chain;
        Value* dbias = BiasGradientOf(consumer, x, chain);
        if (!dbias || dbias->is_graph_input()) continue;
        // The product must not read what the sum feeds (the rest of the chain hangs off the sum).
        if (DependsOn(a, chain[0]) || DependsOn(b, chain[0])) continue;
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) g->RemoveNode(*it);
        Node* fused = g->RebuildNode(p, p->inputs(), {p->output(0), dbias});
        fused->SetAttr("dbias_operand", Attribute::Int(side));
        return true;
      }
    }
  }
  return false;
}

// Cast to bf16 / fp16 of a float32 LayerNormalizationGrad's or RMSNormalizationGrad's dX (the
// residual stream's gradient, read in the low type by the next products and in float32 by the
// next norm's gradient)
// -> the gradient also writes dX_low (low_to): the Cast's one rounding of the same float32
// values, without reading dX back.
bool FoldCastIntoLayerNormGrad(Graph* g, Node* cast) {
  if (!Is(cast, "Cast")) return false;
  Value* dx = cast->input(0);
  Node* grad = dx ? dx->producer() : nullptr;
  const int64_t to = cast->AttrInt("to", 0);
  const NormGradSlots slots = grad ? NormGradSlotsOf(*grad) : NormGradSlots{};
  if (!slots.dx_add || grad->output(0) != dx || dx->dtype() != DataType::kFloat32 ||
      (grad->num_outputs() > slots.dx_low && grad->output(slots.dx_low)) ||
      (to != static_cast<int64_t>(DataType::kBFloat16) && to != static_cast<int64_t>(DataType::kFloat16)))
    return false;
  Value* low = cast->output(0);
  g->RemoveNode(cast);
  std::vector<Value*> outs = grad->outputs();
  outs.resize(slots.dx_low + 1, nullptr);
  outs[slots.dx_low] = low;
  Node* fused = g->RebuildNode(grad, grad->inputs(), outs);
  fused->SetAttr("low_to", Attribute::Int(to));
  return true;
}

// A float32 MatMulBf16 / MatMulF16 result (no accumulation, no dbias) that only a
// SkipLayerNormalization reads as its skip (a residual branch's last product, beside the float32
// residual) or only a LayerNormalizationGrad / RMSNormalizationGrad reads as its dY (beside a
// float32 X) -> the product writes the operands' type (`to`), its float32 bias rounded to that
// type by a Cast, and the reader takes it as float32: PyTorch's autocast returns a linear
// layer's output (bias included) in bf16 too, and the [tokens, width] result is written and
// read in half the bytes.
bool NarrowProductIntoNorm(Graph* g, Node* p) {
  if ((!IsCleaveOp(p, "MatMulBf16") && !IsCleaveOp(p, "MatMulF16")) || p->HasAttr("to") || p->num_inputs() > 3 ||
      (p->num_outputs() > 1 && p->output(1)))
    return false;
  Value* y = p->output(0);
  if (!SoleUse(y) || y->dtype() != DataType::kFloat32) return false;
  const auto [reader, slot] = y->consumers()[0];
  const bool skip = (IsCleaveOp(reader, "SkipLayerNormalization") || IsCleaveOp(reader, "SkipRMSNormalization")) &&
                    slot == 1 &&
                    reader->input(0)->dtype() == DataType::kFloat32;
  const bool dy = NormGradSlotsOf(*reader).dx_add && slot == 0 && reader->input(1)->dtype() == DataType::kFloat32;
  if (!skip && !dy) return false;
  const DataType low = p->op_type() == "MatMulBf16" ? DataType::kBFloat16 : DataType::kFloat16;
  Value* bias = p->num_inputs() > 2 ? p->input(2) : nullptr;
  if (bias) {
    if (bias->dtype() != DataType::kFloat32 || !bias->shape().is_static()) return false;
    Value* narrow = g->CreateUniqueValue(bias->name() + "/" + DataTypeName(low));
    narrow->set_dtype(low);
    narrow->set_shape(bias->shape());
    Node* cast = g->AddNode("Cast", {bias}, {narrow}, g->UniqueName(narrow->name()), "");
    cast->SetAttr("to", Attribute::Int(static_cast<int64_t>(low)));
    cast->metadata() = p->metadata();
    g->SetNodeInput(p, 2, narrow);
  }
  p->SetAttr("to", Attribute::Int(static_cast<int64_t>(low)));
  y->set_dtype(low);
  return true;
}

enum class Rules {
  kActivationNorm,
  kTransformer,
  kAttention,
  kSkipLayerNorm,
  kSceFromScores,
  kLowPrecisionScores,
  kBiasGradient,
  kLayerNormGradCast,
  kLowPrecisionNormInputs
};

// One rewrite at node n, if any applies.
bool FuseAt(Graph* g, Node* n, Rules rules) {
  if (rules == Rules::kAttention) return Is(n, "Softmax") && FuseAttention(g, n);
  if (rules == Rules::kSkipLayerNorm)
    return FuseSkipLayerNorm(g, n) || FoldSkipLayerNormCast(g, n) || FoldResidualGradIntoLayerNormGrad(g, n);
  if (rules == Rules::kSceFromScores) return FuseSceFromScores(g, n) || FoldSceLossIntoGrad(g, n);
  if (rules == Rules::kLowPrecisionScores) return NarrowScores(g, n);
  if (rules == Rules::kBiasGradient) return FoldBiasGradient(g, n);
  if (rules == Rules::kLayerNormGradCast) return FoldCastIntoLayerNormGrad(g, n);
  if (rules == Rules::kLowPrecisionNormInputs) return NarrowProductIntoNorm(g, n);
  const bool matmul_rules = rules == Rules::kTransformer;
  if (Is(n, "Erf")) return FuseErfGelu(g, n);
  if (Is(n, "Tanh")) return FuseTanhGelu(g, n);
  if (Is(n, "ReduceMean")) return FuseLayerNorm(g, n) || FuseRMSNorm(g, n);
  if (Is(n, "Sigmoid")) return FuseSwiGlu(g, n);
  if (Is(n, "Concat")) return FuseRotary(g, n);
  if (IsCleaveOp(n, "RotaryEmbedding")) return HoistRotaryOverHeadSwap(g, n);
  if (!matmul_rules) return false;
  if (Is(n, "MatMul")) return FuseMatMulBias(g, n) || FoldTransposes(g, n);
  if (Is(n, "Transpose")) return FoldTransposeOfMatMul(g, n);
  if (Is(n, "Identity")) return ElideIdentity(g, n);
  if (n->domain() == kCleaveDomain && n->op_type() == "FusedMatMul")
    return FuseMatMulGelu(g, n) || FuseFusedMatMulBias(g, n) || FoldTransposes(g, n);
  if (n->domain() == kCleaveDomain && (n->op_type() == "MatMulBf16" || n->op_type() == "MatMulF16"))
    return FuseFusedMatMulBias(g, n);
  return false;
}

absl::StatusOr<bool> RunFusions(Graph* g, Rules rules) {
  return RewriteToFixedPoint(g, [rules](Graph* graph, Node* n) { return FuseAt(graph, n, rules); });
}

}  // namespace

absl::StatusOr<bool> TransformerFusion::Run(Graph* g) { return RunFusions(g, Rules::kTransformer); }

absl::StatusOr<bool> ActivationNormFusion::Run(Graph* g) { return RunFusions(g, Rules::kActivationNorm); }

absl::StatusOr<bool> AttentionFusion::Run(Graph* g) { return RunFusions(g, Rules::kAttention); }

absl::StatusOr<bool> SkipLayerNormFusion::Run(Graph* g) { return RunFusions(g, Rules::kSkipLayerNorm); }

absl::StatusOr<bool> SoftmaxCrossEntropyFusion::Run(Graph* g) { return RunFusions(g, Rules::kSceFromScores); }

absl::StatusOr<bool> LowPrecisionScores::Run(Graph* g) { return RunFusions(g, Rules::kLowPrecisionScores); }

absl::StatusOr<bool> BiasGradientFusion::Run(Graph* g) { return RunFusions(g, Rules::kBiasGradient); }

absl::StatusOr<bool> LayerNormGradCastFusion::Run(Graph* g) { return RunFusions(g, Rules::kLayerNormGradCast); }

absl::StatusOr<bool> LowPrecisionNormInputs::Run(Graph* g) { return RunFusions(g, Rules::kLowPrecisionNormInputs); }

}  // namespace cleave::graph
