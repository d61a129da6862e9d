// Shape and type inference of the ops that every session decomposes into other ops before it
// places the graph (graph/passes/decomposition.cc): Einsum, GroupNormalization, DepthToSpace,
// SpaceToDepth, OneHot, Hardmax, Shrink, EyeLike, LRN, MeanVarianceNormalization,
// LpNormalization, LpPool, GlobalLpPool, RNN, GRU, LSTM, the quantization ops, the window
// functions, CenterCropPad, ReverseSequence and MaxUnpool.
// Their inference validates what the decomposition relies on, so a bad model is refused here,
// naming the node, before anything is rewritten.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/einsum_equation.h"
#include "graph/infer_fns.h"
#include "graph/infer_util.h"
#include "graph/pool_geometry.h"

namespace cleave::graph {

namespace {

std::string DimString(const Dim& d) {
  if (d.is_static()) return std::to_string(d.value);
  return d.symbol.empty() ? "?" : d.symbol;
}

}  // namespace

absl::Status InferEinsum(InferContext& ctx) {
  const Node& n = ctx.node();
  if (!n.HasAttr("equation")) return ctx.Error("has no 'equation' attribute");
  const DataType t = ctx.input_dtype(0);
  for (int i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.input_dtype(i) != t && ctx.input_dtype(i) != DataType::kUndefined && t != DataType::kUndefined)
      return ctx.Error("input ", i, " has dtype ", DataTypeName(ctx.input_dtype(i)), ", expected ", DataTypeName(t),
                       " (the dtype of input 0)");
  std::vector<int> ranks;
  bool ranked = true;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    ranked &= ctx.input_shape(i).has_rank();
    ranks.push_back(ctx.input_shape(i).has_rank() ? ctx.input_shape(i).rank() : -1);
  }
  auto eq = ParseEinsumEquation(n.AttrString("equation", ""), ranks);
  if (!eq.ok()) return absl::Status(eq.status().code(), absl::StrCat(n.Describe(), ": ", eq.status().message()));
  if (!ranked) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  // Each label's size: the inputs must agree on it, except that an ellipsis axis of 1
  // broadcasts.
  std::map<int, Dim> size;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    for (int a = 0; a < s.rank(); ++a) {
      const int l = eq->inputs[i][a];
      auto [it, fresh] = size.emplace(l, s[a]);
      if (fresh) continue;
      Dim& d = it->second;
      const Dim& e = s[a];
      const bool ellipsis = EinsumEquation::IsEllipsis(l);
      if (ellipsis && e.is_static() && e.value == 1) continue;
      if (ellipsis && d.is_static() && d.value == 1) {
        d = e;
        continue;
      }
      if (d.is_static() && e.is_static() && d.value != e.value)
        return ctx.Error("label '", EinsumEquation::LabelName(l), "' has sizes ", d.value, " and ", e.value,
                         " (input ", i, "'s axis ", a, ")");
      if (!d.is_static() && e.is_static()) d = e;
    }
  }
  std::vector<Dim> out;
  for (int l : eq->output) out.push_back(size.at(l));
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

// GroupNormalization 18 (scale and bias [G]) and 21 (scale and bias [C]).
absl::Status InferGroupNormalization(InferContext& ctx) {
  const std::initializer_list<DataType> floats = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                                  DataType::kBFloat16};
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(ExpectDtype(ctx, i, floats));
  const int64_t groups = ctx.node().AttrInt("num_groups", 0);
  if (groups <= 0) return ctx.Error("expected a 'num_groups' attribute > 0, got ", groups);
  const Shape& x = ctx.input_shape(0);
  Dim channels;
  if (x.has_rank()) {
    if (x.rank() < 2) return ctx.Error("expected X [N, C, ...] of rank >= 2, got ", x.ToString());
    channels = x[1];
    if (channels.is_static() && channels.value % groups != 0)
      return ctx.Error("X's ", channels.value, " channels do not divide into num_groups = ", groups, " groups");
  }
  const Dim expected = ctx.version() >= 21 ? channels : Dim(groups);
  for (int i = 1; i < 3; ++i) {
    const Shape& s = ctx.input_shape(i);
    if (s.has_rank() && (s.rank() != 1 || (expected.is_static() && s[0].is_static() && s[0].value != expected.value)))
      return ctx.Error("input ", i, " '", ctx.node().input(i)->name(), "' is ", s.ToString(), "; expected [",
                       DimString(expected), "] (", ctx.version() >= 21 ? "X's channels" : "num_groups", ")");
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

// DepthToSpace: [N, C, H, W] -> [N, C / b², H b, W b]; SpaceToDepth the inverse.
absl::Status InferDepthSpace(InferContext& ctx) {
  const bool to_space = ctx.node().op_type() == "DepthToSpace";
  const int64_t b = ctx.node().AttrInt("blocksize", 0);
  if (b <= 0) return ctx.Error("expected a 'blocksize' attribute > 0, got ", b);
  if (to_space) {
    const std::string mode = ctx.node().AttrString("mode", "DCR");
    if (mode != "DCR" && mode != "CRD") return ctx.Error("mode '", mode, "' is neither DCR nor CRD");
  }
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  if (x.rank() != 4) return ctx.Error("expected X [N, C, H, W] of rank 4, got ", x.ToString());
  std::vector<Dim> out = x.dims();
  auto scaled = [](const Dim& d, int64_t f) { return d.is_static() ? Dim(d.value * f) : Dim(); };
  if (to_space) {
    if (x[1].is_static() && x[1].value % (b * b) != 0)
      return ctx.Error("X's ", x[1].value, " channels are not a multiple of blocksize² = ", b * b);
    out[1] = x[1].is_static() ? Dim(x[1].value / (b * b)) : Dim();
    out[2] = scaled(x[2], b);
    out[3] = scaled(x[3], b);
  } else {
    for (int a = 2; a < 4; ++a) {
      if (x[a].is_static() && x[a].value % b != 0)
        return ctx.Error("X's dim ", a, " (", x[a].value, ") is not a multiple of blocksize ", b);
      out[a] = x[a].is_static() ? Dim(x[a].value / b) : Dim();
    }
    out[1] = scaled(x[1], b * b);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// OneHot (indices, depth, values [off, on]): indices' shape with depth inserted at `axis`, in
// values' dtype.
absl::Status InferOneHot(InferContext& ctx) {
  const std::initializer_list<DataType> numbers = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                                   DataType::kBFloat16, DataType::kInt32, DataType::kInt64,
                                                   DataType::kInt8, DataType::kUInt8};
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, numbers));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, numbers));
  const Shape& depth = ctx.input_shape(1);
  if (depth.is_static() && depth.NumElements() != 1)
    return ctx.Error("expected depth, a scalar or one element, got ", depth.ToString());
  const Shape& values = ctx.input_shape(2);
  if (values.is_static() && (values.rank() != 1 || values[0].value != 2))
    return ctx.Error("expected values [off_value, on_value] of shape [2], got ", values.ToString());
  const Shape& idx = ctx.input_shape(0);
  if (!idx.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(2), Shape());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", -1), idx.rank() + 1));
  Dim d;
  if (const Tensor* t = ctx.input_constant(1); t && t->numel() == 1) {
    const double v = t->DoubleAt(0);
    if (v < 1) return ctx.Error("depth is ", v, "; expected depth >= 1");
    d = Dim(static_cast<int64_t>(v));
  }
  std::vector<Dim> out = idx.dims();
  out.insert(out.begin() + axis, d);
  ctx.SetOutput(0, ctx.input_dtype(2), Shape(std::move(out)));
  return absl::OkStatus();
}

// Hardmax, Shrink and LRN: X's dtype (a float type) and shape. LRN checks its window and X's rank.
absl::Status InferFloatSameShape(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                       DataType::kBFloat16}));
  const Shape& x = ctx.input_shape(0);
  if (ctx.node().op_type() == "LRN") {
    const int64_t size = ctx.node().AttrInt("size", 0);
    if (size <= 0) return ctx.Error("expected a 'size' attribute > 0, got ", size);
    if (x.has_rank() && x.rank() < 3) return ctx.Error("expected X [N, C, D1, ...] of rank >= 3, got ", x.ToString());
  }
  if (ctx.node().op_type() == "Hardmax" && x.has_rank()) {
    if (x.rank() == 0) return ctx.Error("expected an input of rank >= 1, got a scalar");
    RETURN_IF_ERROR(NormalizeAxis(ctx, ctx.node().AttrInt("axis", ctx.version() >= 13 ? -1 : 1), x.rank()).status());
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

// EyeLike: X's 2-D shape, in `dtype` (X's by default).
absl::Status InferEyeLike(InferContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && x.rank() != 2) return ctx.Error("expected a 2-D input, got ", x.ToString());
  DataType t = ctx.input_dtype(0);
  if (ctx.node().HasAttr("dtype")) {
    t = DataTypeFromInt(static_cast<int>(ctx.node().AttrInt("dtype", 0)));
    if (t == DataType::kUndefined || t == DataType::kString)
      return ctx.Error("dtype ", ctx.node().AttrInt("dtype", 0), " is not a supported element type");
  }
  ctx.SetOutput(0, t, x);
  return absl::OkStatus();
}


// MeanVarianceNormalization (axes) and LpNormalization (axis, p 1 or 2): X's float dtype and
// shape, the axes within X's rank.
absl::Status InferNormalizeAlong(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                       DataType::kBFloat16}));
  const Node& n = ctx.node();
  const Shape& x = ctx.input_shape(0);
  const bool lp = n.op_type() == "LpNormalization";
  if (lp && n.AttrInt("p", 2) != 1 && n.AttrInt("p", 2) != 2)
    return ctx.Error("p is ", n.AttrInt("p", 2), "; expected 1 or 2");
  if (x.has_rank()) {
    const std::vector<int64_t> axes = lp ? std::vector<int64_t>{n.AttrInt("axis", -1)} : n.AttrInts("axes", {0, 2, 3});
    for (int64_t a : axes) RETURN_IF_ERROR(NormalizeAxis(ctx, a, x.rank()).status());
  }
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  return absl::OkStatus();
}

// LpPool and GlobalLpPool: p at least 1, then the output of the AveragePool they become.
absl::Status InferLpPool(InferContext& ctx) {
  const double p = ctx.version() == 1 ? ctx.node().AttrFloat("p", 2.f) : static_cast<double>(ctx.node().AttrInt("p", 2));
  if (!(p >= 1)) return ctx.Error("p is ", p, "; expected p >= 1");
  if (ctx.node().op_type() == "LpPool" && ctx.node().AttrInts("kernel_shape").empty())
    return ctx.Error("has no 'kernel_shape' attribute");
  return InferPool(ctx);
}

// RNN, GRU and LSTM: X [seq, batch, input] (layout 1: [batch, seq, input]), W [dirs, gates·H,
// input], R [dirs, gates·H, H], B [dirs, 2·gates·H], sequence_lens [batch] int32, initial_h
// and initial_c [dirs, batch, H] ([batch, dirs, H]), P [dirs, 3·H]. Y [seq, dirs, batch, H]
// ([batch, seq, dirs, H]); Y_h and Y_c as initial_h.
absl::Status InferRecurrent(InferContext& ctx) {
  const Node& n = ctx.node();
  const std::string& op = n.op_type();
  const int64_t gates = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  const std::string direction = n.AttrString("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return ctx.Error("direction '", direction, "' is none of forward, reverse, bidirectional");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = ctx.version() >= 14 ? n.AttrInt("layout", 0) : 0;
  if (layout != 0 && layout != 1) return ctx.Error("layout is ", layout, "; expected 0 or 1");
  const std::initializer_list<DataType> floats = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                                  DataType::kBFloat16};
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, floats));
  const DataType t = ctx.input_dtype(0);
  static const char* kNames[] = {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"};
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    if (i == 4) {
      RETURN_IF_ERROR(ExpectDtype(ctx, i, {DataType::kInt32}));
    } else if (ctx.input_dtype(i) != t && ctx.input_dtype(i) != DataType::kUndefined) {
      return ctx.Error("input ", kNames[i], " '", n.input(i)->name(), "' has dtype ", DataTypeName(ctx.input_dtype(i)),
                       ", expected ", DataTypeName(t), " (X's)");
    }
  }
  Dim hidden;
  if (n.HasAttr("hidden_size")) {
    hidden = Dim(n.AttrInt("hidden_size", 0));
    if (hidden.value <= 0) return ctx.Error("hidden_size is ", hidden.value, "; expected > 0");
  } else if (ctx.input_shape(2).has_rank() && ctx.input_shape(2).rank() == 3) {
    hidden = ctx.input_shape(2)[2];
  }
  const Shape& x = ctx.input_shape(0);
  Dim seq, batch, in;
  if (x.has_rank()) {
    if (x.rank() != 3)
      return ctx.Error("expected X ", layout ? "[batch, seq, input]" : "[seq, batch, input]", ", got ", x.ToString());
    seq = x[layout ? 1 : 0];
    batch = x[layout ? 0 : 1];
    in = x[2];
  }
  auto times = [](int64_t f, const Dim& d) { return d.is_static() ? Dim(f * d.value) : Dim(); };
  const Dim gh = times(gates, hidden);
  const Dim state_batch_major[] = {batch, Dim(dirs), hidden};
  const Dim state_seq_major[] = {Dim(dirs), batch, hidden};
  const Dim* state = layout ? state_batch_major : state_seq_major;
  const std::vector<std::vector<Dim>> expected = {
      {},
      {Dim(dirs), gh, in},
      {Dim(dirs), gh, hidden},
      {Dim(dirs), times(2 * gates, hidden)},
      {batch},
      {state[0], state[1], state[2]},
      {state[0], state[1], state[2]},
      {Dim(dirs), times(3, hidden)}};
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i) || !ctx.input_shape(i).has_rank()) continue;
    const Shape& s = ctx.input_shape(i);
    bool ok = s.rank() == static_cast<int>(expected[i].size());
    for (int a = 0; ok && a < s.rank(); ++a)
      ok = !s[a].is_static() || !expected[i][a].is_static() || s[a].value == expected[i][a].value;
    if (!ok)
      return ctx.Error("input ", kNames[i], " '", n.input(i)->name(), "' is ", s.ToString(), "; expected ",
                       Shape(expected[i]).ToString(), " (", dirs, " direction", dirs == 2 ? "s" : "", ", ", gates,
                       " gate", gates == 1 ? "" : "s", ", hidden ", DimString(hidden), ")");
  }
  if (ctx.has_output(0)) {
    ctx.SetOutput(0, t, layout ? Shape({batch, seq, Dim(dirs), hidden}) : Shape({seq, Dim(dirs), batch, hidden}));
  }
  for (int k = 1; k < ctx.num_outputs(); ++k)
    if (ctx.has_output(k)) ctx.SetOutput(k, t, Shape({state[0], state[1], state[2]}));
  return absl::OkStatus();
}


// QuantizeLinear (x float or int32, y_scale, y_zero_point) -> y of the zero point's type (else
// output_dtype from version 21, else uint8); DequantizeLinear (x quantized or int32, x_scale,
// x_zero_point) -> y of the scale's type. The scale is per tensor (a scalar or [1]), per axis
// ([C], C = X's dim `axis`), or blocked (version 21's block_size: X's rank, ceil(dim / block_size)
// along `axis`); a zero point has the scale's shape.
absl::Status InferQuantize(InferContext& ctx) {
  const Node& n = ctx.node();
  const bool quantize = n.op_type() == "QuantizeLinear";
  const std::initializer_list<DataType> quantized = {DataType::kUInt8, DataType::kInt8, DataType::kUInt16,
                                                     DataType::kInt16};
  if (quantize) {
    RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32}));
  } else {
    RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kUInt8, DataType::kInt8, DataType::kUInt16, DataType::kInt16,
                                         DataType::kInt32}));
  }
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}));
  const bool has_zp = ctx.num_inputs() > 2 && ctx.has_input(2);
  DataType out;
  if (quantize) {
    out = DataType::kUInt8;
    if (ctx.version() >= 21 && n.AttrInt("output_dtype", 0) != 0) {
      out = DataTypeFromInt(static_cast<int>(n.AttrInt("output_dtype", 0)));
      if (out == DataType::kUndefined) return ctx.Error("output_dtype ", n.AttrInt("output_dtype", 0), " is not a type");
    }
    if (has_zp) {
      if (ctx.version() >= 21 && n.AttrInt("output_dtype", 0) != 0 && ctx.input_dtype(2) != out)
        return ctx.Error("y_zero_point has dtype ", DataTypeName(ctx.input_dtype(2)), " but output_dtype is ",
                         DataTypeName(out));
      out = ctx.input_dtype(2);
    }
    if (std::find(quantized.begin(), quantized.end(), out) == quantized.end())
      return ctx.Error("quantized type ", DataTypeName(out), " is not one cleave supports (uint8, int8, uint16, int16)");
  } else {
    out = ctx.version() >= 19 ? ctx.input_dtype(1) : DataType::kFloat32;
    if (has_zp && ctx.input_dtype(2) != ctx.input_dtype(0))
      return ctx.Error("x_zero_point has dtype ", DataTypeName(ctx.input_dtype(2)), ", expected x's ",
                       DataTypeName(ctx.input_dtype(0)));
  }
  const Shape& x = ctx.input_shape(0);
  const int64_t block = ctx.version() >= 21 ? n.AttrInt("block_size", 0) : 0;
  if (block < 0) return ctx.Error("block_size is ", block, "; expected >= 0");
  if (x.has_rank()) {
    for (int i = 1; i < std::min(ctx.num_inputs(), 3); ++i) {
      if (!ctx.has_input(i) || !ctx.input_shape(i).has_rank()) continue;
      const Shape& s = ctx.input_shape(i);
      const bool per_tensor = s.rank() == 0 || (s.rank() == 1 && s[0].is_static() && s[0].value == 1);
      if (per_tensor && block == 0) continue;  // `axis` applies only to per-axis and blocked scales
      ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.version() >= 13 ? n.AttrInt("axis", 1) : 0, x.rank()));
      bool ok = true;
      std::string want;
      if (block > 0) {
        ok = s.rank() == x.rank();
        for (int a = 0; ok && a < x.rank(); ++a) {
          if (!s[a].is_static() || !x[a].is_static()) continue;
          ok = s[a].value == (a == axis ? (x[a].value + block - 1) / block : x[a].value);
        }
        want = absl::StrCat("X's shape with dim ", axis, " divided into blocks of ", block);
      } else {
        ok = s.rank() == 1 && (!s[0].is_static() || !x[axis].is_static() || s[0].value == x[axis].value);
        want = absl::StrCat("a scalar, [1], or [", DimString(x[axis]), "] (X's dim ", axis, ")");
      }
      if (!ok)
        return ctx.Error("input ", i, " '", n.input(i)->name(), "' is ", s.ToString(), "; expected ", want);
    }
  }
  ctx.SetOutput(0, out, x);
  return absl::OkStatus();
}

// DynamicQuantizeLinear (x float32) -> y uint8 of x's shape, y_scale float32 [], y_zero_point
// uint8 [].
absl::Status InferDynamicQuantize(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32}));
  ctx.SetOutput(0, DataType::kUInt8, ctx.input_shape(0));
  if (ctx.has_output(1)) ctx.SetOutput(1, DataType::kFloat32, Shape::Scalar());
  if (ctx.has_output(2)) ctx.SetOutput(2, DataType::kUInt8, Shape::Scalar());
  return absl::OkStatus();
}

// HannWindow, HammingWindow, BlackmanWindow (size, a scalar int32 or int64) -> [size] of
// output_datatype (float32 by default).
absl::Status InferWindow(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kInt32, DataType::kInt64}));
  const DataType t = DataTypeFromInt(static_cast<int>(ctx.node().AttrInt("output_datatype", 1)));
  if (!IsFloat(t) && !IsInteger(t))
    return ctx.Error("output_datatype ", ctx.node().AttrInt("output_datatype", 1), " is not a number type");
  Dim size;
  if (const Tensor* c = ctx.input_constant(0); c && c->numel() == 1) {
    if (c->DoubleAt(0) < 0) return ctx.Error("size is ", c->DoubleAt(0), "; expected size >= 0");
    size = Dim(static_cast<int64_t>(c->DoubleAt(0)));
  }
  ctx.SetOutput(0, t, Shape({size}));
  return absl::OkStatus();
}

// CenterCropPad (input_data, shape [len(axes)]): X with each of `axes` (all by default) cropped or
// padded to the shape's entry.
absl::Status InferCenterCropPad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  std::vector<int64_t> axes = ctx.node().AttrInts("axes");
  if (axes.empty())
    for (int a = 0; a < x.rank(); ++a) axes.push_back(a);
  std::vector<Dim> out = x.dims();
  const Shape& s = ctx.input_shape(1);
  if (s.has_rank() && (s.rank() != 1 || (s[0].is_static() && s[0].value != static_cast<int64_t>(axes.size()))))
    return ctx.Error("shape is ", s.ToString(), "; expected [", axes.size(), "] (one size per axis)");
  const std::optional<std::vector<int64_t>> target = ConstantInts(ctx, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    ASSIGN_OR_RETURN(const int a, NormalizeAxis(ctx, axes[i], x.rank()));
    out[a] = target ? Dim((*target)[i]) : Dim();
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// ReverseSequence (input, sequence_lens int64 [batch]): X's; time_axis and batch_axis are 0
// and 1 in either order.
absl::Status InferReverseSequence(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const int64_t t = ctx.node().AttrInt("time_axis", 0), b = ctx.node().AttrInt("batch_axis", 1);
  if (!((t == 0 && b == 1) || (t == 1 && b == 0)))
    return ctx.Error("time_axis ", t, " and batch_axis ", b, "; expected 0 and 1 in either order");
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && x.rank() < 2) return ctx.Error("expected an input of rank >= 2, got ", x.ToString());
  const Shape& lens = ctx.input_shape(1);
  if (x.has_rank() && lens.has_rank() &&
      (lens.rank() != 1 || (lens[0].is_static() && x[b].is_static() && lens[0].value != x[b].value)))
    return ctx.Error("sequence_lens is ", lens.ToString(), "; expected [", DimString(x[b]), "] (the batch)");
  return InferSameAsInput0(ctx);
}

// MaxUnpool (X, I int64 of X's shape[, output_shape]): output_shape's values where known, else
// (in - 1) * stride - pads + kernel per spatial dim.
absl::Status InferMaxUnpool(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                       DataType::kBFloat16}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Node& n = ctx.node();
  const std::vector<int64_t> kernel = n.AttrInts("kernel_shape");
  if (kernel.empty()) return ctx.Error("has no 'kernel_shape' attribute");
  const Shape& x = ctx.input_shape(0);
  const int spatial = static_cast<int>(kernel.size());
  if (x.has_rank() && x.rank() != spatial + 2)
    return ctx.Error("X is ", x.ToString(), "; expected [N, C] and ", spatial, " spatial dims (kernel_shape)");
  Shape out;
  if (ctx.num_inputs() > 2 && ctx.has_input(2)) {
    if (const auto given = ConstantInts(ctx, 2)) {
      std::vector<Dim> dims;
      for (int64_t d : *given) dims.push_back(Dim(d));
      out = Shape(std::move(dims));
    } else if (x.has_rank()) {
      out = Shape(std::vector<Dim>(static_cast<size_t>(x.rank())));
    }
  } else if (x.has_rank()) {
    const UnpoolSize u = UnpoolSizeOf(n);
    std::vector<Dim> dims = {x[0], x[1]};
    for (int d = 2; d < spatial + 2; ++d) {
      const Dim& in = x[d];
      dims.push_back(in.is_static() ? Dim(in.value * u.scale[static_cast<size_t>(d)] + u.shift[static_cast<size_t>(d)])
                                    : Dim());
    }
    out = Shape(std::move(dims));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), out);
  return absl::OkStatus();
}

// Col2Im (input [N, C * prod(block), L], image_shape [r], block_shape [r]) -> [N, C, image...]:
// where image_shape and block_shape are constants, C and the check that L counts the blocks'
// positions; else of rank r + 2.
absl::Status InferCol2Im(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kInt64}));
  const Node& n = ctx.node();
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && x.rank() != 3) return ctx.Error("input is ", x.ToString(), "; expected [N, C * prod(block_shape), L]");
  const Shape& is = ctx.input_shape(1);
  const Shape& bs = ctx.input_shape(2);
  int r = -1;
  for (const Shape* s : {&is, &bs}) {
    if (!s->has_rank()) continue;
    if (s->rank() != 1) return ctx.Error("image_shape and block_shape must be 1-D, got ", s->ToString());
    if ((*s)[0].is_static()) {
      if (r >= 0 && (*s)[0].value != r)
        return ctx.Error("image_shape is ", is.ToString(), " and block_shape ", bs.ToString(), "; expected one length");
      r = static_cast<int>((*s)[0].value);
    }
  }
  if (r < 1) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  std::vector<int64_t> dilations = n.AttrInts("dilations"), strides = n.AttrInts("strides"), pads = n.AttrInts("pads");
  if (dilations.empty()) dilations.assign(static_cast<size_t>(r), 1);
  if (strides.empty()) strides.assign(static_cast<size_t>(r), 1);
  if (pads.empty()) pads.assign(2 * static_cast<size_t>(r), 0);
  if (dilations.size() != static_cast<size_t>(r) || strides.size() != static_cast<size_t>(r) ||
      pads.size() != 2 * static_cast<size_t>(r))
    return ctx.Error("expected ", r, " dilations and strides and ", 2 * r, " pads (", r, " spatial dims)");
  std::vector<Dim> out(static_cast<size_t>(r) + 2);
  if (x.has_rank()) out[0] = x[0];
  const std::optional<std::vector<int64_t>> image = ConstantInts(ctx, 1), block = ConstantInts(ctx, 2);
  if (image && block) {
    int64_t k = 1, l = 1;
    for (int d = 0; d < r; ++d) {
      const int64_t span = (*image)[d] + pads[d] + pads[r + d] - dilations[d] * ((*block)[d] - 1) - 1;
      if ((*image)[d] < 1 || (*block)[d] < 1 || strides[d] < 1 || dilations[d] < 1 || span < 0)
        return ctx.Error("image dim ", d, " of ", (*image)[d], " holds no block of ", (*block)[d], " (dilation ",
                         dilations[d], ", pads ", pads[d], " and ", pads[r + d], ", stride ", strides[d], ")");
      k *= (*block)[d];
      l *= span / strides[d] + 1;
      out[static_cast<size_t>(d) + 2] = Dim((*image)[d]);
    }
    if (x.has_rank() && x[1].is_static()) {
      if (x[1].value % k != 0)
        return ctx.Error("input is ", x.ToString(), "; expected dim 1 a multiple of the block's ", k, " elements");
      out[1] = Dim(x[1].value / k);
    }
    if (x.has_rank() && x[2].is_static() && x[2].value != l)
      return ctx.Error("input is ", x.ToString(), "; expected ", l, " block positions in dim 2");
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

}  // namespace cleave::graph
