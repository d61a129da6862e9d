// CPU kernels for reductions and the softmax cross-entropy loss (providers/cpu/).
// ReduceSum takes its axes as an input from version 13, ReduceMean/Max/Min from version 18;
// earlier versions read the axes attribute. Axes are checked against the runtime rank.
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/nn.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

using kernels::cpu::LossReduction;
using kernels::cpu::ReduceKind;

int AxesInputVersion(const std::string& op) { return op == "ReduceSum" ? 13 : 18; }

class ReduceKernel : public OpKernel {
 public:
  ReduceKernel(const graph::Node& n, int version, ReduceKind kind)
      : kind_(kind),
        axes_input_(version >= AxesInputVersion(n.op_type())),
        keepdims_(n.AttrInt("keepdims", 1) != 0),
        noop_(n.AttrInt("noop_with_empty_axes", 0) != 0),
        attr_axes_(n.AttrInts("axes")) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* axes_in = axes_input_ ? ctx.input(1) : nullptr;
    DimVector buf;
    if (axes_in) RETURN_IF_ERROR(ReadDimValues(*axes_in, "axes", &buf));
    const std::span<const int64_t> axes =
        axes_in ? buf.span() : std::span<const int64_t>(attr_axes_);
    if (axes.empty() && noop_ && axes_input_) {  // the identity
      TensorView* y = ctx.Output(0, x.dim_span());
      if (y && x.nbytes()) std::memcpy(y->data, x.data, x.nbytes());
      return absl::OkStatus();
    }
    bool reduced[kMaxRank] = {};
    int norm[kMaxRank];
    int naxes = 0;
    for (int64_t a : axes) {
      const int r = x.rank > 0 ? x.rank : 1;
      if (a < -r || a >= r)
        return InvalidArgument("axis ", a, " is out of range for an input of rank ", x.rank);
      const int k = static_cast<int>(a < 0 ? a + r : a);
      if (reduced[k])
        return InvalidArgument("axis ", a, " appears more than once in axes [",
                               absl::StrJoin(axes, ", "), "]");
      reduced[k] = true;
    }
    DimVector out_dims;
    for (int k = 0; k < x.rank; ++k) {
      if (axes.empty()) reduced[k] = true;
      if (reduced[k]) norm[naxes++] = k;
      if (!reduced[k]) out_dims.push_back(x.dims[k]);
      else if (keepdims_) out_dims.push_back(1);
    }
    const kernels::cpu::ReducePlan plan =
        kernels::cpu::PlanReduce(x.dim_span(), std::span<const int>(norm, naxes));
    TensorView* y = ctx.Output(0, out_dims);
    if (!y) return absl::OkStatus();
    ThreadPool* pool = ctx.thread_pool();
    switch (x.dtype) {
      case DataType::kFloat32: Run<float>(plan, x, *y, pool); break;
      case DataType::kFloat64: Run<double>(plan, x, *y, pool); break;
      case DataType::kInt32: Run<int32_t>(plan, x, *y, pool); break;
      case DataType::kInt64: Run<int64_t>(plan, x, *y, pool); break;
      case DataType::kBool: Run<bool>(plan, x, *y, pool); break;
      default: return Internal("reduce kernel reached with dtype ", DataTypeName(x.dtype));
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  void Run(const kernels::cpu::ReducePlan& plan, const TensorView& x, TensorView& y,
           ThreadPool* pool) const {
    kernels::cpu::Reduce<T>(kind_, plan, x.as<T>(), y.as<T>(), pool);
  }

  ReduceKind kind_;
  bool axes_input_, keepdims_, noop_;
  std::vector<int64_t> attr_axes_;
};

// float32/float64/int32/int64 for every reduction; bool for Max and Min from version 20,
// where ONNX added it.
SupportsFn ReduceTypes(ReduceKind kind) {
  return [kind](const graph::Node& n, int version) {
    std::vector<DataType> types = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                                   DataType::kInt64};
    if ((kind == ReduceKind::kMax || kind == ReduceKind::kMin) && version >= 20)
      types.push_back(DataType::kBool);
    return InputTypeIn(0, types)(n, version);
  };
}

}  // namespace

absl::StatusOr<LossAttrs> ParseLossAttrs(const graph::Node& n) {
  LossAttrs a;
  const std::string red = n.AttrString("reduction", "mean");
  if (red == "none") a.reduction = LossReduction::kNone;
  else if (red == "sum") a.reduction = LossReduction::kSum;
  else if (red == "mean") a.reduction = LossReduction::kMean;
  else return InvalidArgument(n.Describe(), ": expected reduction 'none', 'sum' or 'mean', got '", red, "'");
  if (n.HasAttr("ignore_index")) a.ignore_index = n.AttrInt("ignore_index", 0);
  return a;
}

namespace {

class SceKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(LossAttrs attrs, ParseLossAttrs(n));
    auto k = std::unique_ptr<SceKernel>(new SceKernel());
    k->reduction_ = attrs.reduction;
    k->ignore_index_ = attrs.ignore_index;
    return std::unique_ptr<OpKernel>(std::move(k));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& scores = *ctx.input(0);
    const TensorView& labels = *ctx.input(1);
    const TensorView* weights = ctx.input(2);
    RETURN_IF_ERROR(CheckShapes(scores, labels, weights));
    kernels::cpu::SceParams p;
    p.N = scores.dims[0];
    p.C = scores.dims[1];
    p.D = 1;
    for (int k = 2; k < scores.rank; ++k) p.D *= scores.dims[k];
    p.reduction = reduction_;
    p.ignore_index = ignore_index_;
    const bool none = reduction_ == LossReduction::kNone;
    TensorView* loss = none ? ctx.Output(0, labels.dim_span()) : ctx.Output(0, {});
    TensorView* log_prob = ctx.Output(1, scores.dim_span());
    const int64_t positions = p.N * p.D;
    double* scratch = none ? nullptr : static_cast<double*>(ctx.Scratch(2 * positions * sizeof(double) + 8));
    // An unread loss output still has to go somewhere while log_prob is computed.
    void* loss_data = loss ? loss->data : ctx.Scratch((none ? positions : 1) * sizeof(double) + 8);
    if ((!none && !scratch) || !loss_data) return NoScratch();
    const bool f64 = scores.dtype == DataType::kFloat64, l64 = labels.dtype == DataType::kInt64;
    if (f64 && l64) return Run<double, int64_t>(p, scores, labels, weights, loss_data, log_prob, scratch, ctx);
    if (f64) return Run<double, int32_t>(p, scores, labels, weights, loss_data, log_prob, scratch, ctx);
    if (l64) return Run<float, int64_t>(p, scores, labels, weights, loss_data, log_prob, scratch, ctx);
    return Run<float, int32_t>(p, scores, labels, weights, loss_data, log_prob, scratch, ctx);
  }

 private:
  SceKernel() = default;

  static absl::Status CheckShapes(const TensorView& scores, const TensorView& labels,
                                  const TensorView* weights) {
    bool ok = scores.rank >= 2 && labels.rank == scores.rank - 1;
    for (int k = 0; ok && k < labels.rank; ++k) ok = labels.dims[k] == scores.dims[k == 0 ? 0 : k + 1];
    if (!ok)
      return InvalidArgument("expected scores [N, C, d1, ...] and labels [N, d1, ...], got scores ",
                             DimsToString(scores.shape()), " and labels ", DimsToString(labels.shape()));
    if (weights && (weights->rank != 1 || weights->dims[0] != scores.dims[1]))
      return InvalidArgument("expected weights of shape [C] = [", scores.dims[1], "], got ",
                             DimsToString(weights->shape()));
    return absl::OkStatus();
  }

  template <typename T, typename L>
  static absl::Status Run(const kernels::cpu::SceParams& p, const TensorView& scores,
                          const TensorView& labels, const TensorView* weights, void* loss,
                          TensorView* log_prob, double* scratch, KernelContext& ctx) {
    return kernels::cpu::SoftmaxCrossEntropy<T, L>(
        p, scores.as<T>(), labels.as<L>(), weights ? weights->as<T>() : nullptr,
        static_cast<T*>(loss), log_prob ? log_prob->as<T>() : nullptr, scratch, ctx.thread_pool());
  }

  LossReduction reduction_ = LossReduction::kMean;
  std::optional<int64_t> ignore_index_;
};

}  // namespace

void RegisterReduceKernels(KernelRegistry& r) {
  struct Row {
    const char* op;
    int max_version;
    ReduceKind kind;
  };
  for (const Row& row : {Row{"ReduceSum", 13, ReduceKind::kSum}, Row{"ReduceMean", 18, ReduceKind::kMean},
                         Row{"ReduceMax", 20, ReduceKind::kMax}, Row{"ReduceMin", 20, ReduceKind::kMin}}) {
    const ReduceKind kind = row.kind;
    r.Register({"", row.op, 1, row.max_version, ReduceTypes(kind),
                [kind](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
                  return std::unique_ptr<OpKernel>(new ReduceKernel(n, v, kind));
                }});
  }
  r.Register({"", "SoftmaxCrossEntropyLoss", 12, 13,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                     InputTypeIn(1, {DataType::kInt32, DataType::kInt64})}),
              MakeCheckedFactory<SceKernel>()});
}

}  // namespace cleave::providers
