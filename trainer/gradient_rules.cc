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
  Value* out = g_.CreateUniqueValue(absl::StrCat(fwd_.name(), "_grad/", op));
  Node* n = g_.AddNode(op, inputs, {out}, out->name());
  for (auto& [k, a] : attrs) n->SetAttr(k, std::move(a));
  n->metadata()["role"] = "bwd";
  if (fwd_.output(0)) n->metadata()["grad_of"] = fwd_.output(0)->name();
  absl::Status s = graph::InferNode(g_, *n);
  if (!s.ok() && status_.ok())  // a rule emitted an ill-formed node: a bug in the rule
    status_ = Internal("gradient rule of ", fwd_.Describe(), ": ", s.message());
  return out;
}

Value* GradBuilder::Const(double v, const Value* like) {
  Tensor t(like->dtype(), {});
  if (like->dtype() == DataType::kFloat64) t.data<double>()[0] = v;
  else t.data<float>()[0] = static_cast<float>(v);
  return g_.AddInitializer(g_.UniqueName(absl::StrCat(fwd_.name(), "_grad/const")), std::move(t));
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
  Value* sum = dx;
  if (!axes.empty()) {
    if (g_.OpsetFor("") >= 13) sum = Op("ReduceSum", {dx, Ints(axes)}, {{"keepdims", Attribute::Int(1)}});
    else sum = Op("ReduceSum", {dx}, {{"axes", Attribute::Ints(axes)}, {"keepdims", Attribute::Int(1)}});
  }
  return Op("Reshape", {sum, Ints(to.StaticDims())});
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

absl::Status PowGrad(GradBuilder& b) {  // d/da a^p = p a^(p-1); the exponent gets none here
  const Tensor* p = b.x(1)->initializer();
  if (!p || p->numel() != 1)
    return b.Error("the gradient of Pow needs a constant scalar exponent");
  double e = p->DoubleAt(0);
  Value* base = b.x(0);
  Value* deriv = b.Op("Mul", {b.Const(e, base), b.Op("Pow", {base, b.Const(e - 1, base)})});
  b.SetGrad(0, b.Op("Mul", {b.dy(), deriv}));
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

// exp(-x^2 / 2) with a coefficient c: c exp(-x^2 / 2), shared by Erf and Gelu.
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

absl::Status GeluGrad(GradBuilder& b) {
  Value* x = b.x(0);
  if (b.fwd().AttrString("approximate", "none") == "tanh") {
    // y = 0.5 x (1 + t), t = tanh(u), u = s (x + c x^3):
    // dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2).
    const double s = std::sqrt(2.0 / M_PI), c = 0.044715;
    Value* x2 = b.Op("Mul", {x, x});
    Value* u = b.Op("Mul", {b.Op("Add", {x, b.Op("Mul", {b.Op("Mul", {x2, x}), b.Const(c, x)})}), b.Const(s, x)});
    Value* t = b.Op("Tanh", {u});
    Value* left = b.Op("Mul", {b.Op("Add", {b.Const(1, x), t}), b.Const(0.5, x)});
    Value* sech2 = b.Op("Sub", {b.Const(1, x), b.Op("Mul", {t, t})});
    Value* du = b.Op("Mul", {b.Op("Add", {b.Const(1, x), b.Op("Mul", {x2, b.Const(3 * c, x)})}), b.Const(s, x)});
    Value* right = b.Op("Mul", {b.Op("Mul", {b.Op("Mul", {x, b.Const(0.5, x)}), sech2}), du});
    b.SetGrad(0, b.Op("Mul", {b.dy(), b.Op("Add", {left, right})}));
    return absl::OkStatus();
  }
  // y = x Phi(x): dy/dx = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)).
  Value* erf = b.Op("Erf", {b.Op("Mul", {x, b.Const(1 / std::sqrt(2.0), x)})});
  Value* cdf = b.Op("Mul", {b.Op("Add", {erf, b.Const(1, x)}), b.Const(0.5, x)});
  Value* pdf = ScaledGaussian(b, x, 1 / std::sqrt(2 * M_PI), 0.5);
  b.SetGrad(0, b.Op("Mul", {b.dy(), b.Op("Add", {cdf, b.Op("Mul", {x, pdf})})}));
  return absl::OkStatus();
}

}  // namespace

// The rules for linear algebra, normalisation and data movement.
void RegisterStructuralRules(std::map<std::string, GradRule>& rules);

namespace {

std::map<std::string, GradRule>& Rules() {
  static auto* rules = [] {
    auto* r = new std::map<std::string, GradRule>{
        {"::Add", AddGrad}, {"::Sub", SubGrad}, {"::Mul", MulGrad}, {"::Div", DivGrad},
        {"::Pow", PowGrad}, {"::Neg", NegGrad}, {"::Exp", ExpGrad}, {"::Log", LogGrad},
        {"::Sqrt", SqrtGrad}, {"::Reciprocal", ReciprocalGrad}, {"::Tanh", TanhGrad},
        {"::Sigmoid", SigmoidGrad}, {"::Relu", ReluGrad}, {"::Sin", SinGrad}, {"::Cos", CosGrad},
        {"::Erf", ErfGrad}, {"::Gelu", GeluGrad}, {"ai.cleave::Gelu", GeluGrad},
    };
    RegisterStructuralRules(*r);
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
