// CPU kernels for the ops that rearrange bytes (providers/cpu/): Transpose, Concat, Split,
// Slice, Expand, Gather. Each resolves its runtime arguments into output dims, checks them
// against the inputs, and hands the copy to kernels/cpu/shape.h.
#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/infer_util.h"
#include "kernels/cpu/shape.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

absl::StatusOr<int> Axis(int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    return InvalidArgument("axis ", axis, " is out of range for rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

class TransposeKernel : public OpKernel {
 public:
  TransposeKernel(const graph::Node& n, int) : perm_(n.AttrInts("perm")) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    int perm[kMaxRank];
    std::vector<int64_t> dims(x.rank);
    if (!perm_.empty() && static_cast<int>(perm_.size()) != x.rank)
      return InvalidArgument("perm [", absl::StrJoin(perm_, ","), "] has ", perm_.size(),
                             " entries, expected the input rank ", x.rank);
    bool used[kMaxRank] = {};
    for (int k = 0; k < x.rank; ++k) {
      // No perm reverses the axes.
      int64_t p = perm_.empty() ? x.rank - 1 - k : perm_[k];
      if (p < 0 || p >= x.rank || used[p])
        return InvalidArgument("perm [", absl::StrJoin(perm_, ","), "] is not a permutation of ",
                               x.rank, " axes");
      used[p] = true;
      perm[k] = static_cast<int>(p);
      dims[k] = x.dims[p];
    }
    TensorView* y = ctx.Output(0, dims);
    if (y) kernels::cpu::Transpose(x, std::span<const int>(perm, x.rank), *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> perm_;
};

class ConcatKernel : public OpKernel {
 public:
  ConcatKernel(const graph::Node& n, int) : axis_(n.AttrInt("axis", 0)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x0 = *ctx.input(0);
    ASSIGN_OR_RETURN(int axis, Axis(axis_, x0.rank));
    std::vector<int64_t> dims = x0.shape();
    dims[axis] = 0;
    std::vector<const TensorView*> xs;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView* x = ctx.input(i);
      bool same = x->rank == x0.rank;
      for (int k = 0; same && k < x0.rank; ++k) same = k == axis || x->dims[k] == x0.dims[k];
      if (!same)
        return InvalidArgument("input ", i, " has shape ", DimsToString(x->shape()),
                               ", expected ", DimsToString(x0.shape()), " except at axis ",
                               axis);
      dims[axis] += x->dims[axis];
      xs.push_back(x);
    }
    TensorView* y = ctx.Output(0, dims);
    if (y) kernels::cpu::Concat(xs, axis, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  int64_t axis_;
};

class SplitKernel : public OpKernel {
 public:
  SplitKernel(const graph::Node& n, int version)
      : axis_(n.AttrInt("axis", 0)),
        split_input_(version >= 13),
        split_attr_(version < 13 ? n.AttrInts("split") : std::vector<int64_t>{}) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(int axis, Axis(axis_, x.rank));
    ASSIGN_OR_RETURN(std::vector<int64_t> sizes, Sizes(ctx, x.dims[axis]));
    std::vector<TensorView*> ys(sizes.size());
    std::vector<int64_t> dims = x.shape();
    for (size_t i = 0; i < sizes.size(); ++i) {
      dims[axis] = sizes[i];
      ys[i] = ctx.Output(static_cast<int>(i), dims);
    }
    kernels::cpu::Split(x, axis, sizes, ys, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  // The `split` sizes, or equal parts of ceil(d / n) with a smaller last part.
  absl::StatusOr<std::vector<int64_t>> Sizes(const KernelContext& ctx, int64_t d) const {
    const int n = ctx.num_outputs();
    std::vector<int64_t> sizes = split_attr_;
    if (split_input_ && ctx.input(1)) sizes = ViewInts(*ctx.input(1));
    if (sizes.empty()) {
      int64_t part = (d + n - 1) / n, last = d - part * (n - 1);
      if (last < 0) return InvalidArgument("cannot split axis of size ", d, " into ", n, " parts");
      sizes.assign(n, part);
      sizes.back() = last;
    }
    if (static_cast<int>(sizes.size()) != n)
      return InvalidArgument("split has ", sizes.size(), " sizes, expected one per output (", n,
                             ")");
    int64_t sum = 0;
    for (int64_t s : sizes) {
      if (s < 0)
        return InvalidArgument("split sizes [", absl::StrJoin(sizes, ","), "] contain a negative");
      sum += s;
    }
    if (sum != d)
      return InvalidArgument("split sizes [", absl::StrJoin(sizes, ","), "] sum to ", sum,
                             ", expected the axis size ", d);
    return sizes;
  }

  int64_t axis_;
  bool split_input_;
  std::vector<int64_t> split_attr_;
};

class SliceKernel : public OpKernel {
 public:
  SliceKernel(const graph::Node& n, int version)
      : from_inputs_(version >= 10),
        starts_(n.AttrInts("starts")),
        ends_(n.AttrInts("ends")),
        axes_(n.AttrInts("axes")) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    std::vector<int64_t> starts = starts_, ends = ends_, axes = axes_, steps;
    if (from_inputs_) {
      starts = ViewInts(*ctx.input(1));
      ends = ViewInts(*ctx.input(2));
      axes = ctx.input(3) ? ViewInts(*ctx.input(3)) : std::vector<int64_t>{};
      if (ctx.input(4)) steps = ViewInts(*ctx.input(4));
    }
    ASSIGN_OR_RETURN(kernels::cpu::SliceParams p,
                     kernels::cpu::ResolveSlice(x.dim_span(), starts, ends, axes, steps));
    TensorView* y = ctx.Output(0, p.out_dims);
    if (y) kernels::cpu::Slice(x, p, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool from_inputs_;
  std::vector<int64_t> starts_, ends_, axes_;
};

class ExpandKernel : public OpKernel {
 public:
  ExpandKernel(const graph::Node&, int) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const std::vector<int64_t> shape = ViewInts(*ctx.input(1));
    std::optional<std::vector<int64_t>> dims = graph::BroadcastDims(x.shape(), shape);
    if (!dims)
      return InvalidArgument("cannot broadcast input ", DimsToString(x.shape()), " with shape ",
                             DimsToString(shape));
    if (static_cast<int>(dims->size()) > kMaxRank)
      return InvalidArgument("expanded rank ", dims->size(), " exceeds the maximum ", kMaxRank);
    TensorView* y = ctx.Output(0, *dims);
    if (y) kernels::cpu::Expand(x, *y, ctx.thread_pool());
    return absl::OkStatus();
  }
};

class GatherKernel : public OpKernel {
 public:
  GatherKernel(const graph::Node& n, int) : axis_(n.AttrInt("axis", 0)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& data = *ctx.input(0);
    const TensorView& indices = *ctx.input(1);
    ASSIGN_OR_RETURN(int axis, Axis(axis_, data.rank));
    std::vector<int64_t> dims(data.dims, data.dims + axis);
    dims.insert(dims.end(), indices.dims, indices.dims + indices.rank);
    dims.insert(dims.end(), data.dims + axis + 1, data.dims + data.rank);
    TensorView* y = ctx.Output(0, dims);
    if (!y) return absl::OkStatus();
    return kernels::cpu::Gather(data, indices, axis, *y, ctx.thread_pool());
  }

 private:
  int64_t axis_;
};

}  // namespace

void RegisterDataMovementKernels(KernelRegistry& r) {
  const SupportsFn data_types = InputTypeIn(0, FixedSizeTypes());
  const SupportsFn int_arg = InputTypeIn(1, {DataType::kInt64, DataType::kInt32});
  r.Register({"", "Transpose", 1, 1 << 30, data_types, MakeFactory<TransposeKernel>()});
  r.Register({"", "Concat", 4, 1 << 30, data_types, MakeFactory<ConcatKernel>()});
  r.Register({"", "Split", 2, 1 << 30, AllOf({data_types, InputTypeIn(1, {DataType::kInt64})}),
              MakeFactory<SplitKernel>()});
  r.Register({"", "Slice", 1, 1 << 30, AllOf({data_types, int_arg}), MakeFactory<SliceKernel>()});
  r.Register({"", "Expand", 8, 1 << 30, AllOf({data_types, InputTypeIn(1, {DataType::kInt64})}),
              MakeFactory<ExpandKernel>()});
  r.Register({"", "Gather", 1, 1 << 30, AllOf({data_types, int_arg}), MakeFactory<GatherKernel>()});
}

}  // namespace cleave::providers
