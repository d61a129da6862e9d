// Shape inference for the ai.cleave gradient ops (graph/): GatherGrad and SliceGrad produce
// a tensor of their `shape` input's value (static or symbolic where the value is known from
// a constant or a Shape node, unknown dims otherwise); SoftmaxCrossEntropyLossGrad produces
// the scores' shape, which is log_prob's. The activation and normalisation gradients
// (SoftmaxGrad, LogSoftmaxGrad, GeluGrad, LayerNormalizationGrad) give each gradient the
// shape of the forward tensor it belongs to.
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

// Input i must have input j's dtype.
absl::Status ExpectDtypeOf(const InferContext& ctx, int i, int j) {
  if (ctx.input_dtype(i) == ctx.input_dtype(j)) return absl::OkStatus();
  return ctx.Error("expected input ", i, " '", ctx.node().input(i)->name(), "' of the dtype ",
                   DataTypeName(ctx.input_dtype(j)), " of input ", j, ", got ",
                   DataTypeName(ctx.input_dtype(i)));
}

// dY must have the shape of the forward tensor at input `of` (compared where both are known).
absl::Status ExpectGradShape(const InferContext& ctx, int of) {
  const Shape& dy = ctx.input_shape(0);
  const Shape& t = ctx.input_shape(of);
  if (!dy.has_rank() || !t.has_rank()) return absl::OkStatus();
  bool ok = dy.rank() == t.rank();
  for (int k = 0; ok && k < dy.rank(); ++k)
    ok = !(dy[k].is_static() && t[k].is_static() && dy[k].value != t[k].value);
  if (ok) return absl::OkStatus();
  return ctx.Error("expected dY of the shape of '", ctx.node().input(of)->name(), "' ",
                   t.ToString(), ", got ", dy.ToString());
}

// Output 0 has input `of`'s dtype and shape (dY's shape when that is unknown).
absl::Status InferGradLike(InferContext& ctx, int of) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kGradFloat));
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, of, 0));
  RETURN_IF_ERROR(ExpectGradShape(ctx, of));
  const Shape& t = ctx.input_shape(of);
  ctx.SetOutput(0, ctx.input_dtype(0), t.has_rank() ? t : ctx.input_shape(0));
  return absl::OkStatus();
}

// Checks that mean / inv_std_dev (input i) has X's dims with X[axis:] reduced to 1.
absl::Status ExpectStatisticsShape(const InferContext& ctx, int i, int axis) {
  const Shape& x = ctx.input_shape(1);
  const Shape& s = ctx.input_shape(i);
  if (!s.has_rank()) return absl::OkStatus();
  bool ok = s.rank() == x.rank();
  for (int k = 0; ok && k < s.rank(); ++k) {
    const Dim want = k < axis ? x[k] : Dim(1);
    ok = !(s[k].is_static() && want.is_static() && s[k].value != want.value);
  }
  if (ok) return absl::OkStatus();
  std::vector<Dim> want = x.dims();
  for (int k = axis; k < x.rank(); ++k) want[k] = Dim(1);
  return ctx.Error("expected input ", i, " '", ctx.node().input(i)->name(), "' of shape ",
                   Shape(want).ToString(), " (X's with the normalised axes reduced to 1), got ",
                   s.ToString());
}

// scale (input 2) must broadcast, right-aligned, over the normalised dims X[axis:].
absl::Status ExpectScaleShape(const InferContext& ctx, int axis) {
  const Shape& x = ctx.input_shape(1);
  const Shape& s = ctx.input_shape(2);
  if (!s.has_rank()) return absl::OkStatus();
  bool ok = s.rank() <= x.rank() - axis;
  for (int k = 0; ok && k < s.rank(); ++k) {
    const Dim& d = s[k];
    const Dim& want = x[x.rank() - s.rank() + k];
    ok = !(d.is_static() && d.value != 1 && want.is_static() && d.value != want.value);
  }
  if (ok) return absl::OkStatus();
  return ctx.Error("expected scale to broadcast over the normalised dims of X ", x.ToString(),
                   " from axis ", axis, ", got ", s.ToString());
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
  // A base (dY's type, the table's shape) that dX starts from instead of zeros, and its reset
  // flag (base ignored when set): an accumulated gradient the scatter adds to.
  if (ctx.num_inputs() > 4 && ctx.has_input(4) && !ctx.has_input(3))
    return ctx.Error("expected a base (input 3) with the reset flag (input 4)");
  if (ctx.num_inputs() > 3 && ctx.has_input(3)) {
    RETURN_IF_ERROR(ExpectDtype(ctx, 3, {ctx.input_dtype(2)}));
    const Shape& base = ctx.input_shape(3);
    if (base.is_static() && out.is_static() && base != out)
      return ctx.Error("expected a base of the table's shape ", out.ToString(), ", got ", base.ToString());
    if (!out.has_rank()) out = base;
  }
  if (ctx.num_inputs() > 4 && ctx.has_input(4)) RETURN_IF_ERROR(ExpectDtype(ctx, 4, {DataType::kBool}));
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
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kInt32, DataType::kInt64}));
  // From the scores, bf16 / fp16 scores (a mixed-precision logits product) are read as float32
  // with a float32 dY, and the loss is float32.
  const bool from_scores = ctx.node().AttrInt("from_scores", 0) != 0;
  const DataType scores = ctx.input_dtype(1);
  const bool low_scores = from_scores && (scores == DataType::kBFloat16 || scores == DataType::kFloat16);
  if (low_scores) {
    if (ctx.input_dtype(0) != DataType::kFloat32 || ctx.has_input(3))
      return ctx.Error("expected a float32 dY and no weights with ", DataTypeName(scores), " scores, got dY ",
                       DataTypeName(ctx.input_dtype(0)));
  } else {
    RETURN_IF_ERROR(ExpectDtype(ctx, 1, kGradFloat));
    if (ctx.input_dtype(0) != ctx.input_dtype(1))
      return ctx.Error("expected dY and log_prob of one dtype, got ", DataTypeName(ctx.input_dtype(0)),
                       " and ", DataTypeName(ctx.input_dtype(1)));
  }
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
  // `to`: the gradient's storage type (mixed precision reads it in bf16 or fp16 next); else
  // that of the scores (log_prob), or float32 for bf16 / fp16 scores.
  DataType out = low_scores ? ctx.input_dtype(0) : ctx.input_dtype(1);
  if (ctx.node().HasAttr("to")) {
    out = DataTypeFromInt(static_cast<int>(ctx.node().AttrInt("to", 0)));
    if (out != DataType::kFloat32 && out != DataType::kBFloat16 && out != DataType::kFloat16 &&
        out != DataType::kFloat64)
      return ctx.Error("expected 'to' a float type, got ", ctx.node().AttrInt("to", 0));
  }
  ctx.SetOutput(0, out, lp);
  // The optional loss: the forward's output, from the scores (the forward folded in).
  if (ctx.num_outputs() > 1 && ctx.node().output(1)) {
    if (ctx.node().AttrInt("from_scores", 0) == 0 || ctx.node().AttrInt("class_offset", 0) != 0 ||
        ctx.node().AttrInt("num_classes", 0) != 0 || ctx.has_input(3))
      return ctx.Error("output 1 (the loss) needs from_scores = 1 and no class_offset, num_classes or weights");
    ctx.SetOutput(1, ctx.input_dtype(0), reduction == "none" ? labels : Shape::Scalar());
  }
  return absl::OkStatus();
}

absl::Status InferSoftmaxGrad(InferContext& ctx) {
  RETURN_IF_ERROR(InferGradLike(ctx, 1));
  const Shape& y = ctx.input_shape(1);
  if (y.has_rank()) RETURN_IF_ERROR(NormalizeAxis(ctx, ctx.node().AttrInt("axis", -1), y.rank()).status());
  return absl::OkStatus();
}

absl::Status InferGeluGrad(InferContext& ctx) {
  const std::string approximate = ctx.node().AttrString("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    return ctx.Error("expected approximate 'none' or 'tanh', got '", approximate, "'");
  // Like Gelu, in bf16 and fp16 too (a mixed-precision graph's MLP).
  RETURN_IF_ERROR(
      ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}));
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, 1, 0));
  RETURN_IF_ERROR(ExpectGradShape(ctx, 1));
  const Shape& x = ctx.input_shape(1);
  ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? x : ctx.input_shape(0));
  return absl::OkStatus();
}

// SwiGLU(gate, up) -> y and SwiGLUGrad(dY, gate, up) -> dGate, dUp: every operand of one dtype
// and shape (compared where both are known).
absl::Status InferSwiGlu(InferContext& ctx) {
  RETURN_IF_ERROR(
      ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}));
  Shape shape = ctx.input_shape(0);
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    RETURN_IF_ERROR(ExpectDtypeOf(ctx, i, 0));
    const Shape& s = ctx.input_shape(i);
    if (!s.has_rank()) continue;
    if (!shape.has_rank()) {
      shape = s;
      continue;
    }
    bool ok = s.rank() == shape.rank();
    for (int k = 0; ok && k < s.rank(); ++k)
      ok = !(s[k].is_static() && shape[k].is_static() && s[k].value != shape[k].value);
    if (!ok)
      return ctx.Error("expected input ", i, " '", ctx.node().input(i)->name(), "' of input 0's shape ",
                       ctx.input_shape(0).ToString(), ", got ", s.ToString());
  }
  // The gate's dims where known (the gradients take them), else the others'.
  const Shape& gate = ctx.input_shape(ctx.num_inputs() == 3 ? 1 : 0);
  for (int o = 0; o < ctx.num_outputs(); ++o) ctx.SetOutput(o, ctx.input_dtype(0), gate.has_rank() ? gate : shape);
  return absl::OkStatus();
}

// RotaryEmbedding(x, cos, sin) -> y and RotaryEmbeddingGrad(dY, cos, sin) -> dX: x's shape and
// type; cos and sin of x's type and one shape, broadcasting to x with a last dim of x's or 1, and
// x's last dim even.
absl::Status InferRotary(InferContext& ctx) {
  RETURN_IF_ERROR(
      ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}));
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, 1, 0));
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, 2, 0));
  const Shape &x = ctx.input_shape(0), &c = ctx.input_shape(1), &s = ctx.input_shape(2);
  if (c.has_rank() && s.has_rank() && c.is_static() && s.is_static() && c != s)
    return ctx.Error("expected cos and sin of one shape, got ", c.ToString(), " and ", s.ToString());
  if (x.has_rank() && c.has_rank()) {
    bool ok = x.rank() >= 1 && c.rank() <= x.rank() && !(x[x.rank() - 1].is_static() && x[x.rank() - 1].value % 2);
    for (int k = 0; ok && k < c.rank(); ++k) {
      const Dim& d = c[k];
      const Dim& want = x[x.rank() - c.rank() + k];
      ok = !(d.is_static() && d.value != 1 && want.is_static() && d.value != want.value);
    }
    if (!ok)
      return ctx.Error("expected x with an even last dim and cos/sin broadcasting to it, got x ", x.ToString(),
                       " and cos ", c.ToString());
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

absl::Status InferLayerNormGrad(InferContext& ctx) {
  // RMSNormalizationGrad has no mean input and no dBias output, so InvStdDev, dX_add and
  // dX_low sit one place earlier.
  const NormGradSlots slots = NormGradSlotsOf(ctx.node());
  const bool rms = slots.rms;
  const int inv = slots.inv_std, add_in = slots.dx_add, low_out = slots.dx_low;
  // dY in X's type, or bf16 / fp16 with a float32 X (a low-precision product's result, read
  // as float32).
  const DataType dy = ctx.input_dtype(0);
  if ((dy == DataType::kBFloat16 || dy == DataType::kFloat16) && ctx.input_dtype(1) == DataType::kFloat32) {
    RETURN_IF_ERROR(ExpectGradShape(ctx, 1));
    ctx.SetOutput(0, DataType::kFloat32, ctx.input_shape(1).has_rank() ? ctx.input_shape(1) : ctx.input_shape(0));
  } else {
    RETURN_IF_ERROR(InferGradLike(ctx, 1));
  }
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, 2, 1));
  RETURN_IF_ERROR(ExpectDtype(ctx, 3, kGradFloat));
  RETURN_IF_ERROR(ExpectDtypeOf(ctx, inv, 3));
  const Shape& x = ctx.input_shape(1);
  if (x.has_rank()) {
    ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", -1), x.rank()));
    RETURN_IF_ERROR(ExpectScaleShape(ctx, axis));
    RETURN_IF_ERROR(ExpectStatisticsShape(ctx, 3, axis));
    RETURN_IF_ERROR(ExpectStatisticsShape(ctx, inv, axis));
  }
  // dX_add (optional): a gradient of X's shape and type added to dX (the residual stream's).
  if (ctx.has_input(add_in)) {
    RETURN_IF_ERROR(ExpectDtypeOf(ctx, add_in, 1));
    const Shape& add = ctx.input_shape(add_in);
    if (x.has_rank() && add.has_rank() && x.is_static() && add.is_static() && add != x)
      return ctx.Error("expected dX_add of X's shape ", x.ToString(), ", got ", add.ToString());
  }
  // dScale and dBias: scale's shape (the sums also run over axes along which scale broadcasts).
  ctx.SetOutput(1, ctx.input_dtype(2), ctx.input_shape(2));
  if (!rms) ctx.SetOutput(2, ctx.input_dtype(2), ctx.input_shape(2));
  // dX_low (optional): a float32 dX also written rounded to bf16 / fp16, for the products that
  // read the residual stream's gradient in that type.
  if (ctx.num_outputs() > low_out && ctx.has_output(low_out)) {
    const int64_t low = ctx.node().AttrInt("low_to", static_cast<int64_t>(DataType::kBFloat16));
    if (low != static_cast<int64_t>(DataType::kBFloat16) && low != static_cast<int64_t>(DataType::kFloat16))
      return ctx.Error("attribute low_to = ", low, ": expected 16 (bfloat16) or 10 (float16)");
    if (ctx.input_dtype(1) != DataType::kFloat32)
      return ctx.Error("dX_low rounds a float32 dX, got X of ", DataTypeName(ctx.input_dtype(1)));
    ctx.SetOutput(low_out, static_cast<DataType>(low), ctx.input_shape(1));
  }
  return absl::OkStatus();
}

}  // namespace cleave::graph
