// CPU kernels for ai.cleave.RotaryEmbedding(x, cos, sin) -> y and RotaryEmbeddingGrad(dY, cos,
// sin) -> dX (providers/cpu/), float32 and float64: x's last axis rotated by halves, cos and sin
// broadcast to x.
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/nn.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

class RotaryKernel : public OpKernel {
 public:
  RotaryKernel(const graph::Node& n, int) : backward_(n.op_type() == "RotaryEmbeddingGrad") {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& cos = *ctx.input(1);
    const TensorView& sin = *ctx.input(2);
    if (cos.shape() != sin.shape() || cos.dtype != x.dtype || sin.dtype != x.dtype)
      return InvalidArgument("expected cos and sin of one shape and of x's type ", DataTypeName(x.dtype), ", got ",
                             DimsToString(cos.shape()), " ", DataTypeName(cos.dtype), " and ",
                             DimsToString(sin.shape()), " ", DataTypeName(sin.dtype));
    ASSIGN_OR_RETURN(kernels::RotaryLayout p, kernels::cpu::PlanRotary(x.dim_span(), cos.dim_span()));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64)
      kernels::cpu::Rotary(p, backward_, x.as<double>(), cos.as<double>(), sin.as<double>(), y->as<double>(),
                           ctx.thread_pool());
    else
      kernels::cpu::Rotary(p, backward_, x.as<float>(), cos.as<float>(), sin.as<float>(), y->as<float>(),
                           ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool backward_;
};

}  // namespace

void RegisterRotaryKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  for (const char* op : {"RotaryEmbedding", "RotaryEmbeddingGrad"})
    r.Register({graph::kCleaveDomain, op, 1, 1, InputTypeIn(0, floats), MakeFactory<RotaryKernel>()});
}

}  // namespace cleave::providers
