// Gradient rules for the elementwise math beyond the transformer set (trainer/): the inverse
// and hyperbolic trigonometry, Softplus, Softsign, Mish, the activations with attributes
// (LeakyRelu, Elu, Selu, Celu, HardSigmoid, HardSwish, ThresholdedRelu), the variadic Sum and
// Mean, and the step functions Floor, Ceil, Round and Sign, whose gradient is zero wherever it
// exists (as PyTorch's). Each is written with forward ops; at a kink the one-sided value
// PyTorch uses.
#include <map>

#include "absl/status/status.h"
#include "graph/op_table.h"
#include "trainer/gradient_rules.h"

namespace cleave::trainer {

namespace {

using graph::Value;

// dx = dy * d, for the derivative d.
absl::Status Chain(GradBuilder& b, Value* d) {
  b.SetGrad(0, b.Op("Mul", {b.dy(), d}));
  return absl::OkStatus();
}

Value* Square(GradBuilder& b, Value* v) { return b.Op("Mul", {v, v}); }

absl::Status TanGrad(GradBuilder& b) {  // 1 + tan^2 x
  return Chain(b, b.Op("Add", {b.Const(1, b.y(0)), Square(b, b.y(0))}));
}
absl::Status AsinGrad(GradBuilder& b) {  // 1 / sqrt(1 - x^2)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), b.Op("Sqrt", {b.Op("Sub", {b.Const(1, x), Square(b, x)})})}));
  return absl::OkStatus();
}
absl::Status AcosGrad(GradBuilder& b) {  // -1 / sqrt(1 - x^2)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Neg", {b.Op("Div", {b.dy(), b.Op("Sqrt", {b.Op("Sub", {b.Const(1, x), Square(b, x)})})})}));
  return absl::OkStatus();
}
absl::Status AtanGrad(GradBuilder& b) {  // 1 / (1 + x^2)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), b.Op("Add", {b.Const(1, x), Square(b, x)})}));
  return absl::OkStatus();
}
absl::Status SinhGrad(GradBuilder& b) { return Chain(b, b.Op("Cosh", {b.x(0)})); }
absl::Status CoshGrad(GradBuilder& b) { return Chain(b, b.Op("Sinh", {b.x(0)})); }
absl::Status AsinhGrad(GradBuilder& b) {  // 1 / sqrt(x^2 + 1)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), b.Op("Sqrt", {b.Op("Add", {Square(b, x), b.Const(1, x)})})}));
  return absl::OkStatus();
}
absl::Status AcoshGrad(GradBuilder& b) {  // 1 / sqrt(x^2 - 1)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), b.Op("Sqrt", {b.Op("Sub", {Square(b, x), b.Const(1, x)})})}));
  return absl::OkStatus();
}
absl::Status AtanhGrad(GradBuilder& b) {  // 1 / (1 - x^2)
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), b.Op("Sub", {b.Const(1, x), Square(b, x)})}));
  return absl::OkStatus();
}
absl::Status SoftplusGrad(GradBuilder& b) { return Chain(b, b.Op("Sigmoid", {b.x(0)})); }
absl::Status SoftsignGrad(GradBuilder& b) {  // 1 / (1 + |x|)^2
  Value* x = b.x(0);
  b.SetGrad(0, b.Op("Div", {b.dy(), Square(b, b.Op("Add", {b.Const(1, x), b.Op("Abs", {x})}))}));
  return absl::OkStatus();
}
absl::Status MishGrad(GradBuilder& b) {  // t + x (1 - t^2) sigmoid(x), t = tanh(softplus(x))
  Value* x = b.x(0);
  Value* t = b.Op("Tanh", {b.Op("Softplus", {x})});
  Value* slope = b.Op("Mul", {x, b.Op("Mul", {b.Op("Sub", {b.Const(1, x), Square(b, t)}), b.Op("Sigmoid", {x})})});
  return Chain(b, b.Op("Add", {t, slope}));
}

// dy where `cond`, else dy * `otherwise` (null: 0).
absl::Status Piecewise(GradBuilder& b, Value* cond, Value* otherwise) {
  Value* other = otherwise ? b.Op("Mul", {b.dy(), otherwise}) : b.Const(0, b.dy());
  b.SetGrad(0, b.Op("Where", {cond, b.dy(), other}));
  return absl::OkStatus();
}
Value* Positive(GradBuilder& b) { return b.Op("Greater", {b.x(0), b.Const(0, b.x(0))}); }
graph::ActivationAttrs Attrs(GradBuilder& b) { return graph::ActivationAttrsOf(b.fwd()); }

absl::Status LeakyReluGrad(GradBuilder& b) {  // 1 for x > 0, else alpha
  return Piecewise(b, Positive(b), b.Const(Attrs(b).alpha, b.x(0)));
}
absl::Status EluGrad(GradBuilder& b) {  // 1 for x > 0, else alpha e^x = y + alpha
  return Piecewise(b, Positive(b), b.Op("Add", {b.y(0), b.Const(Attrs(b).alpha, b.y(0))}));
}
absl::Status SeluGrad(GradBuilder& b) {  // gamma for x > 0, else gamma alpha e^x = y + gamma alpha
  const double alpha = Attrs(b).alpha, gamma = Attrs(b).gamma;
  Value* scaled = b.Op("Mul", {b.dy(), b.Const(gamma, b.dy())});
  Value* neg = b.Op("Mul", {b.dy(), b.Op("Add", {b.y(0), b.Const(gamma * alpha, b.y(0))})});
  b.SetGrad(0, b.Op("Where", {Positive(b), scaled, neg}));
  return absl::OkStatus();
}
absl::Status CeluGrad(GradBuilder& b) {  // 1 for x > 0, else e^(x / alpha) = y / alpha + 1
  Value* y = b.y(0);
  return Piecewise(b, Positive(b), b.Op("Add", {b.Op("Div", {y, b.Const(Attrs(b).alpha, y)}), b.Const(1, y)}));
}
absl::Status HardSigmoidGrad(GradBuilder& b) {  // alpha where 0 < alpha x + beta < 1, else 0
  Value* x = b.x(0);
  const double alpha = Attrs(b).alpha;
  Value* z = b.Op("Add", {b.Op("Mul", {x, b.Const(alpha, x)}), b.Const(Attrs(b).beta, x)});
  Value* inside = b.Op("And", {b.Op("Greater", {z, b.Const(0, x)}), b.Op("Less", {z, b.Const(1, x)})});
  b.SetGrad(0, b.Op("Where", {inside, b.Op("Mul", {b.dy(), b.Const(alpha, b.dy())}), b.Const(0, b.dy())}));
  return absl::OkStatus();
}
absl::Status HardSwishGrad(GradBuilder& b) {  // 0 below -3, 1 above 3, x / 3 + 1 / 2 between
  Value* x = b.x(0);
  Value* mid = b.Op("Add", {b.Op("Div", {x, b.Const(3, x)}), b.Const(0.5, x)});
  Value* d = b.Op("Where", {b.Op("Less", {x, b.Const(-3, x)}), b.Const(0, x),
                            b.Op("Where", {b.Op("Greater", {x, b.Const(3, x)}), b.Const(1, x), mid})});
  return Chain(b, d);
}
absl::Status ThresholdedReluGrad(GradBuilder& b) {  // 1 for x > alpha, else 0
  return Piecewise(b, b.Op("Greater", {b.x(0), b.Const(Attrs(b).alpha, b.x(0))}), nullptr);
}

// Sum: dy to every input, summed over the dims it was broadcast along; Mean: dy / n.
absl::Status SumMeanGrad(GradBuilder& b) {
  const int n = b.fwd().num_inputs();
  Value* g = b.fwd().op_type() == "Mean" ? b.Op("Mul", {b.dy(), b.Const(1.0 / n, b.dy())}) : b.dy();
  for (int i = 0; i < n; ++i) {
    if (!b.NeedsGrad(i)) continue;
    absl::StatusOr<Value*> dx = b.ReduceTo(g, b.x(i));
    if (!dx.ok()) return dx.status();
    b.SetGrad(i, *dx);
  }
  return absl::OkStatus();
}

// Floor, Ceil, Round, Sign: flat between their steps; no gradient flows back. Nor through
// RandomNormalLike and RandomUniformLike (which read only their input's shape) and Bernoulli
// (whose draws are not differentiable in the probabilities, as in PyTorch).
absl::Status StepGrad(GradBuilder&) { return absl::OkStatus(); }

}  // namespace

void RegisterActivationRules(std::map<std::string, GradRule>& rules) {
  const std::map<std::string, GradRule> mine = {
      {"::Tan", TanGrad},
      {"::Asin", AsinGrad},
      {"::Acos", AcosGrad},
      {"::Atan", AtanGrad},
      {"::Sinh", SinhGrad},
      {"::Cosh", CoshGrad},
      {"::Asinh", AsinhGrad},
      {"::Acosh", AcoshGrad},
      {"::Atanh", AtanhGrad},
      {"::Softplus", SoftplusGrad},
      {"::Softsign", SoftsignGrad},
      {"::Mish", MishGrad},
      {"::LeakyRelu", LeakyReluGrad},
      {"::Elu", EluGrad},
      {"::Selu", SeluGrad},
      {"::Celu", CeluGrad},
      {"::HardSigmoid", HardSigmoidGrad},
      {"::HardSwish", HardSwishGrad},
      {"::ThresholdedRelu", ThresholdedReluGrad},
      {"::Floor", StepGrad},
      {"::Ceil", StepGrad},
      {"::Round", StepGrad},
      {"::Sign", StepGrad},
      {"::RandomNormalLike", StepGrad},
      {"::RandomUniformLike", StepGrad},
      {"::Bernoulli", StepGrad},
      {"::Sum", SumMeanGrad},
      {"::Mean", SumMeanGrad},
  };
  rules.insert(mine.begin(), mine.end());
}

}  // namespace cleave::trainer
