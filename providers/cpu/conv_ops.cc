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

bool Transposed(const graph::Node& n) {
  return n.op_type() == "ConvTranspose" || n.op_type() == "ConvTransposeGrad";
}

// The two ops' common part: the attributes (output_padding and output_shape empty for Conv),
// the plan, Y's dims and the scratch of the columns.
class ConvBase : public OpKernel {
 protected:
  explicit ConvBase(const graph::Node& n) : transposed_(Transposed(n)), attrs_(ConvTransposeAttrsOf(n)) {}

  absl::StatusOr<kc::ConvParams> Plan(const TensorView& x, const TensorView& w) const {
    return transposed_ ? kc::PlanConvTranspose(x.dim_span(), w.dim_span(), attrs_)
                       : kc::PlanConv(x.dim_span(), w.dim_span(), attrs_);
  }
  // Y [N, M, out...] of Conv, or [N, M, in...] of the ConvTranspose (the planned Conv's C, in).
  DimVector YDims(const kc::ConvParams& p) const {
    DimVector d = {p.N, transposed_ ? p.C : p.M};
    for (int i = 0; i < p.spatial; ++i) d.push_back(transposed_ ? p.in[i] : p.out[i]);
    return d;
  }
  template <typename T>
  absl::StatusOr<T*> Columns(const kc::ConvParams& p, KernelContext& ctx) const {
    if (p.ColumnElements() < 0) return InvalidArgument("the patches of one image overflow int64 elements");
    T* col = ctx.ScratchOf<T>(std::max<int64_t>(p.ColumnElements(), 1));
    if (!col) return NoScratch();
    return col;
  }

  bool transposed_;
  kc::ConvTransposeAttrs attrs_;
};

// Conv(X, W[, B]) -> Y, and ConvTranspose(X, W[, B]) -> Y.
class ConvKernel : public ConvBase {
 public:
  ConvKernel(const graph::Node& n, int) : ConvBase(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& w = *ctx.input(1);
    const TensorView* b = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (w.dtype != x.dtype || (b && b->dtype != x.dtype))
      return InvalidArgument("expected W and B of X's dtype ", DataTypeName(x.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, Plan(x, w));
    const DimVector dims = YDims(p);
    if (b && b->numel() != dims[1])
      return InvalidArgument("expected B of ", dims[1], " elements (", transposed_ ? "W's dim 1 times group" : "W's dim 0",
                             "), got ", b->numel());
    TensorView* y = ctx.Output(0, dims.span());
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64) return Run<double>(p, x, w, b, *y, ctx);
    return Run<float>(p, x, w, b, *y, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& x, const TensorView& w, const TensorView* b,
                   TensorView& y, KernelContext& ctx) const {
    ASSIGN_OR_RETURN(T* col, Columns<T>(p, ctx));
    const T* bias = b ? b->as<T>() : nullptr;
    if (!transposed_) {
      kc::ConvForward<T>(p, x.as<T>(), w.as<T>(), bias, y.as<T>(), col, ctx.thread_pool());
      return absl::OkStatus();
    }
    kc::ConvBackward<T>(p, x.as<T>(), nullptr, w.as<T>(), y.as<T>(), nullptr, nullptr, col, ctx.thread_pool());
    if (bias) {
      T* out = y.as<T>();
      const int64_t I = p.InSize();
      for (int64_t n = 0; n < p.N; ++n)
        for (int64_t c = 0; c < p.C; ++c)
          for (T *e = out + (n * p.C + c) * I, *end = e + I; e < end; ++e) *e += bias[c];
    }
    return absl::OkStatus();
  }
};

// ai.cleave.ConvGrad(dY, X, W) and ConvTransposeGrad(dY, X, W) -> dX, dW, dB (each may go
// unread), with the forward's attributes. The transposed op's dX is the planned Conv's forward of
// dY, its dW that Conv's weight gradient from X, its dB the sums of dY over images and positions.
class ConvGradKernel : public ConvBase {
 public:
  ConvGradKernel(const graph::Node& n, int) : ConvBase(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& w = *ctx.input(2);
    if (dy.dtype != x.dtype || w.dtype != x.dtype)
      return InvalidArgument("expected dY, X and W of one dtype, got ", DataTypeName(dy.dtype), ", ",
                             DataTypeName(x.dtype), " and ", DataTypeName(w.dtype));
    ASSIGN_OR_RETURN(kc::ConvParams p, Plan(x, w));
    const DimVector want = YDims(p);
    if (DimVector(dy.dim_span()) != want)
      return InvalidArgument("expected dY ", DimsToString(want.span()), ", got ", DimsToString(dy.dim_span()));
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dw = ctx.num_outputs() > 1 ? ctx.Output(1, w.dim_span()) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {want[1]}) : nullptr;
    if (x.dtype == DataType::kFloat64) return Run<double>(p, dy, x, w, dx, dw, db, ctx);
    return Run<float>(p, dy, x, w, dx, dw, db, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const kc::ConvParams& p, const TensorView& dy, const TensorView& x, const TensorView& w,
                   TensorView* dx, TensorView* dw, TensorView* db, KernelContext& ctx) const {
    ASSIGN_OR_RETURN(T* col, Columns<T>(p, ctx));
    auto data = [](TensorView* t) { return t ? t->as<T>() : nullptr; };
    if (!transposed_) {
      kc::ConvBackward<T>(p, dy.as<T>(), x.as<T>(), w.as<T>(), data(dx), data(dw), data(db), col, ctx.thread_pool());
      return absl::OkStatus();
    }
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
};

}  // namespace

void RegisterConvKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  const std::string cleave(graph::kCleaveDomain);
  for (const char* op : {"Conv", "ConvTranspose"})
    r.Register({"", op, 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<ConvKernel>()});
  for (const char* op : {"ConvGrad", "ConvTransposeGrad"})
    r.Register({cleave, op, 1, 1, InputTypeIn(0, floats), MakeFactory<ConvGradKernel>()});
}

}  // namespace cleave::providers
