// CPU kernels of the ai.cleave training ops (providers/cpu/): InPlaceAccumulator,
// SquaredNorm, AdamW and SGD. Scalars are read from their inputs each run (the learning rate
// and step change every step); the math lives in kernels/cpu/optimizer.h.
#include <algorithm>
#include <cmath>
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/optimizer.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

absl::Status CheckSameShape(const TensorView& want, const TensorView& got, const char* what) {
  bool same = want.rank == got.rank;
  for (int k = 0; same && k < want.rank; ++k) same = want.dims[k] == got.dims[k];
  if (!same)
    return InvalidArgument(what, " has shape ", DimsToString(got.shape()), ", expected ",
                           DimsToString(want.shape()));
  return absl::OkStatus();
}

class InPlaceAccumulatorKernel : public OpKernel {
 public:
  InPlaceAccumulatorKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& buffer = *ctx.input(0);
    const TensorView& grad = *ctx.input(1);
    RETURN_IF_ERROR(CheckSameShape(buffer, grad, "grad"));
    const bool reset = *ctx.input(2)->as<const bool>();
    TensorView* out = ctx.Output(0, buffer.dim_span());
    if (!out) return absl::OkStatus();
    kernels::cpu::AccumulateGrad(buffer.as<const float>(), grad.as<const float>(), reset,
                                 out->as<float>(), grad.numel(), ctx.thread_pool());
    return absl::OkStatus();
  }
};

// The fused optimizers' global gradient norm (compute_norm = 1), in the float operations and
// order of the unfused graph (SquaredNorm, Sqrt, Mul, then Add, Div, Min, Mul): norm = sqrt(sum
// g^2) * grad_scale, written to output `norm_output`; returns the update's scale, grad_scale *
// min(1, max_norm / (norm + epsilon)) when max_norm > 0, grad_scale otherwise. The gradients are
// inputs first_grad, first_grad + stride, ...
struct GlobalNorm {
  bool enabled = false;
  float max_norm = 0.0f, epsilon = 1e-6f;
  explicit GlobalNorm(const graph::Node& n)
      : enabled(n.AttrInt("compute_norm", 0) != 0),
        max_norm(n.AttrFloat("max_grad_norm", 0.0f)),
        epsilon(n.AttrFloat("clip_epsilon", 1e-6f)) {}
  float UpdateScale(KernelContext& ctx, int first_grad, int stride, int groups, int norm_output,
                    float grad_scale) const {
    if (!enabled) return grad_scale;
    double total = 0.0;  // as SquaredNorm: fp64 over the tensors in order, then rounded
    for (int k = 0; k < groups; ++k) {
      const TensorView& g = *ctx.input(first_grad + stride * k);
      total += kernels::cpu::SquaredNorm(g.as<const float>(), g.numel(), ctx.thread_pool());
    }
    const float norm = std::sqrt(static_cast<float>(total)) * grad_scale;
    if (TensorView* out = ctx.Output(norm_output, std::span<const int64_t>())) *out->as<float>() = norm;
    return max_norm > 0.0f ? grad_scale * std::min(max_norm / (norm + epsilon), 1.0f) : grad_scale;
  }
};

// AdamW and MultiTensorAdamW: the AdamW step of each (param, grad, exp_avg, exp_avg_sq) group
// after the (lr, step, grad_scale) scalars; AdamW is the one-group case. MultiTensorAdamW with
// compute_norm = 1 forms the global norm first and clips with it (GlobalNorm).
class AdamWKernel : public OpKernel {
 public:
  AdamWKernel(const graph::Node& n, int) : op_(n.op_type()), norm_(n) {
    p_.beta1 = n.AttrFloat("beta1", 0.9f);
    p_.beta2 = n.AttrFloat("beta2", 0.999f);
    p_.epsilon = n.AttrFloat("epsilon", 1e-8f);
    p_.weight_decay = n.AttrFloat("weight_decay", 0.0f);
  }
  absl::Status Compute(KernelContext& ctx) const override;

 private:
  std::string op_;
  GlobalNorm norm_;
  kernels::cpu::AdamWParams p_;
};

// IsAllFinite(x...) -> bool scalar: no input has an infinite or NaN element.
class IsAllFiniteKernel : public OpKernel {
 public:
  IsAllFiniteKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    bool finite = true;
    for (int i = 0; i < ctx.num_inputs() && finite; ++i) {
      const TensorView& x = *ctx.input(i);
      finite = kernels::cpu::AllFinite(x.as<const float>(), x.numel(), ctx.thread_pool());
    }
    TensorView* y = ctx.Output(0, std::span<const int64_t>());
    if (y) *y->as<bool>() = finite;
    return absl::OkStatus();
  }
};

class SquaredNormKernel : public OpKernel {
 public:
  SquaredNormKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    double total = 0.0;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView& x = *ctx.input(i);
      total += kernels::cpu::SquaredNorm(x.as<const float>(), x.numel(), ctx.thread_pool());
    }
    TensorView* y = ctx.Output(0, std::span<const int64_t>());
    if (y) *y->as<float>() = static_cast<float>(total);
    return absl::OkStatus();
  }
};

// The (lr, step, grad_scale) scalars shared by the update ops.
struct StepScalars {
  double lr;
  int64_t step;
  float grad_scale;
};

absl::StatusOr<StepScalars> ReadScalars(KernelContext& ctx) {
  for (int i = 0; i < 3; ++i)
    if (ctx.input(i)->numel() != 1)
      return InvalidArgument("input ", i, " must be a scalar, got ", DimsToString(ctx.input(i)->shape()));
  StepScalars s{*ctx.input(0)->as<const float>(), *ctx.input(1)->as<const int64_t>(),
                *ctx.input(2)->as<const float>()};
  if (s.step < 1) return InvalidArgument("step must be >= 1, got ", s.step);
  return s;
}

// SGD and MultiTensorSGD: the step of each (param, grad[, momentum_buffer]) group after the
// (lr, step, grad_scale) scalars (the buffers are there when momentum != 0); SGD is the
// one-group case. MultiTensorSGD with compute_norm = 1 forms the global norm first.
class SgdKernel : public OpKernel {
 public:
  SgdKernel(const graph::Node& n, int) : multi_(n.op_type() == "MultiTensorSGD"), norm_(n) {
    p_.momentum = n.AttrFloat("momentum", 0.0f);
    p_.dampening = n.AttrFloat("dampening", 0.0f);
    p_.weight_decay = n.AttrFloat("weight_decay", 0.0f);
    p_.nesterov = n.AttrInt("nesterov", 0) != 0;
  }
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(StepScalars s, ReadScalars(ctx));
    // Per group: its tensors (k) and outputs (k - 1).
    const int k = multi_ ? (p_.momentum != 0.0f ? 3 : 2) : ctx.num_inputs() - 3;
    const int groups = (ctx.num_inputs() - 3) / k;
    kernels::cpu::SgdParams p = p_;
    p.lr = s.lr;
    p.step = s.step;
    p.grad_scale = norm_.UpdateScale(ctx, 4, k, groups, (k - 1) * groups, s.grad_scale);
    for (int g = 0; g < groups; ++g) {
      const int in = 3 + k * g;
      const TensorView& param = *ctx.input(in);
      RETURN_IF_ERROR(CheckSameShape(param, *ctx.input(in + 1), "grad"));
      const TensorView* buffer = k > 2 ? ctx.input(in + 2) : nullptr;
      if (p_.momentum != 0.0f && !buffer)
        return InvalidArgument("SGD with momentum ", p_.momentum, " needs a momentum_buffer input");
      if (buffer) RETURN_IF_ERROR(CheckSameShape(param, *buffer, "momentum_buffer"));
      TensorView* p_out = ctx.Output((k - 1) * g, param.dim_span());
      TensorView* b_out = buffer ? ctx.Output((k - 1) * g + 1, param.dim_span()) : nullptr;
      if (!p_out || (buffer && !b_out)) return InvalidArgument("SGD is missing an output");
      kernels::cpu::SgdStep(p, param.as<const float>(), ctx.input(in + 1)->as<const float>(),
                            buffer ? buffer->as<const float>() : nullptr, p_out->as<float>(),
                            b_out ? b_out->as<float>() : nullptr, param.numel(), ctx.thread_pool());
    }
    return absl::OkStatus();
  }

 private:
  bool multi_;
  GlobalNorm norm_;
  kernels::cpu::SgdParams p_;
};

absl::Status AdamWKernel::Compute(KernelContext& ctx) const {
  ASSIGN_OR_RETURN(StepScalars s, ReadScalars(ctx));
  kernels::cpu::AdamWParams p = p_;
  p.lr = s.lr;
  p.step = s.step;
  p.grad_scale = s.grad_scale;
  const int n = (ctx.num_inputs() - 3) / 4;
  p.grad_scale = norm_.UpdateScale(ctx, 4, 4, n, 3 * n, s.grad_scale);
  for (int k = 0; k < n; ++k) {
    const TensorView& param = *ctx.input(3 + 4 * k);
    RETURN_IF_ERROR(CheckSameShape(param, *ctx.input(4 + 4 * k), "grad"));
    RETURN_IF_ERROR(CheckSameShape(param, *ctx.input(5 + 4 * k), "exp_avg"));
    RETURN_IF_ERROR(CheckSameShape(param, *ctx.input(6 + 4 * k), "exp_avg_sq"));
    TensorView* p_out = ctx.Output(3 * k, param.dim_span());
    TensorView* m_out = ctx.Output(3 * k + 1, param.dim_span());
    TensorView* v_out = ctx.Output(3 * k + 2, param.dim_span());
    if (!p_out || !m_out || !v_out) return InvalidArgument(op_, " needs every output");
    kernels::cpu::AdamWStep(p, param.as<const float>(), ctx.input(4 + 4 * k)->as<const float>(),
                            ctx.input(5 + 4 * k)->as<const float>(), ctx.input(6 + 4 * k)->as<const float>(),
                            p_out->as<float>(), m_out->as<float>(), v_out->as<float>(), param.numel(),
                            ctx.thread_pool());
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterOptimizerKernels(KernelRegistry& r) {
  const char* const c = graph::kCleaveDomain;
  const std::vector<DataType> f32 = {DataType::kFloat32};
  r.Register({c, "InPlaceAccumulator", 1, 1, InputTypeIn(0, f32),
              MakeFactory<InPlaceAccumulatorKernel>()});
  r.Register({c, "SquaredNorm", 1, 1, InputTypeIn(0, f32), MakeFactory<SquaredNormKernel>()});
  r.Register({c, "IsAllFinite", 1, 1, InputTypeIn(0, f32), MakeFactory<IsAllFiniteKernel>()});
  r.Register({c, "AdamW", 1, 1, InputTypeIn(3, f32), MakeFactory<AdamWKernel>()});
  r.Register({c, "MultiTensorAdamW", 1, 1, InputTypeIn(3, f32), MakeFactory<AdamWKernel>()});
  r.Register({c, "SGD", 1, 1, InputTypeIn(3, f32), MakeFactory<SgdKernel>()});
  r.Register({c, "MultiTensorSGD", 1, 1, InputTypeIn(3, f32), MakeFactory<SgdKernel>()});
}

}  // namespace cleave::providers
