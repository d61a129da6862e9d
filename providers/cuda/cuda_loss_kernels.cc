// The CUDA provider's losses (providers/cuda/): SoftmaxCrossEntropyLoss and its gradient (one
// pass per row, the probabilities never stored; kernels/cuda/loss.cu), NegativeLogLikelihoodLoss
// and its gradient. Cross-entropy beyond float32 [N, C] scores, int64 labels and no class
// weights (scores [N, C, d...], weights, int32 labels, bf16 / fp16) is the log-softmax along the
// class axis followed by the NLL kernels, and its gradient the NLL gradient followed by
// LogSoftmax's, dx = g - exp(log_prob) sum_c g with g = -weight[label] dY at each label.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cuda/kernels.h"
#include "providers/axis.h"
#include "providers/loss_shapes.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

int ReductionCode(const std::string& r) { return r == "none" ? 2 : r == "sum" ? 1 : 0; }

// The one-pass row kernels take float32 [N, C] scores (the gradient also bf16 / fp16 ones from
// the scores, low_ok), int64 labels, no weights and (the gradient) a float32 dY; the forward
// passes float32 for dy. The claim and the kernels decide by this one rule.
bool OnePass(int rank, DataType scores, DataType labels, bool weights, DataType dy, bool low_ok) {
  const bool dtype_ok = scores == DataType::kFloat32 ||
                        (low_ok && (scores == DataType::kBFloat16 || scores == DataType::kFloat16));
  return rank == 2 && labels == DataType::kInt64 && !weights && dtype_ok && dy == DataType::kFloat32;
}

// The scores as [N, C, D] and the NLL kernels' scratch.
struct ClassView {
  int64_t N = 0, C = 0, D = 1;
  float* pos_loss = nullptr;
  float* pos_weight = nullptr;
  double* sums = nullptr;
};
absl::StatusOr<ClassView> ClassViewOf(KernelContext& ctx, const TensorView& in) {
  ClassView v{in.dims[0], in.dims[1], DimProduct(in, 2, in.rank)};
  const int64_t positions = std::max<int64_t>(v.N * v.D, 1);
  v.pos_loss = ctx.ScratchOf<float>(positions);
  v.pos_weight = ctx.ScratchOf<float>(positions);
  v.sums = ctx.ScratchOf<double>(2);
  if (!v.pos_loss || !v.pos_weight || !v.sums) return NoScratch();
  return v;
}

class SceKernel : public CudaKernel {
 public:
  SceKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), reduction_(ReductionCode(n.AttrString("reduction", "mean"))),
        has_ignore_(n.HasAttr("ignore_index")), ignore_(n.AttrInt("ignore_index", 0)),
        tag_(p->IndexCheckTag(absl::StrCat(name_, " (labels)"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& s = *ctx.input(0);
    const TensorView& labels = *ctx.input(1);
    const TensorView* weight = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    RETURN_IF_ERROR(Named(CheckClassShapes("scores", s, labels, weight)));
    if (!OnePass(s.rank, s.dtype, labels.dtype, weight != nullptr, DataType::kFloat32, false))
      return ComputeByNll(ctx, s, labels, weight);
    const int64_t N = s.dims[0], C = s.dims[1];
    TensorView* loss = reduction_ == 2 ? ctx.Output(0, {N}) : ctx.Output(0, std::vector<int64_t>{});
    TensorView* log_prob = ctx.Output(1, s.dim_span());
    // The rows' losses: the output itself with no reduction, else (or when it goes unread while
    // log_prob is read) scratch.
    float* rows = reduction_ == 2 && loss ? loss->as<float>() : ctx.ScratchOf<float>(N);
    if (!rows) return NoScratch();
    return Check(kc::SoftmaxCrossEntropy(s.as<float>(), labels.as<int64_t>(), rows,
                                         log_prob ? log_prob->as<float>() : nullptr, loss ? loss->as<float>() : nullptr,
                                         p_->reduction_scratch(), N, C, reduction_, has_ignore_, ignore_, stream()));
  }

 private:
  // log_prob (the output, or scratch) by LogSoftmax along the class axis, then the NLL loss.
  absl::Status ComputeByNll(KernelContext& ctx, const TensorView& s, const TensorView& labels,
                            const TensorView* weight) const {
    TensorView* loss = reduction_ == 2 ? ctx.Output(0, labels.dim_span()) : ctx.Output(0, std::vector<int64_t>{});
    TensorView* log_prob = ctx.Output(1, s.dim_span());
    if (!loss && !log_prob) return absl::OkStatus();
    ASSIGN_OR_RETURN(const ClassView v, ClassViewOf(ctx, s));
    void* lp = log_prob ? log_prob->data : ctx.Scratch(s.nbytes());
    if (!lp) return NoScratch();
    const kc::Dt dt = DtOf(s.dtype);
    RETURN_IF_ERROR(Check(kc::Softmax(dt, s.data, lp, v.N, v.C, /*log=*/true, stream(), v.D)));
    if (!loss) return absl::OkStatus();
    return Check(kc::NllLoss(dt, lp, labels.data, labels.dtype == DataType::kInt32, weight ? weight->data : nullptr,
                             loss->data, v.pos_loss, v.pos_weight, v.sums, v.N, v.C, v.D, reduction_, has_ignore_,
                             ignore_, stream(), {p_->bad_index_words(), tag_}));
  }

  int reduction_;
  bool has_ignore_;
  int64_t ignore_;
  int64_t tag_;
};

class SceGradKernel : public CudaKernel {
 public:
  SceGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), reduction_(ReductionCode(n.AttrString("reduction", "mean"))),
        has_ignore_(n.HasAttr("ignore_index")), ignore_(n.AttrInt("ignore_index", 0)),
        class_offset_(n.AttrInt("class_offset", 0)), from_scores_(n.AttrInt("from_scores", 0) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& in = *ctx.input(1);  // log_prob, or the scores (from_scores)
    const TensorView& labels = *ctx.input(2);
    const TensorView* weight = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    RETURN_IF_ERROR(Named(CheckClassShapes(from_scores_ ? "scores" : "log_prob", in, labels, weight)));
    if (!OnePass(in.rank, in.dtype, labels.dtype, weight != nullptr, dy.dtype, from_scores_))
      return ComputeByNll(ctx, dy, in, labels, weight);
    TensorView* dx = ctx.Output(0, in.dim_span());
    if (!dx) return absl::OkStatus();
    // The forward's loss folded in (output 1): the rows' losses on the way, then their reduction.
    TensorView* loss = ctx.num_outputs() > 1 ? (reduction_ == 2 ? ctx.Output(1, labels.dim_span()) : ctx.Output(1, {}))
                                             : nullptr;
    if (loss && !from_scores_) return InvalidArgument(name_, ": the loss output needs from_scores = 1");
    float* rows = !loss ? nullptr
                  : reduction_ == 2 ? loss->as<float>()
                                    : ctx.ScratchOf<float>(in.dims[0]);
    if (loss && !rows) return NoScratch();
    return Check(kc::SoftmaxCrossEntropyGrad(dy.as<float>(), in.data, DtOf(in.dtype), from_scores_, labels.as<int64_t>(),
                                             dx->data, DtOf(dx->dtype), p_->reduction_scratch(), in.dims[0], in.dims[1],
                                             reduction_, has_ignore_, ignore_, class_offset_, rows,
                                             loss ? loss->as<float>() : nullptr, stream()));
  }

 private:
  // g = the NLL gradient (scratch), then dx = LogSoftmaxGrad(g, log_prob) along the class axis;
  // from the scores, their log-softmax first (and the loss from it when output 1 is read).
  absl::Status ComputeByNll(KernelContext& ctx, const TensorView& dy, const TensorView& in, const TensorView& labels,
                            const TensorView* weight) const {
    if (class_offset_ != 0)
      return Unimplemented(name_, ": class_offset ", class_offset_,
                           " needs float32 [N, C] scores, int64 labels and no weights on CUDA");
    if (dy.dtype != in.dtype)
      return InvalidArgument(name_, ": dY of ", DataTypeName(dy.dtype), " with ", DataTypeName(in.dtype), " scores");
    TensorView* dx = ctx.Output(0, in.dim_span());
    TensorView* loss = ctx.num_outputs() > 1 ? (reduction_ == 2 ? ctx.Output(1, labels.dim_span()) : ctx.Output(1, {}))
                                             : nullptr;
    if (loss && !from_scores_) return InvalidArgument(name_, ": the loss output needs from_scores = 1");
    if (dx && dx->dtype != in.dtype)
      return InvalidArgument(name_, ": a ", DataTypeName(dx->dtype), " gradient of ", DataTypeName(in.dtype),
                             " scores with class weights or [N, C, d...] scores");
    if (!dx && !loss) return absl::OkStatus();
    ASSIGN_OR_RETURN(const ClassView v, ClassViewOf(ctx, in));
    const kc::Dt dt = DtOf(in.dtype);
    const bool t32 = labels.dtype == DataType::kInt32;
    const void* w = weight ? weight->data : nullptr;
    const void* lp = in.data;
    if (from_scores_) {
      void* formed = ctx.Scratch(in.nbytes());
      if (!formed) return NoScratch();
      RETURN_IF_ERROR(Check(kc::Softmax(dt, in.data, formed, v.N, v.C, /*log=*/true, stream(), v.D)));
      lp = formed;
    }
    if (loss)
      RETURN_IF_ERROR(Check(kc::NllLoss(dt, lp, labels.data, t32, w, loss->data, v.pos_loss, v.pos_weight, v.sums,
                                        v.N, v.C, v.D, reduction_, has_ignore_, ignore_, stream())));
    if (!dx) return absl::OkStatus();
    void* g = ctx.Scratch(in.nbytes());
    if (!g) return NoScratch();
    RETURN_IF_ERROR(Check(kc::NllLossGrad(dt, dy.data, labels.data, t32, w, g, v.pos_weight, v.sums, v.N, v.C, v.D,
                                          reduction_, has_ignore_, ignore_, stream())));
    return Check(kc::SoftmaxGrad(dt, g, lp, dx->data, v.N, v.C, /*log=*/true, stream(), v.D));
  }

  int reduction_;
  bool has_ignore_;
  int64_t ignore_, class_offset_;
  bool from_scores_;
};

// NegativeLogLikelihoodLoss(input [N, C, d...], target [N, d...][, weight [C]]) and its
// gradient ai.cleave.NegativeLogLikelihoodLossGrad(dY, input, target[, weight]).
class NllKernel : public CudaKernel {
 public:
  NllKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), grad_(n.op_type() == "NegativeLogLikelihoodLossGrad"),
        reduction_(ReductionCode(n.AttrString("reduction", "mean"))), has_ignore_(n.HasAttr("ignore_index")),
        ignore_(n.AttrInt("ignore_index", 0)), tag_(p->IndexCheckTag(absl::StrCat(name_, " (target)"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const int first = grad_ ? 1 : 0;
    const TensorView& in = *ctx.input(first);
    const TensorView& target = *ctx.input(first + 1);
    const TensorView* weight = ctx.num_inputs() > first + 2 ? ctx.input(first + 2) : nullptr;
    RETURN_IF_ERROR(Named(CheckClassShapes("input", in, target, weight)));
    const bool t32 = target.dtype == DataType::kInt32;
    const void* w = weight ? weight->data : nullptr;
    TensorView* out = grad_             ? ctx.Output(0, in.dim_span())
                      : reduction_ == 2 ? ctx.Output(0, target.dim_span())
                                        : ctx.Output(0, std::vector<int64_t>{});
    if (!out) return absl::OkStatus();
    ASSIGN_OR_RETURN(const ClassView v, ClassViewOf(ctx, in));
    if (grad_)
      return Check(kc::NllLossGrad(DtOf(in.dtype), ctx.input(0)->data, target.data, t32, w, out->data, v.pos_weight,
                                   v.sums, v.N, v.C, v.D, reduction_, has_ignore_, ignore_, stream()));
    return Check(kc::NllLoss(DtOf(in.dtype), in.data, target.data, t32, w, out->data, v.pos_loss, v.pos_weight,
                             v.sums, v.N, v.C, v.D, reduction_, has_ignore_, ignore_, stream(),
                             {p_->bad_index_words(), tag_}));
  }

 private:
  bool grad_;
  int reduction_;
  bool has_ignore_;
  int64_t ignore_;
  int64_t tag_;
};

// Cross-entropy and its gradient: float32 [N, C] scores with int64 labels and no weights in
// one pass (the gradient from the scores also of bf16 / fp16 scores, its dX of any float type,
// with class_offset); otherwise float32, bf16 or fp16 scores of any rank >= 2 with int64 or
// int32 labels, weights of the scores' dtype, and a gradient (and dY) of the scores' dtype.
std::string SceSupported(const graph::Node& n, int) {
  const bool fwd = n.op_type() == "SoftmaxCrossEntropyLoss";
  const graph::Value* s = n.input(fwd ? 0 : 1);
  const graph::Value* w = n.num_inputs() > (fwd ? 2 : 3) ? n.input(fwd ? 2 : 3) : nullptr;
  const std::string red = n.AttrString("reduction", "mean");
  if (red != "none" && red != "sum" && red != "mean") return absl::StrCat("reduction '", red, "'");
  if (!s || (s->dtype() != DataType::kFloat32 && s->dtype() != DataType::kBFloat16 &&
             s->dtype() != DataType::kFloat16))
    return "scores are not float32, bf16 or fp16";
  if (!s->shape().has_rank() || s->shape().rank() < 2) return "scores of unknown rank or rank below 2";
  const DataType label_t = n.input(fwd ? 1 : 2)->dtype();
  if (label_t != DataType::kInt64 && label_t != DataType::kInt32) return "labels are not int64 or int32";
  const bool low_ok = !fwd && n.AttrInt("from_scores", 0) != 0;
  const bool one_pass = OnePass(s->shape().rank(), s->dtype(), label_t, w != nullptr,
                                fwd ? DataType::kFloat32 : n.input(0)->dtype(), low_ok);
  if (!fwd && n.output(0)) {
    const DataType t = n.output(0)->dtype();
    if (t != DataType::kFloat32 && t != DataType::kBFloat16 && t != DataType::kFloat16)
      return absl::StrCat("a ", DataTypeName(t), " gradient is not supported on CUDA");
  }
  if (one_pass) return "";
  if (w && w->dtype() != s->dtype()) return "class weights of another dtype than the scores";
  if (!fwd) {
    if (n.AttrInt("class_offset", 0) != 0 || n.HasAttr("num_classes"))
      return "class_offset / num_classes need float32 [N, C] scores, int64 labels and no weights on CUDA";
    if (n.input(0)->dtype() != s->dtype() || (n.output(0) && n.output(0)->dtype() != s->dtype()))
      return "with class weights or [N, C, d...] scores, dY and dX must have the scores' dtype on CUDA";
  }
  return "";
}

}  // namespace

void RegisterCudaLossKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  auto floats = InputTypeIn(0, kFloats);
  Add<SceKernel>(r, p, "", "SoftmaxCrossEntropyLoss", 12, 1 << 30, SceSupported);
  Add<SceGradKernel>(r, p, C, "SoftmaxCrossEntropyLossGrad", 1, 1, SceSupported);
  auto nll = [](const graph::Node& n, int) -> std::string {
    const std::string red = n.AttrString("reduction", "mean");
    if (red != "none" && red != "sum" && red != "mean") return absl::StrCat("reduction '", red, "'");
    const int first = n.op_type() == "NegativeLogLikelihoodLoss" ? 0 : 1;
    const graph::Value* w = n.num_inputs() > first + 2 ? n.input(first + 2) : nullptr;
    if (w && w->dtype() != n.input(first)->dtype()) return "weights of another dtype";
    const DataType t = n.input(first + 1)->dtype();
    return t == DataType::kInt64 || t == DataType::kInt32 ? "" : "targets are not int64 or int32";
  };
  Add<NllKernel>(r, p, "", "NegativeLogLikelihoodLoss", 12, 1 << 30, AllOf({floats, nll}));
  Add<NllKernel>(r, p, C, "NegativeLogLikelihoodLossGrad", 1, 1, AllOf({InputTypeIn(1, kFloats), nll}));
}

}  // namespace cleave::providers
