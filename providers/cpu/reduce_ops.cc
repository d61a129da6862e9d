// CPU kernels for reductions and the softmax cross-entropy loss (providers/cpu/).
// ReduceSum takes its axes as an input from version 13, ReduceMean/Max/Min from version 18;
// earlier versions read the axes attribute. Axes are checked against the runtime rank.
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/shape.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"
#include "providers/cpu/shape_ops.h"
#include "providers/loss_shapes.h"

namespace cleave::providers {

namespace {

using kernels::cpu::LossReduction;
using kernels::cpu::ReduceKind;

int AxesInputVersion(const std::string& op) { return op == "ReduceSum" ? 13 : 18; }

// The reductions ONNX defines around a sum (float types): L1 = sum |x|, L2 = sqrt(sum x^2),
// SumSquare = sum x^2, LogSum = log(sum x), LogSumExp = log(sum exp(x)), the last formed
// around each output's maximum so that it neither overflows nor loses the small terms.
enum class Around { kNone, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

class ReduceKernel : public OpKernel {
 public:
  ReduceKernel(const graph::Node& n, int version, ReduceKind kind, Around around = Around::kNone)
      : kind_(kind),
        around_(around),
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
    if (axes.empty() && noop_ && axes_input_) {  // the identity (SumSquare: still squared)
      TensorView* y = ctx.Output(0, x.dim_span());
      if (!y) return absl::OkStatus();
      if (around_ == Around::kSumSquare) {
        auto square = [&]<typename T>(const T* xp, T* yp) {
          for (int64_t i = 0; i < x.numel(); ++i) yp[i] = xp[i] * xp[i];
        };
        if (x.dtype == DataType::kFloat64) square(x.as<double>(), y->as<double>());
        else square(x.as<float>(), y->as<float>());
      } else if (x.nbytes()) {
        std::memcpy(y->data, x.data, x.nbytes());
      }
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
    if (around_ != Around::kNone) {
      DimVector kept(x.dim_span());  // the output's dims with the reduced axes kept as 1
      for (int i = 0; i < naxes; ++i) kept[norm[i]] = 1;
      if (x.dtype == DataType::kFloat64) return RunAround<double>(plan, kept, x, *y, ctx);
      return RunAround<float>(plan, kept, x, *y, ctx);
    }
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

  template <typename T>
  absl::Status RunAround(const kernels::cpu::ReducePlan& plan, const DimVector& kept, const TensorView& x,
                         TensorView& y, KernelContext& ctx) const {
    using kernels::cpu::Reduce;
    ThreadPool* pool = ctx.thread_pool();
    const int64_t n = x.numel(), m = y.numel();
    const T* xp = x.as<T>();
    T* yp = y.as<T>();
    auto each_output = [&](auto f) {
      for (int64_t j = 0; j < m; ++j) yp[j] = f(yp[j]);
    };
    if (around_ == Around::kLogSum) {
      Reduce<T>(ReduceKind::kSum, plan, xp, yp, pool);
      each_output([](T s) { return std::log(s); });
      return absl::OkStatus();
    }
    T* t = ctx.ScratchOf<T>(std::max<int64_t>(n, 1));
    if (!t) return NoScratch();
    auto map = [&](auto f) {
      ParallelFor(pool, n, 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) t[i] = f(xp[i], t[i]);
      });
    };
    switch (around_) {
      case Around::kL1:
        map([](T v, T) { return std::fabs(v); });
        Reduce<T>(ReduceKind::kSum, plan, t, yp, pool);
        return absl::OkStatus();
      case Around::kL2:
      case Around::kSumSquare:
        map([](T v, T) { return v * v; });
        Reduce<T>(ReduceKind::kSum, plan, t, yp, pool);
        if (around_ == Around::kL2) each_output([](T s) { return std::sqrt(s); });
        return absl::OkStatus();
      case Around::kLogSumExp: {
        // y = max, spread over x's dims into t; t = exp(x - max); y = log(sum t) + max (a max
        // that is not finite, from an empty or infinite row, shifts by 0).
        T* sums = ctx.ScratchOf<T>(std::max<int64_t>(m, 1));
        if (!sums) return NoScratch();
        Reduce<T>(ReduceKind::kMax, plan, xp, yp, pool);
        TensorView spread(t, x.dtype, x.dim_span());
        kernels::cpu::Expand(TensorView(yp, x.dtype, kept.span()), spread, pool);
        map([](T v, T mx) { return std::exp(v - (std::isfinite(mx) ? mx : T(0))); });
        Reduce<T>(ReduceKind::kSum, plan, t, sums, pool);
        for (int64_t j = 0; j < m; ++j) yp[j] = std::log(sums[j]) + (std::isfinite(yp[j]) ? yp[j] : T(0));
        return absl::OkStatus();
      }
      default:
        return Internal("no such reduction");
    }
  }

  ReduceKind kind_;
  Around around_;
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
    k->nll_ = n.op_type() == "NegativeLogLikelihoodLoss";
    return std::unique_ptr<OpKernel>(std::move(k));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& scores = *ctx.input(0);
    const TensorView& labels = *ctx.input(1);
    const TensorView* weights = ctx.input(2);
    RETURN_IF_ERROR(CheckClassShapes(nll_ ? "input" : "scores", scores, labels, weights));
    kernels::cpu::SceParams p;
    p.N = scores.dims[0];
    p.C = scores.dims[1];
    p.D = 1;
    for (int k = 2; k < scores.rank; ++k) p.D *= scores.dims[k];
    p.reduction = reduction_;
    p.ignore_index = ignore_index_;
    p.nll = nll_;
    const bool none = reduction_ == LossReduction::kNone;
    TensorView* loss = none ? ctx.Output(0, labels.dim_span()) : ctx.Output(0, {});
    TensorView* log_prob = nll_ ? nullptr : ctx.Output(1, scores.dim_span());
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
  bool nll_ = false;  // NegativeLogLikelihoodLoss: the scores are log-probabilities
};

}  // namespace

void RegisterReduceKernels(KernelRegistry& r) {
  struct Row {
    const char* op;
    int max_version;
    ReduceKind kind;
  };
  for (const Row& row : {Row{"ReduceSum", 13, ReduceKind::kSum}, Row{"ReduceMean", 18, ReduceKind::kMean},
                         Row{"ReduceMax", 20, ReduceKind::kMax}, Row{"ReduceMin", 20, ReduceKind::kMin},
                         Row{"ReduceProd", 18, ReduceKind::kProd}}) {
    const ReduceKind kind = row.kind;
    r.Register({"", row.op, 1, row.max_version, ReduceTypes(kind),
                [kind](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
                  return std::unique_ptr<OpKernel>(new ReduceKernel(n, v, kind));
                }});
  }
  struct AroundRow {
    const char* op;
    Around around;
  };
  for (const AroundRow& row : {AroundRow{"ReduceL1", Around::kL1}, AroundRow{"ReduceL2", Around::kL2},
                               AroundRow{"ReduceSumSquare", Around::kSumSquare},
                               AroundRow{"ReduceLogSum", Around::kLogSum},
                               AroundRow{"ReduceLogSumExp", Around::kLogSumExp}}) {
    const Around around = row.around;
    r.Register({"", row.op, 1, 18, InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                [around](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
                  return std::unique_ptr<OpKernel>(new ReduceKernel(n, v, ReduceKind::kSum, around));
                }});
  }
  r.Register({"", "SoftmaxCrossEntropyLoss", 12, 13,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                     InputTypeIn(1, {DataType::kInt32, DataType::kInt64})}),
              MakeCheckedFactory<SceKernel>()});
  r.Register({"", "NegativeLogLikelihoodLoss", 12, 1 << 30,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                     InputTypeIn(1, {DataType::kInt32, DataType::kInt64})}),
              MakeCheckedFactory<SceKernel>()});
}

}  // namespace cleave::providers
