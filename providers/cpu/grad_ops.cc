// CPU kernels of the ai.cleave gradient ops (providers/cpu/): GatherGrad, SliceGrad,
// SoftmaxCrossEntropyLossGrad, SoftmaxGrad, LogSoftmaxGrad, LayerNormalizationGrad and
// GeluGrad. Each checks its runtime inputs against each other, allocates its outputs (of the
// runtime `shape`, or of the forward tensor each gradient belongs to) and hands the math to
// kernels/cpu/grad.h.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/grad.h"
#include "providers/axis.h"
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
    // A base (input 3) that dX starts from, unless reset (input 4) is set.
    const TensorView* base = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    const TensorView* reset = ctx.num_inputs() > 4 ? ctx.input(4) : nullptr;
    if (base && (base->dtype != dy.dtype || !std::equal(shape.begin(), shape.end(), base->dims, base->dims + base->rank) ||
                 base->rank != r))
      return InvalidArgument("expected a base of the table's shape ", DimsToString(shape.data(), r), " and dY's type ",
                             DataTypeName(dy.dtype), ", got ", DimsToString(base->shape()), " ",
                             DataTypeName(base->dtype));
    if (reset && *reset->as<const bool>()) base = nullptr;
    TensorView* dx = ctx.Output(0, std::span<const int64_t>(shape.data(), shape.size()));
    if (!dx) return absl::OkStatus();
    return kernels::cpu::GatherGrad(dy, indices, axis, *dx, ctx.thread_pool(), base ? base->data : nullptr);
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

// SoftmaxCrossEntropyLossGrad(dY, log_prob, labels[, weights]) {reduction, ignore_index,
// class_offset, num_classes, from_scores, to}. With from_scores = 1 input 1 holds the scores,
// whose log-softmax along the class axis is the log_prob (the forward then need not store it);
// `to` makes the gradient bf16 or fp16, rounded from the float32 result.
class SceGradKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(LossAttrs attrs, ParseLossAttrs(n));
    auto k = std::unique_ptr<SceGradKernel>(new SceGradKernel());
    k->reduction_ = attrs.reduction;
    k->ignore_index_ = attrs.ignore_index;
    k->class_offset_ = n.AttrInt("class_offset", 0);
    k->num_classes_ = n.AttrInt("num_classes", 0);
    k->from_scores_ = n.AttrInt("from_scores", 0) != 0;
    k->nll_ = n.op_type() == "NegativeLogLikelihoodLossGrad";
    if (k->nll_ && (k->from_scores_ || k->class_offset_ || k->num_classes_ || n.HasAttr("to")))
      return InvalidArgument(n.Describe(), ": takes no from_scores, class_offset, num_classes or to");
    if (k->class_offset_ < 0 || k->num_classes_ < 0)
      return InvalidArgument(n.Describe(), ": class_offset ", k->class_offset_, " and num_classes ", k->num_classes_,
                             " must be >= 0");
    return std::unique_ptr<OpKernel>(std::move(k));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    TensorView in = *ctx.input(1);
    const TensorView& labels = *ctx.input(2);
    const TensorView* weights = ctx.input(3);
    RETURN_IF_ERROR(CheckShapes(dy, in, labels, weights));
    if (OnePass(dy, in, weights)) return ComputeOnePass(ctx, dy, in, labels);
    // bf16 / fp16 scores: read as float32 (widened into scratch), as the CUDA kernel reads them.
    if (from_scores_ && (in.dtype == DataType::kBFloat16 || in.dtype == DataType::kFloat16)) {
      if (dy.dtype != DataType::kFloat32 || weights)
        return InvalidArgument("expected a float32 dY and no weights with ", DataTypeName(in.dtype), " scores");
      TensorView wide(ctx.ScratchOf<float>(in.numel()), DataType::kFloat32, in.dim_span());
      if (!wide.data) return NoScratch();
      kernels::cpu::Cast(in, wide, ctx.thread_pool());
      in = wide;
    }
    // The log_prob: input 1, or the log-softmax of the scores there, in scratch.
    TensorView lp = in;
    if (from_scores_) {
      lp.data = ctx.Scratch(in.nbytes());
      if (!lp.data) return NoScratch();
      kernels::cpu::SoftmaxParams sp;
      sp.log = true;
      sp.outer = in.dims[0];
      sp.axis = in.dims[1];
      for (int k = 2; k < in.rank; ++k) sp.inner *= in.dims[k];
      if (in.dtype == DataType::kFloat64)
        kernels::cpu::Softmax(sp, in.as<double>(), static_cast<double*>(lp.data), ctx.thread_pool());
      else
        kernels::cpu::Softmax(sp, in.as<float>(), static_cast<float*>(lp.data), ctx.thread_pool());
    }
    kernels::cpu::SceParams p;
    p.N = lp.dims[0];
    p.C = lp.dims[1];
    for (int k = 2; k < lp.rank; ++k) p.D *= lp.dims[k];
    p.reduction = reduction_;
    p.ignore_index = ignore_index_;
    p.class_offset = class_offset_;
    p.num_classes = num_classes_;
    p.nll = nll_;
    if (num_classes_ > 0 && class_offset_ + p.C > num_classes_)
      return InvalidArgument("log_prob holds classes [", class_offset_, ", ", class_offset_ + p.C,
                             ") of num_classes ", num_classes_);
    TensorView* out = ctx.Output(0, lp.dim_span());
    if (!out) return absl::OkStatus();
    // A bf16 / fp16 gradient is computed in float32 scratch and rounded.
    const bool narrow = out->dtype != lp.dtype;
    if (narrow && (lp.dtype != DataType::kFloat32 || (out->dtype != DataType::kBFloat16 && out->dtype != DataType::kFloat16)))
      return InvalidArgument("a ", DataTypeName(out->dtype), " gradient of ", DataTypeName(lp.dtype), " scores");
    TensorView wide = *out;
    if (narrow) {
      wide.data = ctx.ScratchOf<float>(out->numel());
      wide.dtype = DataType::kFloat32;
      if (!wide.data) return NoScratch();
    }
    TensorView& dx = wide;
    const bool f64 = lp.dtype == DataType::kFloat64, l64 = labels.dtype == DataType::kInt64;
    absl::Status s;
    if (f64 && l64) s = Run<double, int64_t>(p, dy, lp, labels, weights, dx, ctx);
    else if (f64) s = Run<double, int32_t>(p, dy, lp, labels, weights, dx, ctx);
    else if (l64) s = Run<float, int64_t>(p, dy, lp, labels, weights, dx, ctx);
    else s = Run<float, int32_t>(p, dy, lp, labels, weights, dx, ctx);
    if (s.ok() && narrow) kernels::cpu::Cast(wide, *out, ctx.thread_pool());
    RETURN_IF_ERROR(s);
    // The forward's loss of these scores (output 1), as SoftmaxCrossEntropyLoss computes it.
    if (ctx.num_outputs() > 1) RETURN_IF_ERROR(Loss(p, in, labels, ctx));
    return absl::OkStatus();
  }

 private:
  SceGradKernel() = default;

  // The language model's loss: float32, bf16 or fp16 scores [N, C] over every class, read once
  // per row for the gradient and the loss together (kernels/cpu/grad.h).
  bool OnePass(const TensorView& dy, const TensorView& scores, const TensorView* weights) const {
    const DataType t = scores.dtype;
    return from_scores_ && !weights && class_offset_ == 0 && num_classes_ == 0 && scores.rank == 2 &&
           dy.dtype == DataType::kFloat32 &&
           (t == DataType::kFloat32 || t == DataType::kBFloat16 || t == DataType::kFloat16);
  }

  absl::Status ComputeOnePass(KernelContext& ctx, const TensorView& dy, const TensorView& scores,
                              const TensorView& labels) const {
    kernels::cpu::SceParams p;
    p.N = scores.dims[0];
    p.C = scores.dims[1];
    p.reduction = reduction_;
    p.ignore_index = ignore_index_;
    TensorView* dx = ctx.Output(0, scores.dim_span());
    const bool none = reduction_ == LossReduction::kNone;
    TensorView* loss = ctx.num_outputs() > 1 ? (none ? ctx.Output(1, labels.dim_span()) : ctx.Output(1, {})) : nullptr;
    TensorView unread;  // where the gradient goes when only the loss is read
    if (!dx) {
      if (!loss) return absl::OkStatus();
      unread = TensorView(ctx.ScratchOf<float>(scores.numel()), DataType::kFloat32, scores.dim_span());
      if (!unread.data) return NoScratch();
      dx = &unread;
    }
    const DataType to = dx->dtype;
    if (to != DataType::kFloat32 && to != DataType::kBFloat16 && to != DataType::kFloat16)
      return InvalidArgument("a ", DataTypeName(to), " gradient of ", DataTypeName(scores.dtype), " scores");
    if (loss && loss->dtype != DataType::kFloat32)
      return InvalidArgument("expected a float32 loss, got ", DataTypeName(loss->dtype));
    double* scratch = static_cast<double*>(ctx.Scratch(static_cast<size_t>(p.N) * sizeof(double) + 8));
    if (!scratch) return NoScratch();
    float* lp = loss ? loss->as<float>() : nullptr;
    if (labels.dtype == DataType::kInt64)
      return kernels::cpu::SoftmaxCrossEntropyFromScores<int64_t>(p, dy.as<float>(), scores, labels.as<int64_t>(), *dx,
                                                                  lp, scratch, ctx.thread_pool());
    return kernels::cpu::SoftmaxCrossEntropyFromScores<int32_t>(p, dy.as<float>(), scores, labels.as<int32_t>(), *dx,
                                                                lp, scratch, ctx.thread_pool());
  }

  absl::Status Loss(kernels::cpu::SceParams p, const TensorView& scores, const TensorView& labels,
                    KernelContext& ctx) const {
    const bool none = reduction_ == LossReduction::kNone;
    TensorView* loss = none ? ctx.Output(1, labels.dim_span()) : ctx.Output(1, {});
    if (!loss) return absl::OkStatus();
    if (!from_scores_ || class_offset_ != 0 || num_classes_ != 0 || ctx.input(3))
      return InvalidArgument("the loss output needs from_scores = 1 and no class_offset, num_classes or weights");
    p.class_offset = 0;
    p.num_classes = 0;
    double* scratch = none ? nullptr : static_cast<double*>(ctx.Scratch(2 * p.N * p.D * sizeof(double) + 8));
    if (!none && !scratch) return NoScratch();
    const bool f64 = scores.dtype == DataType::kFloat64, l64 = labels.dtype == DataType::kInt64;
    ThreadPool* pool = ctx.thread_pool();
    if (f64 && l64)
      return kernels::cpu::SoftmaxCrossEntropy<double, int64_t>(p, scores.as<double>(), labels.as<int64_t>(), nullptr,
                                                                loss->as<double>(), nullptr, scratch, pool);
    if (f64)
      return kernels::cpu::SoftmaxCrossEntropy<double, int32_t>(p, scores.as<double>(), labels.as<int32_t>(), nullptr,
                                                                loss->as<double>(), nullptr, scratch, pool);
    if (l64)
      return kernels::cpu::SoftmaxCrossEntropy<float, int64_t>(p, scores.as<float>(), labels.as<int64_t>(), nullptr,
                                                               loss->as<float>(), nullptr, scratch, pool);
    return kernels::cpu::SoftmaxCrossEntropy<float, int32_t>(p, scores.as<float>(), labels.as<int32_t>(), nullptr,
                                                             loss->as<float>(), nullptr, scratch, pool);
  }

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
  int64_t class_offset_ = 0, num_classes_ = 0;
  bool from_scores_ = false;
  bool nll_ = false;  // NegativeLogLikelihoodLossGrad: input 1 is the forward's log-probabilities
};

absl::Status ExpectSameDims(const TensorView& dy, const TensorView& t, const char* what) {
  if (dy.shape() == t.shape()) return absl::OkStatus();
  return InvalidArgument("expected dY of the shape of ", what, " ", DimsToString(t.shape()), ", got ",
                         DimsToString(dy.shape()));
}

// SoftmaxGrad / LogSoftmaxGrad(dY, Y) {axis}: along one axis, as Softmax-13.
class SoftmaxGradKernel : public OpKernel {
 public:
  SoftmaxGradKernel(const graph::Node& n, int)
      : log_(n.op_type() == "LogSoftmaxGrad"), axis_(n.AttrInt("axis", -1)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& y = *ctx.input(1);
    RETURN_IF_ERROR(ExpectSameDims(dy, y, "Y"));
    ASSIGN_OR_RETURN(const AxisView v, SoftmaxView(y, axis_, /*flatten=*/false));
    kernels::cpu::SoftmaxParams p;
    p.log = log_;
    p.outer = v.outer;
    p.axis = v.len;
    p.inner = v.inner;
    TensorView* dx = ctx.Output(0, y.dim_span());
    if (!dx) return absl::OkStatus();
    if (y.dtype == DataType::kFloat64)
      kernels::cpu::SoftmaxGrad(p, dy.as<const double>(), y.as<const double>(), dx->as<double>(),
                                ctx.thread_pool());
    else
      kernels::cpu::SoftmaxGrad(p, dy.as<const float>(), y.as<const float>(), dx->as<float>(),
                                ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool log_;
  int64_t axis_;
};

// GeluGrad(dY, X) {approximate}.
class GeluGradKernel : public OpKernel {
 public:
  GeluGradKernel(const graph::Node& n, int) : tanh_(n.AttrString("approximate", "none") == "tanh") {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    RETURN_IF_ERROR(ExpectSameDims(dy, x, "X"));
    TensorView* dx = ctx.Output(0, x.dim_span());
    if (!dx) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64)
      kernels::cpu::GeluGrad(tanh_, dy.as<const double>(), x.as<const double>(), dx->as<double>(),
                             x.numel(), ctx.thread_pool());
    else
      kernels::cpu::GeluGrad(tanh_, dy.as<const float>(), x.as<const float>(), dx->as<float>(),
                             x.numel(), ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool tanh_;
};

std::string GeluGradSupported(const graph::Node& n, int) {
  const std::string a = n.AttrString("approximate", "none");
  return a == "none" || a == "tanh" ? "" : "approximate '" + a + "' is not 'none' or 'tanh'";
}

// LayerNormalizationGrad(dY, X, scale, mean, inv_std_dev) {axis} -> dX[, dScale, dBias].
// RMSNormalizationGrad(dY, X, scale, inv_std_dev[, dX_add]) {axis} -> dX[, dScale, dX_low]: the
// same without the mean (and so without its mean(g) term) or a bias.
// A scale that broadcasts over the normalised dims is expanded for the math, and its
// gradients are summed back over the broadcast axes.
class LayerNormGradKernel : public OpKernel {
 public:
  LayerNormGradKernel(const graph::Node& n, int)
      : slots_(graph::NormGradSlotsOf(n)), axis_(n.AttrInt("axis", -1)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& inv_std = *ctx.input(slots_.inv_std);
    const TensorView& mean = slots_.rms ? inv_std : *ctx.input(3);
    RETURN_IF_ERROR(ExpectSameDims(dy, x, "X"));
    if (dy.dtype != x.dtype &&
        !(x.dtype == DataType::kFloat32 && (dy.dtype == DataType::kBFloat16 || dy.dtype == DataType::kFloat16)))
      return InvalidArgument("expected dY of X's type, or bf16 / fp16 with a float32 X, got ", DataTypeName(dy.dtype),
                             " and ", DataTypeName(x.dtype));
    if (const TensorView* add = ctx.num_inputs() > slots_.dx_add ? ctx.input(slots_.dx_add) : nullptr;
        add && add->shape() != x.shape())
      return InvalidArgument("expected dX_add of X's shape ", DimsToString(x.shape()), ", got ",
                             DimsToString(add->shape()));
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, x.rank, true));
    kernels::cpu::LayerNormGradParams p;
    p.rows = DimProduct(x, 0, axis);
    p.cols = DimProduct(x, axis, x.rank);
    p.rms = slots_.rms;
    RETURN_IF_ERROR(CheckScale(*ctx.input(2), x, axis));
    for (const TensorView* v : {&mean, &inv_std})
      if (v->numel() != p.rows || v->dtype != mean.dtype)
        return InvalidArgument("expected mean and inv_std_dev of one dtype with ", p.rows,
                               " elements (X ", DimsToString(x.shape()), " before axis ", axis,
                               "), got ", DimsToString(mean.shape()), " and ",
                               DimsToString(inv_std.shape()));
    const bool f64 = x.dtype == DataType::kFloat64, u64 = mean.dtype == DataType::kFloat64;
    if (ctx.num_outputs() > slots_.dx_low && x.dtype != DataType::kFloat32)
      return InvalidArgument("dX_low rounds a float32 dX, got X of ", DataTypeName(x.dtype));
    if (f64 && u64) return Run<double, double>(p, axis, ctx);
    if (f64) return Run<double, float>(p, axis, ctx);
    if (u64) return Run<float, double>(p, axis, ctx);
    return Run<float, float>(p, axis, ctx);
  }

 private:
  static absl::Status CheckScale(const TensorView& scale, const TensorView& x, int axis) {
    bool ok = scale.rank <= x.rank - axis;
    for (int k = 0; ok && k < scale.rank; ++k) {
      const int64_t d = scale.dims[k];
      ok = d == 1 || d == x.dims[x.rank - scale.rank + k];
    }
    if (ok) return absl::OkStatus();
    return InvalidArgument("scale ", DimsToString(scale.shape()),
                           " does not broadcast over the normalised dims of X ",
                           DimsToString(x.shape()), " from axis ", axis);
  }

  template <typename T, typename U>
  absl::Status Run(const kernels::cpu::LayerNormGradParams& p, int axis, KernelContext& ctx) const {
    const TensorView& x = *ctx.input(1);
    const TensorView& scale = *ctx.input(2);
    const std::span<const int64_t> norm_dims(x.dims + axis, x.rank - axis);
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dscale = ctx.Output(1, scale.dim_span());
    TensorView* dbias = slots_.rms ? nullptr : ctx.Output(2, scale.dim_span());
    const bool broadcast = scale.numel() != p.cols;
    bool no_scratch = false;
    auto buffer = [&](int64_t n) {
      T* b = ctx.ScratchOf<T>(n);
      no_scratch |= !b;
      return b;
    };
    const T* s = scale.as<const T>();
    if (broadcast) {
      TensorView full(buffer(p.cols), scale.dtype, norm_dims);
      if (no_scratch) return NoScratch();
      kernels::cpu::Expand(scale, full, ctx.thread_pool());
      s = full.as<const T>();
    }
    // With a broadcast scale, the column sums land in scratch and are folded below.
    T* ds = dscale ? (broadcast ? buffer(p.cols) : dscale->as<T>()) : nullptr;
    T* db = dbias ? (broadcast ? buffer(p.cols) : dbias->as<T>()) : nullptr;
    double* workspace = (ds || db) ? ctx.ScratchOf<double>(kernels::cpu::LayerNormGradWorkspace(p)) : nullptr;
    if ((ds || db) && !workspace) no_scratch = true;
    // dX_low (float32 X only, checked above): dX rounded to bf16 / fp16 as a Cast of it would be.
    TensorView* low = ctx.num_outputs() > slots_.dx_low ? ctx.Output(slots_.dx_low, x.dim_span()) : nullptr;
    T* d = dx ? dx->as<T>() : buffer(x.numel());
    // A bf16 / fp16 dY (a low-precision product's result) is read as float32.
    const T* dy = ctx.input(0)->as<const T>();
    T* wide = ctx.input(0)->dtype != x.dtype ? buffer(x.numel()) : nullptr;
    if (no_scratch) return NoScratch();
    if (wide) {
      kernels::cpu::Cast(*ctx.input(0), TensorView(wide, x.dtype, x.dim_span()), ctx.thread_pool());
      dy = wide;
    }
    kernels::cpu::LayerNormGrad<T, U>(p, dy, x.as<const T>(), s,
                                      slots_.rms ? nullptr : ctx.input(3)->as<const U>(),
                                      ctx.input(slots_.inv_std)->as<const U>(), d, ds, db, workspace,
                                      ctx.thread_pool());
    // dX_add: added to dX after it is formed, as a separate Add would add it.
    const TensorView* add = ctx.num_inputs() > slots_.dx_add ? ctx.input(slots_.dx_add) : nullptr;
    if ((dx || low) && add) {
      const T* a = add->as<const T>();
      ParallelFor(ctx.thread_pool(), x.numel(), 1 << 14, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) d[i] = d[i] + a[i];
      });
    }
    if (low) kernels::cpu::Cast(TensorView(d, x.dtype, x.dim_span()), *low, ctx.thread_pool());
    if (!broadcast) return absl::OkStatus();
    int axes[kMaxRank];
    int num_axes = 0;
    const int lead = static_cast<int>(norm_dims.size()) - scale.rank;
    for (int k = 0; k < static_cast<int>(norm_dims.size()); ++k)
      if (k < lead || scale.dims[k - lead] == 1) axes[num_axes++] = k;
    const kernels::cpu::ReducePlan plan =
        kernels::cpu::PlanReduce(norm_dims, std::span<const int>(axes, num_axes));
    if (ds) kernels::cpu::Reduce<T>(kernels::cpu::ReduceKind::kSum, plan, ds, dscale->as<T>(), ctx.thread_pool());
    if (db) kernels::cpu::Reduce<T>(kernels::cpu::ReduceKind::kSum, plan, db, dbias->as<T>(), ctx.thread_pool());
    return absl::OkStatus();
  }

  graph::NormGradSlots slots_;  // InvStdDev and dX_add inputs, dX_low output; rms
  int64_t axis_;
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
  // Input 1 may be bf16 / fp16 scores (from_scores; the kernel checks).
  r.Register({c, "NegativeLogLikelihoodLossGrad", 1, 1,
              AllOf({InputTypeIn(0, floats), InputTypeIn(1, floats), InputTypeIn(2, ints)}),
              MakeCheckedFactory<SceGradKernel>()});
  r.Register({c, "SoftmaxCrossEntropyLossGrad", 1, 1,
              AllOf({InputTypeIn(0, floats),
                     InputTypeIn(1, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}),
                     InputTypeIn(2, ints)}),
              MakeCheckedFactory<SceGradKernel>()});
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"})
    r.Register({c, op, 1, 1, AllOf({InputTypeIn(0, floats), InputTypeIn(1, floats)}),
                MakeFactory<SoftmaxGradKernel>()});
  r.Register({c, "GeluGrad", 1, 1, AllOf({InputTypeIn(0, floats), InputTypeIn(1, floats), GeluGradSupported}),
              MakeFactory<GeluGradKernel>()});
  r.Register({c, "LayerNormalizationGrad", 1, 1,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}),
                     InputTypeIn(1, floats), InputTypeIn(3, floats)}),
              MakeFactory<LayerNormGradKernel>()});
  r.Register({c, "RMSNormalizationGrad", 1, 1,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}),
                     InputTypeIn(1, floats), InputTypeIn(3, floats)}),
              MakeFactory<LayerNormGradKernel>()});
}

}  // namespace cleave::providers
