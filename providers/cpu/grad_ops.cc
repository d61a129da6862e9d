// CPU kernels of the ai.cleave gradient ops (providers/cpu/): GatherGrad, SliceGrad and
// SoftmaxCrossEntropyLossGrad. Each checks its runtime inputs against each other, allocates
// the output of the runtime `shape` (or log_prob's shape) and hands the math to
// kernels/cpu/grad.h.
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/grad.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

using kernels::cpu::LossReduction;

// GatherGrad(shape, indices, dY) {axis}: dX of `shape` with dY scatter-added along axis.
class GatherGradKernel : public OpKernel {
 public:
  GatherGradKernel(const graph::Node& n, int) : axis_(n.AttrInt("axis", 0)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    DimVector shape;
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(0), "shape", &shape));
    const TensorView& indices = *ctx.input(1);
    const TensorView& dy = *ctx.input(2);
    const int r = static_cast<int>(shape.size());
    if (axis_ < -r || axis_ >= r || r == 0)
      return InvalidArgument("axis ", axis_, " is out of range for shape ", DimsToString(shape.data(), r));
    const int axis = static_cast<int>(axis_ < 0 ? axis_ + r : axis_);
    // dY must be shape[:axis] + indices.dims + shape[axis+1:].
    bool ok = dy.rank == r - 1 + indices.rank;
    for (int k = 0; ok && k < dy.rank; ++k) {
      int64_t want = k < axis ? shape[k]
                     : k < axis + indices.rank ? indices.dims[k - axis]
                                               : shape[k - indices.rank + 1];
      ok = dy.dims[k] == want;
    }
    if (!ok)
      return InvalidArgument("dY ", DimsToString(dy.shape()), " does not match shape ",
                             DimsToString(shape.data(), r), " with indices ",
                             DimsToString(indices.shape()), " along axis ", axis);
    TensorView* dx = ctx.Output(0, std::span<const int64_t>(shape.data(), shape.size()));
    if (!dx) return absl::OkStatus();
    return kernels::cpu::GatherGrad(dy, indices, axis, *dx, ctx.thread_pool());
  }

 private:
  int64_t axis_;
};

// SliceGrad(dY, shape, starts, ends[, axes, steps]): zeros of `shape` with dY in the slice.
class SliceGradKernel : public OpKernel {
 public:
  SliceGradKernel(const graph::Node&, int) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    DimVector shape, starts, ends, axes, steps;
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(1), "shape", &shape));
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(2), "starts", &starts));
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(3), "ends", &ends));
    if (ctx.input(4)) RETURN_IF_ERROR(ReadDimValues(*ctx.input(4), "axes", &axes));
    if (ctx.input(5)) RETURN_IF_ERROR(ReadDimValues(*ctx.input(5), "steps", &steps));
    const std::span<const int64_t> dims(shape.data(), shape.size());
    ASSIGN_OR_RETURN(kernels::cpu::SliceParams p,
                     kernels::cpu::ResolveSlice(dims, starts, ends, axes, steps));
    bool ok = dy.rank == static_cast<int>(p.out_dims.size());
    for (int k = 0; ok && k < dy.rank; ++k) ok = dy.dims[k] == p.out_dims[k];
    if (!ok)
      return InvalidArgument("dY ", DimsToString(dy.shape()), " does not match the slice ",
                             DimsToString(p.out_dims.data(), static_cast<int>(p.out_dims.size())),
                             " of shape ", DimsToString(shape.data(), static_cast<int>(shape.size())));
    TensorView* dx = ctx.Output(0, dims);
    if (dx) kernels::cpu::SliceGrad(dy, p, *dx, ctx.thread_pool());
    return absl::OkStatus();
  }
};

// SoftmaxCrossEntropyLossGrad(dY, log_prob, labels[, weights]) {reduction, ignore_index}.
class SceGradKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(LossAttrs attrs, ParseLossAttrs(n));
    auto k = std::unique_ptr<SceGradKernel>(new SceGradKernel());
    k->reduction_ = attrs.reduction;
    k->ignore_index_ = attrs.ignore_index;
    return std::unique_ptr<OpKernel>(std::move(k));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& lp = *ctx.input(1);
    const TensorView& labels = *ctx.input(2);
    const TensorView* weights = ctx.input(3);
    RETURN_IF_ERROR(CheckShapes(dy, lp, labels, weights));
    kernels::cpu::SceParams p;
    p.N = lp.dims[0];
    p.C = lp.dims[1];
    for (int k = 2; k < lp.rank; ++k) p.D *= lp.dims[k];
    p.reduction = reduction_;
    p.ignore_index = ignore_index_;
    TensorView* dx = ctx.Output(0, lp.dim_span());
    if (!dx) return absl::OkStatus();
    const bool f64 = lp.dtype == DataType::kFloat64, l64 = labels.dtype == DataType::kInt64;
    if (f64 && l64) return Run<double, int64_t>(p, dy, lp, labels, weights, *dx, ctx);
    if (f64) return Run<double, int32_t>(p, dy, lp, labels, weights, *dx, ctx);
    if (l64) return Run<float, int64_t>(p, dy, lp, labels, weights, *dx, ctx);
    return Run<float, int32_t>(p, dy, lp, labels, weights, *dx, ctx);
  }

 private:
  SceGradKernel() = default;

  absl::Status CheckShapes(const TensorView& dy, const TensorView& lp, const TensorView& labels,
                           const TensorView* weights) const {
    bool ok = lp.rank >= 2 && labels.rank == lp.rank - 1;
    for (int k = 0; ok && k < labels.rank; ++k) ok = labels.dims[k] == lp.dims[k == 0 ? 0 : k + 1];
    if (!ok)
      return InvalidArgument("expected log_prob [N, C, d1, ...] and labels [N, d1, ...], got log_prob ",
                             DimsToString(lp.shape()), " and labels ", DimsToString(labels.shape()));
    if (weights && (weights->rank != 1 || weights->dims[0] != lp.dims[1]))
      return InvalidArgument("expected weights of shape [C] = [", lp.dims[1], "], got ",
                             DimsToString(weights->shape()));
    if (reduction_ == LossReduction::kNone ? dy.shape() != labels.shape() : dy.numel() != 1)
      return InvalidArgument("expected dY ",
                             reduction_ == LossReduction::kNone ? DimsToString(labels.shape()) : "[]",
                             " (the loss's shape), got ", DimsToString(dy.shape()));
    return absl::OkStatus();
  }

  template <typename T, typename L>
  static absl::Status Run(const kernels::cpu::SceParams& p, const TensorView& dy, const TensorView& lp,
                          const TensorView& labels, const TensorView* weights, TensorView& dx,
                          KernelContext& ctx) {
    return kernels::cpu::SoftmaxCrossEntropyGrad<T, L>(p, dy.as<const T>(), lp.as<const T>(),
                                                       labels.as<const L>(),
                                                       weights ? weights->as<const T>() : nullptr,
                                                       dx.as<T>(), ctx.thread_pool());
  }

  LossReduction reduction_ = LossReduction::kMean;
  std::optional<int64_t> ignore_index_;
};

}  // namespace

void RegisterGradKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  const std::vector<DataType> ints = {DataType::kInt32, DataType::kInt64};
  const char* const c = graph::kCleaveDomain;
  r.Register({c, "GatherGrad", 1, 1,
              AllOf({InputTypeIn(0, {DataType::kInt64}), InputTypeIn(1, ints), InputTypeIn(2, floats)}),
              MakeFactory<GatherGradKernel>()});
  r.Register({c, "SliceGrad", 1, 1, AllOf({InputTypeIn(0, floats), InputTypeIn(1, {DataType::kInt64})}),
              MakeFactory<SliceGradKernel>()});
  r.Register({c, "SoftmaxCrossEntropyLossGrad", 1, 1,
              AllOf({InputTypeIn(0, floats), InputTypeIn(1, floats), InputTypeIn(2, ints)}),
              MakeCheckedFactory<SceGradKernel>()});
}

}  // namespace cleave::providers
