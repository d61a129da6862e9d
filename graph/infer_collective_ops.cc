// Shape inference for the ai.cleave collectives (graph/): AllReduce and AllToAll keep the
// shape, AllGather multiplies its `axis` by the group size, ReduceScatter divides it (and
// must divide evenly), Send yields a bool scalar, Recv has the `shape` and `dtype` attributes.
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

absl::StatusOr<int64_t> GroupSize(const InferContext& ctx) {
  const std::vector<int64_t> group = ctx.node().AttrInts("group");
  if (group.empty()) return ctx.Error("attribute 'group' (the ranks of the collective) is missing or empty");
  return static_cast<int64_t>(group.size());
}

absl::Status ScaleAxis(InferContext& ctx, bool gather) {
  ASSIGN_OR_RETURN(int64_t n, GroupSize(ctx));
  Shape s = ctx.input_shape(0);
  if (s.has_rank()) {
    if (s.rank() == 0) return ctx.Error("expected a tensor of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), s.rank()));
    Dim& d = s.mutable_dims()[axis];
    if (d.is_static()) {
      if (!gather && d.value % n != 0)
        return ctx.Error("axis ", axis, " of ", ctx.input_shape(0).ToString(), " does not divide over ", n, " ranks");
      d = Dim(gather ? d.value * n : d.value / n);
    } else {
      d = Dim();
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(s));
  return absl::OkStatus();
}

}  // namespace

absl::Status InferAllReduce(InferContext& ctx) {
  RETURN_IF_ERROR(GroupSize(ctx).status());
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferAllGather(InferContext& ctx) { return ScaleAxis(ctx, /*gather=*/true); }
absl::Status InferReduceScatter(InferContext& ctx) { return ScaleAxis(ctx, /*gather=*/false); }

absl::Status InferSend(InferContext& ctx) {
  if (ctx.node().AttrInt("peer", -1) < 0) return ctx.Error("attribute 'peer' is missing or negative");
  ctx.SetOutput(0, DataType::kBool, Shape::Scalar());
  return absl::OkStatus();
}

absl::Status InferRecv(InferContext& ctx) {
  if (ctx.node().AttrInt("peer", -1) < 0) return ctx.Error("attribute 'peer' is missing or negative");
  const int64_t dtype = ctx.node().AttrInt("dtype", 0);
  if (ElementSize(static_cast<DataType>(dtype)) == 0)
    return ctx.Error("attribute 'dtype' must be an ONNX tensor element type, got ", dtype);
  ctx.SetOutput(0, static_cast<DataType>(dtype), Shape::FromDims(ctx.node().AttrInts("shape")));
  return absl::OkStatus();
}

}  // namespace cleave::graph
