// CPU kernels for Conv, ConvTranspose and their gradients, ai.cleave.ConvGrad and
// ConvTransposeGrad (providers/cpu/), over kernels/cpu/conv.h: float32 through the GEMM, float64
// through the reference product. ConvTranspose runs as the input gradient of the Conv that
// PlanConvTranspose describes, and its gradients as that Conv's forward and weight gradient.
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/conv.h"
#include "providers/conv_attrs.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

namespace kc = kernels::cpu;

// Conv(X, W[, B]) -> Y.
class ConvKernel : public OpKernel {
 public:
  ConvKernel(const graph::Node& n, int) : attrs_(ConvAttrsOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& w = *ctx.input(1);
    const TensorView* b = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (w.dtype != x.dtype || (b && b->dtype != x.dtype))
      return InvalidArgument("expected W and B of X's dtype ", DataTypeName(x.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, kc::PlanConv(x.dim_span(), w.dim_span(), attrs_));
    if (b && b->numel() != p.M) return InvalidArgument("expected B of ", p.M, " elements (W's dim 0), got ", b->numel());
    DimVector out = {p.N, p.M};
    for (int d = 0; d < p.spatial; ++d) out.push_back(p.out[d]);
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64) return Run<double>(p, x, w, b, *y, ctx);
    return Run<float>(p, x, w, b, *y, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& x, const TensorView& w, const TensorView* b,
                   TensorView& y, KernelContext& ctx) const {
    if (p.ColumnElements() < 0) return InvalidArgument("the patches of one image overflow int64 elements");
    T* col = ctx.ScratchOf<T>(std::max<int64_t>(p.ColumnElements(), 1));
    if (!col) return NoScratch();
    kc::ConvForward<T>(p, x.as<T>(), w.as<T>(), b ? b->as<T>() : nullptr, y.as<T>(), col, ctx.thread_pool());
    return absl::OkStatus();
  }
  kc::ConvAttrs attrs_;
};

// ai.cleave.ConvGrad(dY, X, W) -> dX, dW, dB (each may go unread) with the forward's attributes.
class ConvGradKernel : public OpKernel {
 public:
  ConvGradKernel(const graph::Node& n, int) : attrs_(ConvAttrsOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& w = *ctx.input(2);
    if (dy.dtype != x.dtype || w.dtype != x.dtype)
      return InvalidArgument("expected dY, X and W of one dtype, got ", DataTypeName(dy.dtype), ", ",
                             DataTypeName(x.dtype), " and ", DataTypeName(w.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, kc::PlanConv(x.dim_span(), w.dim_span(), attrs_));
    DimVector want = {p.N, p.M};
    for (int d = 0; d < p.spatial; ++d) want.push_back(p.out[d]);
    if (DimVector(dy.dim_span()) != want)
      return InvalidArgument("expected dY ", DimsToString(want.span()), ", got ", DimsToString(dy.dim_span()));
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dw = ctx.num_outputs() > 1 ? ctx.Output(1, w.dim_span()) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {p.M}) : nullptr;
    if (x.dtype == DataType::kFloat64) return Run<double>(p, dy, x, w, dx, dw, db, ctx);
    return Run<float>(p, dy, x, w, dx, dw, db, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& dy, const TensorView& x, const TensorView& w,
                   TensorView* dx, TensorView* dw, TensorView* db, KernelContext& ctx) const {
    if (p.ColumnElements() < 0) return InvalidArgument("the patches of one image overflow int64 elements");
    T* col = ctx.ScratchOf<T>(std::max<int64_t>(p.ColumnElements(), 1));
    if (!col) return NoScratch();
    kc::ConvBackward<T>(p, dy.as<T>(), x.as<T>(), w.as<T>(), dx ? dx->as<T>() : nullptr, dw ? dw->as<T>() : nullptr,
                        db ? db->as<T>() : nullptr, col, ctx.thread_pool());
    return absl::OkStatus();
  }
  kc::ConvAttrs attrs_;
};

DimVector OutputDims(const kc::ConvParams& p, int64_t channels, const int64_t* spatial) {
  DimVector d = {p.N, channels};
  for (int i = 0; i < p.spatial; ++i) d.push_back(spatial[i]);
  return d;
}

// ConvTranspose(X, W[, B]) -> Y.
class ConvTransposeKernel : public OpKernel {
 public:
  ConvTransposeKernel(const graph::Node& n, int) : attrs_(ConvTransposeAttrsOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& w = *ctx.input(1);
    const TensorView* b = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (w.dtype != x.dtype || (b && b->dtype != x.dtype))
      return InvalidArgument("expected W and B of X's dtype ", DataTypeName(x.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, kc::PlanConvTranspose(x.dim_span(), w.dim_span(), attrs_));
    if (b && b->numel() != p.C)
      return InvalidArgument("expected B of ", p.C, " elements (W's dim 1 times group), got ", b->numel());
    TensorView* y = ctx.Output(0, OutputDims(p, p.C, p.in));
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64) return Run<double>(p, x, w, b, *y, ctx);
    return Run<float>(p, x, w, b, *y, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& x, const TensorView& w, const TensorView* b,
                   TensorView& y, KernelContext& ctx) const {
    if (p.ColumnElements() < 0) return InvalidArgument("the patches of one image overflow int64 elements");
    T* col = ctx.ScratchOf<T>(std::max<int64_t>(p.ColumnElements(), 1));
    if (!col) return NoScratch();
    kc::ConvBackward<T>(p, x.as<T>(), nullptr, w.as<T>(), y.as<T>(), nullptr, nullptr, col, ctx.thread_pool());
    if (b) {
      const T* bias = b->as<T>();
      T* out = y.as<T>();
      const int64_t I = p.InSize();
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t c = 0; c < p.C; ++c)
          for (T *e = out + (n * p.C + c) * I, *end = e + I; e < end; ++e) *e += bias[c];
    }
    return absl::OkStatus();
  }
  kc::ConvTransposeAttrs attrs_;
};

// ai.cleave.ConvTransposeGrad(dY, X, W) -> dX, dW, dB (each may go unread), the forward's
// attributes: dX is the Conv of dY with W, dW that Conv's weight gradient from X, dB the sums of
// dY over the images and positions.
class ConvTransposeGradKernel : public OpKernel {
 public:
  ConvTransposeGradKernel(const graph::Node& n, int) : attrs_(ConvTransposeAttrsOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& w = *ctx.input(2);
    if (dy.dtype != x.dtype || w.dtype != x.dtype)
      return InvalidArgument("expected dY, X and W of one dtype, got ", DataTypeName(dy.dtype), ", ",
                             DataTypeName(x.dtype), " and ", DataTypeName(w.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, kc::PlanConvTranspose(x.dim_span(), w.dim_span(), attrs_));
    const DimVector want = OutputDims(p, p.C, p.in);
    if (DimVector(dy.dim_span()) != want)
      return InvalidArgument("expected dY ", DimsToString(want.span()), ", got ", DimsToString(dy.dim_span()));
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dw = ctx.num_outputs() > 1 ? ctx.Output(1, w.dim_span()) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {p.C}) : nullptr;
    if (x.dtype == DataType::kFloat64) return Run<double>(p, dy, x, w, dx, dw, db, ctx);
    return Run<float>(p, dy, x, w, dx, dw, db, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& dy, const TensorView& x, const TensorView& w,
                   TensorView* dx, TensorView* dw, TensorView* db, KernelContext& ctx) const {
    if (p.ColumnElements() < 0) return InvalidArgument("the patches of one image overflow int64 elements");
    T* col = ctx.ScratchOf<T>(std::max<int64_t>(p.ColumnElements(), 1));
    if (!col) return NoScratch();
    if (dx && dx->numel() > 0)
      kc::ConvForward<T>(p, dy.as<T>(), w.as<T>(), nullptr, dx->as<T>(), col, ctx.thread_pool());
    if (dw && dw->numel() > 0)
      kc::ConvBackward<T>(p, x.as<T>(), dy.as<T>(), w.as<T>(), nullptr, dw->as<T>(), nullptr, col,
                          ctx.thread_pool());
    if (db) {
      const int64_t I = p.InSize();
      const T* g = dy.as<T>();
      for (int64_t c = 0; c < p.C; ++c) {
        double sum = 0;
        for (int64_t n = 0; n < p.N; ++n)
          for (const T *e = g + (n * p.C + c) * I, *end = e + I; e < end; ++e) sum += static_cast<double>(*e);
        db->as<T>()[c] = static_cast<T>(sum);
      }
    }
    return absl::OkStatus();
  }
  kc::ConvTransposeAttrs attrs_;
};

}  // namespace

void RegisterConvKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  r.Register({"", "Conv", 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<ConvKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "ConvGrad", 1, 1, InputTypeIn(0, floats),
              MakeFactory<ConvGradKernel>()});
  r.Register({"", "ConvTranspose", 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<ConvTransposeKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "ConvTransposeGrad", 1, 1, InputTypeIn(0, floats),
              MakeFactory<ConvTransposeGradKernel>()});
}

}  // namespace cleave::providers
