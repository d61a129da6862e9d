// QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear as float32 arithmetic and Casts
// (graph/passes/decomposition.cc), so QDQ models run wherever Cast, Round and Clip do:
//
//   QuantizeLinear:   y = Cast(Clip(Round(x / scale) + zero_point, lo, hi), the quantized type)
//   DequantizeLinear: y = Cast((Cast(x, f32) - zero_point) * scale, the scale's type)
//
// Round is ONNX's, halves to even, as the ops ask. The scale and zero point are per tensor (a
// scalar or [1]), per axis (a [C] vector reshaped to [C, 1, ...] to line up with `axis`), or
// blocked (opset 21: each element along `axis` reads block i / block_size, a Gather).
#include <string>
#include <vector>

#include "graph/passes/emitter.h"

namespace cleave::graph::decompose {

namespace {

struct Range {
  double lo, hi;
};

absl::StatusOr<Range> QuantizedRange(const Node& n, DataType t) {
  switch (t) {
    case DataType::kUInt8: return Range{0, 255};
    case DataType::kInt8: return Range{-128, 127};
    case DataType::kUInt16: return Range{0, 65535};
    case DataType::kInt16: return Range{-32768, 32767};
    default:
      return Unimplemented(n.Describe(), ": quantized type ", DataTypeName(t),
                           " is not one cleave decomposes (uint8, int8, uint16, int16)");
  }
}

// `v` (a scale or zero point) as float32, shaped to broadcast against x [.., dims[axis], ..].
// `node` describes the replaced node for errors.
absl::StatusOr<Value*> Aligned(Emitter& e, const std::string& node, Value* v, const Shape& x, int64_t axis,
                               int64_t block) {
  const Shape& s = v->shape();
  if (!s.has_rank() || !x.has_rank())
    return Unimplemented(node, ": the rank of '", v->name(), "' or X is unknown; cleave decomposes it by rank");
  ASSIGN_OR_RETURN(Value * f, e.Cast(v, DataType::kFloat32));
  if (block > 0) {
    const Dim& len = x[static_cast<int>(axis)];
    if (!len.is_static())
      return Unimplemented(node, ": X's dim ", axis, " is symbolic; cleave decomposes blocked quantization over a "
                           "static one");
    Tensor idx(DataType::kInt64, {len.value});
    for (int64_t i = 0; i < len.value; ++i) idx.data<int64_t>()[i] = i / block;
    Value* at = e.Constant(v->name() + "/blocks", std::move(idx));
    return e.Add("Gather", {f, at}, {{"axis", Attribute::Int(axis)}});
  }
  if (s.rank() == 0 || (s.rank() == 1 && s[0].is_static() && s[0].value == 1)) return f;  // per tensor
  std::vector<int64_t> target(static_cast<size_t>(x.rank() - axis), 1);
  target[0] = -1;
  return e.Reshape(f, target);
}

}  // namespace

absl::Status DecomposeQuantize(Graph* g, Node* n, int version) {
  const std::string op = n->op_type();
  Value* x = n->input(0);
  Value* scale = n->input(1);
  Value* zp = n->num_inputs() > 2 ? n->input(2) : nullptr;
  const Shape xs = x->shape();
  int64_t axis = version >= 13 ? n->AttrInt("axis", 1) : 0;  // read only by per-axis and blocked scales
  if (xs.has_rank() && axis < 0) axis += xs.rank();
  const int64_t block = version >= 21 ? n->AttrInt("block_size", 0) : 0;
  const bool quantize = op == "QuantizeLinear";
  const DataType qtype = quantize ? n->output(0)->dtype() : x->dtype();
  Range range{0, 0};
  if (quantize || x->dtype() != DataType::kInt32) {
    ASSIGN_OR_RETURN(range, QuantizedRange(*n, qtype));
  }
  if (quantize && g->OpsetFor("") < 11)
    return Unimplemented(n->Describe(), ": QuantizeLinear at opset ", g->OpsetFor(""),
                         " would round with Round, which needs opset 11");
  const DataType out_type = n->output(0)->dtype();
  const std::string node = n->Describe();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * xf, e.Cast(x, DataType::kFloat32));
  ASSIGN_OR_RETURN(Value * s, Aligned(e, node, scale, xs, axis, block));
  Value* z = nullptr;
  if (zp) {
    ASSIGN_OR_RETURN(z, Aligned(e, node, zp, xs, axis, block));
  }
  Value* y = xf;
  if (quantize) {
    ASSIGN_OR_RETURN(y, e.Add("Div", {xf, s}));
    ASSIGN_OR_RETURN(y, e.Add("Round", {y}));
    if (z) {
      ASSIGN_OR_RETURN(y, e.Add("Add", {y, z}));
    }
    Value* lo = e.Scalar(DataType::kFloat32, range.lo);
    Value* hi = e.Scalar(DataType::kFloat32, range.hi);
    ASSIGN_OR_RETURN(y, e.Add("Clip", {y, lo, hi}));
  } else {
    if (z) {
      ASSIGN_OR_RETURN(y, e.Add("Sub", {y, z}));
    }
    ASSIGN_OR_RETURN(y, e.Add("Mul", {y, s}));
  }
  ASSIGN_OR_RETURN(y, e.Cast(y, out_type));
  return e.Finish(y, out);
}

// DynamicQuantizeLinear, as the ONNX function computes it: the range of x widened to hold 0,
// scale = range / 255, zero point = Round(Clip(-min / scale, 0, 255)), then x quantized to uint8.
absl::Status DecomposeDynamicQuantize(Graph* g, Node* n) {
  Value* x = n->input(0);
  std::vector<Value*> outs;
  for (int i = 0; i < 3; ++i) outs.push_back(n->output(i));
  Emitter e(g, *n);
  g->RemoveNode(n);
  const DataType f = DataType::kFloat32;
  ASSIGN_OR_RETURN(Value * lo, e.Add("ReduceMin", {x}, {{"keepdims", Attribute::Int(0)}}));
  ASSIGN_OR_RETURN(lo, e.Add("Min", {lo, e.Scalar(f, 0)}));
  ASSIGN_OR_RETURN(Value * hi, e.Add("ReduceMax", {x}, {{"keepdims", Attribute::Int(0)}}));
  ASSIGN_OR_RETURN(hi, e.Add("Max", {hi, e.Scalar(f, 0)}));
  ASSIGN_OR_RETURN(Value * scale, e.Add("Sub", {hi, lo}));
  ASSIGN_OR_RETURN(scale, e.Add("Div", {scale, e.Scalar(f, 255)}));
  ASSIGN_OR_RETURN(Value * zp, e.Add("Div", {lo, scale}));
  ASSIGN_OR_RETURN(zp, e.Add("Sub", {e.Scalar(f, 0), zp}));
  ASSIGN_OR_RETURN(zp, e.Add("Clip", {zp, e.Scalar(f, 0), e.Scalar(f, 255)}));
  ASSIGN_OR_RETURN(zp, e.Add("Round", {zp}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Div", {x, scale}));
  ASSIGN_OR_RETURN(y, e.Add("Round", {y}));
  ASSIGN_OR_RETURN(y, e.Add("Add", {y, zp}));
  ASSIGN_OR_RETURN(y, e.Add("Clip", {y, e.Scalar(f, 0), e.Scalar(f, 255)}));
  ASSIGN_OR_RETURN(y, e.Cast(y, DataType::kUInt8));
  ASSIGN_OR_RETURN(Value * zp8, e.Cast(zp, DataType::kUInt8));
  if (outs[0]) RETURN_IF_ERROR(e.Finish(y, outs[0]));
  if (outs[1]) RETURN_IF_ERROR(e.Finish(scale, outs[1]));
  if (outs[2]) RETURN_IF_ERROR(e.Finish(zp8, outs[2]));
  return absl::OkStatus();
}

}  // namespace cleave::graph::decompose
