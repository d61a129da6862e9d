// CPU kernels for the ops that rearrange bytes (providers/cpu/): Transpose, Concat, Split,
// Slice, Expand, Gather. Each resolves its runtime arguments into output dims, checks them
// against the inputs, and hands the copy to kernels/cpu/shape.h. Compute allocates nothing:
// dims are DimVectors and per-input or per-output arrays come from scratch memory.
#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/shape.h"
#include "providers/axis.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

class TransposeKernel : public OpKernel {
 public:
  TransposeKernel(const graph::Node& n, int) : perm_(n.AttrInts("perm")) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    int perm[kMaxRank];
    int64_t dims[kMaxRank];
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
    TensorView* y = ctx.Output(0, std::span<const int64_t>(dims, x.rank));
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
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, x0.rank));
    DimVector dims(x0.dim_span());
    dims[axis] = 0;
    std::span<const TensorView*> xs = ScratchArray<const TensorView*>(ctx, ctx.num_inputs());
    if (!xs.data()) return NoScratch();
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const TensorView* x = ctx.input(i);
      bool same = x->rank == x0.rank;
      for (int k = 0; same && k < x0.rank; ++k) same = k == axis || x->dims[k] == x0.dims[k];
      if (!same)
        return InvalidArgument("input ", i, " has shape ", DimsToString(x->dim_span()),
                               ", expected ", DimsToString(x0.dim_span()), " except at axis ",
                               axis);
      dims[axis] += x->dims[axis];
      xs[i] = x;
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
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, x.rank));
    const int n = ctx.num_outputs();
    std::span<int64_t> sizes = ScratchArray<int64_t>(ctx, n);
    std::span<TensorView*> ys = ScratchArray<TensorView*>(ctx, n);
    if (!sizes.data() || !ys.data()) return NoScratch();
    RETURN_IF_ERROR(Sizes(ctx, x.dims[axis], sizes));
    DimVector dims(x.dim_span());
    for (int i = 0; i < n; ++i) {
      dims[axis] = sizes[i];
      ys[i] = ctx.Output(i, dims);
    }
    kernels::cpu::Split(x, axis, sizes, ys, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  // Fills `sizes` (one per output) from the `split` attribute or input, or with equal parts
  // of ceil(d / n) and a smaller last part when neither is given.
  absl::Status Sizes(const KernelContext& ctx, int64_t d, std::span<int64_t> sizes) const {
    const int n = static_cast<int>(sizes.size());
    const TensorView* in = split_input_ ? ctx.input(1) : nullptr;
    const int64_t given = in ? in->numel() : static_cast<int64_t>(split_attr_.size());
    if (given == 0) {
      int64_t part = (d + n - 1) / n, last = d - part * (n - 1);
      if (last < 0) return InvalidArgument("cannot split axis of size ", d, " into ", n, " parts");
      std::fill(sizes.begin(), sizes.end(), part);
      sizes[n - 1] = last;
      return absl::OkStatus();
    }
    if (given != n)
      return InvalidArgument("split has ", given, " sizes, expected one per output (", n, ")");
    for (int i = 0; i < n; ++i) sizes[i] = in ? IntAt(*in, i) : split_attr_[i];
    int64_t sum = 0;
    for (int64_t s : sizes) {
      if (s < 0)
        return InvalidArgument("split sizes [", absl::StrJoin(sizes, ","), "] contain a negative");
      sum += s;
    }
    if (sum != d)
      return InvalidArgument("split sizes [", absl::StrJoin(sizes, ","), "] sum to ", sum,
                             ", expected the axis size ", d);
    return absl::OkStatus();
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
    kernels::cpu::SliceParams p;
    if (from_inputs_) {
      DimVector starts, ends, axes, steps;
      RETURN_IF_ERROR(ReadDimValues(*ctx.input(1), "starts", &starts));
      RETURN_IF_ERROR(ReadDimValues(*ctx.input(2), "ends", &ends));
      if (ctx.input(3)) RETURN_IF_ERROR(ReadDimValues(*ctx.input(3), "axes", &axes));
      if (ctx.input(4)) RETURN_IF_ERROR(ReadDimValues(*ctx.input(4), "steps", &steps));
      ASSIGN_OR_RETURN(p, kernels::cpu::ResolveSlice(x.dim_span(), starts, ends, axes, steps));
    } else {
      ASSIGN_OR_RETURN(p, kernels::cpu::ResolveSlice(x.dim_span(), starts_, ends_, axes_, {}));
    }
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
    DimVector shape;
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(1), "shape", &shape));
    // The shape as a data-less view, so the elementwise broadcast rule applies to it.
    const TensorView shape_view(nullptr, x.dtype, shape);
    const TensorView* both[2] = {&x, &shape_view};
    int64_t dims[kMaxRank];
    const int rank = kernels::cpu::BroadcastOutputDims(both, dims);
    if (rank < 0)
      return InvalidArgument("cannot broadcast input ", DimsToString(x.dim_span()),
                             " with shape ", DimsToString(shape));
    TensorView* y = ctx.Output(0, std::span<const int64_t>(dims, rank));
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
    ASSIGN_OR_RETURN(int axis, ResolveAxis(axis_, data.rank));
    // y.dims = data.dims[:axis] + indices.dims + data.dims[axis+1:]
    const int rank = data.rank - 1 + indices.rank;
    if (rank > kMaxRank)
      return InvalidArgument("output rank ", rank, " (data rank ", data.rank, ", indices rank ",
                             indices.rank, ") exceeds the maximum ", kMaxRank);
    int64_t dims[kMaxRank];
    int64_t* d = std::copy(data.dims, data.dims + axis, dims);
    d = std::copy(indices.dims, indices.dims + indices.rank, d);
    std::copy(data.dims + axis + 1, data.dims + data.rank, d);
    TensorView* y = ctx.Output(0, std::span<const int64_t>(dims, rank));
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
