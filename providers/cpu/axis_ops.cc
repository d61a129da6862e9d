// CPU kernels that run along one axis (providers/cpu/): CumSum (inclusive or exclusive, forward
// or reversed), ArgMax / ArgMin (int64 indices; the first extreme, or the last with
// select_last_index; NaN counts as the extreme, as numpy's argmax takes it), and
// GatherElements / ScatterElements (torch.gather and scatter: an index per element along the
// axis; every index is checked before anything is written), and TopK (kernels/topk_order.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/type_dispatch.h"
#include "kernels/topk_order.h"
#include "providers/axis.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"
#include "providers/scatter_reduction.h"

namespace cleave::providers {

namespace {

class CumSumKernel : public OpKernel {
 public:
  CumSumKernel(const graph::Node& n, int)
      : exclusive_(n.AttrInt("exclusive", 0) != 0), reverse_(n.AttrInt("reverse", 0) != 0) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& a = *ctx.input(1);
    if (a.numel() != 1) return InvalidArgument("expected a one-element axis, got ", a.numel(), " elements");
    if (x.rank == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(int axis, ResolveAxis(IntAt(a, 0), x.rank));
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
            yr[i] = kernels::cpu::WrapAdd(prev ? prev[i] : T(0), add);  // integers wrap, as numpy's
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
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, x.rank));
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

// TopK: each line's first k elements in kernels::TopKBefore's order (sorted whatever `sorted`
// says, which the spec allows), with their int64 indices. bf16 and fp16 are ordered by their
// float32 values and copied as they are.
class TopKKernel : public OpKernel {
 public:
  TopKKernel(const graph::Node& n, int version)
      : axis_(n.AttrInt("axis", -1)), largest_(n.AttrInt("largest", 1) != 0),
        k_attr_(version < 10 ? n.AttrInt("k", 0) : -1) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank == 0) return InvalidArgument("expected an input of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(const int axis, ResolveAxis(axis_, x.rank));
    ASSIGN_OR_RETURN(const int64_t k, TopKCount(k_attr_, ctx.num_inputs() > 1 ? ctx.input(1) : nullptr, x, axis));
    DimVector out(x.dim_span());
    out[axis] = k;
    TensorView* values = ctx.Output(0, out);
    TensorView* indices = ctx.Output(1, out);
    if (!values || !indices) return Internal("TopK's outputs were not allocated");
    const AxisView v = ViewAround(x, axis);
    if (k == 0 || v.outer * v.inner == 0) return absl::OkStatus();
    auto widen = [](uint16_t h, DataType t) { return t == DataType::kBFloat16 ? BFloat16ToFloat(h) : HalfToFloat(h); };
    if (x.dtype == DataType::kBFloat16 || x.dtype == DataType::kFloat16) {
      const DataType t = x.dtype;
      Run<uint16_t>(x, v, k, *values, *indices, ctx.thread_pool(), [&](uint16_t h) { return widen(h, t); });
      return absl::OkStatus();
    }
    const bool known = kernels::cpu::VisitNumeric(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Run<T>(x, v, k, *values, *indices, ctx.thread_pool(), [](T a) { return a; });
    });
    return known ? absl::OkStatus() : Internal("TopK reached with dtype ", DataTypeName(x.dtype));
  }

 private:
  // key(stored) is the value the order compares.
  template <typename T, typename Key>
  void Run(const TensorView& x, const AxisView& v, int64_t k, TensorView& values, TensorView& indices,
           ThreadPool* pool, Key key) const {
    const T* xp = x.as<T>();
    T* vp = values.as<T>();
    int64_t* ip = indices.as<int64_t>();
    const bool largest = largest_;
    ParallelFor(pool, v.outer * v.inner, std::max<int64_t>(1, 4096 / v.len), [&](int64_t p0, int64_t p1) {
      std::vector<int64_t> order(static_cast<size_t>(v.len));
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t o = p / v.inner, i = p % v.inner;
        const T* col = xp + o * v.len * v.inner + i;
        for (int64_t j = 0; j < v.len; ++j) order[static_cast<size_t>(j)] = j;
        auto before = [&](int64_t a, int64_t b) {
          const auto ka = key(col[a * v.inner]), kb = key(col[b * v.inner]);
          return kernels::TopKBefore(ka, IsNan(ka), a, kb, IsNan(kb), b, largest,
                                     [](auto p, auto q) { return p < q; });
        };
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        const int64_t base = o * k * v.inner + i;
        for (int64_t r = 0; r < k; ++r) {
          vp[base + r * v.inner] = col[order[static_cast<size_t>(r)] * v.inner];
          ip[base + r * v.inner] = order[static_cast<size_t>(r)];
        }
      }
    });
  }

  template <typename K>
  static bool IsNan(K v) {
    if constexpr (std::is_floating_point_v<K>) return std::isnan(v);
    else return false;
  }

  int64_t axis_;
  bool largest_;
  int64_t k_attr_;
};

// The element offsets of `idx` (checked by ElementIndicesAxis) into x: every position of idx,
// its own coordinates with the axis's replaced by the index there (negative ones counting from
// the end). An index outside [-len, len) is an error naming it and its position.
absl::Status IndexedOffsets(const TensorView& x, const TensorView& idx, int axis, std::span<int64_t> out) {
  int64_t stride[kMaxRank];
  int64_t s = 1;
  for (int k = x.rank - 1; k >= 0; --k) {
    stride[k] = s;
    s *= x.dims[k];
  }
  const int64_t n = idx.numel(), len = x.dims[axis];
  int64_t coord[kMaxRank] = {};
  for (int64_t p = 0; p < n; ++p) {
    int64_t i = IntAt(idx, p);
    if (i < -len || i >= len)
      return InvalidArgument("index ", i, " at position ", p, " is outside [", -len, ", ", len, ") along axis ", axis);
    if (i < 0) i += len;
    int64_t off = 0;
    for (int k = 0; k < x.rank; ++k) off += (k == axis ? i : coord[k]) * stride[k];
    out[static_cast<size_t>(p)] = off;
    for (int k = x.rank - 1; k >= 0; --k) {  // the next position of idx
      if (++coord[k] < idx.dims[k]) break;
      coord[k] = 0;
    }
  }
  return absl::OkStatus();
}

// IndexedOffsets along `axis` (counting from the end when negative), in the context's scratch:
// planned with the run, so nothing is allocated once the session is warm.
absl::StatusOr<std::span<int64_t>> ElementOffsets(KernelContext& ctx, const TensorView& x, const TensorView& idx,
                                                  int64_t axis) {
  ASSIGN_OR_RETURN(const int a, ElementIndicesAxis(x, idx, axis));
  int64_t* buffer = ctx.ScratchOf<int64_t>(std::max<int64_t>(idx.numel(), 1));
  if (!buffer) return NoScratch();
  const std::span<int64_t> offsets(buffer, static_cast<size_t>(idx.numel()));
  RETURN_IF_ERROR(IndexedOffsets(x, idx, a, offsets));
  return offsets;
}

class GatherElementsKernel : public OpKernel {
 public:
  GatherElementsKernel(const graph::Node& n, int) : axis_(n.AttrInt("axis", 0)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    ASSIGN_OR_RETURN(const std::span<int64_t> offsets, ElementOffsets(ctx, x, idx, axis_));
    TensorView* y = ctx.Output(0, idx.dim_span());
    if (!y) return absl::OkStatus();
    const size_t es = ElementSize(x.dtype);
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), static_cast<int64_t>(offsets.size()), 1 << 14, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) std::memcpy(dst + p * es, src + offsets[p] * es, es);
    });
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

// ScatterElements(data, indices, updates): data with updates written at the indices along the
// axis, or combined there by `reduction` (add, mul, max, min; duplicates combine in index
// order, so the result does not depend on the thread count: it runs on one thread).
class ScatterElementsKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const ScatterReduction red, ScatterReductionOf(n));
    return std::unique_ptr<OpKernel>(new ScatterElementsKernel(n.AttrInt("axis", 0), red));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    const TensorView& upd = *ctx.input(2);
    if (upd.dtype != x.dtype)
      return InvalidArgument("expected updates of the data's dtype ", DataTypeName(x.dtype), ", got ",
                             DataTypeName(upd.dtype));
    if (DimVector(upd.dim_span()) != DimVector(idx.dim_span()))
      return InvalidArgument("expected updates of the indices' shape ", DimsToString(idx.dim_span()), ", got ",
                             DimsToString(upd.dim_span()));
    ASSIGN_OR_RETURN(const std::span<int64_t> offsets, ElementOffsets(ctx, x, idx, axis_));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (y->data != x.data && x.nbytes()) std::memcpy(y->data, x.data, x.nbytes());
    if (reduction_ == ScatterReduction::kNone) {
      const size_t es = ElementSize(x.dtype);
      for (size_t p = 0; p < offsets.size(); ++p)
        std::memcpy(static_cast<char*>(y->data) + offsets[p] * es, static_cast<const char*>(upd.data) + p * es, es);
      return absl::OkStatus();
    }
    switch (x.dtype) {
      case DataType::kFloat32: Combine<float>(offsets, upd, *y); break;
      case DataType::kFloat64: Combine<double>(offsets, upd, *y); break;
      case DataType::kInt32: Combine<int32_t>(offsets, upd, *y); break;
      case DataType::kInt64: Combine<int64_t>(offsets, upd, *y); break;
      default: return InvalidArgument("a reduction over ", DataTypeName(x.dtype), " data");
    }
    return absl::OkStatus();
  }

 private:
  ScatterElementsKernel(int64_t axis, ScatterReduction reduction) : axis_(axis), reduction_(reduction) {}

  template <typename T>
  void Combine(std::span<const int64_t> offsets, const TensorView& upd, TensorView& y) const {
    T* out = y.as<T>();
    const T* u = upd.as<T>();
    for (size_t p = 0; p < offsets.size(); ++p) CombineInto(reduction_, out[offsets[p]], u[p]);
  }

  int64_t axis_;
  ScatterReduction reduction_;
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
  std::vector<DataType> topk = ordered;
  topk.insert(topk.end(), {DataType::kBFloat16, DataType::kFloat16});
  r.Register({"", "TopK", 1, 1 << 30, InputTypeIn(0, topk), MakeFactory<TopKKernel>()});
  const SupportsFn int_indices = InputTypeIn(1, {DataType::kInt32, DataType::kInt64});
  r.Register({"", "GatherElements", 11, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int_indices}),
              MakeFactory<GatherElementsKernel>()});
  // Scatter (9, 10) is ScatterElements under its first name.
  for (const auto& [op, since] : {std::pair<const char*, int>{"ScatterElements", 11}, {"Scatter", 9}})
    r.Register({"", op, since, 1 << 30, AllOf({InputTypeIn(0, FixedSizeTypes()), int_indices}),
                MakeCheckedFactory<ScatterElementsKernel>()});
}

}  // namespace cleave::providers
