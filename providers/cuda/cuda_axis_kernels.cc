// The CUDA provider's kernels along an axis or over padded dims (providers/cuda/): Pad and Tile
// (one kernel: Tile is wrap padding), Pad's gradient ai.cleave.PadGrad, CumSum, ArgMax / ArgMin, TopK, GatherElements and
// ScatterElements, GatherND and ScatterND (kernels/cuda/axis.cu). Pads, repeats, axes, TopK's K and the constant are read on the
// host; out-of-range element indices are found on the device and reported at the stream's next
// wait, naming the node (as Gather's are).
#include <cuda_runtime_api.h>

#include <cstring>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "providers/axis.h"
#include "providers/cpu/shape_ops.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/nd_index_plan.h"
#include "providers/scatter_reduction.h"
#include "providers/pad_tile_plan.h"

namespace cleave::providers {
namespace {

// Pad (x, pads[, constant_value][, axes]) and Tile (x, repeats).
class PadTileKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n,
                                                          int version) {
    kernels::PadMode mode = kernels::PadMode::kWrap;
    const bool tile = n.op_type() == "Tile";
    if (!tile) {
      ASSIGN_OR_RETURN(mode, PadModeOf(n, version));
    }
    return std::unique_ptr<OpKernel>(new PadTileKernel(p, n, tile, mode));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank > kc::kMaxRank) return Unimplemented(name_, ": rank ", x.rank, " over ", kc::kMaxRank);
    kc::PadLayout l;
    l.rank = x.rank;
    uint64_t fill = 0;
    DimVector out;
    if (tile_) {
      auto dims = PlanTile(x, *ctx.input(1));
      if (!dims.ok()) return InvalidArgument(name_, ": ", dims.status().message());
      out = *dims;
    } else {
      auto plan = PlanPad(x, *ctx.input(1), ctx.num_inputs() > 3 ? ctx.input(3) : nullptr, mode_);
      if (!plan.ok()) return InvalidArgument(name_, ": ", plan.status().message());
      out = plan->out;
      for (int d = 0; d < x.rank; ++d) l.before[d] = plan->before[d];
      const TensorView* value = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
      if (value && value->numel() > 0) {
        if (value->dtype != x.dtype)
          return InvalidArgument(name_, ": expected a constant_value of the data's dtype ", DataTypeName(x.dtype),
                                 ", got ", DataTypeName(value->dtype));
        std::memcpy(&fill, value->data, ElementSize(x.dtype));
      }
    }
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (x.rank == 0) return Copy(y->data, x.data, x.nbytes());  // a scalar has nothing to pad
    for (int d = 0; d < x.rank; ++d) {
      l.out_dims[d] = out[d];
      l.in_dims[d] = x.dims[d];
    }
    return Check(kc::Pad(static_cast<int>(ElementSize(x.dtype)), mode_, l, x.data, y->data, fill, stream()));
  }

 private:
  PadTileKernel(const CudaExecutionProvider* p, const graph::Node& n, bool tile, kernels::PadMode mode)
      : CudaKernel(p, n), tile_(tile), mode_(mode) {}
  bool tile_;
  kernels::PadMode mode_;
};

// ai.cleave.PadGrad(dY, pads) {mode} -> dX: each element the sum of the dY elements that read it
// (kernels/pad_coord.h), the dims' preimages formed on the host and copied up with the launch.
class PadGradKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const kernels::PadMode mode, PadModeOf(n, kPadGradEveryMode));
    return std::unique_ptr<OpKernel>(new PadGradKernel(p, n, mode));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    auto plan = PlanPadGrad(dy, *ctx.input(1), mode_);
    if (!plan.ok()) return Named(plan.status());
    TensorView* dx = ctx.Output(0, plan->x_dims);
    if (!dx || dx->numel() == 0) return absl::OkStatus();
    if (dy.rank == 0) return Copy(dx->data, dy.data, dy.nbytes());  // a scalar was not padded
    const int64_t words = static_cast<int64_t>(plan->index.size());
    int64_t* index = ctx.ScratchOf<int64_t>(words);
    if (!index) return NoScratch();
    TensorView host(plan->index.data(), DataType::kInt64, std::span<const int64_t>(&words, 1));
    TensorView dev(index, DataType::kInt64, std::span<const int64_t>(&words, 1));
    RETURN_IF_ERROR(p_->CopyTensor(host, dev));
    kernels::PadGradLayout l = plan->layout;
    for (int d = 0; d < l.rank; ++d) l.pre[d] = {index + plan->offsets_at[d], index + plan->coords_at[d]};
    return Check(kc::PadGrad(DtOf(dy.dtype), l, dy.data, dx->data, dx->numel(), stream()));
  }

 private:
  PadGradKernel(const CudaExecutionProvider* p, const graph::Node& n, kernels::PadMode mode)
      : CudaKernel(p, n), mode_(mode) {}
  kernels::PadMode mode_;
};

class CumSumKernel : public CudaKernel {
 public:
  CumSumKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), exclusive_(n.AttrInt("exclusive", 0) != 0), reverse_(n.AttrInt("reverse", 0) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& a = *ctx.input(1);
    if (a.numel() != 1) return InvalidArgument(name_, ": expected a one-element axis, got ", a.numel(), " elements");
    if (x.rank == 0) return InvalidArgument(name_, ": expected an input of rank >= 1, got a scalar");
    auto axis = ResolveAxis(IntAt(a, 0), x.rank);
    if (!axis.ok()) return InvalidArgument(name_, ": ", axis.status().message());
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    const AxisView v = ViewAround(x, *axis);
    return Check(kc::CumSum(ElemOf(x.dtype), x.data, y->data, v.outer, v.len, v.inner, exclusive_, reverse_, stream()));
  }

 private:
  bool exclusive_, reverse_;
};

// TopK (X[, K]): k from the attribute (version 1) or K, read on the host.
class TopKKernel : public CudaKernel {
 public:
  TopKKernel(const CudaExecutionProvider* p, const graph::Node& n, int version)
      : CudaKernel(p, n), axis_(n.AttrInt("axis", -1)), largest_(n.AttrInt("largest", 1) != 0),
        k_attr_(version < 10 ? n.AttrInt("k", 0) : -1) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank == 0) return InvalidArgument(name_, ": expected an input of rank >= 1, got a scalar");
    auto axis = ResolveAxis(axis_, x.rank);
    if (!axis.ok()) return InvalidArgument(name_, ": ", axis.status().message());
    auto k = TopKCount(k_attr_, ctx.num_inputs() > 1 ? ctx.input(1) : nullptr, x, *axis);
    if (!k.ok()) return InvalidArgument(name_, ": ", k.status().message());
    DimVector out(x.dim_span());
    out[*axis] = *k;
    TensorView* values = ctx.Output(0, out);
    TensorView* indices = ctx.Output(1, out);
    if (!values || !indices) return Internal(name_, ": TopK's outputs were not allocated");
    const AxisView v = ViewAround(x, *axis);
    return Check(kc::TopK(ElemOf(x.dtype), largest_, x.data, values->data, indices->as<int64_t>(), v.outer, v.len,
                          v.inner, *k, stream()));
  }

 private:
  int64_t axis_;
  bool largest_;
  int64_t k_attr_;
};

class ArgExtremeKernel : public CudaKernel {
 public:
  ArgExtremeKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), max_(n.op_type() == "ArgMax"), axis_(n.AttrInt("axis", 0)),
        keepdims_(n.AttrInt("keepdims", 1) != 0), last_(n.AttrInt("select_last_index", 0) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank == 0) return InvalidArgument(name_, ": expected an input of rank >= 1, got a scalar");
    auto axis = ResolveAxis(axis_, x.rank);
    if (!axis.ok()) return InvalidArgument(name_, ": ", axis.status().message());
    const AxisView v = ViewAround(x, *axis);
    if (v.len == 0)
      return InvalidArgument(name_, ": axis ", axis_, " of ", DimsToString(x.dim_span()), " is empty: no index to take");
    DimVector out;
    for (int k = 0; k < x.rank; ++k) {
      if (k != *axis) out.push_back(x.dims[k]);
      else if (keepdims_) out.push_back(1);
    }
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    return Check(kc::ArgExtreme(ElemOf(x.dtype), max_, last_, x.data, y->as<int64_t>(), v.outer, v.len, v.inner,
                                stream()));
  }

 private:
  bool max_;
  int64_t axis_;
  bool keepdims_, last_;
};

absl::StatusOr<kc::ElementsLayout> ElementsLayoutOf(const std::string& name, const TensorView& x,
                                                    const TensorView& idx, int64_t axis) {
  if (x.rank > kc::kMaxRank) return Unimplemented(name, ": rank ", x.rank, " over ", kc::kMaxRank);
  auto a = ElementIndicesAxis(x, idx, axis);
  if (!a.ok()) return InvalidArgument(name, ": ", a.status().message());
  kc::ElementsLayout l;
  l.rank = x.rank;
  l.axis = *a;
  for (int d = 0; d < x.rank; ++d) {
    l.x_dims[d] = x.dims[d];
    l.idx_dims[d] = idx.dims[d];
  }
  return l;
}

class GatherElementsKernel : public CudaKernel {
 public:
  GatherElementsKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), axis_(n.AttrInt("axis", 0)),
        tag_(p->IndexCheckTag(absl::StrCat(name_, " (axis ", axis_, ")"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    ASSIGN_OR_RETURN(const kc::ElementsLayout l, ElementsLayoutOf(name_, x, idx, axis_));
    TensorView* y = ctx.Output(0, idx.dim_span());
    if (!y) return absl::OkStatus();
    return Check(kc::GatherElements(static_cast<int>(ElementSize(x.dtype)), l, x.data, idx.data,
                                    idx.dtype == DataType::kInt32, y->data, stream(), {p_->bad_index_words(), tag_}));
  }

 private:
  int64_t axis_;
  int64_t tag_;
};

// ScatterElements' and ScatterND's reduction attribute (providers/scatter_reduction.h), as the
// kernels name it.
absl::StatusOr<kc::ScatterReduction> DeviceReductionOf(const graph::Node& n) {
  ASSIGN_OR_RETURN(const ScatterReduction r, ScatterReductionOf(n));
  switch (r) {
    case ScatterReduction::kNone: return kc::ScatterReduction::kNone;
    case ScatterReduction::kAdd: return kc::ScatterReduction::kAdd;
    case ScatterReduction::kMul: return kc::ScatterReduction::kMul;
    case ScatterReduction::kMax: return kc::ScatterReduction::kMax;
    default: return kc::ScatterReduction::kMin;
  }
}

class ScatterElementsKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const kc::ScatterReduction red, DeviceReductionOf(n));
    return std::unique_ptr<OpKernel>(new ScatterElementsKernel(p, n, red));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    const TensorView& upd = *ctx.input(2);
    if (upd.dtype != x.dtype)
      return InvalidArgument(name_, ": expected updates of the data's dtype ", DataTypeName(x.dtype), ", got ",
                             DataTypeName(upd.dtype));
    if (DimVector(upd.dim_span()) != DimVector(idx.dim_span()))
      return InvalidArgument(name_, ": expected updates of the indices' shape ", DimsToString(idx.dim_span()),
                             ", got ", DimsToString(upd.dim_span()));
    ASSIGN_OR_RETURN(const kc::ElementsLayout l, ElementsLayoutOf(name_, x, idx, axis_));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    RETURN_IF_ERROR(Copy(y->data, x.data, x.nbytes()));
    return Check(kc::ScatterElements(ElemOf(x.dtype), static_cast<int>(ElementSize(x.dtype)), reduction_, l, idx.data,
                                     idx.dtype == DataType::kInt32, upd.data, y->data, stream(),
                                     {p_->bad_index_words(), tag_}));
  }

 private:
  ScatterElementsKernel(const CudaExecutionProvider* p, const graph::Node& n, kc::ScatterReduction r)
      : CudaKernel(p, n), axis_(n.AttrInt("axis", 0)), reduction_(r),
        tag_(p->IndexCheckTag(absl::StrCat(name_, " (axis ", axis_, ")"))) {}
  int64_t axis_;
  kc::ScatterReduction reduction_;
  int64_t tag_;
};

// GatherND (data, indices) over the indices' tuples (providers/nd_index_plan.h).
class GatherNdKernel : public CudaKernel {
 public:
  GatherNdKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), batch_dims_(n.AttrInt("batch_dims", 0)), tag_(p->IndexCheckTag(name_)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    auto l = PlanNdIndex(x, idx, batch_dims_);
    if (!l.ok()) return InvalidArgument(name_, ": ", l.status().message());
    TensorView* y = ctx.Output(0, NdGatheredDims(x, idx, batch_dims_));
    if (!y) return absl::OkStatus();
    return Check(kc::GatherND(static_cast<int>(ElementSize(x.dtype)), *l, x.data, idx.as<int64_t>(), y->data, stream(),
                              {p_->bad_index_words(), tag_}));
  }

 private:
  int64_t batch_dims_;
  int64_t tag_;
};

// ScatterND (data, indices, updates): the data copied, then the updates written or combined.
class ScatterNdKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const kc::ScatterReduction red, DeviceReductionOf(n));
    return std::unique_ptr<OpKernel>(new ScatterNdKernel(p, n, red));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    const TensorView& upd = *ctx.input(2);
    auto l = PlanNdIndex(x, idx, 0);
    if (!l.ok()) return InvalidArgument(name_, ": ", l.status().message());
    if (upd.dtype != x.dtype)
      return InvalidArgument(name_, ": expected updates of the data's dtype ", DataTypeName(x.dtype), ", got ",
                             DataTypeName(upd.dtype));
    const DimVector want = NdGatheredDims(x, idx, 0);
    if (DimVector(upd.dim_span()) != want)
      return InvalidArgument(name_, ": expected updates ", DimsToString(want.span()), ", got ",
                             DimsToString(upd.dim_span()));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    RETURN_IF_ERROR(Copy(y->data, x.data, x.nbytes()));
    return Check(kc::ScatterND(ElemOf(x.dtype), static_cast<int>(ElementSize(x.dtype)), reduction_, *l,
                               idx.as<int64_t>(), upd.data, y->data, stream(), {p_->bad_index_words(), tag_}));
  }

 private:
  ScatterNdKernel(const CudaExecutionProvider* p, const graph::Node& n, kc::ScatterReduction r)
      : CudaKernel(p, n), reduction_(r), tag_(p->IndexCheckTag(name_)) {}
  kc::ScatterReduction reduction_;
  int64_t tag_;
};

}  // namespace

void RegisterCudaAxisKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  // Bytes of any fixed size move; sums, orders and reductions need the arithmetic.
  const SupportsFn any = InputTypeIn(0, FixedSizeTypes());
  std::vector<DataType> numbers = kFloats;
  numbers.insert(numbers.end(), {DataType::kInt64, DataType::kInt32});
  const SupportsFn int_indices = InputTypeIn(1, {DataType::kInt32, DataType::kInt64});
  AddChecked<PadTileKernel>(r, p, "", "Pad", 11, any, {1, 2, 3});
  AddChecked<PadTileKernel>(r, p, "", "Tile", 6, any, {1});
  AddChecked<PadGradKernel>(r, p, graph::kCleaveDomain, "PadGrad", 1, InputTypeIn(0, kFloats), {1});
  Add<CumSumKernel>(r, p, "", "CumSum", 11, 1 << 30, AllOf({InputTypeIn(0, numbers), int_indices}), {1});
  for (const char* op : {"ArgMax", "ArgMin"}) Add<ArgExtremeKernel>(r, p, "", op, 1, 1 << 30, InputTypeIn(0, numbers));
  Add<TopKKernel>(r, p, "", "TopK", 1, 1 << 30, InputTypeIn(0, numbers), {1});
  Add<GatherElementsKernel>(r, p, "", "GatherElements", 11, 1 << 30, AllOf({any, int_indices}));
  // A reduction needs the arithmetic of the data's type; plain writes take any.
  auto reducible = [numbers](const graph::Node& n, int) -> std::string {
    if (n.AttrString("reduction", "none") == "none") return "";
    for (DataType t : numbers)
      if (n.input(0)->dtype() == t) return "";
    return absl::StrCat("a reduction over ", DataTypeName(n.input(0)->dtype()), " data");
  };
  AddChecked<ScatterElementsKernel>(r, p, "", "ScatterElements", 11, AllOf({any, int_indices, reducible}));
  AddChecked<ScatterElementsKernel>(r, p, "", "Scatter", 9, AllOf({any, int_indices}));  // its first name
  const SupportsFn int64_indices = InputTypeIn(1, {DataType::kInt64});
  Add<GatherNdKernel>(r, p, "", "GatherND", 11, 1 << 30, AllOf({any, int64_indices}));
  AddChecked<ScatterNdKernel>(r, p, "", "ScatterND", 11, AllOf({any, int64_indices, reducible}));
}

}  // namespace cleave::providers
