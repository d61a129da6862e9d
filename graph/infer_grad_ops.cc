// Shape inference for the ai.cleave gradient ops (graph/): GatherGrad and SliceGrad produce
// a tensor of their `shape` input's value (static or symbolic where the value is known from
// a constant or a Shape node, unknown dims otherwise); SoftmaxCrossEntropyLossGrad produces
// the scores' shape, which is log_prob's.
#include <string>
#include <vector>

#include "base/status.h"
#include "graph/dims_value.h"
#include "graph/infer_fns.h"
#include "graph/infer_shape_util.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

const std::initializer_list<DataType> kGradFloat = {DataType::kFloat32, DataType::kFloat64};

// The shape named by 1-D int64 input i: its value's dims when known, else `rank` unknown
// dims when the input's length is static, else unknown rank.
absl::StatusOr<Shape> ShapeFromInput(const InferContext& ctx, int i) {
  RETURN_IF_ERROR(ExpectDtype(ctx, i, {DataType::kInt64}));
  const Shape& s = ctx.input_shape(i);
  if (s.has_rank() && s.rank() != 1)
    return ctx.Error("expected a 1-D shape input, got ", s.ToString());
  if (std::optional<std::vector<Dim>> v = InputDimsValue(ctx.node(), i)) {
    for (const Dim& d : *v)
      if (!d.symbol.empty() && d.symbol[0] == '-')  // a literal negative element
        return ctx.Error("expected non-negative dims in the shape input, got ", d.symbol);
    return Shape(*v);
  }
  if (s.has_rank() && s[0].is_static()) return UnknownDims(static_cast<int>(s[0].value));
  return Shape();
}

}  // namespace

absl::Status InferGatherGrad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, kGradFloat));
  ASSIGN_OR_RETURN(Shape out, ShapeFromInput(ctx, 0));
  const Shape& indices = ctx.input_shape(1);
  const Shape& dy = ctx.input_shape(2);
  if (out.has_rank()) {
    if (out.rank() == 0) return ctx.Error("expected a shape of rank >= 1, got a scalar");
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), out.rank()));
    (void)axis;
    if (indices.has_rank() && dy.has_rank() && dy.rank() != out.rank() - 1 + indices.rank())
      return ctx.Error("expected dY of rank ", out.rank() - 1 + indices.rank(),
                       " (shape rank - 1 + indices rank), got ", dy.ToString());
  }
  ctx.SetOutput(0, ctx.input_dtype(2), std::move(out));
  return absl::OkStatus();
}

absl::Status InferSliceGrad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kGradFloat));
  for (int i = 2; i < 6 && i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i)) RETURN_IF_ERROR(ExpectDtype(ctx, i, {DataType::kInt32, DataType::kInt64}));
  ASSIGN_OR_RETURN(Shape out, ShapeFromInput(ctx, 1));
  const Shape& dy = ctx.input_shape(0);
  if (out.has_rank() && dy.has_rank() && out.rank() != dy.rank())
    return ctx.Error("expected dY of the shape's rank ", out.rank(), ", got ", dy.ToString());
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(out));
  return absl::OkStatus();
}

absl::Status InferSoftmaxCrossEntropyLossGrad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kGradFloat));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, kGradFloat));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kInt32, DataType::kInt64}));
  if (ctx.input_dtype(0) != ctx.input_dtype(1))
    return ctx.Error("expected dY and log_prob of one dtype, got ", DataTypeName(ctx.input_dtype(0)),
                     " and ", DataTypeName(ctx.input_dtype(1)));
  if (ctx.has_input(3) && ctx.input_dtype(3) != ctx.input_dtype(1))
    return ctx.Error("expected weights of log_prob's dtype ", DataTypeName(ctx.input_dtype(1)),
                     ", got ", DataTypeName(ctx.input_dtype(3)));
  const std::string reduction = ctx.node().AttrString("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return ctx.Error("expected reduction 'none', 'sum' or 'mean', got '", reduction, "'");
  const Shape& lp = ctx.input_shape(1);
  const Shape& labels = ctx.input_shape(2);
  if (lp.has_rank() && lp.rank() < 2)
    return ctx.Error("expected log_prob of rank >= 2 ([N, C, ...]), got ", lp.ToString());
  if (lp.has_rank() && labels.has_rank() && labels.rank() != lp.rank() - 1)
    return ctx.Error("expected labels of rank ", lp.rank() - 1, " (log_prob's without the class dim), got ",
                     labels.ToString());
  const Shape& dy = ctx.input_shape(0);
  if (reduction != "none" && dy.has_rank() && dy.rank() != 0)
    return ctx.Error("expected a scalar dY for reduction '", reduction, "', got ", dy.ToString());
  ctx.SetOutput(0, ctx.input_dtype(1), lp);
  return absl::OkStatus();
}

}  // namespace cleave::graph
