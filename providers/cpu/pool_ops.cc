// CPU kernels for MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool and their gradients
// ai.cleave.MaxPoolGrad and ai.cleave.AveragePoolGrad (providers/cpu/), over the windows of
// kernels/pool_window.h: every output element on its own, in parallel. The gradients gather
// each input element's sum from the windows that read it, in a fixed order, as the CUDA
// kernels do.
#include <cmath>
#include <limits>
#include <memory>

#include "base/status.h"
#include "graph/op_table.h"
#include "graph/pool_geometry.h"
#include "kernels/pool_window.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/pool_plan.h"

namespace cleave::providers {

namespace {

using kernels::PoolLayout;

template <typename T>
bool IsNanOf(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

// The plane offset of each output's chosen tap (-1 for a window wholly in the padding), for
// every plane.
template <typename T>
void ArgMaxes(const PoolLayout& l, const T* x, int64_t planes, int64_t* arg, ThreadPool* pool) {
  const int64_t total = planes * l.out_size;
  ParallelFor(pool, total, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const T* plane = x + i / l.out_size * l.in_size;
      arg[i] = kernels::PoolArgMax(
          l, i % l.out_size, [plane](int64_t k) { return plane[k]; }, [](T a, T b) { return a < b; },
          [](T v) { return IsNanOf(v); });
    }
  });
}

// MaxPool (X) -> Y[, Indices], AveragePool (X) -> Y, and the global pools.
class PoolKernel : public OpKernel {
 public:
  PoolKernel(const graph::Node& n, int) : attrs_(graph::PoolAttrsOf(n)), max_(n.op_type().find("Max") != std::string::npos) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(const PoolPlan p, PlanPool(x.dim_span(), attrs_));
    if (max_ && attrs_.storage_order != 0 && attrs_.storage_order != 1)
      return InvalidArgument("expected storage_order 0 or 1, got ", attrs_.storage_order);
    TensorView* y = ctx.Output(0, p.out);
    TensorView* indices = ctx.num_outputs() > 1 ? ctx.Output(1, p.out) : nullptr;
    if (!y || y->numel() == 0) return absl::OkStatus();
    switch (x.dtype) {
      case DataType::kFloat32: return Run<float, float>(p, x, *y, indices, ctx);
      case DataType::kFloat64: return Run<double, double>(p, x, *y, indices, ctx);
      case DataType::kInt8: return Run<int8_t, int>(p, x, *y, indices, ctx);
      case DataType::kUInt8: return Run<uint8_t, int>(p, x, *y, indices, ctx);
      default: return InvalidArgument("no pooling of ", DataTypeName(x.dtype));
    }
  }

 private:
  template <typename T, typename Acc>
  absl::Status Run(const PoolPlan& p, const TensorView& x, TensorView& y, TensorView* indices,
                   KernelContext& ctx) const {
    const PoolLayout& l = p.layout;
    const T* in = x.as<T>();
    T* out = y.as<T>();
    const int64_t total = p.planes * l.out_size;
    if (max_) {
      int64_t* arg = ctx.ScratchOf<int64_t>(total);
      if (!arg) return NoScratch();
      ArgMaxes(l, in, p.planes, arg, ctx.thread_pool());
      int64_t* idx = indices ? indices->as<int64_t>() : nullptr;
      const bool column_major = attrs_.storage_order == 1;
      // A window wholly in the padding takes the padding's value.
      constexpr T kEmpty = std::is_floating_point_v<T> ? -std::numeric_limits<T>::infinity()
                                                       : std::numeric_limits<T>::lowest();
      ParallelFor(ctx.thread_pool(), total, 4096, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t plane = i / l.out_size, a = arg[i];
          out[i] = a < 0 ? kEmpty : in[plane * l.in_size + a];
          if (idx) idx[i] = a < 0 ? -1 : plane * l.in_size + (column_major ? kernels::PoolColumnMajor(l, a) : a);
        }
      });
      return absl::OkStatus();
    }
    if constexpr (std::is_floating_point_v<T>) {
      ParallelFor(ctx.thread_pool(), total, 256, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const T* plane = in + i / l.out_size * l.in_size;
          const int64_t o = i % l.out_size;
          Acc sum = 0;
          kernels::PoolVisitWindow(l, o, [&](int64_t k) { sum += plane[k]; });
          const int64_t count = kernels::PoolDivisor(l, o);
          out[i] = count > 0 ? static_cast<T>(sum / static_cast<Acc>(count)) : T(0);
        }
      });
      return absl::OkStatus();
    }
    return InvalidArgument("AveragePool takes float32 or float64, got ", DataTypeName(x.dtype));
  }

  graph::PoolAttrs attrs_;
  bool max_;
};

// ai.cleave.MaxPoolGrad(dY, X) -> dX: each element's dY summed over the windows that chose it.
// ai.cleave.AveragePoolGrad(dY, X's shape) -> dX: each element's dY / divisor summed over the
// windows that read it.
class PoolGradKernel : public OpKernel {
 public:
  PoolGradKernel(const graph::Node& n, int) : attrs_(graph::PoolAttrsOf(n)), max_(n.op_type() == "MaxPoolGrad") {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& second = *ctx.input(1);
    DimVector x_dims;
    if (max_) {
      if (second.dtype != dy.dtype)
        return InvalidArgument("expected dY and X of one dtype, got ", DataTypeName(dy.dtype), " and ",
                               DataTypeName(second.dtype));
      x_dims = DimVector(second.dim_span());
    } else {
      ASSIGN_OR_RETURN(x_dims, PoolInputDims(second));
    }
    ASSIGN_OR_RETURN(const PoolPlan p, PlanPoolGrad(x_dims.span(), dy.dim_span(), attrs_));
    TensorView* dx = ctx.Output(0, x_dims.span());
    if (!dx || dx->numel() == 0) return absl::OkStatus();
    if (dy.dtype == DataType::kFloat64) return Run<double>(p, dy, second, *dx, ctx);
    return Run<float>(p, dy, second, *dx, ctx);
  }

 private:
  template <typename T>
  absl::Status Run(const PoolPlan& p, const TensorView& dy, const TensorView& x, TensorView& dx,
                   KernelContext& ctx) const {
    const PoolLayout& l = p.layout;
    const T* g = dy.as<T>();
    T* out = dx.as<T>();
    const int64_t* arg = nullptr;
    if (max_) {
      int64_t* a = ctx.ScratchOf<int64_t>(p.planes * l.out_size);
      if (!a) return NoScratch();
      ArgMaxes(l, x.as<T>(), p.planes, a, ctx.thread_pool());
      arg = a;
    }
    ParallelFor(ctx.thread_pool(), p.planes * l.in_size, 256, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t plane = i / l.in_size, k = i % l.in_size;
        const T* gp = g + plane * l.out_size;
        T sum = 0;
        if (max_) {
          const int64_t* ap = arg + plane * l.out_size;
          kernels::PoolVisitReaders(l, k, [&](int64_t o) {
            if (ap[o] == k) sum += gp[o];
          });
        } else {
          kernels::PoolVisitReaders(l, k, [&](int64_t o) { sum += gp[o] / static_cast<T>(kernels::PoolDivisor(l, o)); });
        }
        out[i] = sum;
      }
    });
    return absl::OkStatus();
  }

  graph::PoolAttrs attrs_;
  bool max_;
};

}  // namespace

void RegisterPoolKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  std::vector<DataType> max_types = floats;
  max_types.insert(max_types.end(), {DataType::kInt8, DataType::kUInt8});
  const std::string cleave(graph::kCleaveDomain);
  r.Register({"", "MaxPool", 1, 1 << 30, InputTypeIn(0, max_types), MakeFactory<PoolKernel>()});
  r.Register({"", "AveragePool", 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<PoolKernel>()});
  r.Register({"", "GlobalMaxPool", 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<PoolKernel>()});
  r.Register({"", "GlobalAveragePool", 1, 1 << 30, InputTypeIn(0, floats), MakeFactory<PoolKernel>()});
  r.Register({cleave, "MaxPoolGrad", 1, 1, AllOf({InputTypeIn(0, floats), InputTypeIn(1, floats)}),
              MakeFactory<PoolGradKernel>()});
  r.Register({cleave, "AveragePoolGrad", 1, 1, AllOf({InputTypeIn(0, floats), InputTypeIn(1, {DataType::kInt64})}),
              MakeFactory<PoolGradKernel>()});
}

}  // namespace cleave::providers
