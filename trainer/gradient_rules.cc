// Gradient rules (trainer/). Notation: x(i) inputs, y(i) outputs, dy the output gradient.
// Each rule states its derivative in a comment; broadcasting inputs get their gradient
// summed back to their own shape by ReduceTo.
#include "trainer/gradient_rules.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::trainer {

using graph::Attribute;
using graph::Node;
using graph::Value;

graph::Value* GradBuilder::Op(const std::string& op, std::vector<Value*> inputs,
                              std::vector<std::pair<std::string, Attribute>> attrs) {
  return OpN(op, std::move(inputs), 1, std::move(attrs))[0];
}

std::vector<Value*> GradBuilder::OpN(const std::string& op, std::vector<Value*> inputs,
                                     int outputs,
                                     std::vector<std::pair<std::string, Attribute>> attrs) {
  std::vector<Value*> outs;
  for (int i = 0; i < outputs; ++i)
    outs.push_back(g_.CreateUniqueValue(absl::StrCat(fwd_.name(), "_grad/", op)));
  // "ai.cleave.Op" names an op of cleave's domain.
  const std::string prefix = std::string(graph::kCleaveDomain) + ".";
  const bool cleave_op = op.rfind(prefix, 0) == 0;
  Node* n = g_.AddNode(cleave_op ? op.substr(prefix.size()) : op, inputs, outs, outs[0]->name(),
                       cleave_op ? graph::kCleaveDomain : "");
  for (auto& [k, a] : attrs) n->SetAttr(k, std::move(a));
  n->metadata()["role"] = "bwd";
  if (fwd_.output(0)) n->metadata()["grad_of"] = fwd_.output(0)->name();
  absl::Status s = graph::InferNode(g_, *n);
  if (!s.ok() && status_.ok())  // a rule emitted an ill-formed node: a bug in the rule
    status_ = Internal("gradient rule of ", fwd_.Describe(), ": ", s.message());
  return outs;
}

Value* GradBuilder::ForwardOutput(int i, const std::string& suffix) {
  if (Value* v = fwd_.output(i)) return v;
  Value* v = g_.CreateUniqueValue(absl::StrCat(fwd_.output(0)->name(), "/", suffix));
  g_.SetNodeOutput(&fwd_, i, v);
  absl::Status s = graph::InferNode(g_, fwd_);
  if (!s.ok() && status_.ok())
    status_ = Internal("gradient rule of ", fwd_.Describe(), ": ", s.message());
  return v;
}

Value* GradBuilder::Const(double v, const Value* like) {
  Tensor t(like->dtype(), {});
  if (like->dtype() == DataType::kFloat64) t.data<double>()[0] = v;
  else t.data<float>()[0] = static_cast<float>(v);
  return g_.AddInitializer(g_.UniqueName(absl::StrCat(fwd_.name(), "_grad/const")), std::move(t));
}

Value* GradBuilder::Zeros(const Value* like) {
  return g_.AddInitializer(g_.UniqueName(absl::StrCat(fwd_.name(), "_grad/zeros")),
                           Tensor(like->dtype(), like->shape().StaticDims()));
}

Value* GradBuilder::Ints(const std::vector<int64_t>& v) {
  return g_.AddInitializer(g_.UniqueName(absl::StrCat(fwd_.name(), "_grad/ints")),
                           Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size())}));
}

absl::StatusOr<Value*> GradBuilder::ReduceTo(Value* dx, const Value* x) {
  const Shape& to = x->shape();
  const Shape& from = dx->shape();
  if (to == from) return dx;
  if (!to.is_static() || !from.is_static())
    return Error(absl::StrCat("the gradient of '", x->name(), "' ", to.ToString(),
                              " must be summed over broadcast axes of ", from.ToString(),
                              ", which needs static shapes (fix the batch and sequence dims)"));
  std::vector<int64_t> axes;
  const int lead = from.rank() - to.rank();
  for (int k = 0; k < from.rank(); ++k)
    if (k < lead || (to[k - lead].value == 1 && from[k].value != 1)) axes.push_back(k);
  Value* sum = axes.empty() ? dx : ReduceSum(dx, axes, /*keepdims=*/true);
  return Op("Reshape", {sum, Ints(to.StaticDims())});
}

Value* GradBuilder::ShapeOf(Value* v) {
  return v->shape().is_static() ? Ints(v->shape().StaticDims()) : Op("Shape", {v});
}

Value* GradBuilder::ReduceSum(Value* v, const std::vector<int64_t>& axes, bool keepdims) {
  Attribute keep = Attribute::Int(keepdims ? 1 : 0);
  if (g_opset13()) return Op("ReduceSum", {v, Ints(axes)}, {{"keepdims", keep}});
  return Op("ReduceSum", {v}, {{"axes", Attribute::Ints(axes)}, {"keepdims", keep}});
}

Value* GradBuilder::ReduceMean(Value* v, const std::vector<int64_t>& axes) {
  if (graph_opset() >= 18) return Op("ReduceMean", {v, Ints(axes)}, {{"keepdims", Attribute::Int(1)}});
  return Op("ReduceMean", {v}, {{"axes", Attribute::Ints(axes)}, {"keepdims", Attribute::Int(1)}});
}

Value* GradBuilder::Unsqueeze(Value* v, const std::vector<int64_t>& axes) {
  if (g_opset13()) return Op("Unsqueeze", {v, Ints(axes)});
  return Op("Unsqueeze", {v}, {{"axes", Attribute::Ints(axes)}});
}

Value* GradBuilder::TransposeLast2(Value* v) {
  const int r = v->shape().rank();
  std::vector<int64_t> perm(r);
  for (int k = 0; k < r; ++k) perm[k] = k;
  std::swap(perm[r - 1], perm[r - 2]);
  return Op("Transpose", {v}, {{"perm", Attribute::Ints(perm)}});
}

void GradBuilder::SetGrad(int input, Value* dx) {
  if (static_cast<int>(dx_.size()) <= input) dx_.resize(input + 1, nullptr);
  dx_[input] = dx;
}

absl::Status GradBuilder::Error(const std::string& what) const {
  return InvalidArgument(fwd_.Describe(), ": ", what);
}

namespace {

// ---- Elementwise arithmetic (broadcasting) ----

absl::Status AddGrad(GradBuilder& b) {  // d/da (a + b) = 1, d/db = 1
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(Value * d, b.ReduceTo(b.dy(), b.x(i)));
    b.SetGrad(i, d);
  }
  return absl::OkStatus();
}

absl::Status SubGrad(GradBuilder& b) {  // d/da (a - b) = 1, d/db = -1
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.dy(), b.x(0)));
  ASSIGN_OR_RETURN(Value * db, b.ReduceTo(b.Op("Neg", {b.dy()}), b.x(1)));
  b.SetGrad(0, da);
  b.SetGrad(1, db);
  return absl::OkStatus();
}

absl::Status MulGrad(GradBuilder& b) {  // d/da (a b) = b, d/db = a
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.Op("Mul", {b.dy(), b.x(1)}), b.x(0)));
  ASSIGN_OR_RETURN(Value * db, b.ReduceTo(b.Op("Mul", {b.dy(), b.x(0)}), b.x(1)));
  b.SetGrad(0, da);
  b.SetGrad(1, db);
  return absl::OkStatus();
}

absl::Status DivGrad(GradBuilder& b) {  // d/da (a / b) = 1 / b, d/db = -(a / b) / b = -y / b
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.Op("Div", {b.dy(), b.x(1)}), b.x(0)));
  Value* t = b.Op("Div", {b.Op("Mul", {b.dy(), b.y(0)}), b.x(1)});
  ASSIGN_OR_RETURN(Value * db, b.ReduceTo(b.Op("Neg", {t}), b.x(1)));
  b.SetGrad(0, da);
  b.SetGrad(1, db);
  return absl::OkStatus();
}

absl::Status PowGrad(GradBuilder& b) {
  // d/da a^p = p a^(p-1). A constant scalar exponent (an initializer or a Constant node)
  // folds into the backward nodes; a run-time exponent also gets d/dp a^p = a^p ln(a).
  const Tensor* p = graph::ConstantInput(b.fwd(), 1);
  Value* base = b.x(0);
  if (p && p->numel() == 1) {
    double e = p->DoubleAt(0);
    Value* deriv = b.Op("Mul", {b.Const(e, base), b.Op("Pow", {base, b.Const(e - 1, base)})});
    b.SetGrad(0, b.Op("Mul", {b.dy(), deriv}));
    return absl::OkStatus();
  }
  if (b.x(1)->dtype() != base->dtype())
    return b.Error("the gradient of Pow with a run-time exponent needs base and exponent of one float type");
  Value* deriv = b.Op("Mul", {b.x(1), b.Op("Pow", {base, b.Op("Sub", {b.x(1), b.Const(1, base)})})});
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.Op("Mul", {b.dy(), deriv}), base));
  b.SetGrad(0, da);
  ASSIGN_OR_RETURN(Value * dp, b.ReduceTo(b.Op("Mul", {b.dy(), b.Op("Mul", {b.y(0), b.Op("Log", {base})})}), b.x(1)));
  b.SetGrad(1, dp);
  return absl::OkStatus();
}

// ---- Unary math ----

absl::Status NegGrad(GradBuilder& b) {  // -1
  b.SetGrad(0, b.Op("Neg", {b.dy()}));
  return absl::OkStatus();
}
absl::Status ExpGrad(GradBuilder& b) {  // exp(x) = y
  b.SetGrad(0, b.Op("Mul", {b.dy(), b.y(0)}));
  return absl::OkStatus();
}
absl::Status LogGrad(GradBuilder& b) {  // 1 / x
  b.SetGrad(0, b.Op("Div", {b.dy(), b.x(0)}));
  return absl::OkStatus();
}
absl::Status SqrtGrad(GradBuilder& b) {  // 1 / (2 sqrt x) = 0.5 / y
  b.SetGrad(0, b.Op("Div", {b.Op("Mul", {b.dy(), b.Const(0.5, b.y(0))}), b.y(0)}));
  return absl::OkStatus();
}
absl::Status ReciprocalGrad(GradBuilder& b) {  // -1 / x^2 = -y^2
  b.SetGrad(0, b.Op("Neg", {b.Op("Mul", {b.dy(), b.Op("Mul", {b.y(0), b.y(0)})})}));
  return absl::OkStatus();
}
absl::Status TanhGrad(GradBuilder& b) {  // 1 - y^2
  Value* one_minus = b.Op("Sub", {b.Const(1, b.y(0)), b.Op("Mul", {b.y(0), b.y(0)})});
  b.SetGrad(0, b.Op("Mul", {b.dy(), one_minus}));
  return absl::OkStatus();
}
absl::Status SigmoidGrad(GradBuilder& b) {  // y (1 - y)
  Value* d = b.Op("Mul", {b.y(0), b.Op("Sub", {b.Const(1, b.y(0)), b.y(0)})});
  b.SetGrad(0, b.Op("Mul", {b.dy(), d}));
  return absl::OkStatus();
}
absl::Status ReluGrad(GradBuilder& b) {  // 1 where x > 0 (0 at x = 0, as PyTorch)
  Value* pos = b.Op("Greater", {b.x(0), b.Const(0, b.x(0))});
  b.SetGrad(0, b.Op("Where", {pos, b.dy(), b.Const(0, b.dy())}));
  return absl::OkStatus();
}
absl::Status SinGrad(GradBuilder& b) {  // cos x
  b.SetGrad(0, b.Op("Mul", {b.dy(), b.Op("Cos", {b.x(0)})}));
  return absl::OkStatus();
}
absl::Status CosGrad(GradBuilder& b) {  // -sin x
  b.SetGrad(0, b.Op("Neg", {b.Op("Mul", {b.dy(), b.Op("Sin", {b.x(0)})})}));
  return absl::OkStatus();
}

absl::Status AbsGrad(GradBuilder& b) {  // sign(x), 0 at 0 (as PyTorch)
  Value* zero = b.Const(0, b.x(0));
  Value* neg = b.Op("Where", {b.Op("Less", {b.x(0), zero}), b.Op("Neg", {b.dy()}), b.Const(0, b.dy())});
  b.SetGrad(0, b.Op("Where", {b.Op("Greater", {b.x(0), zero}), b.dy(), neg}));
  return absl::OkStatus();
}

// max(a, b): dy goes to the larger operand; on a tie each gets half, as PyTorch's maximum.
absl::Status MaxMinGrad(GradBuilder& b) {
  if (b.fwd().num_inputs() != 2)
    return b.Error("the gradient of Max/Min is implemented for two inputs");
  const char* wins = b.fwd().op_type() == "Max" ? "Greater" : "Less";
  Value* half = b.Op("Mul", {b.dy(), b.Const(0.5, b.dy())});
  Value* zero = b.Const(0, b.dy());
  Value* tie = b.Op("Equal", {b.x(0), b.x(1)});
  for (int i = 0; i < 2; ++i) {
    Value* win = b.Op(wins, {b.x(i), b.x(1 - i)});
    Value* d = b.Op("Where", {win, b.dy(), b.Op("Where", {tie, half, zero})});
    ASSIGN_OR_RETURN(Value * dx, b.ReduceTo(d, b.x(i)));
    b.SetGrad(i, dx);
  }
  return absl::OkStatus();
}

// prelu(x, slope) = x < 0 ? slope * x : x: dX = dY where x >= 0, dY * slope where x < 0 (at 0
// the identity's side, as PyTorch); dSlope = dY * x where x < 0, summed to the slope's shape.
absl::Status PReluGrad(GradBuilder& b) {
  Value* negative = b.Op("Less", {b.x(0), b.Const(0, b.x(0))});
  if (b.NeedsGrad(0)) b.SetGrad(0, b.Op("Where", {negative, b.Op("Mul", {b.dy(), b.x(1)}), b.dy()}));
  if (b.NeedsGrad(1)) {
    Value* d = b.Op("Where", {negative, b.Op("Mul", {b.dy(), b.x(0)}), b.Const(0, b.dy())});
    ASSIGN_OR_RETURN(Value * ds, b.ReduceTo(d, b.x(1)));
    b.SetGrad(1, ds);
  }
  return absl::OkStatus();
}

// clip(x, lo, hi): 1 inside [lo, hi], 0 outside; the bounds get no gradient.
absl::Status ClipGrad(GradBuilder& b) {
  Value* x = b.x(0);
  Value* keep = nullptr;
  auto bound = [&](int input, const char* attr, double dflt) -> Value* {
    if (b.fwd_version() >= 11) return b.x(input);
    return b.fwd().HasAttr(attr) ? b.Const(b.fwd().AttrFloat(attr, static_cast<float>(dflt)), x) : nullptr;
  };
  // x >= lo written as Not(x < lo) (GreaterOrEqual is newer than the opsets Clip-6 lives in).
  for (auto [v, outside] : {std::pair{bound(1, "min", 0), "Less"}, std::pair{bound(2, "max", 0), "Greater"}}) {
    if (!v) continue;
    Value* in = b.Op("Not", {b.Op(outside, {x, v})});
    keep = keep ? b.Op("And", {keep, in}) : in;
  }
  b.SetGrad(0, keep ? b.Op("Where", {keep, b.dy(), b.Const(0, b.dy())}) : b.dy());
  return absl::OkStatus();
}

// c exp(-inner x^2).
Value* ScaledGaussian(GradBuilder& b, Value* x, double c, double inner) {
  Value* sq = b.Op("Mul", {x, x});
  Value* e = b.Op("Exp", {b.Op("Mul", {sq, b.Const(-inner, x)})});
  return b.Op("Mul", {e, b.Const(c, x)});
}

absl::Status ErfGrad(GradBuilder& b) {  // 2 / sqrt(pi) exp(-x^2)
  Value* d = ScaledGaussian(b, b.x(0), 2.0 / std::sqrt(M_PI), 1.0);
  b.SetGrad(0, b.Op("Mul", {b.dy(), d}));
  return absl::OkStatus();
}

// dy gelu'(x) for the erf form or the tanh approximation, by ai.cleave.GeluGrad.
Value* GeluBackward(GradBuilder& b, Value* dy, Value* x, bool tanh_form) {
  return b.Op("ai.cleave.GeluGrad", {dy, x},
              {{"approximate", Attribute::String(tanh_form ? "tanh" : "none")}});
}

absl::Status GeluGrad(GradBuilder& b) {
  bool tanh_form = b.fwd().AttrString("approximate", "none") == "tanh";
  b.SetGrad(0, GeluBackward(b, b.dy(), b.x(0), tanh_form));
  return absl::OkStatus();
}

// y = silu(gate) * up: both gradients from one ai.cleave.SwiGLUGrad pass over dy, gate and up.
absl::Status SwiGluGrad(GradBuilder& b) {
  std::vector<Value*> d = b.OpN("ai.cleave.SwiGLUGrad", {b.dy(), b.x(0), b.x(1)}, 2, {});
  b.SetGrad(0, d[0]);
  b.SetGrad(1, d[1]);
  return absl::OkStatus();
}

// y = x cos + rotate_half(x) sin: dx by ai.cleave.RotaryEmbeddingGrad (rotate_half's transpose).
// A cos or sin that needs a gradient (computed from a parameter) gets dy x, or dy rotate_half(x)
// (the op with cos 0 and sin 1), summed to its shape.
absl::Status RotaryGrad(GradBuilder& b) {
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("ai.cleave.RotaryEmbeddingGrad", {b.dy(), b.x(1), b.x(2)}));
  if (b.NeedsGrad(1)) {
    ASSIGN_OR_RETURN(Value * dcos, b.ReduceTo(b.Op("Mul", {b.dy(), x}), b.x(1)));
    b.SetGrad(1, dcos);
  }
  if (b.NeedsGrad(2)) {
    Value* rotated = b.Op("ai.cleave.RotaryEmbedding", {x, b.Const(0.0, x), b.Const(1.0, x)});
    ASSIGN_OR_RETURN(Value * dsin, b.ReduceTo(b.Op("Mul", {b.dy(), rotated}), b.x(2)));
    b.SetGrad(2, dsin);
  }
  return absl::OkStatus();
}

// y = act(A @ op(B) + bias) with B 2-D. The pre-activation z is recomputed (one GEMM) rather
// than stored, then dz = dy act'(z), dA = dz op(B)^T, d op(B) = A^T dz, dbias = sum dz.
absl::Status FusedMatMulGrad(GradBuilder& b) {
  const bool trans_b = b.fwd().AttrInt("transB", 0) != 0;
  const std::string act = b.fwd().AttrString("activation", "");
  if (b.x(1)->shape().rank() != 2 || b.x(0)->shape().rank() < 2)
    return b.Error("the gradient of FusedMatMul needs a 2-D B and A of rank >= 2");
  Value* dz = b.dy();
  if (!act.empty()) {
    std::vector<Value*> ins = {b.x(0), b.x(1)};
    if (b.x(2)) ins.push_back(b.x(2));
    std::vector<std::pair<std::string, graph::Attribute>> attrs;
    if (trans_b) attrs.emplace_back("transB", graph::Attribute::Int(1));
    Value* z = b.Op("ai.cleave.FusedMatMul", ins, attrs);
    dz = GeluBackward(b, b.dy(), z, act == "gelu_tanh");
  }
  Value* bt = trans_b ? b.x(1) : b.TransposeLast2(b.x(1));
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.Op("MatMul", {dz, bt}), b.x(0)));
  Value* dopb_full = b.Op("MatMul", {b.TransposeLast2(b.x(0)), dz});  // [..., K, N]
  Value* dopb;
  if (!trans_b) {
    ASSIGN_OR_RETURN(dopb, b.ReduceTo(dopb_full, b.x(1)));
  } else {  // B is [N, K]: sum d op(B) over the batch, then transpose it back
    const int r = b.x(0)->shape().rank();
    std::vector<int64_t> lead;
    for (int k = 0; k < r - 2; ++k) lead.push_back(k);
    Value* summed = lead.empty() ? dopb_full : b.ReduceSum(dopb_full, lead, /*keepdims=*/false);
    dopb = b.TransposeLast2(summed);
  }
  b.SetGrad(0, da);
  b.SetGrad(1, dopb);
  if (b.x(2)) {
    ASSIGN_OR_RETURN(Value * dbias, b.ReduceTo(dz, b.x(2)));
    b.SetGrad(2, dbias);
  }
  return absl::OkStatus();
}

}  // namespace

// The rules for linear algebra, normalisation and data movement.
void RegisterStructuralRules(std::map<std::string, GradRule>& rules);  // _structural.cc
void RegisterNnRules(std::map<std::string, GradRule>& rules);          // _nn.cc
void RegisterActivationRules(std::map<std::string, GradRule>& rules);  // _activation.cc

namespace {

std::map<std::string, GradRule>& Rules() {
  static auto* rules = [] {
    auto* r = new std::map<std::string, GradRule>{
        {"::Add", AddGrad}, {"::Sub", SubGrad}, {"::Mul", MulGrad}, {"::Div", DivGrad},
        {"::Pow", PowGrad}, {"::Neg", NegGrad}, {"::Exp", ExpGrad}, {"::Log", LogGrad},
        {"::Sqrt", SqrtGrad}, {"::Reciprocal", ReciprocalGrad}, {"::Tanh", TanhGrad},
        {"::Sigmoid", SigmoidGrad}, {"::Relu", ReluGrad}, {"::Sin", SinGrad}, {"::Cos", CosGrad},
        {"::Erf", ErfGrad}, {"::Gelu", GeluGrad}, {"ai.cleave::Gelu", GeluGrad}, {"ai.cleave::SwiGLU", SwiGluGrad},
        {"ai.cleave::RotaryEmbedding", RotaryGrad},
        {"ai.cleave::FusedMatMul", FusedMatMulGrad},
        {"::Abs", AbsGrad}, {"::Max", MaxMinGrad}, {"::Min", MaxMinGrad}, {"::PRelu", PReluGrad}, {"::Clip", ClipGrad},
    };
    RegisterStructuralRules(*r);
    RegisterNnRules(*r);
    RegisterActivationRules(*r);
    return r;
  }();
  return *rules;
}

}  // namespace

GradRule FindGradRule(const std::string& domain, const std::string& op) {
  auto it = Rules().find(absl::StrCat(domain == "ai.onnx" ? "" : domain, "::", op));
  return it == Rules().end() ? nullptr : it->second;
}

std::vector<std::string> OpsWithGradRules() {
  std::vector<std::string> out;
  for (const auto& [k, v] : Rules()) out.push_back(k);
  return out;
}

}  // namespace cleave::trainer
