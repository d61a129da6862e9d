// CPU kernels for normalisation (providers/cpu/): Softmax, LogSoftmax, LayerNormalization
// (ONNX 17 and ai.cleave 1, same semantics) and ai.cleave.RMSNormalization. Each maps the node's axis
// onto the [outer, axis, inner] / [rows, cols] views of kernels/cpu/nn.h.
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/shape.h"
#include "providers/axis.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"

namespace cleave::providers {

namespace {

class SoftmaxKernel : public OpKernel {
 public:
  SoftmaxKernel(const graph::Node& n, int version, bool log)
      : log_(log), flatten_(version < 13), axis_(n.AttrInt("axis", version < 13 ? 1 : -1)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    // Versions 1 and 11 (flatten_) normalise over all of x[axis:] as one row.
    ASSIGN_OR_RETURN(const AxisView v, SoftmaxView(x, axis_, flatten_));
    kernels::cpu::SoftmaxParams p;
    p.log = log_;
    p.outer = v.outer;
    p.axis = v.len;
    p.inner = v.inner;
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64)
      kernels::cpu::Softmax(p, x.as<double>(), y->as<double>(), ctx.thread_pool());
    else
      kernels::cpu::Softmax(p, x.as<float>(), y->as<float>(), ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool log_, flatten_;
  int64_t axis_;
};

// LayerNormalization(X, Scale[, B]) -> Y, Mean, InvStdDev, and ai.cleave.RMSNormalization(X,
// Scale) -> Y, InvStdDev (no centring, no bias).
class LayerNormKernel : public OpKernel {
 public:
  LayerNormKernel(const graph::Node& n, int)
      : rms_(n.op_type() == "RMSNormalization"),
        axis_(n.AttrInt("axis", -1)),
        epsilon_(n.AttrFloat("epsilon", 1e-5f)),
        stash_double_(n.AttrInt("stash_type", 1) == static_cast<int>(DataType::kFloat64)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, x.rank, true));
    kernels::cpu::LayerNormParams p;
    p.rows = DimProduct(x, 0, axis);
    p.cols = DimProduct(x, axis, x.rank);
    // The epsilon attribute is a float; widening it keeps exactly the value the model holds.
    p.epsilon = static_cast<double>(epsilon_);
    p.rms = rms_;
    const void* scale = nullptr;
    const void* bias = nullptr;
    RETURN_IF_ERROR(AffineParam(ctx, 1, x, axis, &scale));
    if (!rms_) RETURN_IF_ERROR(AffineParam(ctx, 2, x, axis, &bias));
    DimVector stat_dims(x.dim_span());
    for (int k = axis; k < x.rank; ++k) stat_dims[k] = 1;
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* mean = rms_ ? nullptr : ctx.Output(1, stat_dims);
    TensorView* inv_std = ctx.Output(rms_ ? 1 : 2, stat_dims);
    if (!y) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64) Run<double>(p, x, scale, bias, y, mean, inv_std, ctx);
    else Run<float>(p, x, scale, bias, y, mean, inv_std, ctx);
    return absl::OkStatus();
  }

 private:
  // Points *out at input i's values laid out over the normalised dims x[axis:], expanding
  // a broadcast Scale or B into scratch when it is smaller than those dims.
  static absl::Status AffineParam(KernelContext& ctx, int i, const TensorView& x, int axis,
                                  const void** out) {
    const TensorView* v = ctx.input(i);
    if (!v) return absl::OkStatus();
    const int norm_rank = x.rank - axis;
    bool ok = v->rank <= norm_rank;
    for (int k = 0; ok && k < v->rank; ++k) {
      const int64_t d = v->dims[k], want = x.dims[x.rank - v->rank + k];
      ok = d == want || d == 1;
    }
    if (!ok)
      return InvalidArgument(i == 1 ? "Scale " : "B ", DimsToString(v->shape()),
                             " does not broadcast over the normalised dims of X ",
                             DimsToString(x.shape()), " from axis ", axis);
    if (v->numel() == DimProduct(x, axis, x.rank)) {
      *out = v->data;
      return absl::OkStatus();
    }
    TensorView expanded(ctx.Scratch(DimProduct(x, axis, x.rank) * ElementSize(v->dtype)),
                        v->dtype, std::span<const int64_t>(x.dims + axis, norm_rank));
    if (!expanded.data) return NoScratch();
    kernels::cpu::Expand(*v, expanded, ctx.thread_pool());
    *out = expanded.data;
    return absl::OkStatus();
  }

  template <typename T>
  void Run(const kernels::cpu::LayerNormParams& p, const TensorView& x, const void* scale,
           const void* bias, TensorView* y, TensorView* mean, TensorView* inv_std,
           KernelContext& ctx) const {
    const T* s = static_cast<const T*>(scale);
    const T* b = static_cast<const T*>(bias);
    if (stash_double_)
      kernels::cpu::LayerNorm<T, double>(p, x.as<T>(), s, b, y->as<T>(),
                                         mean ? mean->as<double>() : nullptr,
                                         inv_std ? inv_std->as<double>() : nullptr,
                                         ctx.thread_pool());
    else
      kernels::cpu::LayerNorm<T, float>(p, x.as<T>(), s, b, y->as<T>(),
                                        mean ? mean->as<float>() : nullptr,
                                        inv_std ? inv_std->as<float>() : nullptr,
                                        ctx.thread_pool());
  }

  bool rms_;
  int64_t axis_;
  float epsilon_;
  bool stash_double_;
};

// SkipLayerNormalization(x, skip, scale[, bias]) -> y, mean, inv_std_dev, sum over the last
// axis: the sum is formed as Add forms it, then normalised by the LayerNormalization kernel, so
// the fused op computes exactly what Add + LayerNormalization compute.
// SkipRMSNormalization(x, skip, scale) -> y, inv_std_dev, sum likewise, by the RMSNorm kernel.
class SkipLayerNormKernel : public OpKernel {
 public:
  SkipLayerNormKernel(const graph::Node& n, int)
      : rms_(n.op_type() == "SkipRMSNormalization"), epsilon_(n.AttrFloat("epsilon", 1e-5f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& skip = *ctx.input(1);
    const TensorView& scale = *ctx.input(2);
    const TensorView* bias = rms_ ? nullptr : ctx.input(3);
    if (x.shape() != skip.shape() || x.rank == 0)
      return InvalidArgument("expected x and skip of one shape, got ", DimsToString(x.shape()), " and ",
                             DimsToString(skip.shape()));
    kernels::cpu::LayerNormParams p;
    p.cols = x.dims[x.rank - 1];
    p.rows = p.cols ? x.numel() / p.cols : 0;
    p.epsilon = static_cast<double>(epsilon_);
    p.rms = rms_;
    if (scale.numel() != p.cols || (bias && bias->numel() != p.cols))
      return InvalidArgument("expected scale and bias of ", p.cols, " elements (x's last dim)");
    DimVector stat_dims(x.dim_span());
    stat_dims[x.rank - 1] = 1;
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* mean = rms_ ? nullptr : ctx.Output(1, stat_dims);
    TensorView* inv_std = ctx.Output(rms_ ? 1 : 2, stat_dims);
    TensorView* sum = ctx.Output(rms_ ? 2 : 3, x.dim_span());
    float* s = sum ? sum->as<float>() : static_cast<float*>(ctx.Scratch(x.nbytes()));
    if (!s) return NoScratch();
    const float* a = x.as<float>();
    // A bf16 / fp16 skip (a low-precision product's result) is added as float32.
    const float* b = skip.as<float>();
    if (skip.dtype != DataType::kFloat32) {
      if (skip.dtype != DataType::kBFloat16 && skip.dtype != DataType::kFloat16)
        return InvalidArgument("expected a float32, bf16 or fp16 skip, got ", DataTypeName(skip.dtype));
      float* wide = static_cast<float*>(ctx.Scratch(x.nbytes()));
      if (!wide) return NoScratch();
      kernels::cpu::Cast(skip, TensorView(wide, DataType::kFloat32, skip.dim_span()), ctx.thread_pool());
      b = wide;
    }
    ParallelFor(ctx.thread_pool(), x.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) s[i] = a[i] + b[i];
    });
    if (!y) return absl::OkStatus();
    // A low-precision y (`to`): the float32 result rounded once.
    TensorView y32 = *y;
    if (y->dtype != DataType::kFloat32) {
      y32.dtype = DataType::kFloat32;
      y32.data = ctx.Scratch(y32.nbytes());
      if (!y32.data) return NoScratch();
    }
    kernels::cpu::LayerNorm<float, float>(p, s, scale.as<float>(), bias ? bias->as<float>() : nullptr, y32.as<float>(),
                                          mean ? mean->as<float>() : nullptr,
                                          inv_std ? inv_std->as<float>() : nullptr, ctx.thread_pool());
    if (y->dtype != DataType::kFloat32) kernels::cpu::Cast(y32, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool rms_;
  float epsilon_;
};

std::string StashTypeSupported(const graph::Node& n, int) {
  const int64_t s = n.AttrInt("stash_type", 1);
  if (s == static_cast<int>(DataType::kFloat32) || s == static_cast<int>(DataType::kFloat64))
    return "";
  return absl::StrCat("stash_type ", s, " is not supported; the kernel takes 1 (float32) or 11 (float64)");
}

}  // namespace

void RegisterNormKernels(KernelRegistry& r) {
  const DataType f32 = DataType::kFloat32, f64 = DataType::kFloat64;
  for (bool log : {false, true}) {
    r.Register({"", log ? "LogSoftmax" : "Softmax", 1, 13, InputTypeIn(0, {f32, f64}),
                [log](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
                  return std::unique_ptr<OpKernel>(new SoftmaxKernel(n, v, log));
                }});
  }
  auto ln_supports = AllOf({InputTypeIn(0, {f32, f64}), StashTypeSupported});
  r.Register({"", "LayerNormalization", 17, 17, ln_supports, MakeFactory<LayerNormKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "LayerNormalization", 1, 1, ln_supports,
              MakeFactory<LayerNormKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "RMSNormalization", 1, 1, ln_supports,
              MakeFactory<LayerNormKernel>()});
  for (const char* op : {"SkipLayerNormalization", "SkipRMSNormalization"})
    r.Register(
        {std::string(graph::kCleaveDomain), op, 1, 1, InputTypeIn(0, {f32}), MakeFactory<SkipLayerNormKernel>()});
}

}  // namespace cleave::providers
