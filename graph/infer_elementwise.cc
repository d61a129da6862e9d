// Shape and type inference for elementwise ops (graph/): unary math, broadcasting binary
// ops, comparisons and logic, variadic Max/Min, Where, Clip and Cast.
// Outputs keep symbolic dims through broadcasting; an unknown-rank input gives an
// unknown-rank output. Dtype mismatches ONNX forbids are reported here, at load.
#include <string>

#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

// Inputs [first, last] (present ones) must share a dtype; returns it (kUndefined when
// none is known yet).
absl::StatusOr<DataType> CommonDtype(const InferContext& ctx, int first, int last) {
  DataType common = DataType::kUndefined;
  int common_input = -1;
  for (int i = first; i <= last; ++i) {
    if (!ctx.has_input(i)) continue;
    DataType t = ctx.input_dtype(i);
    if (t == DataType::kUndefined) continue;
    if (common == DataType::kUndefined) {
      common = t;
      common_input = i;
    } else if (t != common) {
      return ctx.Error("expected inputs of one dtype, got ", DataTypeName(common), " for input ",
                       common_input, " '", ctx.node().input(common_input)->name(), "' and ",
                       DataTypeName(t), " for input ", i, " '", ctx.node().input(i)->name(), "'");
    }
  }
  return common;
}

absl::StatusOr<Shape> BroadcastInputs(const InferContext& ctx, int first, int last) {
  std::vector<Shape> shapes;
  for (int i = first; i <= last; ++i)
    if (ctx.has_input(i)) shapes.push_back(ctx.input_shape(i));
  return BroadcastShapes(ctx, shapes);
}

absl::Status ExpectNumeric(const InferContext& ctx, int i) {
  DataType t = ctx.input_dtype(i);
  if (t == DataType::kUndefined || IsFloat(t) || IsInteger(t)) return absl::OkStatus();
  return ctx.Error("input ", i, " '", ctx.node().input(i)->name(), "' has dtype ",
                   DataTypeName(t), ", expected a float or integer type");
}

}  // namespace

absl::Status InferUnary(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  return InferSameAsInput0(ctx);
}

absl::Status InferUnaryFloat(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(
      ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  return InferSameAsInput0(ctx);
}

absl::Status InferBinaryArith(InferContext& ctx) {
  ASSIGN_OR_RETURN(DataType t, CommonDtype(ctx, 0, 1));
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, t, std::move(s));
  return absl::OkStatus();
}

// BitwiseAnd, BitwiseOr, BitwiseXor, BitShift (direction LEFT or RIGHT) and BitwiseNot: integer
// inputs of one type, broadcast.
absl::Status InferBitwise(InferContext& ctx) {
  const Node& n = ctx.node();
  if (n.op_type() == "BitShift") {
    const std::string d = n.AttrString("direction", "");
    if (d != "LEFT" && d != "RIGHT") return ctx.Error("direction '", d, "' is neither LEFT nor RIGHT");
  }
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kInt8, DataType::kInt16, DataType::kInt32, DataType::kInt64,
                                       DataType::kUInt8, DataType::kUInt16, DataType::kUInt32, DataType::kUInt64}));
  if (ctx.num_inputs() == 1) return InferSameAsInput0(ctx);
  ASSIGN_OR_RETURN(DataType t, CommonDtype(ctx, 0, 1));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, t, std::move(s));
  return absl::OkStatus();
}

// PRelu (X, slope): Y of X's shape and type, the slope broadcasting to X (unidirectionally).
absl::Status InferPRelu(InferContext& ctx) {
  ASSIGN_OR_RETURN(DataType t, CommonDtype(ctx, 0, 1));
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && s.has_rank() && (s.rank() != x.rank() || [&] {
        for (int i = 0; i < x.rank(); ++i)
          if (x[i].is_static() && s[i].is_static() && x[i].value != s[i].value) return true;
        return false;
      }()))
    return ctx.Error("slope ", ctx.input_shape(1).ToString(), " does not broadcast to X ", x.ToString());
  ctx.SetOutput(0, t, x);
  return absl::OkStatus();
}

absl::Status InferPow(InferContext& ctx) {
  // The exponent may have its own numeric type (from version 12); the result has the base's.
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  RETURN_IF_ERROR(ExpectNumeric(ctx, 1));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(s));
  return absl::OkStatus();
}

absl::Status InferCompare(InferContext& ctx) {
  RETURN_IF_ERROR(CommonDtype(ctx, 0, 1).status());
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, DataType::kBool, std::move(s));
  return absl::OkStatus();
}

absl::Status InferLogical(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kBool}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kBool}));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 1));
  ctx.SetOutput(0, DataType::kBool, std::move(s));
  return absl::OkStatus();
}

absl::Status InferNot(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kBool}));
  ctx.SetOutput(0, DataType::kBool, ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferVariadicMinMax(InferContext& ctx) {
  const int last = ctx.num_inputs() - 1;
  ASSIGN_OR_RETURN(DataType t, CommonDtype(ctx, 0, last));
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, last));
  ctx.SetOutput(0, t, std::move(s));
  return absl::OkStatus();
}

absl::Status InferWhere(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kBool}));
  ASSIGN_OR_RETURN(DataType t, CommonDtype(ctx, 1, 2));
  ASSIGN_OR_RETURN(Shape s, BroadcastInputs(ctx, 0, 2));
  ctx.SetOutput(0, t, std::move(s));
  return absl::OkStatus();
}

absl::Status InferClip(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectNumeric(ctx, 0));
  if (ctx.version() >= 11) {
    // min and max are optional inputs from version 11 (attributes before): scalars of the
    // input's dtype. A one-element tensor of any rank is accepted too, as exporters emit.
    RETURN_IF_ERROR(CommonDtype(ctx, 0, 2).status());
    for (int i = 1; i <= 2; ++i) {
      if (!ctx.has_input(i)) continue;
      const Shape& s = ctx.input_shape(i);
      int64_t n = s.NumElements();
      if (s.is_static() && n != 1)
        return ctx.Error("expected a scalar for input ", i, " '", ctx.node().input(i)->name(),
                         "' (", i == 1 ? "min" : "max", "), got shape ", s.ToString());
    }
  }
  return InferSameAsInput0(ctx);
}

absl::Status InferCast(InferContext& ctx) {
  const Attribute* to = ctx.node().FindAttr("to");
  if (!to || to->type != AttrType::kInt)
    return ctx.Error("expected an int attribute 'to' naming the target element type");
  DataType t = DataTypeFromInt(static_cast<int>(to->i));
  if (t == DataType::kUndefined)
    return absl::UnimplementedError(absl::StrCat(ctx.node().Describe(), ": Cast to element type ",
                                                 to->i, " is not supported"));
  ctx.SetOutput(0, t, ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferFloatClass(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(
      ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  ctx.SetOutput(0, DataType::kBool, ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferCastLike(InferContext& ctx) {
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(0));
  return absl::OkStatus();
}

}  // namespace cleave::graph
