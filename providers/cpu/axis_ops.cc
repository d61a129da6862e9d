// CPU kernels that run along one axis (providers/cpu/): CumSum (inclusive or exclusive, forward
// or reversed) and ArgMax / ArgMin (int64 indices; the first extreme, or the last with
// select_last_index; NaN counts as the extreme, as numpy's argmax takes it).
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "base/status.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

// x viewed as [outer, len, inner] around `axis`.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisView ViewAround(const TensorView& x, int axis) {
  AxisView v;
  for (int k = 0; k < x.rank; ++k) {
    if (k < axis) v.outer *= x.dims[k];
    else if (k == axis) v.len = x.dims[k];
    else v.inner *= x.dims[k];
  }
  return v;
}

absl::StatusOr<int> NormalisedAxis(int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    return InvalidArgument("axis ", axis, " is out of range for an input of rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

class CumSumKernel : public OpKernel {
 public:
  CumSumKernel(const graph::Node& n, int)
      : exclusive_(n.AttrInt("exclusive", 0) != 0), reverse_(n.AttrInt("reverse", 0) != 0) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& a = *ctx.input(1);
    if (a.numel() != 1) return InvalidArgument("expected a one-element axis, got ", a.numel(), " elements");
    if (x.rank == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(int axis, NormalisedAxis(IntAt(a, 0), x.rank));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    const AxisView v = ViewAround(x, axis);
    switch (x.dtype) {
      case DataType::kFloat32: Run<float>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kFloat64: Run<double>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kInt32: Run<int32_t>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kInt64: Run<int64_t>(v, x, *y, ctx.thread_pool()); break;
      default: return Internal("CumSum reached with dtype ", DataTypeName(x.dtype));
    }
    return absl::OkStatus();
  }

 private:
  // Each [len, inner] block in its own task: the running sums of a row of `inner` columns at
  // once, summed in the axis's order (reversed: from its end).
  template <typename T>
  void Run(const AxisView& v, const TensorView& x, TensorView& y, ThreadPool* pool) const {
    const T* xp = x.as<T>();
    T* yp = y.as<T>();
    const int64_t block = v.len * v.inner;
    ParallelFor(pool, v.outer, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(block, 1)), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const T* xb = xp + o * block;
        T* yb = yp + o * block;
        const T* prev = nullptr;  // the previous position's sum (null before the first)
        const T* prev_x = nullptr;
        for (int64_t s = 0; s < v.len; ++s) {
          const int64_t k = reverse_ ? v.len - 1 - s : s;
          const T* xr = xb + k * v.inner;
          T* yr = yb + k * v.inner;
          for (int64_t i = 0; i < v.inner; ++i) {
            // inclusive: y_k = y_prev + x_k; exclusive: y_k = y_prev + x_prev (0 at the start)
            const T add = exclusive_ ? (prev_x ? prev_x[i] : T(0)) : xr[i];
            yr[i] = (prev ? prev[i] : T(0)) + add;
          }
          prev = yr;
          prev_x = xr;
        }
      }
    });
  }

  bool exclusive_, reverse_;
};

class ArgExtremeKernel : public OpKernel {
 public:
  ArgExtremeKernel(const graph::Node& n, int)
      : max_(n.op_type() == "ArgMax"),
        axis_(n.AttrInt("axis", 0)),
        keepdims_(n.AttrInt("keepdims", 1) != 0),
        last_(n.AttrInt("select_last_index", 0) != 0) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(int axis, NormalisedAxis(axis_, x.rank));
    const AxisView v = ViewAround(x, axis);
    if (v.len == 0) return InvalidArgument("axis ", axis_, " of ", DimsToString(x.dim_span()), " is empty: no index to take");
    DimVector out;
    for (int k = 0; k < x.rank; ++k) {
      if (k != axis) out.push_back(x.dims[k]);
      else if (keepdims_) out.push_back(1);
    }
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    switch (x.dtype) {
      case DataType::kFloat32: Run<float>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kFloat64: Run<double>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kInt32: Run<int32_t>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kInt64: Run<int64_t>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kUInt8: Run<uint8_t>(v, x, *y, ctx.thread_pool()); break;
      case DataType::kInt8: Run<int8_t>(v, x, *y, ctx.thread_pool()); break;
      default: return Internal(max_ ? "ArgMax" : "ArgMin", " reached with dtype ", DataTypeName(x.dtype));
    }
    return absl::OkStatus();
  }

 private:
  // Whether a replaces the best so far b: strictly more extreme, or equal with
  // select_last_index; a NaN beats every number and, once taken, only a later NaN (last) does.
  template <typename T>
  bool Beats(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(b)) return last_ && std::isnan(a);
      if (std::isnan(a)) return true;
    }
    if (a == b) return last_;
    return max_ ? a > b : a < b;
  }

  template <typename T>
  void Run(const AxisView& v, const TensorView& x, TensorView& y, ThreadPool* pool) const {
    const T* xp = x.as<T>();
    int64_t* yp = y.as<int64_t>();
    ParallelFor(pool, v.outer * v.inner, 1024, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t o = p / v.inner, i = p % v.inner;
        const T* col = xp + o * v.len * v.inner + i;
        int64_t best = 0;
        for (int64_t k = 1; k < v.len; ++k)
          if (Beats(col[k * v.inner], col[best * v.inner])) best = k;
        yp[p] = best;
      }
    });
  }

  bool max_;
  int64_t axis_;
  bool keepdims_, last_;
};

}  // namespace

void RegisterAxisKernels(KernelRegistry& r) {
  const std::vector<DataType> sums = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64};
  r.Register({"", "CumSum", 11, 1 << 30, AllOf({InputTypeIn(0, sums), InputTypeIn(1, {DataType::kInt32, DataType::kInt64})}),
              MakeFactory<CumSumKernel>()});
  const std::vector<DataType> ordered = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                                         DataType::kInt64,   DataType::kUInt8,   DataType::kInt8};
  for (const char* op : {"ArgMax", "ArgMin"})
    r.Register({"", op, 1, 1 << 30, InputTypeIn(0, ordered), MakeFactory<ArgExtremeKernel>()});
}

}  // namespace cleave::providers
