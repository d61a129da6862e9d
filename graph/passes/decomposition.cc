// Decomposition of the ops the op table marks `decomposed` into other ops of the table
// (graph/passes/pass.h): Einsum (einsum_decomposition.cc); RNN, GRU and LSTM, unrolled over
// the sequence (rnn_decomposition.cc); QuantizeLinear, DequantizeLinear and
// DynamicQuantizeLinear into float
// arithmetic (quantize_decomposition.cc); GroupNormalization into an
// InstanceNormalization over the groups; DepthToSpace and SpaceToDepth into Reshape, Transpose,
// Reshape; OneHot and Hardmax into comparisons with positions; EyeLike into a constant; Shrink
// into Wheres; LRN into an AveragePool over the channels; LpPool and GlobalLpPool into an
// AveragePool or ReduceSum of |x|^p; MeanVarianceNormalization and LpNormalization into
// reductions; BitwiseNot into a BitwiseXor with all ones; the window functions into Range and
// Cos; CenterCropPad, ReverseSequence and MaxUnpool into index arithmetic
// (layout_decomposition.cc). What they become has kernels on every
// provider and gradient rules, so the decomposed ops run and train wherever those do. Each
// rewrite writes the node's own output value, so graph outputs keep their names.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "graph/passes/emitter.h"
#include "graph/pool_geometry.h"
#include "graph/passes/pass.h"

namespace cleave::graph {

namespace {

using decompose::Emitter;
using decompose::SetElement;
using decompose::StaticDim;
using decompose::Target;

// ---- GroupNormalization ----

// Version 18: InstanceNormalization over X as [N, G, rest] with the [G] scale and bias.
// Version 21: the same with ones and zeros, then X's shape back, times the [C] scale, plus
// the [C] bias (each as [C, 1, ...]).
absl::Status DecomposeGroupNormalization(Graph* g, Node* n, int version) {
  Value* x = n->input(0);
  if (!x->shape().has_rank())
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes GroupNormalization by rank");
  const int rank = x->shape().rank();
  const int64_t groups = n->AttrInt("num_groups", 0);
  const float eps = n->AttrFloat("epsilon", 1e-5f);
  Value* scale = n->input(1);
  Value* bias = n->input(2);
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * grouped, e.Reshape(x, {0, groups, -1}));
  Value* s = scale;
  Value* b = bias;
  if (version >= 21) {
    s = e.Filled(x->dtype(), groups, 1.f);
    b = e.Filled(x->dtype(), groups, 0.f);
  }
  ASSIGN_OR_RETURN(Value * y, e.Add("InstanceNormalization", {grouped, s, b}, {{"epsilon", Attribute::Float(eps)}}));
  // X's shape: a constant where at most its batch dim is symbolic, else X's Shape at run time.
  bool constant = true;
  std::vector<int64_t> dims;
  for (int a = 0; a < rank; ++a) {
    const Dim& d = x->shape()[a];
    constant &= d.is_static() || a == 0;
    dims.push_back(d.is_static() ? d.value : 0);
  }
  if (constant) {
    ASSIGN_OR_RETURN(y, e.Reshape(y, dims));
  } else {
    ASSIGN_OR_RETURN(Value * shape, e.Add("Shape", {x}));
    ASSIGN_OR_RETURN(y, e.Add("Reshape", {y, shape}));
  }
  if (version >= 21) {
    std::vector<int64_t> per_channel(rank - 1, 1);
    per_channel[0] = -1;
    ASSIGN_OR_RETURN(Value * sc, e.Reshape(scale, per_channel));
    ASSIGN_OR_RETURN(Value * bc, e.Reshape(bias, per_channel));
    ASSIGN_OR_RETURN(y, e.Add("Mul", {y, sc}));
    ASSIGN_OR_RETURN(y, e.Add("Add", {y, bc}));
  }
  return e.Finish(y, out);
}

// ---- DepthToSpace, SpaceToDepth ----

absl::Status DecomposeDepthSpace(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().has_rank() || x->shape().rank() != 4)
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes ", n->op_type(), " over [N, C, H, W]");
  const int64_t b = n->AttrInt("blocksize", 1);
  auto c = StaticDim(x, 1), h = StaticDim(x, 2), w = StaticDim(x, 3);
  auto times = [](std::optional<int64_t> v, int64_t f) { return v ? std::optional<int64_t>(*v * f) : std::nullopt; };
  auto over = [](std::optional<int64_t> v, int64_t f) { return v ? std::optional<int64_t>(*v / f) : std::nullopt; };
  std::vector<std::optional<int64_t>> split, merged;
  std::vector<int64_t> perm;
  if (n->op_type() == "DepthToSpace") {
    if (n->AttrString("mode", "DCR") == "CRD") {
      split = {over(c, b * b), b, b, h, w};
      perm = {0, 1, 4, 2, 5, 3};
    } else {
      split = {b, b, over(c, b * b), h, w};
      perm = {0, 3, 4, 1, 5, 2};
    }
    merged = {over(c, b * b), times(h, b), times(w, b)};
  } else {
    split = {c, over(h, b), b, over(w, b), b};
    perm = {0, 3, 5, 1, 2, 4};
    merged = {times(c, b * b), over(h, b), over(w, b)};
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> t1, Target(n->Describe(), split, "X split into blocks"));
  ASSIGN_OR_RETURN(std::vector<int64_t> t2, Target(n->Describe(), merged, "Y"));
  t1.insert(t1.begin(), 0);
  t2.insert(t2.begin(), 0);
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * y, e.Reshape(x, t1));
  ASSIGN_OR_RETURN(y, e.Transpose(y, perm));
  ASSIGN_OR_RETURN(y, e.Reshape(y, t2));
  return e.Finish(y, out);
}

// ---- OneHot, Hardmax, EyeLike ----

// Positions 0..n-1 along `axis` of an output of `rank` dims: an int64 constant [n, 1, ...].
Value* Positions(Graph* g, const std::string& hint, int64_t n, int rank, int axis) {
  std::vector<int64_t> dims(rank - axis, 1);
  dims[0] = n;
  Tensor t(DataType::kInt64, dims);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i;
  return g->AddInitializer(g->UniqueName(hint + "/positions"), std::move(t));
}

// OneHot: Where(Equal(Unsqueeze(indices, axis), positions), on, off), a negative index wrapped
// once (one below -depth then matches nothing and its row is all off, as the spec asks). The
// positions are a constant where depth is a constant, else Range(0, depth) (opset 11).
absl::Status DecomposeOneHot(Graph* g, Node* n) {
  Value* indices = n->input(0);
  Value* depth = n->input(1);
  Value* values = n->input(2);
  if (!indices->shape().has_rank())
    return Unimplemented(n->Describe(), ": the indices' rank is unknown; cleave decomposes OneHot by rank");
  const int rank = indices->shape().rank() + 1;
  int axis = static_cast<int>(n->AttrInt("axis", -1));
  if (axis < 0) axis += rank;
  const Tensor* constant_depth = ConstantInput(*n, 1);
  if (!constant_depth && g->OpsetFor("") < 11)
    return Unimplemented(n->Describe(), ": a depth known only at run time needs Range (opset 11)");
  const std::string hint = n->name().empty() ? "OneHot" : n->name();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * d, e.Reshape(depth, {}));
  ASSIGN_OR_RETURN(d, e.Cast(d, DataType::kInt64));
  ASSIGN_OR_RETURN(Value * idx, e.Cast(indices, DataType::kInt64));
  Value* zero = e.Scalar(DataType::kInt64, 0);
  ASSIGN_OR_RETURN(Value * negative, e.Add("Less", {idx, zero}));
  ASSIGN_OR_RETURN(Value * shifted, e.Add("Add", {idx, d}));
  ASSIGN_OR_RETURN(idx, e.Add("Where", {negative, shifted, idx}));
  ASSIGN_OR_RETURN(idx, e.Unsqueeze(idx, {axis}));
  Value* positions;
  if (constant_depth) {
    positions = Positions(g, hint, static_cast<int64_t>(constant_depth->DoubleAt(0)), rank, axis);
  } else {
    ASSIGN_OR_RETURN(positions, e.Add("Range", {zero, d, e.Scalar(DataType::kInt64, 1)}));
    std::vector<int64_t> target(rank - axis, 1);
    target[0] = -1;
    ASSIGN_OR_RETURN(positions, e.Reshape(positions, target));
  }
  ASSIGN_OR_RETURN(Value * hot, e.Add("Equal", {idx, positions}));
  ASSIGN_OR_RETURN(Value * off, e.Add("Gather", {values, e.Scalar(DataType::kInt64, 0)}));
  ASSIGN_OR_RETURN(Value * on, e.Add("Gather", {values, e.Scalar(DataType::kInt64, 1)}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Where", {hot, on, off}));
  return e.Finish(y, out);
}

// Hardmax: 1 at the first largest element along the axis (ArgMax, keepdims), 0 elsewhere. Before
// version 13 the input counts as 2-D, [dims before axis, dims from axis on], Flattened first.
absl::Status DecomposeHardmax(Graph* g, Node* n, int version) {
  Value* x = n->input(0);
  const Shape& s = x->shape();
  if (!s.has_rank()) return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes Hardmax by rank");
  const int rank = s.rank();
  int axis = static_cast<int>(n->AttrInt("axis", version >= 13 ? -1 : 1));
  if (axis < 0) axis += rank;
  std::optional<int64_t> len = 1;
  for (int a = axis; a < (version >= 13 ? axis + 1 : rank); ++a)
    len = len && s[a].is_static() ? std::optional<int64_t>(*len * s[a].value) : std::nullopt;
  if (!len)
    return Unimplemented(n->Describe(), ": the length along axis ", axis, " is symbolic; cleave decomposes Hardmax over a static one");
  const std::string hint = n->name().empty() ? "Hardmax" : n->name();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  Value* v = x;
  int along = axis, r = rank;
  if (version < 13) {
    ASSIGN_OR_RETURN(v, e.Add("Flatten", {x}, {{"axis", Attribute::Int(axis)}}));
    along = 1;
    r = 2;
  }
  ASSIGN_OR_RETURN(Value * best, e.Add("ArgMax", {v}, {{"axis", Attribute::Int(along)}, {"keepdims", Attribute::Int(1)}}));
  ASSIGN_OR_RETURN(Value * hot, e.Add("Equal", {best, Positions(g, hint, *len, r, along)}));
  ASSIGN_OR_RETURN(Value * y, e.Cast(hot, x->dtype()));
  if (version < 13) {
    ASSIGN_OR_RETURN(Value * shape, e.Add("Shape", {x}));
    ASSIGN_OR_RETURN(y, e.Add("Reshape", {y, shape}));
  }
  return e.Finish(y, out);
}

// EyeLike: a constant of X's (static) shape, ones on the k-th diagonal.
absl::Status DecomposeEyeLike(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().is_static())
    return Unimplemented(n->Describe(), ": X's shape ", x->shape().ToString(), " is not static; cleave makes EyeLike a constant");
  const std::vector<int64_t> dims = x->shape().StaticDims();
  const DataType t = n->output(0)->dtype();
  const int64_t k = n->AttrInt("k", 0);
  Tensor eye(t, dims);  // zeros
  for (int64_t i = 0; i < dims[0]; ++i) {
    const int64_t j = i + k;
    if (j < 0 || j >= dims[1]) continue;
    SetElement(eye, i * dims[1] + j, 1.f);
  }
  Value* out = n->output(0);
  Value* c = g->AddInitializer(g->UniqueName((n->name().empty() ? "EyeLike" : n->name()) + "/eye"), std::move(eye));
  Emitter e(g, *n);
  g->RemoveNode(n);
  return e.Finish(c, out);
}

// ---- Shrink, LRN ----

// Shrink: x + bias below -lambd, x - bias above lambd, 0 between.
absl::Status DecomposeShrink(Graph* g, Node* n) {
  Value* x = n->input(0);
  const double lambd = n->AttrFloat("lambd", 0.5f), bias = n->AttrFloat("bias", 0.f);
  const DataType t = x->dtype();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * below, e.Add("Less", {x, e.Scalar(t, -lambd)}));
  ASSIGN_OR_RETURN(Value * above, e.Add("Greater", {x, e.Scalar(t, lambd)}));
  ASSIGN_OR_RETURN(Value * up, e.Add("Add", {x, e.Scalar(t, bias)}));
  ASSIGN_OR_RETURN(Value * down, e.Add("Sub", {x, e.Scalar(t, bias)}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Where", {above, down, e.Scalar(t, 0)}));
  ASSIGN_OR_RETURN(y, e.Add("Where", {below, up, y}));
  return e.Finish(y, out);
}

// LRN: x / (bias + alpha / size * the sum of x² over `size` channels around each)^beta; the
// sum is size times an AveragePool over the channels (as a spatial dim of X unsqueezed at 1)
// that counts its zero padding, floor((size - 1) / 2) before and the rest after.
absl::Status DecomposeLrn(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().has_rank()) return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes LRN by rank");
  const int rank = x->shape().rank();
  const int64_t size = n->AttrInt("size", 1);
  const double alpha = n->AttrFloat("alpha", 1e-4f), beta = n->AttrFloat("beta", 0.75f), bias = n->AttrFloat("bias", 1.f);
  const DataType t = x->dtype();
  std::vector<int64_t> kernel(rank - 1, 1), pads(2 * (rank - 1), 0);
  kernel[0] = size;
  pads[0] = (size - 1) / 2;
  pads[rank - 1] = size - 1 - pads[0];
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * sq, e.Add("Mul", {x, x}));
  ASSIGN_OR_RETURN(sq, e.Unsqueeze(sq, {1}));
  ASSIGN_OR_RETURN(Value * mean, e.Add("AveragePool", {sq}, {{"kernel_shape", Attribute::Ints(kernel)},
                                                              {"pads", Attribute::Ints(pads)},
                                                              {"count_include_pad", Attribute::Int(1)}}));
  ASSIGN_OR_RETURN(mean, e.Squeeze(mean, {1}));
  ASSIGN_OR_RETURN(Value * scaled, e.Add("Mul", {mean, e.Scalar(t, alpha)}));
  ASSIGN_OR_RETURN(Value * base, e.Add("Add", {scaled, e.Scalar(t, bias)}));
  ASSIGN_OR_RETURN(Value * den, e.Add("Pow", {base, e.Scalar(t, beta)}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Div", {x, den}));
  return e.Finish(y, out);
}

// ---- MeanVarianceNormalization, LpNormalization ----

// (x - mean) / (the standard deviation + 1e-9) over `axes` (the ONNX function's epsilon, added
// to the deviation); the variance centred, which the function's E[x²] - E[x]² equals.
absl::Status DecomposeMeanVarianceNormalization(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().has_rank())
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes MeanVarianceNormalization by rank");
  std::vector<int64_t> axes = n->AttrInts("axes", {0, 2, 3});
  for (int64_t& a : axes) a = a < 0 ? a + x->shape().rank() : a;
  const DataType t = x->dtype();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * mean, e.Reduce("ReduceMean", x, axes, true));
  ASSIGN_OR_RETURN(Value * d, e.Add("Sub", {x, mean}));
  ASSIGN_OR_RETURN(Value * sq, e.Add("Mul", {d, d}));
  ASSIGN_OR_RETURN(Value * var, e.Reduce("ReduceMean", sq, axes, true));
  ASSIGN_OR_RETURN(Value * sd, e.Add("Sqrt", {var}));
  ASSIGN_OR_RETURN(sd, e.Add("Add", {sd, e.Scalar(t, 1e-9)}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Div", {d, sd}));
  return e.Finish(y, out);
}

// x over its L1 or L2 norm along the axis; a zero norm (an all-zero line) gives zeros.
absl::Status DecomposeLpNormalization(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().has_rank())
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes LpNormalization by rank");
  int64_t axis = n->AttrInt("axis", -1);
  if (axis < 0) axis += x->shape().rank();
  const int64_t p = n->AttrInt("p", 2);
  const DataType t = x->dtype();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  Value* norm;
  if (p == 1) {
    ASSIGN_OR_RETURN(Value * a, e.Add("Abs", {x}));
    ASSIGN_OR_RETURN(norm, e.ReduceSum(a, {axis}, true));
  } else {
    ASSIGN_OR_RETURN(Value * sq, e.Add("Mul", {x, x}));
    ASSIGN_OR_RETURN(Value * sum, e.ReduceSum(sq, {axis}, true));
    ASSIGN_OR_RETURN(norm, e.Add("Sqrt", {sum}));
  }
  ASSIGN_OR_RETURN(Value * zero, e.Add("Equal", {norm, e.Scalar(t, 0)}));
  ASSIGN_OR_RETURN(norm, e.Add("Where", {zero, e.Scalar(t, 1), norm}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Div", {x, norm}));
  return e.Finish(y, out);
}

// ---- HannWindow, HammingWindow, BlackmanWindow ----

// a0 - a1 cos(2πn / N) + a2 cos(4πn / N) for n in [0, size), N = size (periodic) or size - 1
// (symmetric), in float32 (float64 for a float64 window), cast to output_datatype.
absl::Status DecomposeWindow(Graph* g, Node* n) {
  const std::string op = n->op_type();
  double a0 = 0.5, a1 = 0.5, a2 = 0;  // Hann
  if (op == "HammingWindow") {
    a0 = 25.0 / 46.0;
    a1 = 1 - a0;
  } else if (op == "BlackmanWindow") {
    a0 = 0.42;
    a2 = 0.08;
  }
  const bool periodic = n->AttrInt("periodic", 1) != 0;
  Value* size = n->input(0);
  Value* out = n->output(0);
  const DataType t = out->dtype();
  const DataType f = t == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
  const Tensor* constant_size = ConstantInput(*n, 0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  if (constant_size && constant_size->numel() == 1) {  // the window itself, a constant
    const int64_t len = static_cast<int64_t>(constant_size->DoubleAt(0));
    const double period = static_cast<double>(periodic ? len : len - 1);
    Tensor w(t, {len});
    for (int64_t i = 0; i < len; ++i) {
      const double angle = 2 * M_PI * static_cast<double>(i) / period;
      SetElement(w, i, a0 - a1 * std::cos(angle) + a2 * std::cos(2 * angle));
    }
    return e.Finish(e.Constant(out->name() + "/window", std::move(w)), out);
  }
  ASSIGN_OR_RETURN(Value * count, e.Reshape(size, {}));
  ASSIGN_OR_RETURN(count, e.Cast(count, DataType::kInt64));
  ASSIGN_OR_RETURN(Value * idx, e.Add("Range", {e.Scalar(DataType::kInt64, 0), count, e.Scalar(DataType::kInt64, 1)}));
  ASSIGN_OR_RETURN(idx, e.Cast(idx, f));
  ASSIGN_OR_RETURN(Value * period, e.Cast(count, f));
  if (!periodic) {
    ASSIGN_OR_RETURN(period, e.Add("Sub", {period, e.Scalar(f, 1)}));
  }
  ASSIGN_OR_RETURN(Value * angle, e.Add("Mul", {idx, e.Scalar(f, 2 * M_PI)}));
  ASSIGN_OR_RETURN(angle, e.Add("Div", {angle, period}));
  ASSIGN_OR_RETURN(Value * c1, e.Add("Cos", {angle}));
  ASSIGN_OR_RETURN(c1, e.Add("Mul", {c1, e.Scalar(f, a1)}));
  ASSIGN_OR_RETURN(Value * w, e.Add("Sub", {e.Scalar(f, a0), c1}));
  if (a2 != 0) {
    ASSIGN_OR_RETURN(Value * twice, e.Add("Mul", {angle, e.Scalar(f, 2)}));
    ASSIGN_OR_RETURN(Value * c2, e.Add("Cos", {twice}));
    ASSIGN_OR_RETURN(c2, e.Add("Mul", {c2, e.Scalar(f, a2)}));
    ASSIGN_OR_RETURN(w, e.Add("Add", {w, c2}));
  }
  ASSIGN_OR_RETURN(w, e.Cast(w, t));
  return e.Finish(w, out);
}

// ---- BitwiseNot ----

// BitwiseNot: a BitwiseXor with every bit set.
absl::Status DecomposeBitwiseNot(Graph* g, Node* n) {
  Value* x = n->input(0);
  Tensor ones(x->dtype(), {});
  std::memset(ones.data<uint8_t>(), 0xff, ones.nbytes());
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  ASSIGN_OR_RETURN(Value * y, e.Add("BitwiseXor", {x, e.Constant(x->name() + "/all_ones", std::move(ones))}));
  return e.Finish(y, out);
}

// ---- LpPool, GlobalLpPool ----

// (the sum of |x|^p over each window)^(1/p). The sum is the window's volume times an
// AveragePool that counts its zero padding; GlobalLpPool's is a ReduceSum over the spatial
// dims. Where the spatial dims are static the padding is made explicit, ceil_mode's last
// window included (its taps past the input then fall in padding, adding zeros).
absl::Status DecomposeLpPool(Graph* g, Node* n, int version) {
  Value* x = n->input(0);
  if (!x->shape().has_rank()) return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes ", n->op_type(), " by rank");
  const int rank = x->shape().rank();
  const double p = version == 1 ? n->AttrFloat("p", 2.f) : static_cast<double>(n->AttrInt("p", 2));
  const bool global = n->op_type() == "GlobalLpPool";
  std::map<std::string, Attribute> pool;
  int64_t volume = 1;
  if (!global) {
    const PoolAttrs a = PoolAttrsOf(*n);
    for (int64_t k : a.kernel_shape) volume *= k;
    pool["kernel_shape"] = Attribute::Ints(a.kernel_shape);
    pool["count_include_pad"] = Attribute::Int(1);
    if (!a.strides.empty()) pool["strides"] = Attribute::Ints(a.strides);
    if (!a.dilations.empty()) pool["dilations"] = Attribute::Ints(a.dilations);
    std::vector<int64_t> spatial;
    for (int d = 2; d < rank; ++d)
      if (x->shape()[d].is_static()) spatial.push_back(x->shape()[d].value);
    if (static_cast<int>(spatial.size()) == rank - 2) {
      ASSIGN_OR_RETURN(const PoolGeometry geo, PlanPoolGeometry(spatial, a));
      std::vector<int64_t> pads(2 * geo.spatial);
      for (int d = 0; d < geo.spatial; ++d) {
        const int64_t span = (geo.out[d] - 1) * geo.stride[d] + geo.dilation[d] * (geo.kernel[d] - 1) + 1;
        pads[d] = geo.pad_begin[d];
        pads[geo.spatial + d] = std::max(geo.pad_end[d], span - spatial[d] - geo.pad_begin[d]);
      }
      pool["pads"] = Attribute::Ints(pads);
    } else if (a.ceil_mode) {
      return Unimplemented(n->Describe(), ": ceil_mode over symbolic spatial dims ", x->shape().ToString(),
                           "; cleave decomposes it over static ones");
    } else {
      if (!a.pads.empty()) pool["pads"] = Attribute::Ints(a.pads);
      pool["auto_pad"] = Attribute::String(a.auto_pad);
    }
  }
  const DataType t = x->dtype();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  Value* powered;
  if (p == 2) {
    ASSIGN_OR_RETURN(powered, e.Add("Mul", {x, x}));
  } else {
    ASSIGN_OR_RETURN(powered, e.Add("Abs", {x}));
    if (p != 1) {
      ASSIGN_OR_RETURN(powered, e.Add("Pow", {powered, e.Scalar(t, p)}));
    }
  }
  Value* sum;
  if (global) {
    std::vector<int64_t> axes;
    for (int d = 2; d < rank; ++d) axes.push_back(d);
    ASSIGN_OR_RETURN(sum, e.ReduceSum(powered, axes, /*keepdims=*/true));
  } else {
    ASSIGN_OR_RETURN(Value * mean, e.Add("AveragePool", {powered}, pool));
    ASSIGN_OR_RETURN(sum, e.Add("Mul", {mean, e.Scalar(t, static_cast<double>(volume))}));
  }
  Value* y = sum;
  if (p == 2) {
    ASSIGN_OR_RETURN(y, e.Add("Sqrt", {sum}));
  } else if (p != 1) {
    ASSIGN_OR_RETURN(y, e.Add("Pow", {sum, e.Scalar(t, 1.0 / p)}));
  }
  return e.Finish(y, out);
}

}  // namespace

absl::StatusOr<bool> OpDecomposition::Run(Graph* g) {
  std::vector<Node*> todo;
  for (const auto& n : g->nodes()) {
    const OpDef* def = FindOp(n->domain(), n->op_type());
    if (def && def->decomposed) todo.push_back(n.get());
  }
  // The rewrites read the nodes' output types and their inputs' dtypes and shapes: infer them
  // first, for a graph the pass sees before any shape inference.
  if (!todo.empty()) RETURN_IF_ERROR(InferShapes(*g));
  for (Node* n : todo) {
    ASSIGN_OR_RETURN(ResolvedOp op, ResolveNode(*g, *n));
    const std::string& t = n->op_type();
    if (t == "Einsum") RETURN_IF_ERROR(decompose::DecomposeEinsum(g, n));
    else if (t == "RNN" || t == "GRU" || t == "LSTM") RETURN_IF_ERROR(decompose::DecomposeRecurrent(g, n, op.version));
    else if (n->op_type() == "GroupNormalization") RETURN_IF_ERROR(DecomposeGroupNormalization(g, n, op.version));
    else if (n->op_type() == "OneHot") RETURN_IF_ERROR(DecomposeOneHot(g, n));
    else if (n->op_type() == "Hardmax") RETURN_IF_ERROR(DecomposeHardmax(g, n, op.version));
    else if (n->op_type() == "EyeLike") RETURN_IF_ERROR(DecomposeEyeLike(g, n));
    else if (n->op_type() == "Shrink") RETURN_IF_ERROR(DecomposeShrink(g, n));
    else if (n->op_type() == "LRN") RETURN_IF_ERROR(DecomposeLrn(g, n));
    else if (t == "LpPool" || t == "GlobalLpPool") RETURN_IF_ERROR(DecomposeLpPool(g, n, op.version));
    else if (t == "MeanVarianceNormalization") RETURN_IF_ERROR(DecomposeMeanVarianceNormalization(g, n));
    else if (t == "LpNormalization") RETURN_IF_ERROR(DecomposeLpNormalization(g, n));
    else if (t == "BitwiseNot") RETURN_IF_ERROR(DecomposeBitwiseNot(g, n));
    else if (t == "HannWindow" || t == "HammingWindow" || t == "BlackmanWindow") RETURN_IF_ERROR(DecomposeWindow(g, n));
    else if (t == "CenterCropPad") RETURN_IF_ERROR(decompose::DecomposeCenterCropPad(g, n));
    else if (t == "ReverseSequence") RETURN_IF_ERROR(decompose::DecomposeReverseSequence(g, n));
    else if (t == "MaxUnpool") RETURN_IF_ERROR(decompose::DecomposeMaxUnpool(g, n));
    else if (t == "AffineGrid") RETURN_IF_ERROR(decompose::DecomposeAffineGrid(g, n));
    else if (t == "Col2Im") RETURN_IF_ERROR(decompose::DecomposeCol2Im(g, n));
    else if (t == "QuantizeLinear" || t == "DequantizeLinear") RETURN_IF_ERROR(decompose::DecomposeQuantize(g, n, op.version));
    else if (t == "DynamicQuantizeLinear") RETURN_IF_ERROR(decompose::DecomposeDynamicQuantize(g, n));
    else RETURN_IF_ERROR(DecomposeDepthSpace(g, n));
  }
  if (todo.empty()) return false;
  g->RemoveUnusedValues();
  RETURN_IF_ERROR(g->SortTopologically());
  return true;
}

}  // namespace cleave::graph
