// Shape inference for the reshaping ops (graph/): Reshape, Squeeze, Unsqueeze, Flatten,
// Expand, Shape, ConstantOfShape, Range, Identity, Constant. Shape arguments are read from
// initializers when constant, so dims come out static or symbolic wherever the values allow;
// otherwise the rank is kept when it is knowable and only the rank is lost when it is not.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_shape_util.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

// The -1 entry of a Reshape: input elements / the other output dims. Works on symbols as
// well as numbers: [batch, seq, 64] -> [0, -1, 64] cancels batch and 64 and leaves seq.
Dim InferMinusOne(const Shape& in, const std::vector<Dim>& out, int minus_one) {
  DimProduct num = DimProduct::Of(in.dims(), 0, in.rank());
  DimProduct den;
  for (int k = 0; k < static_cast<int>(out.size()); ++k)
    if (k != minus_one) den.Mul(out[k]);
  return num.DivideBy(den);
}

}  // namespace

absl::Status InferReshape(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  const bool allow_zero = ctx.version() >= 14 && ctx.node().AttrInt("allowzero", 0) != 0;
  std::optional<std::vector<int64_t>> target = ConstantInts(ctx, 1);
  if (!target) {
    std::optional<int64_t> n = StaticLength(ctx.input_shape(1));
    ctx.SetOutput(0, t, n ? UnknownDims(static_cast<int>(*n)) : Shape());
    return absl::OkStatus();
  }
  std::vector<Dim> out(target->size());
  int minus_one = -1;
  bool has_zero = false;
  for (int k = 0; k < static_cast<int>(target->size()); ++k) {
    int64_t v = (*target)[k];
    if (v == -1) {
      if (minus_one >= 0)
        return ctx.Error("shape ", absl::StrJoin(*target, ","), " has more than one -1");
      minus_one = k;
    } else if (v == 0 && !allow_zero) {
      if (in.has_rank() && k >= in.rank())
        return ctx.Error("shape entry ", k, " is 0 (copy the input dim) but the input ",
                         in.ToString(), " has rank ", in.rank());
      out[k] = in.has_rank() ? in[k] : Dim();
    } else if (v < 0) {
      return ctx.Error("shape entry ", k, " is ", v, ", expected >= -1");
    } else {
      has_zero |= v == 0;
      out[k] = Dim(v);
    }
  }
  if (minus_one >= 0) {
    if (has_zero)
      return ctx.Error("shape ", absl::StrJoin(*target, ","),
                       " has both -1 and a literal 0 (allowzero=1), which is ambiguous");
    out[minus_one] = in.has_rank() ? InferMinusOne(in, out, minus_one) : Dim();
  }
  Shape result(std::move(out));
  int64_t n_in = in.NumElements(), n_out = result.NumElements();
  if (n_in >= 0 && minus_one >= 0 && !result[minus_one].is_static())
    return ctx.Error("cannot reshape ", in.ToString(), " (", n_in, " elements) to shape ",
                     absl::StrJoin(*target, ","), ": the other dims do not divide ", n_in);
  if (n_in >= 0 && n_out >= 0 && n_in != n_out)
    return ctx.Error("cannot reshape ", in.ToString(), " (", n_in, " elements) to ",
                     result.ToString(), " (", n_out, " elements)");
  ctx.SetOutput(0, t, std::move(result));
  return absl::OkStatus();
}

namespace {

// Squeeze's axes: an attribute before version 13, an optional input from 13. Returns
// nullopt when they are given but not constant; an empty vector when omitted (squeeze all).
std::optional<std::vector<int64_t>> SqueezeAxes(const InferContext& ctx) {
  if (ctx.version() < 13) return ctx.node().AttrInts("axes");
  if (!ctx.has_input(1)) return std::vector<int64_t>{};
  return ConstantInts(ctx, 1);
}

}  // namespace

absl::Status InferSqueeze(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  std::optional<std::vector<int64_t>> axes = SqueezeAxes(ctx);
  if (!in.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  if (!axes) {  // a runtime axes input: only its length can tell the rank
    std::optional<int64_t> n = StaticLength(ctx.input_shape(1));
    ctx.SetOutput(0, t, n ? UnknownDims(in.rank() - static_cast<int>(*n)) : Shape());
    return absl::OkStatus();
  }
  std::vector<bool> drop(in.rank(), false);
  if (axes->empty()) {
    // Squeeze every size-1 dim; a dim not known statically might be 1, so the rank is
    // only known when every dim is static.
    if (!in.is_static()) {
      ctx.SetOutput(0, t, Shape());
      return absl::OkStatus();
    }
    for (int k = 0; k < in.rank(); ++k) drop[k] = in[k].value == 1;
  }
  for (int64_t a : *axes) {
    ASSIGN_OR_RETURN(int k, NormalizeAxis(ctx, a, in.rank()));
    if (drop[k]) return ctx.Error("axis ", a, " is repeated in axes");
    if (in[k].is_static() && in[k].value != 1)
      return ctx.Error("cannot squeeze axis ", a, " of ", in.ToString(), ": its size is ",
                       in[k].value, ", expected 1");
    drop[k] = true;
  }
  std::vector<Dim> out;
  for (int k = 0; k < in.rank(); ++k)
    if (!drop[k]) out.push_back(in[k]);
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferUnsqueeze(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  std::optional<std::vector<int64_t>> axes;
  if (ctx.version() < 13) {
    if (!ctx.node().HasAttr("axes")) return ctx.Error("expected an 'axes' attribute, got none");
    axes = ctx.node().AttrInts("axes");
  } else {
    if (!ctx.has_input(1)) return ctx.Error("expected an 'axes' input, got none");
    axes = ConstantInts(ctx, 1);
  }
  if (!in.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  if (!axes) {
    std::optional<int64_t> n = StaticLength(ctx.input_shape(1));
    ctx.SetOutput(0, t, n ? UnknownDims(in.rank() + static_cast<int>(*n)) : Shape());
    return absl::OkStatus();
  }
  // Axes index the output, so negative ones count back from the output rank.
  const int out_rank = in.rank() + static_cast<int>(axes->size());
  std::vector<bool> inserted(out_rank, false);
  for (int64_t a : *axes) {
    if (a < -out_rank || a >= out_rank)
      return ctx.Error("axis ", a, " is out of range for output rank ", out_rank);
    int k = static_cast<int>(a < 0 ? a + out_rank : a);
    if (inserted[k]) return ctx.Error("axis ", a, " is repeated in axes");
    inserted[k] = true;
  }
  std::vector<Dim> out;
  int j = 0;
  for (int k = 0; k < out_rank; ++k) out.push_back(inserted[k] ? Dim(1) : in[j++]);
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferFlatten(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  const int64_t axis = ctx.node().AttrInt("axis", 1);
  if (!in.has_rank()) {
    ctx.SetOutput(0, t, Shape({axis == 0 ? Dim(1) : Dim(), Dim()}));
    return absl::OkStatus();
  }
  // Flatten's axis ranges over [-r, r]: axis == r puts every dim in the outer product.
  const int r = in.rank();
  if (axis < -r || axis > r)
    return ctx.Error("axis ", axis, " is out of range for rank ", r, ", expected [", -r, ", ",
                     r, "]");
  const int a = static_cast<int>(axis < 0 ? axis + r : axis);
  Dim outer = DimProduct::Of(in.dims(), 0, a).ToDim();
  Dim inner = DimProduct::Of(in.dims(), a, r).ToDim();
  ctx.SetOutput(0, t, Shape({outer, inner}));
  return absl::OkStatus();
}

absl::Status InferExpand(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  if (std::optional<std::vector<int64_t>> target = ConstantInts(ctx, 1)) {
    ASSIGN_OR_RETURN(Shape out, BroadcastShapes(ctx, {in, Shape::FromDims(*target)}));
    ctx.SetOutput(0, t, std::move(out));
    return absl::OkStatus();
  }
  std::optional<int64_t> n = StaticLength(ctx.input_shape(1));
  if (!n || !in.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  // The runtime shape is unknown, but an input dim > 1 can only broadcast to itself.
  const int rank = std::max(static_cast<int>(*n), in.rank());
  std::vector<Dim> out(rank);
  for (int k = 0; k < in.rank(); ++k)
    if (in[k].is_static() && in[k].value > 1) out[rank - in.rank() + k] = in[k];
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferShape(InferContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  if (!in.has_rank()) {
    ctx.SetOutput(0, DataType::kInt64, UnknownDims(1));
    return absl::OkStatus();
  }
  // start/end (version 15) are clamped into [0, r] after adding r to negatives.
  const int64_t r = in.rank();
  int64_t start = 0, end = r;
  if (ctx.version() >= 15) {
    start = ctx.node().AttrInt("start", 0);
    end = ctx.node().AttrInt("end", r);
  }
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  ctx.SetOutput(0, DataType::kInt64, Shape({Dim(std::max<int64_t>(end - start, 0))}));
  return absl::OkStatus();
}

absl::Status InferSize(InferContext& ctx) {
  ctx.SetOutput(0, DataType::kInt64, Shape::Scalar());
  return absl::OkStatus();
}

absl::Status InferCumSum(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  const Shape& a = ctx.input_shape(1);
  if (a.is_static() && a.NumElements() != 1)
    return ctx.Error("expected a one-element axis, got ", a.ToString());
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && x.rank() == 0) return ctx.Error("expected an input of rank >= 1, got a scalar");
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

absl::Status InferArgExtreme(InferContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, DataType::kInt64, Shape());
    return absl::OkStatus();
  }
  const int r = x.rank();
  if (r == 0) return ctx.Error("expected an input of rank >= 1, got a scalar");
  ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), r));
  const bool keepdims = ctx.node().AttrInt("keepdims", 1) != 0;
  std::vector<Dim> out;
  for (int k = 0; k < r; ++k) {
    if (k != axis) out.push_back(x[k]);
    else if (keepdims) out.push_back(Dim(1));
  }
  ctx.SetOutput(0, DataType::kInt64, Shape(std::move(out)));
  return absl::OkStatus();
}

namespace {

// GatherND's output and ScatterND's updates: indices [batch (b)..., tuples..., k] and data
// [batch..., indexed (k)..., slice...] -> [batch..., tuples..., slice...]; unknown rank where k is.
absl::StatusOr<Shape> NdGathered(const InferContext& ctx, int64_t b) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Shape& x = ctx.input_shape(0);
  const Shape& idx = ctx.input_shape(1);
  if (!x.has_rank() || !idx.has_rank()) return Shape();
  if (idx.rank() < 1) return ctx.Error("expected indices of rank >= 1, got a scalar");
  if (b < 0 || b >= std::min(x.rank(), idx.rank()))
    return ctx.Error("batch_dims ", b, " must be below both ranks (data ", x.ToString(), ", indices ", idx.ToString(), ")");
  const Dim& k = idx[idx.rank() - 1];
  if (!k.is_static()) return Shape();
  if (k.value < 1 || k.value > x.rank() - b)
    return ctx.Error("the indices' last dim is ", k.value, "; expected 1 to ", x.rank() - b,
                     " coordinates (the data's rank less batch_dims)");
  std::vector<Dim> out(idx.dims().begin(), idx.dims().end() - 1);
  for (int d = static_cast<int>(b + k.value); d < x.rank(); ++d) out.push_back(x[d]);
  return Shape(std::move(out));
}

}  // namespace

absl::Status InferGatherND(InferContext& ctx) {
  ASSIGN_OR_RETURN(Shape out, NdGathered(ctx, ctx.version() >= 12 ? ctx.node().AttrInt("batch_dims", 0) : 0));
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(out));
  return absl::OkStatus();
}

absl::Status InferScatterND(InferContext& ctx) {
  ASSIGN_OR_RETURN(Shape want, NdGathered(ctx, 0));
  const Shape& upd = ctx.input_shape(2);
  if (ctx.input_dtype(2) != ctx.input_dtype(0) && ctx.input_dtype(2) != DataType::kUndefined)
    return ctx.Error("updates have dtype ", DataTypeName(ctx.input_dtype(2)), ", expected the data's ",
                     DataTypeName(ctx.input_dtype(0)));
  if (want.is_static() && upd.is_static() && want.StaticDims() != upd.StaticDims())
    return ctx.Error("expected updates ", want.ToString(),
                     " (the indices' dims less the last, then the data's after the indexed ones), got ", upd.ToString());
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

// TopK (X, K) from version 10, (X) with attribute k in version 1: k along the axis; k must not
// exceed the axis where both are known.
absl::Status InferTopK(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                                       DataType::kInt32, DataType::kInt64, DataType::kInt8, DataType::kUInt8}));
  std::optional<int64_t> k;
  if (ctx.version() < 10) {
    if (!ctx.node().HasAttr("k")) return ctx.Error("has no 'k' attribute (TopK 1 takes k as one)");
    k = ctx.node().AttrInt("k", 0);
  } else {
    if (!ctx.has_input(1)) return ctx.Error("has no K input (TopK 10 and later take k as input 1)");
    RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
    const Shape& ks = ctx.input_shape(1);
    if (ks.is_static() && (ks.rank() != 1 || ks.NumElements() != 1))
      return ctx.Error("expected K of shape [1], got ", ks.ToString());
    if (auto v = ConstantInts(ctx, 1)) k = (*v)[0];
  }
  if (k && *k < 0) return ctx.Error("k is ", *k, "; expected k >= 0");
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    ctx.SetOutput(1, DataType::kInt64, Shape());
    return absl::OkStatus();
  }
  if (x.rank() == 0) return ctx.Error("expected an input of rank >= 1, got a scalar");
  ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", -1), x.rank()));
  if (k && x[axis].is_static() && *k > x[axis].value)
    return ctx.Error("k is ", *k, ", more than the ", x[axis].value, " elements along axis ", axis, " of ", x.ToString());
  std::vector<Dim> out = x.dims();
  out[axis] = k ? Dim(*k) : Dim();
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(out));
  ctx.SetOutput(1, DataType::kInt64, Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferConstantOfShape(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kInt64}));
  DataType t = DataType::kFloat32;  // the spec's default value is a float32 zero
  if (const Attribute* value = ctx.node().FindAttr("value")) {
    if (value->type != AttrType::kTensor || value->t.numel() != 1)
      return ctx.Error("expected 'value' to be a one-element tensor, got ",
                       value->type == AttrType::kTensor
                           ? absl::StrCat(value->t.numel(), " elements")
                           : std::string("a non-tensor attribute"));
    t = value->t.dtype();
  }
  if (std::optional<std::vector<int64_t>> dims = ConstantInts(ctx, 0)) {
    for (int64_t d : *dims)
      if (d < 0) return ctx.Error("shape ", absl::StrJoin(*dims, ","), " has a negative dim");
    ctx.SetOutput(0, t, Shape::FromDims(*dims));
    return absl::OkStatus();
  }
  std::optional<int64_t> n = StaticLength(ctx.input_shape(0));
  ctx.SetOutput(0, t, n ? UnknownDims(static_cast<int>(*n)) : Shape());
  return absl::OkStatus();
}

absl::Status InferRange(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kInt16,
                                       DataType::kInt32, DataType::kInt64}));
  const DataType t = ctx.input_dtype(0);
  for (int i = 1; i < 3; ++i)
    if (ctx.input_dtype(i) != t && ctx.input_dtype(i) != DataType::kUndefined)
      return ctx.Error("input ", i, " has dtype ", DataTypeName(ctx.input_dtype(i)),
                       ", expected ", DataTypeName(t), " like start");
  const Tensor* start = ctx.input_constant(0);
  const Tensor* limit = ctx.input_constant(1);
  const Tensor* delta = ctx.input_constant(2);
  if (!start || !limit || !delta || start->numel() != 1 || limit->numel() != 1 ||
      delta->numel() != 1) {
    ctx.SetOutput(0, t, UnknownDims(1));
    return absl::OkStatus();
  }
  int64_t n;
  if (IsFloat(t)) {
    double d = delta->DoubleAt(0);
    if (d == 0) return ctx.Error("delta is 0, expected non-zero");
    double count = std::ceil((limit->DoubleAt(0) - start->DoubleAt(0)) / d);
    n = count > 0 ? static_cast<int64_t>(count) : 0;
  } else {
    int64_t d = delta->IntAt(0);
    if (d == 0) return ctx.Error("delta is 0, expected non-zero");
    n = CeilDivNonNegative(limit->IntAt(0) - start->IntAt(0), d);
  }
  ctx.SetOutput(0, t, Shape({Dim(n)}));
  return absl::OkStatus();
}

absl::Status InferIdentity(InferContext& ctx) { return InferSameAsInput0(ctx); }

absl::Status InferConstant(InferContext& ctx) {
  const Node& n = ctx.node();
  static const char* const kForms[] = {"value",      "value_float",  "value_floats", "value_int",
                                       "value_ints", "value_string", "value_strings",
                                       "sparse_value"};
  std::vector<std::string> present;
  for (const char* f : kForms)
    if (n.HasAttr(f)) present.emplace_back(f);
  if (present.size() != 1)
    return ctx.Error("expected exactly one of value, sparse_value or value_* attributes, got ",
                     present.empty() ? std::string("none") : absl::StrJoin(present, ", "));
  const std::string& form = present[0];
  const Attribute& a = *n.FindAttr(form);
  if (form == "value" || form == "sparse_value") {
    // A sparse value arrives densified when the importer can do it; otherwise its type is
    // unknown here and the provider reports the node as unsupported.
    if (a.type == AttrType::kTensor && a.t.defined())
      ctx.SetOutput(0, a.t.dtype(), Shape::FromDims(a.t.dims()));
    else if (form == "value")
      return ctx.Error("expected 'value' to be a tensor attribute");
    return absl::OkStatus();
  }
  auto list = [](size_t n) { return Shape({Dim(static_cast<int64_t>(n))}); };
  if (form == "value_float") ctx.SetOutput(0, DataType::kFloat32, Shape::Scalar());
  else if (form == "value_floats") ctx.SetOutput(0, DataType::kFloat32, list(a.floats.size()));
  else if (form == "value_int") ctx.SetOutput(0, DataType::kInt64, Shape::Scalar());
  else if (form == "value_ints") ctx.SetOutput(0, DataType::kInt64, list(a.ints.size()));
  else if (form == "value_string") ctx.SetOutput(0, DataType::kString, Shape::Scalar());
  else ctx.SetOutput(0, DataType::kString, list(a.strings.size()));  // value_strings
  return absl::OkStatus();
}

}  // namespace cleave::graph
