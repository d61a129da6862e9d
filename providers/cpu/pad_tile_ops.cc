// CPU kernels for Pad and Tile (providers/cpu/). Both write each output row (the last dim) from
// one input row found by mapping the output's leading coordinates back to the input's.
// Pad: modes constant (a negative pad crops), reflect (about the edge, not repeating it), edge
// and wrap; `axes` (version 18) names the padded dims. Tile: the input repeated along each dim.
// ai.cleave.PadGrad: Pad's adjoint, each input element's gradient the sum of the output
// elements that read it (kernels/pad_coord.h), in a fixed order.
#include <cstring>
#include <memory>
#include <string>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/pad_coord.h"
#include "providers/axis.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"
#include "providers/pad_tile_plan.h"

namespace cleave::providers {

namespace {

using kernels::PadMode;

class PadKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int version) {
    ASSIGN_OR_RETURN(const PadMode mode, PadModeOf(n, version));
    return std::unique_ptr<OpKernel>(new PadKernel(mode));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* value = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    ASSIGN_OR_RETURN(const PadPlan plan, PlanPad(x, *ctx.input(1), ctx.num_inputs() > 3 ? ctx.input(3) : nullptr, mode_));
    const int r = x.rank;
    const DimVector& out = plan.out;
    const int64_t* before = plan.before;
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const size_t es = ElementSize(x.dtype);
    if (r == 0) {  // a scalar has nothing to pad
      std::memcpy(y->data, x.data, es);
      return absl::OkStatus();
    }
    // The constant, as bytes of x's type (0 when absent).
    char fill[16] = {};
    if (value && value->numel() > 0) {
      if (value->dtype != x.dtype)
        return InvalidArgument("expected a constant_value of the data's dtype ", DataTypeName(x.dtype), ", got ",
                               DataTypeName(value->dtype));
      std::memcpy(fill, value->data, es);
    }
    const int64_t cols = out[r - 1], rows = y->numel() / cols;
    int64_t in_stride[kMaxRank];
    int64_t s = 1;
    for (int k = r - 1; k >= 0; --k) {
      in_stride[k] = s;
      s *= x.dims[k];
    }
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        // The row's input offset over the leading dims, or -1 when it lies in the constant.
        int64_t rem = row, offset = 0;
        for (int k = r - 2; k >= 0 && offset >= 0; --k) {
          const int64_t o = rem % out[k];
          rem /= out[k];
          const int64_t i = kernels::PadSourceCoord(o, before[k], x.dims[k], mode_);
          offset = i < 0 ? -1 : offset + i * in_stride[k];
        }
        char* yr = dst + row * cols * es;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = offset < 0 ? -1 : kernels::PadSourceCoord(c, before[r - 1], x.dims[r - 1], mode_);
          std::memcpy(yr + c * es, i < 0 ? fill : src + (offset + i) * es, es);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit PadKernel(PadMode mode) : mode_(mode) {}
  PadMode mode_;
};

// ai.cleave.PadGrad(dY, pads) {mode} -> dX, pads giving the begins then the ends of every dim.
class PadGradKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const PadMode mode, PadModeOf(n, kPadGradEveryMode));
    return std::unique_ptr<OpKernel>(new PadGradKernel(mode));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    ASSIGN_OR_RETURN(const PadGradPlan plan, PlanPadGrad(dy, *ctx.input(1), mode_));
    TensorView* dx = ctx.Output(0, plan.x_dims);
    if (!dx || dx->numel() == 0) return absl::OkStatus();
    if (dy.dtype == DataType::kFloat64) Gather<double>(plan.layout, dy, *dx, ctx.thread_pool());
    else Gather<float>(plan.layout, dy, *dx, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  explicit PadGradKernel(PadMode mode) : mode_(mode) {}
  template <typename T>
  static void Gather(const kernels::PadGradLayout& l, const TensorView& dy, TensorView& dx, ThreadPool* pool) {
    const T* g = dy.as<T>();
    T* out = dx.as<T>();
    ParallelFor(pool, dx.numel(), 1024, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) out[i] = kernels::PadGradGather<T>(l, i, [g](int64_t o) { return g[o]; });
    });
  }
  PadMode mode_;
};

class TileKernel : public OpKernel {
 public:
  TileKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const int r = x.rank;
    ASSIGN_OR_RETURN(const DimVector out, PlanTile(x, *ctx.input(1)));
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const size_t es = ElementSize(x.dtype);
    const int64_t in_cols = x.dims[r - 1], cols = out[r - 1], rows = y->numel() / cols;
    const size_t row_bytes = static_cast<size_t>(in_cols) * es;
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        int64_t rem = row, in_row = 0, scale = 1;
        for (int k = r - 2; k >= 0; --k) {
          in_row += (rem % out[k]) % x.dims[k] * scale;
          rem /= out[k];
          scale *= x.dims[k];
        }
        char* yr = dst + row * cols * es;
        for (int64_t c = 0; c < cols; c += in_cols) std::memcpy(yr + c * es, src + in_row * row_bytes, row_bytes);
      }
    });
    return absl::OkStatus();
  }
};

}  // namespace

void RegisterPadTileKernels(KernelRegistry& r) {
  const SupportsFn int64_arg = InputTypeIn(1, {DataType::kInt64});
  r.Register({"", "Pad", 11, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int64_arg}),
              MakeCheckedFactory<PadKernel>()});
  r.Register({"", "Tile", 6, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int64_arg}),
              MakeFactory<TileKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "PadGrad", 1, 1,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}), int64_arg}),
              MakeCheckedFactory<PadGradKernel>()});
}

}  // namespace cleave::providers
