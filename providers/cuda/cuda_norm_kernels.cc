// The CUDA kernels over rows (providers/cuda/): Softmax and LogSoftmax and their gradients,
// LayerNormalization and RMSNormalization (plain, with the residual add, and their gradients),
// and the reductions. Each checks shapes on the host and enqueues kernels/cuda/norm.cu or
// reduce.cu on the provider's stream.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cuda/kernels.h"
#include "providers/axis.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

// Softmax and LogSoftmax along any axis: over rows along the last (one block per row), with
// the elements of a line apart otherwise; before version 13 over x flattened at the axis.
class SoftmaxKernel : public CudaKernel {
 public:
  SoftmaxKernel(const CudaExecutionProvider* p, const graph::Node& n, int version)
      : CudaKernel(p, n), log_(n.op_type() == "LogSoftmax"), flatten_(version < 13),
        axis_(n.AttrInt("axis", version < 13 ? 1 : -1)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    auto view = SoftmaxView(x, axis_, flatten_);
    if (!view.ok()) return Named(view.status());
    const AxisView& v = *view;
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return Check(kc::Softmax(DtOf(x.dtype), x.data, y->data, v.outer, v.len, log_, stream(), v.inner));
  }

 private:
  bool log_, flatten_;
  int64_t axis_;
};

// The kernels keep float32 statistics; ONNX's stash_type may ask for another type.
std::string Fp32Stash(const graph::Node& n, int) {
  const int64_t stash = n.AttrInt("stash_type", 1);
  return stash == 1 ? "" : absl::StrCat("stash_type ", stash, " (only float32 statistics on CUDA)");
}

// X as [rows, cols] for a normalisation over its dims from `axis` on; their count in *first.
absl::Status NormRows(const std::string& name, const TensorView& x, int64_t axis, int64_t* rows, int64_t* cols,
                      int* first) {
  auto a = ResolveAxis(axis, x.rank, /*scalar_as_one=*/true);
  if (!a.ok()) return InvalidArgument(name, ": ", a.status().message());
  *first = x.rank ? *a : 0;
  *cols = DimProduct(x, *first, x.rank);
  *rows = *cols ? x.numel() / *cols : 0;
  return absl::OkStatus();
}

// LayerNormalization(X, Scale[, B]) -> Y, Mean, InvStdDev, and RMSNormalization(X, Scale) -> Y,
// InvStdDev over the dims of X from `axis` on (the last by default), as rows of their product.
class LayerNormKernel : public CudaKernel {
 public:
  LayerNormKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), rms_(n.op_type() == "RMSNormalization"), epsilon_(n.AttrFloat("epsilon", 1e-5f)),
        axis_(n.AttrInt("axis", -1)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& gamma = *ctx.input(1);
    const TensorView* beta = rms_ ? nullptr : ctx.input(2);
    int64_t rows = 0, cols = 0;
    int first = 0;
    RETURN_IF_ERROR(NormRows(name_, x, axis_, &rows, &cols, &first));
    if (gamma.numel() != cols || (beta && beta->numel() != cols))
      return InvalidArgument(name_, ": scale and bias must have ", cols, " elements (the normalised dims of X ",
                             DimsToString(x.shape()), ")");
    TensorView* y = ctx.Output(0, x.dim_span());
    std::vector<int64_t> stat(x.dims, x.dims + x.rank);
    for (int k = first; k < x.rank; ++k) stat[k] = 1;
    TensorView* mean = rms_ ? nullptr : ctx.Output(1, stat);
    TensorView* inv = ctx.Output(rms_ ? 1 : 2, stat);
    if (!y) return absl::OkStatus();
    return Check(kc::LayerNorm(DtOf(x.dtype), x.data, gamma.data, beta ? beta->data : nullptr, y->data,
                               mean ? mean->as<float>() : nullptr, inv ? inv->as<float>() : nullptr, rows, cols,
                               epsilon_, stream(), rms_));
  }

 private:
  bool rms_;
  float epsilon_;
  int64_t axis_;
};

// SkipLayerNormalization(x, skip, scale[, bias]) -> y, mean, inv_std_dev, sum in one pass;
// SkipRMSNormalization(x, skip, scale) -> y, inv_std_dev, sum.
class SkipLayerNormKernel : public CudaKernel {
 public:
  SkipLayerNormKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), rms_(n.op_type() == "SkipRMSNormalization"), epsilon_(n.AttrFloat("epsilon", 1e-5f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& skip = *ctx.input(1);
    const TensorView& gamma = *ctx.input(2);
    const TensorView* beta = !rms_ && ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    if (x.shape() != skip.shape() || x.rank == 0)
      return InvalidArgument(name_, ": x ", DimsToString(x.shape()), " and skip ", DimsToString(skip.shape()),
                             " differ");
    const int64_t cols = x.dims[x.rank - 1];
    if (gamma.numel() != cols || (beta && beta->numel() != cols))
      return InvalidArgument(name_, ": scale and bias must have ", cols, " elements");
    std::vector<int64_t> stat(x.dims, x.dims + x.rank);
    stat.back() = 1;
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* mean = rms_ ? nullptr : ctx.Output(1, stat);
    TensorView* inv = ctx.Output(rms_ ? 1 : 2, stat);
    TensorView* sum = ctx.Output(rms_ ? 2 : 3, x.dim_span());
    if (!y) return absl::OkStatus();
    // y in x's type, or (`to`) the low type mixed precision's next product reads.
    // skip in x's type, or a low-precision product's bf16 / fp16 result with a float32 x.
    if (skip.dtype != x.dtype && x.dtype != DataType::kFloat32)
      return InvalidArgument(name_, ": skip of ", DataTypeName(skip.dtype), " with x of ", DataTypeName(x.dtype));
    return Check(kc::SkipLayerNorm(DtOf(x.dtype), DtOf(skip.dtype), DtOf(y->dtype), x.data, skip.data, gamma.data,
                                   beta ? beta->data : nullptr, y->data,
                                   mean ? mean->as<float>() : nullptr, inv ? inv->as<float>() : nullptr,
                                   sum ? sum->data : nullptr, cols ? x.numel() / cols : 0, cols, epsilon_, stream(),
                                   rms_));
  }

 private:
  bool rms_;
  float epsilon_;
};

// LayerNormalizationGrad(dY, X, scale, mean, inv_std_dev[, dX_add]) -> dX, dScale, dBias[, dX_low];
// RMSNormalizationGrad(dY, X, scale, inv_std_dev[, dX_add]) -> dX, dScale[, dX_low].
class LayerNormGradKernel : public CudaKernel {
 public:
  LayerNormGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), slots_(graph::NormGradSlotsOf(n)), axis_(n.AttrInt("axis", -1)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const int inv_in = slots_.inv_std, add_in = slots_.dx_add, low_out = slots_.dx_low;
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& gamma = *ctx.input(2);
    const TensorView& inv = *ctx.input(inv_in);
    const TensorView& mean = slots_.rms ? inv : *ctx.input(3);
    int64_t rows = 0, cols = 0;
    int first = 0;
    RETURN_IF_ERROR(NormRows(name_, x, axis_, &rows, &cols, &first));
    if (mean.numel() != rows || inv.numel() != rows || gamma.numel() != cols || dy.shape() != x.shape())
      return InvalidArgument(name_, ": expected dY like X ", DimsToString(x.shape()), ", ", cols,
                             " scale elements and ", rows, " statistics");
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dg = ctx.Output(1, gamma.dim_span());
    TensorView* db = slots_.rms ? nullptr : ctx.Output(2, gamma.dim_span());
    TensorView* low = ctx.num_outputs() > low_out ? ctx.Output(low_out, x.dim_span()) : nullptr;  // dX rounded
    if (low && x.dtype != DataType::kFloat32)
      return InvalidArgument(name_, ": dX_low rounds a float32 dX, got X of ", DataTypeName(x.dtype));
    // The parameter gradients' partial sums over chunks of the rows.
    const int64_t parts = dg || db ? kc::LayerNormGradScratch(rows, cols) : 0;
    float* scratch = parts ? ctx.ScratchOf<float>(parts) : nullptr;
    if (parts && !scratch) return NoScratch();
    // dX_add: the residual stream's gradient.
    const TensorView* add = ctx.num_inputs() > add_in ? ctx.input(add_in) : nullptr;
    if (add && add->shape() != x.shape())
      return InvalidArgument(name_, ": expected dX_add of X's shape ", DimsToString(x.shape()), ", got ",
                             DimsToString(add->shape()));
    return Check(kc::LayerNormGrad(DtOf(x.dtype), dy.data, x.data, gamma.data, slots_.rms ? nullptr : mean.as<float>(),
                                   inv.as<float>(), add ? add->data : nullptr, dx ? dx->data : nullptr,
                                   dg ? dg->as<float>() : nullptr,
                                   db ? db->as<float>() : nullptr, scratch, rows, cols, low ? low->data : nullptr,
                                   low ? DtOf(low->dtype) : kc::Dt::kBf16, DtOf(dy.dtype), stream()));
  }

 private:
  graph::NormGradSlots slots_;
  int64_t axis_;
};

// SoftmaxGrad / LogSoftmaxGrad (dY, Y) {axis}.
class SoftmaxGradKernel : public CudaKernel {
 public:
  SoftmaxGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), log_(n.op_type() == "LogSoftmaxGrad"), axis_(n.AttrInt("axis", -1)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& y = *ctx.input(1);
    if (dy.shape() != y.shape())
      return InvalidArgument(name_, ": dY ", DimsToString(dy.shape()), " and Y ", DimsToString(y.shape()), " differ");
    auto view = SoftmaxView(y, axis_, /*flatten=*/false);
    if (!view.ok()) return Named(view.status());
    const AxisView& v = *view;
    TensorView* dx = ctx.Output(0, y.dim_span());
    if (!dx) return absl::OkStatus();
    return Check(kc::SoftmaxGrad(DtOf(y.dtype), dy.data, y.data, dx->data, v.outer, v.len, log_, stream(), v.inner));
  }

 private:
  bool log_;
  int64_t axis_;
};

// ReduceSum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum and LogSumExp: axes from the attribute
// or (newer opsets) a host input.
class ReduceKernel : public CudaKernel {
 public:
  ReduceKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), keepdims_(n.AttrInt("keepdims", 1) != 0),
        noop_with_empty_axes_(n.AttrInt("noop_with_empty_axes", 0) != 0), axes_attr_(n.AttrInts("axes")) {
    const std::string& o = n.op_type();
    op_ = o == "ReduceSum" ? kc::ReduceOp::kSum : o == "ReduceMean" ? kc::ReduceOp::kMean
        : o == "ReduceMax" ? kc::ReduceOp::kMax : o == "ReduceMin" ? kc::ReduceOp::kMin
        : o == "ReduceL1" ? kc::ReduceOp::kL1 : o == "ReduceL2" ? kc::ReduceOp::kL2
        : o == "ReduceSumSquare" ? kc::ReduceOp::kSumSquare : o == "ReduceLogSum" ? kc::ReduceOp::kLogSum
        : o == "ReduceProd" ? kc::ReduceOp::kProd : kc::ReduceOp::kLogSumExp;
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    std::vector<int64_t> axes = axes_attr_;
    const TensorView* a = ctx.num_inputs() > 1 ? ctx.input(1) : nullptr;
    if (a) axes.assign(a->as<int64_t>(), a->as<int64_t>() + a->numel());
    if (x.rank > kc::kMaxRank) return Unimplemented(name_, ": rank ", x.rank, " over ", kc::kMaxRank);
    bool reduce[kc::kMaxRank] = {};
    if (axes.empty() && !noop_with_empty_axes_) {
      for (int d = 0; d < x.rank; ++d) reduce[d] = true;
    }
    for (int64_t ax : axes) {
      const int64_t d = ax < 0 ? ax + x.rank : ax;
      if (d < 0 || d >= x.rank) return InvalidArgument(name_, ": axis ", ax, " is out of range for rank ", x.rank);
      reduce[d] = true;
    }
    std::vector<int64_t> out;
    for (int d = 0; d < x.rank; ++d)
      if (!reduce[d]) out.push_back(x.dims[d]);
      else if (keepdims_) out.push_back(1);
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    // No axes with noop_with_empty_axes: the input as it is (SumSquare still squares it), as
    // ONNX's reference and the CPU's kernels have it.
    if (axes.empty() && noop_with_empty_axes_ && op_ != kc::ReduceOp::kSumSquare)
      return Copy(y->data, x.data, x.nbytes());
    // Partial results of a bias gradient's chunks of rows.
    const int64_t parts = kc::ReduceScratch(x.rank, x.dims, reduce);
    double* scratch = parts ? ctx.ScratchOf<double>(parts) : nullptr;
    if (parts && !scratch) return NoScratch();
    return Check(kc::Reduce(op_, DtOf(x.dtype), x.data, y->data, x.rank, x.dims, reduce, scratch, stream()));
  }

 private:
  kc::ReduceOp op_;
  bool keepdims_, noop_with_empty_axes_;
  std::vector<int64_t> axes_attr_;
};

}  // namespace

void RegisterCudaNormKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  auto floats = InputTypeIn(0, kFloats);
  for (const char* op : {"Softmax", "LogSoftmax"}) Add<SoftmaxKernel>(r, p, "", op, 1, 1 << 30, floats);
  Add<LayerNormKernel>(r, p, "", "LayerNormalization", 17, 1 << 30, AllOf({floats, Fp32Stash}));
  Add<LayerNormKernel>(r, p, C, "LayerNormalization", 1, 1, AllOf({floats, Fp32Stash}));
  Add<LayerNormKernel>(r, p, C, "RMSNormalization", 1, 1, AllOf({floats, Fp32Stash}));
  // dY float32, or bf16 / fp16 (a low-precision product's result) with the float32 X.
  for (const char* op : {"LayerNormalizationGrad", "RMSNormalizationGrad"})
    Add<LayerNormGradKernel>(r, p, C, op, 1, 1, InputTypeIn(1, {DataType::kFloat32}));
  Add<SkipLayerNormKernel>(r, p, C, "SkipLayerNormalization", 1, 1, floats);
  Add<SkipLayerNormKernel>(r, p, C, "SkipRMSNormalization", 1, 1, floats);
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad"}) Add<SoftmaxGradKernel>(r, p, C, op, 1, 1, floats);
  Add<ReduceKernel>(r, p, "", "ReduceSum", 1, 12, floats);
  Add<ReduceKernel>(r, p, "", "ReduceSum", 13, 1 << 30, floats, {1});
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"}) {
    Add<ReduceKernel>(r, p, "", op, 1, 17, floats);
    Add<ReduceKernel>(r, p, "", op, 18, 1 << 30, floats, {1});
  }
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"}) {
    Add<ReduceKernel>(r, p, "", op, 1, 17, floats);
    Add<ReduceKernel>(r, p, "", op, 18, 1 << 30, floats, {1});
  }
}

}  // namespace cleave::providers
