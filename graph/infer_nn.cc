// Shape and type inference for linear algebra, normalisation, reductions, losses, Dropout
// and Trilu (graph/). Static dims are computed where the inputs allow, symbolic dims pass
// through unchanged, and an input of unknown rank yields an output of unknown rank.
// Errors say what was expected and what was found.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_shape_util.h"
#include "graph/infer_util.h"
#include "graph/dims_value.h"
#include "graph/pool_geometry.h"
#include "graph/resize_geometry.h"

namespace cleave::graph {

namespace {

std::string InputName(const InferContext& ctx, int i) {
  return absl::StrCat("input ", i, " '", ctx.node().input(i)->name(), "'");
}

// Input i must have input 0's dtype (when both are known).
absl::Status ExpectSameDtype(const InferContext& ctx, int i) {
  DataType a = ctx.input_dtype(0), b = ctx.input_dtype(i);
  if (a == DataType::kUndefined || b == DataType::kUndefined || a == b) return absl::OkStatus();
  return ctx.Error(InputName(ctx, i), " has dtype ", DataTypeName(b), ", expected ",
                   DataTypeName(a), " (the dtype of input 0)");
}

// Two dims that must be equal: an error only when both are static and differ.
bool DimsConflict(const Dim& a, const Dim& b) {
  return a.is_static() && b.is_static() && a.value != b.value;
}

std::string DimText(const Dim& d) {
  if (d.is_static()) return std::to_string(d.value);
  return d.symbol.empty() ? "?" : d.symbol;
}

// numpy matmul of shapes a and b (B transposed in its last two dims when trans_b).
absl::StatusOr<Shape> MatMulShape(const InferContext& ctx, const Shape& a, const Shape& b,
                                  bool trans_b, bool trans_a = false) {
  if (!a.has_rank() || !b.has_rank()) return Shape();
  if (a.rank() == 0 || b.rank() == 0)
    return ctx.Error("expected operands of rank >= 1, got A ", a.ToString(), " and B ",
                     b.ToString());
  const int ra = a.rank(), rb = b.rank();
  if (trans_a && ra < 2) return ctx.Error("expected A of rank >= 2 with transA, got ", a.ToString());
  Dim ka = a[ra - (trans_a ? 2 : 1)];
  Dim kb = rb == 1 ? b[0] : b[rb - (trans_b ? 1 : 2)];
  if (DimsConflict(ka, kb))
    return ctx.Error("inner dims differ: A ", a.ToString(), " has K = ", ka.value, ", B ",
                     b.ToString(), trans_b ? " (transposed)" : "", " has K = ", kb.value);
  std::vector<Dim> ba(a.dims().begin(), a.dims().end() - std::min(ra, 2));
  std::vector<Dim> bb(b.dims().begin(), b.dims().end() - std::min(rb, 2));
  ASSIGN_OR_RETURN(Shape batch, BroadcastShapes(ctx, {Shape(ba), Shape(bb)}));
  std::vector<Dim> out = batch.dims();
  if (ra >= 2) out.push_back(a[ra - (trans_a ? 1 : 2)]);
  if (rb >= 2) out.push_back(b[rb - (trans_b ? 2 : 1)]);
  return Shape(std::move(out));
}

}  // namespace

absl::Status InferMatMul(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  ASSIGN_OR_RETURN(Shape out, MatMulShape(ctx, ctx.input_shape(0), ctx.input_shape(1), false));
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(out));
  return absl::OkStatus();
}

absl::Status InferGemm(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  const Node& n = ctx.node();
  const bool ta = n.AttrInt("transA", 0) != 0, tb = n.AttrInt("transB", 0) != 0;
  const Shape& a = ctx.input_shape(0);
  const Shape& b = ctx.input_shape(1);
  for (int i = 0; i < 2; ++i) {
    const Shape& s = ctx.input_shape(i);
    if (s.has_rank() && s.rank() != 2)
      return ctx.Error("expected ", InputName(ctx, i), " of rank 2, got ", s.ToString());
  }
  if (ctx.version() < 11 && !ctx.has_input(2))
    return ctx.Error("input C is required before Gemm version 11 (this node is version ",
                     ctx.version(), ")");
  Dim M, N;
  if (a.has_rank() && b.has_rank()) {
    Dim ka = a[ta ? 0 : 1], kb = b[tb ? 1 : 0];
    if (DimsConflict(ka, kb))
      return ctx.Error("inner dims differ: op(A) of A ", a.ToString(), " has K = ", ka.value,
                       ", op(B) of B ", b.ToString(), " has K = ", kb.value);
  }
  if (a.has_rank()) M = a[ta ? 1 : 0];
  if (b.has_rank()) N = b[tb ? 0 : 1];
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ExpectSameDtype(ctx, 2));
    const Shape& c = ctx.input_shape(2);
    if (c.has_rank()) {
      if (c.rank() > 2)
        return ctx.Error("expected C of rank <= 2 (broadcast to [M, N]), got ", c.ToString());
      const Dim target[2] = {M, N};
      for (int k = 0; k < c.rank(); ++k) {
        const Dim& d = c[k];
        const Dim& t = target[2 - c.rank() + k];
        if (d.is_static() && d.value != 1 && DimsConflict(d, t))
          return ctx.Error("C ", c.ToString(), " does not broadcast to [M, N] = [", DimText(M),
                           ", ", DimText(N), "]");
      }
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape({M, N}));
  return absl::OkStatus();
}

absl::Status InferFusedMatMul(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  const Node& n = ctx.node();
  const std::string act = n.AttrString("activation", "");
  if (act != "" && act != "gelu" && act != "gelu_tanh")
    return ctx.Error("expected activation '', 'gelu' or 'gelu_tanh', got '", act, "'");
  const bool tb = n.AttrInt("transB", 0) != 0;
  const Shape& b = ctx.input_shape(1);
  if (b.has_rank() && b.rank() < 2)
    return ctx.Error("expected B of rank >= 2, got ", b.ToString());
  const bool ta = n.AttrInt("transA", 0) != 0;
  ASSIGN_OR_RETURN(Shape out, MatMulShape(ctx, ctx.input_shape(0), b, tb, ta));
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ExpectSameDtype(ctx, 2));
    const Shape& bias = ctx.input_shape(2);
    if (bias.has_rank()) {
      if (bias.rank() != 1)
        return ctx.Error("expected bias of rank 1 ([N]), got ", bias.ToString());
      if (b.has_rank() && DimsConflict(bias[0], b[b.rank() - (tb ? 2 : 1)]))
        return ctx.Error("bias ", bias.ToString(), " does not match N of B ", b.ToString());
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), std::move(out));
  return absl::OkStatus();
}

// MatMulBf16 and MatMulF16: low-precision operands, a float32 result (or, with `to`, one of the
// operands' type, rounded from the float32 accumulation), an optional bias [N] of the result's
// type added to every row.
absl::Status InferMatMulBf16(InferContext& ctx) {
  const DataType low = ctx.node().op_type() == "MatMulF16" ? DataType::kFloat16 : DataType::kBFloat16;
  const int64_t to = ctx.node().AttrInt("to", static_cast<int64_t>(DataType::kFloat32));
  if (to != static_cast<int64_t>(DataType::kFloat32) && to != static_cast<int64_t>(low))
    return ctx.Error("attribute to = ", to, ": expected ", static_cast<int>(DataType::kFloat32), " (float32) or ",
                     static_cast<int>(low), " (", DataTypeName(low), ")");
  const DataType result = static_cast<DataType>(to);
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {low}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {low}));
  const Node& n = ctx.node();
  const Shape& a = ctx.input_shape(0);
  const Shape& b = ctx.input_shape(1);
  if (a.has_rank() && a.rank() < 2) return ctx.Error("expected A of rank >= 2, got ", a.ToString());
  if (b.has_rank() && b.rank() != 2 && a.has_rank() && b.rank() != a.rank())
    return ctx.Error("expected B of rank 2 or of A's rank ", a.rank(), ", got ", b.ToString());
  ASSIGN_OR_RETURN(Shape out, MatMulShape(ctx, a, b, n.AttrInt("transB", 0) != 0, n.AttrInt("transA", 0) != 0));
  // `rows`: only op(A)'s first rows rows (2-D A): a padded operand's product that leaves out
  // its padding.
  if (n.HasAttr("rows")) {
    const int64_t rows = n.AttrInt("rows", 0);
    if (a.has_rank() && a.rank() != 2) return ctx.Error("rows = ", rows, " needs a 2-D A, got ", a.ToString());
    if (rows < 0 || (out.has_rank() && out[0].is_static() && rows > out[0].value))
      return ctx.Error("rows = ", rows, ": expected 0 to op(A)'s ", out[0].value, " rows");
    if (out.has_rank()) out = Shape({Dim(rows), out[1]});
  }
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ExpectDtype(ctx, 2, {result}));
    const Shape& bias = ctx.input_shape(2);
    if (bias.has_rank() && (bias.rank() != 1 || (out.has_rank() && DimsConflict(bias[0], out[out.rank() - 1]))))
      return ctx.Error("expected bias [N] for a result ", out.ToString(), ", got ", bias.ToString());
  }
  // An accumulation buffer (float32, the result's shape) and its bool reset flag: the result is
  // the product plus the buffer, or the product alone when reset.
  if (ctx.has_input(3) != ctx.has_input(4))
    return ctx.Error("expected the accumulation buffer (input 3) and its reset flag (input 4) together");
  if (ctx.has_input(3)) {
    if (result != DataType::kFloat32 || ctx.has_input(2))
      return ctx.Error("accumulating into a buffer needs a float32 result and no bias");
    RETURN_IF_ERROR(ExpectDtype(ctx, 3, {DataType::kFloat32}));
    RETURN_IF_ERROR(ExpectDtype(ctx, 4, {DataType::kBool}));
    const Shape& acc = ctx.input_shape(3);
    if (acc.is_static() && out.is_static() && acc != out)
      return ctx.Error("expected an accumulation buffer of the result's shape ", out.ToString(), ", got ",
                       acc.ToString());
  }
  // dbias (output 1): the float32 sums over K of A [K, M] (dbias_operand 0, with transA) or of
  // B [K, N] (1, without transB), 2-D operands and a float32 result: a weight gradient's product
  // that also forms its layer's bias gradient.
  if (ctx.num_outputs() > 1 && ctx.has_output(1)) {
    const int64_t of = n.AttrInt("dbias_operand", 1);
    if (of != 0 && of != 1) return ctx.Error("attribute dbias_operand = ", of, ": expected 0 (A) or 1 (B)");
    if (result != DataType::kFloat32) return ctx.Error("dbias needs a float32 result");
    if ((a.has_rank() && a.rank() != 2) || (b.has_rank() && b.rank() != 2))
      return ctx.Error("dbias needs 2-D A and B, got ", a.ToString(), " and ", b.ToString());
    if (of == 0 && n.HasAttr("rows")) return ctx.Error("dbias of A with rows");
    const bool stored_k_first = of == 0 ? n.AttrInt("transA", 0) != 0 : n.AttrInt("transB", 0) == 0;
    if (!stored_k_first)
      return ctx.Error("dbias sums ", of == 0 ? "A" : "B", " over K, stored first: expected ",
                       of == 0 ? "transA = 1" : "transB = 0");
    const Shape& summed = of == 0 ? a : b;
    ctx.SetOutput(1, DataType::kFloat32, summed.has_rank() ? Shape({summed[1]}) : Shape());
  }
  // `activation` (GELU of the result, bias included) with its input as output 2, or
  // `activation_grad`: the product times the GELU's derivative at input 5 (the result's shape and
  // type; no bias, accumulation or activation). Neither beside a dbias or rows.
  const std::string act = n.AttrString("activation", ""), act_grad = n.AttrString("activation_grad", "");
  for (const std::string* a : {&act, &act_grad})
    if (!a->empty() && *a != "gelu" && *a != "gelu_tanh")
      return ctx.Error("attribute ", a == &act ? "activation" : "activation_grad", " = '", *a,
                       "': expected 'gelu' or 'gelu_tanh'");
  const bool pre_out = ctx.num_outputs() > 2 && ctx.has_output(2);
  if (pre_out && act.empty()) return ctx.Error("output 2 (the GELU input) needs an activation");
  if (act_grad.empty() == ctx.has_input(5))
    return ctx.Error(act_grad.empty() ? "input 5 (the GELU input) needs activation_grad"
                                      : "activation_grad needs the GELU input (input 5)");
  if ((!act.empty() || !act_grad.empty()) &&
      ((ctx.num_outputs() > 1 && ctx.has_output(1)) || n.HasAttr("rows") || ctx.has_input(3)))
    return ctx.Error("a GELU with a dbias, rows or an accumulation buffer");
  if (!act_grad.empty()) {
    if (!act.empty() || ctx.has_input(2)) return ctx.Error("activation_grad with an activation or a bias");
    RETURN_IF_ERROR(ExpectDtype(ctx, 5, {result}));
    const Shape& x = ctx.input_shape(5);
    if (x.is_static() && out.is_static() && x != out)
      return ctx.Error("expected the GELU input of the result's shape ", out.ToString(), ", got ", x.ToString());
  }
  if (pre_out) ctx.SetOutput(2, result, out);
  ctx.SetOutput(0, result, std::move(out));
  return absl::OkStatus();
}

absl::Status InferSoftmax(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64,
                                       DataType::kFloat16, DataType::kBFloat16}));
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank()) {
    // Before version 13 the axis (default 1) splits x into [outer, inner]; from 13 it
    // names the one normalised axis (default -1). Both accept [-r, r-1].
    const int64_t axis = ctx.node().AttrInt("axis", ctx.version() < 13 ? 1 : -1);
    RETURN_IF_ERROR(NormalizeAxis(ctx, axis, x.rank()).status());
  }
  return InferSameAsInput0(ctx);
}

absl::Status InferLayerNorm(InferContext& ctx) {
  // ai.cleave.RMSNormalization(X, Scale) -> Y, InvStdDev: no bias, no mean.
  const bool rms = ctx.node().op_type() == "RMSNormalization";
  const int inv = rms ? 1 : 2;
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64,
                                       DataType::kFloat16, DataType::kBFloat16}));
  RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  if (ctx.has_input(2)) RETURN_IF_ERROR(ExpectSameDtype(ctx, 2));
  const Node& n = ctx.node();
  const int64_t stash = n.AttrInt("stash_type", 1);
  const DataType stash_type = DataTypeFromInt(static_cast<int>(stash));
  if (!IsFloat(stash_type))
    return ctx.Error("expected stash_type to name a float type (1 = float32), got ", stash);
  const Shape& x = ctx.input_shape(0);
  ctx.SetOutput(0, ctx.input_dtype(0), x);
  if (!x.has_rank()) {
    for (int i = 1; i <= inv; ++i) ctx.SetOutput(i, stash_type, Shape());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, n.AttrInt("axis", -1), x.rank()));
  // Scale and bias broadcast (right-aligned) over the normalised dims x[axis:].
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    const Shape& s = ctx.input_shape(i);
    if (!s.has_rank()) continue;
    bool ok = s.rank() <= x.rank() - axis;
    for (int k = 0; ok && k < s.rank(); ++k) {
      const Dim& d = s[k];
      ok = !(d.is_static() && d.value != 1 && DimsConflict(d, x[x.rank() - s.rank() + k]));
    }
    if (!ok)
      return ctx.Error(InputName(ctx, i), " ", s.ToString(),
                       " does not broadcast over the normalised dims of X ", x.ToString(),
                       " from axis ", axis);
  }
  std::vector<Dim> stat = x.dims();
  for (int k = axis; k < x.rank(); ++k) stat[k] = Dim(1);
  for (int i = 1; i <= inv; ++i) ctx.SetOutput(i, stash_type, Shape(stat));
  return absl::OkStatus();
}

// What Conv and ConvTranspose check alike: X, W and B of one float dtype, and X and W of one rank
// >= 3 (W laid out as `w_layout` says). False, with Y set as far as it is known, where a rank is
// not.
absl::StatusOr<bool> ConvRanksKnown(InferContext& ctx, const char* w_layout) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  if (ctx.has_input(2)) RETURN_IF_ERROR(ExpectSameDtype(ctx, 2));
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  if (!x.has_rank() || !w.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? UnknownDims(x.rank()) : Shape());
    return false;
  }
  if (x.rank() < 3 || w.rank() != x.rank())
    return ctx.Error("expected X [N, C, spatial...] and W ", w_layout, " of one rank >= 3, got ", x.ToString(),
                     " and ", w.ToString());
  return true;
}

absl::Status InferConv(InferContext& ctx) {
  ASSIGN_OR_RETURN(const bool known, ConvRanksKnown(ctx, "[M, C / group, kernel...]"));
  if (!known) return absl::OkStatus();
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  const int r = x.rank(), s = r - 2;
  const Node& n = ctx.node();
  const int64_t group = n.AttrInt("group", 1);
  if (x[1].is_static() && w[1].is_static() && (group < 1 || x[1].value != w[1].value * group))
    return ctx.Error("X's ", x[1].value, " channels are not W's dim 1 (", w[1].value, ") times group ", group);
  const std::string auto_pad = n.AttrString("auto_pad", "NOTSET");
  const std::vector<int64_t> strides = n.AttrInts("strides"), dilations = n.AttrInts("dilations"),
                             pads = n.AttrInts("pads");
  std::vector<Dim> out = {x[0], w[0]};
  for (int d = 0; d < s; ++d) {
    const Dim& in = x[2 + d];
    const Dim& k = w[2 + d];
    const int64_t stride = d < static_cast<int>(strides.size()) ? strides[d] : 1;
    const int64_t dil = d < static_cast<int>(dilations.size()) ? dilations[d] : 1;
    constexpr int64_t kLimit = int64_t{1} << 31;  // the kernel's bounds (kernels/cpu/conv.cc)
    bool huge = stride >= kLimit || dil >= kLimit || (in.is_static() && in.value >= kLimit) ||
                (k.is_static() && k.value >= kLimit);
    for (int64_t v : pads) huge |= v >= kLimit || v < 0;
    if (!in.is_static() || !k.is_static() || stride < 1 || dil < 1 || huge) {
      out.push_back(Dim());
      continue;
    }
    const int64_t span = dil * (k.value - 1) + 1;
    int64_t padded = in.value;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out.push_back(Dim((in.value + stride - 1) / stride));
      continue;
    }
    if (auto_pad == "NOTSET" && static_cast<int>(pads.size()) == 2 * s) padded += pads[d] + pads[s + d];
    if (padded < span)
      return ctx.Error("spatial dim ", d, " of ", in.value, " (padded to ", padded, ") is smaller than the ", span,
                       " the dilated kernel spans");
    out.push_back(Dim((padded - span) / stride + 1));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// BatchNormalization (X [N, C, ...], scale, B, input_mean, input_var [C]) -> Y of X's, and in
// training mode running_mean, running_var [C] of input_mean's dtype.
// ai.cleave.BatchNormalizationGrad (dY, X, scale, input_mean, input_var) -> dX of X's, dScale and
// dB of scale's. InstanceNormalization (X, scale, B) and ai.cleave.InstanceNormalizationGrad
// (dY, X, scale) likewise.
absl::Status InferBatchNorm(InferContext& ctx) {
  const bool grad = ctx.node().domain() == kCleaveDomain;
  const int xi = grad ? 1 : 0;
  const std::initializer_list<DataType> floats = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                                  DataType::kBFloat16};
  RETURN_IF_ERROR(ExpectDtype(ctx, xi, floats));
  if (grad) RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
  for (int i = xi + 1; i < ctx.num_inputs(); ++i) RETURN_IF_ERROR(ExpectDtype(ctx, i, floats));
  const Shape& x = ctx.input_shape(xi);
  Dim channels;
  if (x.has_rank()) {
    if (x.rank() < 2) return ctx.Error("expected X [N, C, ...] of rank >= 2, got ", x.ToString());
    channels = x[1];
  }
  for (int i = xi + 1; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    if (s.has_rank() && (s.rank() != 1 || DimsConflict(s[0], channels)))
      return ctx.Error(InputName(ctx, i), " is ", s.ToString(), "; expected [", DimText(channels), "] (X's channels)");
  }
  ctx.SetOutput(0, ctx.input_dtype(xi), x);
  const DataType stat = grad || ctx.num_inputs() < 4 ? ctx.input_dtype(2) : ctx.input_dtype(3);
  for (int o = 1; o < ctx.num_outputs(); ++o) ctx.SetOutput(o, stat, Shape({channels}));
  return absl::OkStatus();
}

// MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool: Y [N, C, out...] (and MaxPool's
// Indices, int64 of Y's shape) from X [N, C, spatial...] and the window (graph/pool_geometry.h).
absl::Status InferPool(InferContext& ctx) {
  if (ctx.node().op_type() == "MaxPool")
    RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                         DataType::kBFloat16, DataType::kInt8, DataType::kUInt8}));
  else
    RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  const Shape& x = ctx.input_shape(0);
  Shape out;
  if (x.has_rank()) {
    const int r = x.rank();
    if (r < 3 || r > kMaxRank)
      return ctx.Error("expected X [N, C, spatial...] of rank 3 to ", kMaxRank, ", got ", x.ToString());
    std::vector<Dim> dims = {x[0], x[1]};
    std::vector<int64_t> spatial;
    for (int d = 2; d < r; ++d)
      if (x[d].is_static()) spatial.push_back(x[d].value);
    if (static_cast<int>(spatial.size()) == r - 2) {
      auto g = PlanPoolGeometry(spatial, PoolAttrsOf(ctx.node()));
      if (!g.ok()) return ctx.Error(g.status().message());
      for (int d = 0; d < r - 2; ++d) dims.push_back(Dim(g->out[d]));
    } else {
      dims.resize(static_cast<size_t>(r));
    }
    out = Shape(std::move(dims));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), out);
  if (ctx.num_outputs() > 1) ctx.SetOutput(1, DataType::kInt64, out);
  return absl::OkStatus();
}

// ai.cleave.MaxPoolGrad(dY, X) -> dX of X's; ai.cleave.AveragePoolGrad(dY, X's shape) -> dX of
// dY's dtype and the shape's dims where they are known.
absl::Status InferPoolGrad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  if (ctx.node().op_type() == "MaxPoolGrad") {
    RETURN_IF_ERROR(ExpectSameDtype(ctx, 1));
    ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  Shape out;
  if (auto dims = InputDimsValue(ctx.node(), 1)) {
    for (Dim& d : *dims)
      if (!d.symbol.empty() && d.symbol[0] == '-') d = Dim();
    out = Shape(std::move(*dims));
  } else if (const Shape& s = ctx.input_shape(1); s.has_rank() && s.rank() == 1 && s[0].is_static()) {
    out = UnknownDims(static_cast<int>(s[0].value));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), out);
  return absl::OkStatus();
}

// ConvTranspose (X [N, C, in...], W [C, M / group, kernel...][, B [M]]) -> Y [N, M, out...]:
// output_shape where given, in * stride under SAME_UPPER / SAME_LOWER, else
// stride * (in - 1) + output_padding + dilation * (kernel - 1) + 1 - pads (the kernels' plan,
// kernels/cpu/conv.h PlanConvTranspose, checks the rest).
absl::Status InferConvTranspose(InferContext& ctx) {
  ASSIGN_OR_RETURN(const bool known, ConvRanksKnown(ctx, "[C, M / group, kernel...]"));
  if (!known) return absl::OkStatus();
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  const int s = x.rank() - 2;
  const Node& n = ctx.node();
  const int64_t group = n.AttrInt("group", 1);
  if (group < 1) return ctx.Error("group must be >= 1, got ", group);
  if (x[1].is_static() && w[0].is_static() && x[1].value != w[0].value)
    return ctx.Error("X's ", x[1].value, " channels are not W's dim 0 (", w[0].value, ")");
  const std::string auto_pad = n.AttrString("auto_pad", "NOTSET");
  const std::vector<int64_t> strides = n.AttrInts("strides"), dilations = n.AttrInts("dilations"),
                             pads = n.AttrInts("pads"), out_pad = n.AttrInts("output_padding"),
                             out_shape = n.AttrInts("output_shape");
  auto at = [](const std::vector<int64_t>& v, int d, int64_t dflt) {
    return d < static_cast<int>(v.size()) ? v[d] : dflt;
  };
  const int shape_at = static_cast<int>(out_shape.size()) == s + 2 ? 2 : 0;
  std::vector<Dim> out = {x[0], w[1].is_static() ? Dim(w[1].value * group) : Dim()};
  for (int d = 0; d < s; ++d) {
    const Dim& in = x[2 + d];
    const Dim& k = w[2 + d];
    const int64_t stride = at(strides, d, 1), dil = at(dilations, d, 1);
    constexpr int64_t kLimit = int64_t{1} << 31;  // the kernel's bounds (kernels/cpu/conv.cc)
    if (!out_shape.empty()) {
      out.push_back(Dim(out_shape[static_cast<size_t>(shape_at + d)]));
      continue;
    }
    bool usable = in.is_static() && k.is_static() && stride >= 1 && dil >= 1 && stride < kLimit && dil < kLimit &&
                  in.value >= 1 && in.value < kLimit && k.value < kLimit;
    for (int64_t v : pads) usable &= v >= 0 && v < kLimit;
    if (!usable) {
      out.push_back(Dim());
      continue;
    }
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      out.push_back(Dim(in.value * stride));
      continue;
    }
    int64_t y = stride * (in.value - 1) + at(out_pad, d, 0) + dil * (k.value - 1) + 1;
    if (auto_pad == "NOTSET" && static_cast<int>(pads.size()) == 2 * s) y -= pads[d] + pads[s + d];
    if (y < 0) return ctx.Error("pads take more than the extent of Y's spatial dim ", d);
    out.push_back(Dim(y));
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferConvTransposeGrad(InferContext& ctx) {
  const Shape& w = ctx.input_shape(2);
  const int64_t group = ctx.node().AttrInt("group", 1);
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
  ctx.SetOutput(1, ctx.input_dtype(2), w);
  ctx.SetOutput(2, ctx.input_dtype(2),
                w.has_rank() && w.rank() > 1 && w[1].is_static() ? Shape({Dim(w[1].value * group)}) : UnknownDims(1));
  return absl::OkStatus();
}

// Resize (X, roi, scales, sizes): Y of X's dtype; its dims where the scales or sizes are
// constants (graph/resize_geometry.h), else of X's rank.
absl::Status InferResize(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  const Shape& x = ctx.input_shape(0);
  ASSIGN_OR_RETURN(const ResizeAttrs a, ResizeAttrsOf(ctx.node()));
  auto floats = [&](int i) -> std::optional<std::vector<float>> {
    if (!ctx.has_input(i)) return std::vector<float>{};
    const Tensor* t = ctx.input_constant(i);
    if (!t || t->dtype() != DataType::kFloat32) return std::nullopt;
    return std::vector<float>(t->data<float>(), t->data<float>() + t->numel());
  };
  const std::optional<std::vector<float>> roi = floats(1), scales = floats(2);
  std::optional<std::vector<int64_t>> sizes = std::vector<int64_t>{};
  if (ctx.has_input(3)) sizes = ConstantInts(ctx, 3);
  if (!x.is_static() || !roi || !scales || !sizes) {
    ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? UnknownDims(x.rank()) : Shape());
    return absl::OkStatus();
  }
  std::vector<int64_t> in;
  for (int d = 0; d < x.rank(); ++d) in.push_back(x[d].value);
  auto dims = PlanResize(in, a, *roi, *scales, *sizes);
  if (!dims.ok()) return ctx.Error(dims.status().message());
  std::vector<Dim> out;
  for (const ResizeDim& d : *dims) out.push_back(Dim(d.out));
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// ai.cleave.ResizeGrad (dY, X's shape, roi, scales, sizes): dX of dY's dtype, its dims the
// shape input's value where that is a constant.
absl::Status InferResizeGrad(InferContext& ctx) {
  std::optional<std::vector<int64_t>> dims = ConstantInts(ctx, 1);
  if (!dims) {
    const Shape& s = ctx.input_shape(1);
    ctx.SetOutput(0, ctx.input_dtype(0),
                  s.has_rank() && s.rank() == 1 && s[0].is_static() ? UnknownDims(static_cast<int>(s[0].value)) : Shape());
    return absl::OkStatus();
  }
  std::vector<Dim> out(dims->begin(), dims->end());
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferConvGrad(InferContext& ctx) {
  const Shape& w = ctx.input_shape(2);
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
  ctx.SetOutput(1, ctx.input_dtype(2), w);
  ctx.SetOutput(2, ctx.input_dtype(2), w.has_rank() && w.rank() > 0 ? Shape({w[0]}) : UnknownDims(1));
  return absl::OkStatus();
}

absl::Status InferReduce(InferContext& ctx) {
  const Node& n = ctx.node();
  // ReduceSum takes its axes as an input from version 13, the others from version 18.
  const int input_from = n.op_type() == "ReduceSum" ? 13 : 18;
  const bool axes_input = ctx.version() >= input_from;
  if (!axes_input && ctx.has_input(1))
    return ctx.Error("axes is an attribute before version ", input_from,
                     ", but this version ", ctx.version(), " node has a second input");
  if (axes_input && n.HasAttr("axes"))
    return ctx.Error("axes is an input from version ", input_from,
                     ", but this version ", ctx.version(), " node has an axes attribute");
  const bool keepdims = n.AttrInt("keepdims", 1) != 0;
  const bool noop = axes_input && n.AttrInt("noop_with_empty_axes", 0) != 0;
  std::optional<std::vector<int64_t>> axes;
  if (!axes_input) {
    axes = n.AttrInts("axes");
  } else if (!ctx.has_input(1)) {
    axes = std::vector<int64_t>{};
  } else {
    RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
    axes = ConstantInts(ctx, 1);
    if (!axes && ctx.input_shape(1).NumElements() == 0) axes = std::vector<int64_t>{};
  }
  const Shape& x = ctx.input_shape(0);
  const DataType dt = ctx.input_dtype(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, dt, Shape());
    return absl::OkStatus();
  }
  if (!axes) {  // axes known only at run time: with keepdims the rank survives
    if (!keepdims) {
      ctx.SetOutput(0, dt, Shape());
      return absl::OkStatus();
    }
    std::vector<Dim> out = x.dims();
    for (Dim& d : out)
      if (!(d.is_static() && d.value == 1)) d = Dim();
    ctx.SetOutput(0, dt, Shape(out));
    return absl::OkStatus();
  }
  if (axes->empty() && noop) return InferSameAsInput0(ctx);
  std::vector<bool> reduced(x.rank(), axes->empty());
  for (int64_t a : *axes) {
    ASSIGN_OR_RETURN(int k, NormalizeAxis(ctx, a, x.rank()));
    if (reduced[k])
      return ctx.Error("axis ", a, " appears more than once in axes [", absl::StrJoin(*axes, ", "), "]");
    reduced[k] = true;
  }
  std::vector<Dim> out;
  for (int k = 0; k < x.rank(); ++k) {
    if (!reduced[k]) out.push_back(x[k]);
    else if (keepdims) out.push_back(Dim(1));
  }
  ctx.SetOutput(0, dt, Shape(out));
  return absl::OkStatus();
}

absl::Status InferSoftmaxCrossEntropyLoss(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64,
                                       DataType::kFloat16, DataType::kBFloat16}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  if (ctx.has_input(2)) RETURN_IF_ERROR(ExpectSameDtype(ctx, 2));
  const std::string reduction = ctx.node().AttrString("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    return ctx.Error("expected reduction 'none', 'sum' or 'mean', got '", reduction, "'");
  const Shape& scores = ctx.input_shape(0);
  const Shape& labels = ctx.input_shape(1);
  if (scores.has_rank() && scores.rank() < 2)
    return ctx.Error("expected scores of rank >= 2 ([N, C, ...]), got ", scores.ToString());
  if (scores.has_rank() && labels.has_rank()) {
    bool ok = labels.rank() == scores.rank() - 1;
    for (int k = 0; ok && k < labels.rank(); ++k)
      ok = !DimsConflict(labels[k], scores[k == 0 ? 0 : k + 1]);
    if (!ok)
      return ctx.Error("labels ", labels.ToString(), " do not match scores ", scores.ToString(),
                       ": expected scores' dims without the class dim 1");
  }
  if (ctx.has_input(2) && scores.has_rank()) {
    const Shape& w = ctx.input_shape(2);
    if (w.has_rank() && (w.rank() != 1 || DimsConflict(w[0], scores[1])))
      return ctx.Error("expected weights of shape [C] = [", DimText(scores[1]), "], got ",
                       w.ToString());
  }
  Shape loss = Shape::Scalar();
  if (reduction == "none") {
    if (labels.has_rank()) {
      loss = labels;
    } else if (scores.has_rank()) {
      std::vector<Dim> d = scores.dims();
      d.erase(d.begin() + 1);
      loss = Shape(d);
    } else {
      loss = Shape();
    }
  }
  ctx.SetOutput(0, ctx.input_dtype(0), loss);
  ctx.SetOutput(1, ctx.input_dtype(0), scores);
  return absl::OkStatus();
}

absl::Status InferDropout(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64,
                                       DataType::kFloat16, DataType::kBFloat16}));
  if (ctx.has_input(1))
    RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kFloat32, DataType::kFloat64,
                                         DataType::kFloat16, DataType::kBFloat16}));
  if (ctx.has_input(2)) RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kBool}));
  for (int i = 1; i <= 2; ++i) {
    if (!ctx.has_input(i)) continue;
    const Shape& s = ctx.input_shape(i);
    if (s.has_rank() && s.NumElements() != 1 && s.is_static())
      return ctx.Error("expected ", InputName(ctx, i), " to be a scalar, got ", s.ToString());
  }
  if (const Tensor* r = ctx.input_constant(1)) {
    const double ratio = r->DoubleAt(0);
    if (!(ratio >= 0 && ratio < 1))
      return ctx.Error("expected ratio in [0, 1), got ", ratio);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  // Dropout-7 returned its mask in the input's type; from version 10 the mask is bool.
  ctx.SetOutput(1, ctx.version() < 10 ? ctx.input_dtype(0) : DataType::kBool, ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferTrilu(InferContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && x.rank() < 2)
    return ctx.Error("expected input of rank >= 2, got ", x.ToString());
  if (ctx.has_input(1)) {
    RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
    const Shape& k = ctx.input_shape(1);
    if (k.is_static() && k.NumElements() != 1)
      return ctx.Error("expected k to be a scalar, got ", k.ToString());
  }
  return InferSameAsInput0(ctx);
}

}  // namespace cleave::graph

namespace cleave::graph {

namespace {

// The Attention ops' layout attribute: "bhsd" (the default: [..., T, D], heads among the
// leading dims), "bshd" ([B, T, H, D], as the q/k/v products lay heads out) or "bs3hd" (q, k
// and v packed in input `packed` as [B, T, 3, H, D], the q/k/v product itself; k and v
// omitted).
enum class AttentionLayout { kBhsd, kBshd, kBs3hd };

absl::StatusOr<AttentionLayout> GetAttentionLayout(const InferContext& ctx, int packed) {
  const std::string layout = ctx.node().AttrString("layout", "bhsd");
  if (layout == "bhsd" || layout == "bshd") {
    if (!ctx.has_input(packed + 1) || !ctx.has_input(packed + 2))
      return ctx.Error("layout \"", layout, "\": expected q, k and v");
    return layout == "bshd" ? AttentionLayout::kBshd : AttentionLayout::kBhsd;
  }
  if (layout != "bs3hd") return ctx.Error("layout \"", layout, "\": expected \"bhsd\", \"bshd\" or \"bs3hd\"");
  if (ctx.has_input(packed + 1) || ctx.has_input(packed + 2))
    return ctx.Error("layout \"bs3hd\": q, k and v are packed in input ", packed, "; expected k and v omitted");
  const Shape& qkv = ctx.input_shape(packed);
  if (qkv.has_rank() && (qkv.rank() != 5 || (qkv[2].is_static() && qkv[2].value != 3)))
    return ctx.Error("layout \"bs3hd\": expected q, k and v packed [B, T, 3, H, D], got ", qkv.ToString());
  return AttentionLayout::kBs3hd;
}


}  // namespace

// Attention(q [..., T, D], k [..., S, D], v [..., S, Dv]) {scale, causal} -> out [..., T, Dv],
// lse [..., T] (float); with layout "bshd": q [B, T, H, D], k [B, S, H, D], v [B, S, H, Dv] ->
// out [B, T, H, Dv], lse [B, H, T].
// The optional additive bias of Attention (input `index`): float32 or q's type `t`, and dims
// that broadcast to the scores, lse's dims then S, where both are known.
absl::Status CheckAttentionBias(InferContext& ctx, int index, DataType t, const std::vector<Dim>& lse, const Dim& S) {
  if (!ctx.has_input(index)) return absl::OkStatus();
  const DataType bt = ctx.input_dtype(index);
  if (bt != DataType::kFloat32 && bt != t)
    return ctx.Error("expected a float32 bias or one of q's type ", DataTypeName(t), ", got ", DataTypeName(bt));
  const Shape& bias = ctx.input_shape(index);
  if (!bias.has_rank()) return absl::OkStatus();
  std::vector<Dim> scores = lse;
  scores.push_back(S);
  const int R = static_cast<int>(scores.size()), r = bias.rank();
  bool ok = r <= R;
  for (int d = 0; ok && d < r; ++d) {
    const Dim &b = bias[d], &x = scores[R - r + d];
    ok = !b.is_static() || b.value == 1 || !x.is_static() || b.value == x.value;
  }
  if (!ok)
    return ctx.Error("expected a bias that broadcasts to the scores ", Shape(scores).ToString(), ", got ",
                     bias.ToString());
  return absl::OkStatus();
}

absl::Status InferAttention(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  if (t != DataType::kFloat32 && t != DataType::kFloat64 && t != DataType::kBFloat16 && t != DataType::kFloat16)
    return ctx.Error("expected float q, got ", DataTypeName(t));
  for (int i = 1; i < 3; ++i)
    if (ctx.has_input(i) && ctx.input_dtype(i) != t)
      return ctx.Error("input ", i, " is ", DataTypeName(ctx.input_dtype(i)), ", q is ", DataTypeName(t));
  ASSIGN_OR_RETURN(const AttentionLayout layout, GetAttentionLayout(ctx, 0));
  if (layout == AttentionLayout::kBs3hd) {
    const Shape& qkv = ctx.input_shape(0);
    if (!qkv.has_rank()) {
      ctx.SetOutput(0, t, Shape());
      if (ctx.num_outputs() > 1) ctx.SetOutput(1, DataType::kFloat32, Shape());
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CheckAttentionBias(ctx, 3, t, {qkv[0], qkv[3], qkv[1]}, qkv[1]));
    ctx.SetOutput(0, t, Shape({qkv[0], qkv[1], qkv[3], qkv[4]}));
    if (ctx.num_outputs() > 1) ctx.SetOutput(1, DataType::kFloat32, Shape({qkv[0], qkv[3], qkv[1]}));
    return absl::OkStatus();
  }
  const bool bshd = layout == AttentionLayout::kBshd;
  const Shape& q = ctx.input_shape(0);
  const Shape& k = ctx.input_shape(1);
  const Shape& v = ctx.input_shape(2);
  if (!q.has_rank() || !k.has_rank() || !v.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    if (ctx.num_outputs() > 1) ctx.SetOutput(1, DataType::kFloat32, Shape());
    return absl::OkStatus();
  }
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    return ctx.Error("expected q, k and v of one rank >= 2, got ", q.ToString(), ", ", k.ToString(), ", ", v.ToString());
  if (bshd && q.rank() != 4)
    return ctx.Error("layout \"bshd\": expected q, k and v of rank 4 [B, T, H, D], got ", q.ToString());
  const int r = q.rank();
  // The sequence axis: r - 2, or 1 under "bshd" (whose heads axis 2 is a batch axis).
  const int seq = bshd ? 1 : r - 2;
  auto differ = [](const Dim& a, const Dim& b) { return a.is_static() && b.is_static() && a.value != b.value; };
  for (int d = 0; d < r - 1; ++d)
    if (d != seq && (differ(q[d], k[d]) || differ(q[d], v[d])))
      return ctx.Error("batch dims of q ", q.ToString(), ", k ", k.ToString(), " and v ", v.ToString(), " differ");
  if (differ(q[r - 1], k[r - 1])) return ctx.Error("q ", q.ToString(), " and k ", k.ToString(), " differ in D");
  if (differ(k[seq], v[seq])) return ctx.Error("k ", k.ToString(), " and v ", v.ToString(), " differ in S");
  std::vector<Dim> out = q.dims();
  out[r - 1] = v[r - 1];
  const std::vector<Dim> lse =
      bshd ? std::vector<Dim>{q[0], q[2], q[1]} : std::vector<Dim>(q.dims().begin(), q.dims().end() - 1);
  RETURN_IF_ERROR(CheckAttentionBias(ctx, 3, t, lse, k[seq]));
  ctx.SetOutput(0, t, Shape(out));
  if (ctx.num_outputs() > 1) ctx.SetOutput(1, DataType::kFloat32, Shape(lse));
  return absl::OkStatus();
}

// AttentionGrad(dOut, q, k, v, out, lse[, bias]) -> dq, dk, dv like q, k, v[, dbias] (bs3hd:
// dOut, qkv, _, _, out, lse[, bias] -> dqkv like qkv, _, _[, dbias]); dbias, the scores' gradient,
// is float32 over lse's dims and S.
absl::Status InferAttentionGrad(InferContext& ctx) {
  ASSIGN_OR_RETURN(const AttentionLayout layout, GetAttentionLayout(ctx, 1));
  const bool dbias = ctx.num_outputs() > 3 && ctx.node().output(3);
  if (dbias) {
    const Shape &lse = ctx.input_shape(5), &q = ctx.input_shape(1);
    const Shape& k = ctx.input_shape(layout == AttentionLayout::kBs3hd ? 1 : 2);
    const int seq = layout == AttentionLayout::kBhsd ? k.rank() - 2 : 1;
    if (!lse.has_rank() || !k.has_rank() || !q.has_rank()) {
      ctx.SetOutput(3, DataType::kFloat32, Shape());
    } else {
      std::vector<Dim> scores = lse.dims();
      scores.push_back(k[seq]);
      ctx.SetOutput(3, DataType::kFloat32, Shape(scores));
    }
  }
  if (layout == AttentionLayout::kBs3hd) {
    if (ctx.num_outputs() > 1 && (ctx.node().output(1) || (ctx.num_outputs() > 2 && ctx.node().output(2))))
      return ctx.Error("layout \"bs3hd\": one packed gradient, expected dk and dv omitted");
    ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
    return absl::OkStatus();
  }
  for (int i = 0; i < 3 && i < ctx.num_outputs(); ++i)
    ctx.SetOutput(i, ctx.input_dtype(1 + i), ctx.input_shape(1 + i));
  return absl::OkStatus();
}

}  // namespace cleave::graph

namespace cleave::graph {

// SkipRMSNormalization(x, skip, scale) {epsilon} -> y, inv_std_dev, sum: the same for RMSNorm.
// SkipLayerNormalization(x, skip, scale[, bias]) {epsilon} -> y, mean, inv_std_dev, sum: the
// LayerNormalization (last axis, float statistics) of sum = x + skip, which it also outputs.
absl::Status InferSkipLayerNorm(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  if (t != DataType::kFloat32 && t != DataType::kBFloat16 && t != DataType::kFloat16)
    return ctx.Error("expected float x, got ", DataTypeName(t));
  // skip (input 1) may be bf16 / fp16 with a float32 x: a low-precision product's result, added
  // as float32.
  const DataType skip_t = ctx.input_dtype(1);
  const bool low_skip =
      t == DataType::kFloat32 && (skip_t == DataType::kBFloat16 || skip_t == DataType::kFloat16);
  for (int i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i) && ctx.input_dtype(i) != t && !(i == 1 && low_skip))
      return ctx.Error("input ", i, " is ", DataTypeName(ctx.input_dtype(i)), ", x is ", DataTypeName(t));
  const Shape& x = ctx.input_shape(0);
  const Shape& skip = ctx.input_shape(1);
  if (x.has_rank() && skip.has_rank() && x.is_static() && skip.is_static() && x != skip)
    return ctx.Error("x ", x.ToString(), " and skip ", skip.ToString(), " differ");
  // y in x's type, or with `to` in bf16/fp16 (the next product's operand, rounded once).
  DataType y = t;
  if (const Attribute* to = ctx.node().FindAttr("to")) {
    y = static_cast<DataType>(to->i);
    if (y != t && y != DataType::kBFloat16 && y != DataType::kFloat16)
      return ctx.Error("attribute to = ", to->i, ": expected x's type ", static_cast<int>(t), " (", DataTypeName(t),
                       "), 16 (bfloat16) or 10 (float16)");
  }
  ctx.SetOutput(0, y, x);
  Shape stat;
  if (x.has_rank() && x.rank() > 0) {
    std::vector<Dim> d = x.dims();
    d.back() = Dim(1);
    stat = Shape(d);
  }
  // SkipRMSNormalization: y, inv_std_dev, sum (no mean).
  const int sum = ctx.node().op_type() == "SkipRMSNormalization" ? 2 : 3;
  for (int i = 1; i < sum && i < ctx.num_outputs(); ++i) ctx.SetOutput(i, DataType::kFloat32, stat);
  if (ctx.num_outputs() > sum) ctx.SetOutput(sum, t, x);
  return absl::OkStatus();
}

// Det (X [..., M, M]) -> [...] of X's dtype.
absl::Status InferDet(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}));
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  const int r = x.rank();
  if (r < 2 || (x[r - 1].is_static() && x[r - 2].is_static() && x[r - 1].value != x[r - 2].value))
    return ctx.Error("X is ", x.ToString(), "; expected square matrices [..., M, M]");
  std::vector<Dim> out(x.dims().begin(), x.dims().end() - 2);
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

}  // namespace cleave::graph
