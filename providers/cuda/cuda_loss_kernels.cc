// The CUDA provider's losses (providers/cuda/): SoftmaxCrossEntropyLoss and its gradient (one
// pass per row, the probabilities never stored; kernels/cuda/loss.cu), NegativeLogLikelihoodLoss
// and its gradient.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cuda/kernels.h"
#include "providers/axis.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

int ReductionCode(const std::string& r) { return r == "none" ? 2 : r == "sum" ? 1 : 0; }

class SceKernel : public CudaKernel {
 public:
  SceKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), reduction_(ReductionCode(n.AttrString("reduction", "mean"))),
        has_ignore_(n.HasAttr("ignore_index")), ignore_(n.AttrInt("ignore_index", 0)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& s = *ctx.input(0);
    const TensorView& labels = *ctx.input(1);
    if (s.rank != 2 || labels.rank != 1 || labels.dims[0] != s.dims[0])
      return InvalidArgument(name_, ": expected scores [N, C] and labels [N], got ", DimsToString(s.shape()), " and ",
                             DimsToString(labels.shape()));
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
  int reduction_;
  bool has_ignore_;
  int64_t ignore_;
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
    if (in.rank != 2 || labels.rank != 1 || labels.dims[0] != in.dims[0])
      return InvalidArgument(name_, ": expected ", from_scores_ ? "scores" : "log_prob", " [N, C] and labels [N], got ",
                             DimsToString(in.shape()), " and ", DimsToString(labels.shape()));
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
    bool ok = in.rank >= 2 && target.rank == in.rank - 1;
    for (int k = 0; ok && k < target.rank; ++k) ok = target.dims[k] == in.dims[k == 0 ? 0 : k + 1];
    if (!ok)
      return InvalidArgument(name_, ": expected input [N, C, d1, ...] and target [N, d1, ...], got ",
                             DimsToString(in.shape()), " and ", DimsToString(target.shape()));
    if (weight && (weight->rank != 1 || weight->dims[0] != in.dims[1] || weight->dtype != in.dtype))
      return InvalidArgument(name_, ": expected weight [", in.dims[1], "] of the input's dtype, got ",
                             DataTypeName(weight->dtype), DimsToString(weight->shape()));
    const int64_t N = in.dims[0], C = in.dims[1], D = DimProduct(in, 2, in.rank);
    const bool t32 = target.dtype == DataType::kInt32;
    const void* w = weight ? weight->data : nullptr;
    float* pos_weight = ctx.ScratchOf<float>(std::max<int64_t>(N * D, 1));
    double* sums = ctx.ScratchOf<double>(2);
    if (!pos_weight || !sums) return NoScratch();
    if (grad_) {
      TensorView* dx = ctx.Output(0, in.dim_span());
      if (!dx) return absl::OkStatus();
      return Check(kc::NllLossGrad(DtOf(in.dtype), ctx.input(0)->data, target.data, t32, w, dx->data, pos_weight,
                                   sums, N, C, D, reduction_, has_ignore_, ignore_, stream()));
    }
    TensorView* loss = reduction_ == 2 ? ctx.Output(0, target.dim_span()) : ctx.Output(0, std::vector<int64_t>{});
    if (!loss) return absl::OkStatus();
    float* pos_loss = ctx.ScratchOf<float>(std::max<int64_t>(N * D, 1));
    if (!pos_loss) return NoScratch();
    return Check(kc::NllLoss(DtOf(in.dtype), in.data, target.data, t32, w, loss->data, pos_loss, pos_weight,
                             sums, N, C, D, reduction_, has_ignore_, ignore_, stream(),
                             {p_->bad_index_words(), tag_}));
  }

 private:
  bool grad_;
  int reduction_;
  bool has_ignore_;
  int64_t ignore_;
  int64_t tag_;
};

std::string Int64Input(const graph::Node& n, int i) {
  const graph::Value* v = n.input(i);
  return v && v->dtype() == DataType::kInt64 ? "" : absl::StrCat("input ", i, " is not int64");
}

std::string TwoDimScores(const graph::Node& n, int) {
  const bool fwd = n.op_type() == "SoftmaxCrossEntropyLoss";
  const graph::Value* s = n.input(fwd ? 0 : 1);
  // The gradient from the scores also reads bf16 / fp16 scores (as float32).
  const bool low_ok = !fwd && n.AttrInt("from_scores", 0) != 0;
  if (!s || (s->dtype() != DataType::kFloat32 &&
             !(low_ok && (s->dtype() == DataType::kBFloat16 || s->dtype() == DataType::kFloat16))))
    return low_ok ? "scores are not float32, bf16 or fp16" : "scores are not float32";
  if (!s->shape().has_rank() || s->shape().rank() != 2) return "only [N, C] scores are supported on CUDA";
  if (n.num_inputs() > (fwd ? 2 : 3) && n.input(fwd ? 2 : 3)) return "class weights are not supported on CUDA";
  if (!fwd && n.output(0)) {
    const DataType t = n.output(0)->dtype();
    if (t != DataType::kFloat32 && t != DataType::kBFloat16 && t != DataType::kFloat16)
      return absl::StrCat("a ", DataTypeName(t), " gradient is not supported on CUDA");
  }
  return Int64Input(n, fwd ? 1 : 2);
}

}  // namespace

void RegisterCudaLossKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  auto floats = InputTypeIn(0, kFloats);
  Add<SceKernel>(r, p, "", "SoftmaxCrossEntropyLoss", 12, 1 << 30, TwoDimScores);
  Add<SceGradKernel>(r, p, C, "SoftmaxCrossEntropyLossGrad", 1, 1, TwoDimScores);
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
