// CPU kernels for ai.cleave.SwiGLU(gate, up) -> y = silu(gate) * up and SwiGLUGrad(dY, gate, up)
// -> dGate, dUp (providers/cpu/), float32 and float64, every operand of one shape.
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/nn.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

// The operands of a SwiGLU (gate, up and, for the gradient, dY) must be of one shape and type.
absl::Status ExpectAlike(KernelContext& ctx, int n) {
  const TensorView& first = *ctx.input(0);
  for (int i = 1; i < n; ++i) {
    const TensorView& v = *ctx.input(i);
    if (v.shape() != first.shape() || v.dtype != first.dtype)
      return InvalidArgument("expected input ", i, " of input 0's shape ", DimsToString(first.shape()), " and type ",
                             DataTypeName(first.dtype), ", got ", DimsToString(v.shape()), " ",
                             DataTypeName(v.dtype));
  }
  return absl::OkStatus();
}

class SwiGluKernel : public OpKernel {
 public:
  SwiGluKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    RETURN_IF_ERROR(ExpectAlike(ctx, 2));
    const TensorView& gate = *ctx.input(0);
    TensorView* y = ctx.Output(0, gate.dim_span());
    if (!y) return absl::OkStatus();
    if (gate.dtype == DataType::kFloat64)
      kernels::cpu::SwiGlu(gate.as<double>(), ctx.input(1)->as<double>(), y->as<double>(), gate.numel(),
                           ctx.thread_pool());
    else
      kernels::cpu::SwiGlu(gate.as<float>(), ctx.input(1)->as<float>(), y->as<float>(), gate.numel(),
                           ctx.thread_pool());
    return absl::OkStatus();
  }
};

class SwiGluGradKernel : public OpKernel {
 public:
  SwiGluGradKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    RETURN_IF_ERROR(ExpectAlike(ctx, 3));
    const TensorView& dy = *ctx.input(0);
    TensorView* dgate = ctx.Output(0, dy.dim_span());
    TensorView* dup = ctx.Output(1, dy.dim_span());
    if (dy.dtype == DataType::kFloat64)
      Run<double>(ctx, dgate, dup);
    else
      Run<float>(ctx, dgate, dup);
    return absl::OkStatus();
  }

 private:
  template <typename T>
  static void Run(KernelContext& ctx, TensorView* dgate, TensorView* dup) {
    kernels::cpu::SwiGluGrad(ctx.input(0)->as<T>(), ctx.input(1)->as<T>(), ctx.input(2)->as<T>(),
                             dgate ? dgate->as<T>() : nullptr, dup ? dup->as<T>() : nullptr, ctx.input(0)->numel(),
                             ctx.thread_pool());
  }
};

}  // namespace

void RegisterSwiGluKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  const char* const c = graph::kCleaveDomain;
  r.Register({c, "SwiGLU", 1, 1, InputTypeIn(0, floats), MakeFactory<SwiGluKernel>()});
  r.Register({c, "SwiGLUGrad", 1, 1, InputTypeIn(0, floats), MakeFactory<SwiGluGradKernel>()});
}

}  // namespace cleave::providers
