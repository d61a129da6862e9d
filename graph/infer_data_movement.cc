// Shape inference for the data-movement ops (graph/): Transpose, Concat, Split, Slice,
// Gather. Dims that an op only moves keep their symbols; dims it cuts are static when the
// cut points are constants and the dim is static, and unknown otherwise. Part of
// infer_shape_ops (see infer_fns.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_shape_util.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

// Exporters write "to the end" as INT64_MAX or INT32_MAX; either keeps a symbolic dim whole.
constexpr int64_t kToEnd = 2147483647;

// Merges what several inputs say about one dim: static beats symbolic beats unknown, and
// two different static values are an error the caller reports.
bool MergeDim(const Dim& d, Dim* into) {
  if (d.is_static()) {
    if (into->is_static() && into->value != d.value) return false;
    *into = d;
  } else if (!into->is_static() && into->symbol.empty()) {
    *into = d;
  }
  return true;
}

// Output length of one sliced axis of static size d (the ONNX clamping rules).
int64_t SliceLength(int64_t d, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    return end > start ? (end - start + step - 1) / step : 0;
  }
  if (d == 0) return 0;
  start = std::clamp<int64_t>(start, 0, d - 1);
  end = std::clamp<int64_t>(end, -1, d - 1);  // -1: through index 0
  return start > end ? (start - end - step - 1) / -step : 0;
}

// A sliced axis of symbolic size keeps its symbol only when the slice takes all of it, in
// order (0 to the end, step 1) or reversed (the last index to before the first, step -1).
Dim SliceDim(const Dim& d, int64_t start, int64_t end, int64_t step) {
  if (d.is_static()) return Dim(SliceLength(d.value, start, end, step));
  if (step == 1 && start == 0 && end >= kToEnd) return d;
  if (step == -1 && (start == -1 || start >= kToEnd) && end <= -kToEnd) return d;
  return Dim();
}

// How many axes a version >= 10 Slice without axes cuts: the static length of its starts or
// ends.
std::optional<int64_t> SliceCount(const InferContext& ctx) {
  if (ctx.version() < 10) return std::nullopt;
  for (int i : {1, 2})
    if (auto n = StaticLength(ctx.input_shape(i))) return n;
  return std::nullopt;
}

}  // namespace

absl::Status InferTranspose(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  const bool has_perm = ctx.node().HasAttr("perm");
  std::vector<int64_t> perm = ctx.node().AttrInts("perm");
  if (!in.has_rank()) {
    ctx.SetOutput(0, t, has_perm ? UnknownDims(static_cast<int>(perm.size())) : Shape());
    return absl::OkStatus();
  }
  const int r = in.rank();
  if (!has_perm)
    for (int k = 0; k < r; ++k) perm.push_back(r - 1 - k);  // default: reverse the axes
  std::vector<bool> used(r, false);
  bool valid = static_cast<int>(perm.size()) == r;
  for (int64_t p : perm) {
    valid = valid && p >= 0 && p < r && !used[p];
    if (valid) used[p] = true;
  }
  if (!valid)
    return ctx.Error("perm [", absl::StrJoin(perm, ","), "] is not a permutation of the ", r,
                     " axes of ", in.ToString());
  std::vector<Dim> out;
  for (int64_t p : perm) out.push_back(in[p]);
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferConcat(InferContext& ctx) {
  if (!ctx.node().HasAttr("axis")) return ctx.Error("expected an 'axis' attribute, got none");
  const int64_t axis_attr = ctx.node().AttrInt("axis", 0);
  const DataType t = ctx.input_dtype(0);
  int rank = -1;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (ctx.input_dtype(i) != t)
      return ctx.Error("input ", i, " has dtype ", DataTypeName(ctx.input_dtype(i)),
                       ", expected ", DataTypeName(t), " like input 0");
    const Shape& s = ctx.input_shape(i);
    if (!s.has_rank()) continue;
    if (rank >= 0 && s.rank() != rank)
      return ctx.Error("input ", i, " has rank ", s.rank(), ", expected ", rank,
                       " like the inputs before it");
    rank = s.rank();
  }
  if (rank < 0) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, axis_attr, rank));
  std::vector<Dim> out(rank);
  int64_t axis_sum = 0;
  std::vector<Dim> nonzero_axis;  // axis dims that are not a static 0
  bool axis_known = true, all_ranked = true;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    if (!s.has_rank()) {
      axis_known = all_ranked = false;
      continue;
    }
    for (int k = 0; k < rank; ++k) {
      if (k == axis) continue;
      if (!MergeDim(s[k], &out[k]))
        return ctx.Error("input ", i, " has dim ", k, " = ", s[k].value, ", expected ",
                         out[k].value, " like the other inputs (only axis ", axis, " may differ)");
    }
    const Dim& a = s[axis];
    if (a.is_static()) axis_sum += a.value;
    else axis_known = false;
    if (!(a.is_static() && a.value == 0)) nonzero_axis.push_back(a);
  }
  if (axis_known) out[axis] = Dim(axis_sum);
  // Concatenating one symbolic block with empty ones (an empty cache) keeps the symbol.
  else if (all_ranked && nonzero_axis.size() == 1 && !nonzero_axis[0].symbol.empty())
    out[axis] = nonzero_axis[0];
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

namespace {

// The split sizes when they are known: the `split` attribute (< 13) or constant input
// (>= 13), else equal parts of a static dim (num_outputs from 18 leaves a smaller last part).
absl::StatusOr<std::optional<std::vector<int64_t>>> SplitSizes(const InferContext& ctx,
                                                               const Dim& d) {
  const int n = ctx.num_outputs();
  std::optional<std::vector<int64_t>> split;
  if (ctx.version() < 13) split = ctx.node().AttrInts("split");
  if (ctx.version() >= 13 && ctx.has_input(1)) {
    split = ConstantInts(ctx, 1);
    if (!split) return split;  // runtime sizes
  }
  if (split && split->empty()) split.reset();  // an empty list means "not given"
  if (ctx.version() >= 18 && ctx.node().HasAttr("num_outputs")) {
    if (split) return ctx.Error("expected either a 'split' input or 'num_outputs', got both");
    int64_t k = ctx.node().AttrInt("num_outputs", 0);
    if (k != n) return ctx.Error("num_outputs is ", k, " but the node has ", n, " outputs");
  }
  if (split) {
    if (static_cast<int>(split->size()) != n)
      return ctx.Error("split has ", split->size(), " sizes, expected one per output (", n, ")");
    int64_t sum = 0;
    for (int64_t s : *split) {
      if (s < 0)
        return ctx.Error("split sizes [", absl::StrJoin(*split, ","), "] contain a negative");
      sum += s;
    }
    if (d.is_static() && sum != d.value)
      return ctx.Error("split sizes [", absl::StrJoin(*split, ","), "] sum to ", sum,
                       ", expected the axis size ", d.value);
    return split;
  }
  if (!d.is_static()) return split;
  // Equal parts of ceil(d / n); the last takes what is left (the reference behaviour, and
  // what version 18 specifies for num_outputs).
  int64_t part = (d.value + n - 1) / n, last = d.value - part * (n - 1);
  if (last < 0)
    return ctx.Error("cannot split axis of size ", d.value, " into ", n, " parts");
  std::vector<int64_t> sizes(n, part);
  sizes.back() = last;
  return std::optional<std::vector<int64_t>>(std::move(sizes));
}

}  // namespace

absl::Status InferSplit(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  if (!in.has_rank()) {
    for (int i = 0; i < ctx.num_outputs(); ++i) ctx.SetOutput(i, t, Shape());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), in.rank()));
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> sizes, SplitSizes(ctx, in[axis]));
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    std::vector<Dim> out = in.dims();
    // One output takes the whole axis, so it keeps the symbol.
    if (sizes) out[axis] = Dim((*sizes)[i]);
    else if (ctx.num_outputs() > 1) out[axis] = Dim();
    ctx.SetOutput(i, t, Shape(std::move(out)));
  }
  return absl::OkStatus();
}

absl::Status InferSlice(InferContext& ctx) {
  const DataType t = ctx.input_dtype(0);
  const Shape& in = ctx.input_shape(0);
  if (!in.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  const int r = in.rank();
  std::optional<std::vector<int64_t>> starts, ends, axes, steps;
  if (ctx.version() < 10) {
    const Node& n = ctx.node();
    if (!n.HasAttr("starts") || !n.HasAttr("ends"))
      return ctx.Error("expected 'starts' and 'ends' attributes (version 1)");
    starts = n.AttrInts("starts");
    ends = n.AttrInts("ends");
    if (n.HasAttr("axes")) axes = n.AttrInts("axes");
  } else {
    starts = ConstantInts(ctx, 1);
    ends = ConstantInts(ctx, 2);
    if (ctx.has_input(3)) axes = ConstantInts(ctx, 3);
    if (ctx.has_input(4)) steps = ConstantInts(ctx, 4);
  }
  const bool axes_known = !ctx.has_input(3) || ctx.version() < 10 || axes;
  std::vector<Dim> out = in.dims();
  if (!starts || !ends || !axes_known || (ctx.has_input(4) && !steps)) {
    // Runtime cut points: every axis they may touch becomes unknown.
    if (axes) {
      for (int64_t a : *axes) {
        ASSIGN_OR_RETURN(int k, NormalizeAxis(ctx, a, r));
        out[k] = Dim();
      }
    } else if (auto count = !ctx.has_input(3) ? SliceCount(ctx) : std::nullopt; count && *count <= r) {
      // No axes: the first len(starts) axes (a static length of starts or ends).
      for (int64_t k = 0; k < *count; ++k) out[k] = Dim();
    } else {
      out = UnknownDims(r).dims();
    }
    ctx.SetOutput(0, t, Shape(std::move(out)));
    return absl::OkStatus();
  }
  const size_t n = starts->size();
  if (ends->size() != n || (axes && axes->size() != n) || (steps && steps->size() != n))
    return ctx.Error("expected starts, ends, axes and steps of equal length, got ", n, ", ",
                     ends->size(), ", ", axes ? axes->size() : n, ", ", steps ? steps->size() : n);
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(int k, NormalizeAxis(ctx, axes ? (*axes)[i] : static_cast<int64_t>(i), r));
    if (seen[k]) return ctx.Error("axis ", k, " is sliced twice");
    seen[k] = true;
    int64_t step = steps ? (*steps)[i] : 1;
    if (step == 0) return ctx.Error("step for axis ", k, " is 0, expected non-zero");
    out[k] = SliceDim(in[k], (*starts)[i], (*ends)[i], step);
  }
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

// ai.cleave.PadGrad(dY, pads) {mode}: pads gives the begins then the ends of every dim.
absl::Status InferPadGrad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Shape& dy = ctx.input_shape(0);
  const Tensor* pads = ctx.input_constant(1);
  if (!dy.has_rank() || !pads) {
    ctx.SetOutput(0, ctx.input_dtype(0), dy.has_rank() ? UnknownDims(dy.rank()) : Shape());
    return absl::OkStatus();
  }
  const int r = dy.rank();
  const std::vector<int64_t> p = pads->ToInt64Vector();
  if (p.size() != static_cast<size_t>(2 * r))
    return ctx.Error("expected ", 2 * r, " pads (begins then ends of every dim), got ", p.size());
  std::vector<Dim> out = dy.dims();
  for (int k = 0; k < r; ++k) {
    Dim& d = out[static_cast<size_t>(k)];
    if (p[k] < 0 || p[r + k] < 0) return ctx.Error("expected pads >= 0, got ", p[k], " and ", p[r + k], " of dim ", k);
    if (!d.is_static()) continue;
    const int64_t v = d.value - p[k] - p[r + k];
    if (v < 0) return ctx.Error("pads ", p[k], " and ", p[r + k], " exceed dim ", k, " of dY (", d.value, ")");
    d = Dim(v);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferPad(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Shape& x = ctx.input_shape(0);
  const Tensor* pads = ctx.input_constant(1);
  const bool axes_given = ctx.num_inputs() > 3 && ctx.has_input(3);
  const Tensor* axes = axes_given ? ctx.input_constant(3) : nullptr;
  if (!x.has_rank() || !pads || (axes_given && !axes)) {
    ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? UnknownDims(x.rank()) : Shape());
    return absl::OkStatus();
  }
  const int r = x.rank();
  std::vector<int64_t> which;
  if (axes) {
    for (int64_t a : axes->ToInt64Vector()) {
      ASSIGN_OR_RETURN(const int k, NormalizeAxis(ctx, a, r));
      which.push_back(k);
    }
  } else {
    for (int k = 0; k < r; ++k) which.push_back(k);
  }
  const std::vector<int64_t> p = pads->ToInt64Vector();
  if (p.size() != 2 * which.size())
    return ctx.Error("expected ", 2 * which.size(), " pads (begins then ends of ", which.size(), " dims), got ",
                     p.size());
  std::vector<Dim> out = x.dims();
  for (size_t j = 0; j < which.size(); ++j) {
    Dim& d = out[static_cast<size_t>(which[j])];
    if (!d.is_static()) {
      if (p[j] != 0 || p[which.size() + j] != 0) d = Dim();
      continue;
    }
    int64_t v = 0;
    if (__builtin_add_overflow(d.value, p[j], &v) || __builtin_add_overflow(v, p[which.size() + j], &v))
      return ctx.Error("pads of dim ", which[j], " overflow int64");
    if (v < 0) return ctx.Error("pads crop dim ", which[j], " of ", d.value, " below 0");
    d = Dim(v);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

absl::Status InferTile(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Shape& x = ctx.input_shape(0);
  const Tensor* rep = ctx.input_constant(1);
  if (!x.has_rank() || !rep) {
    ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? UnknownDims(x.rank()) : Shape());
    return absl::OkStatus();
  }
  const std::vector<int64_t> n = rep->ToInt64Vector();
  if (static_cast<int>(n.size()) != x.rank())
    return ctx.Error("expected ", x.rank(), " repeats (one per dim), got ", n.size());
  std::vector<Dim> out = x.dims();
  for (size_t k = 0; k < n.size(); ++k) {
    if (n[k] < 0) return ctx.Error("repeat ", n[k], " of dim ", k, " is negative");
    int64_t d = 0;
    if (out[k].is_static() && __builtin_mul_overflow(out[k].value, n[k], &d))
      return ctx.Error("repeat ", n[k], " of dim ", k, " overflows int64");
    if (out[k].is_static()) out[k] = Dim(d);
    else if (n[k] != 1) out[k] = Dim();
  }
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// Indices of data's rank, each dim but the axis's no larger than data's.
absl::Status CheckElementIndices(InferContext& ctx, const Shape& data, const Shape& idx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  if (!data.has_rank()) return absl::OkStatus();
  const int r = data.rank();
  if (r == 0) return ctx.Error("expected data of rank >= 1, got a scalar");
  ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), r));
  if (!idx.has_rank()) return absl::OkStatus();
  if (idx.rank() != r) return ctx.Error("expected indices of the data's rank ", r, ", got ", idx.ToString());
  for (int k = 0; k < r; ++k)
    if (k != axis && data[k].is_static() && idx[k].is_static() && idx[k].value > data[k].value)
      return ctx.Error("indices ", idx.ToString(), " exceed the data ", data.ToString(), " at dim ", k);
  return absl::OkStatus();
}

absl::Status InferGatherElements(InferContext& ctx) {
  RETURN_IF_ERROR(CheckElementIndices(ctx, ctx.input_shape(0), ctx.input_shape(1)));
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(1));
  return absl::OkStatus();
}

absl::Status InferScatterElements(InferContext& ctx) {
  RETURN_IF_ERROR(CheckElementIndices(ctx, ctx.input_shape(0), ctx.input_shape(1)));
  if (ctx.input_dtype(2) != ctx.input_dtype(0))
    return ctx.Error("expected updates of the data's dtype ", DataTypeName(ctx.input_dtype(0)), ", got ",
                     DataTypeName(ctx.input_dtype(2)));
  const Shape& idx = ctx.input_shape(1);
  const Shape& upd = ctx.input_shape(2);
  if (idx.is_static() && upd.is_static() && idx != upd)
    return ctx.Error("expected updates of the indices' shape ", idx.ToString(), ", got ", upd.ToString());
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferGather(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt32, DataType::kInt64}));
  const DataType t = ctx.input_dtype(0);
  const Shape& data = ctx.input_shape(0);
  const Shape& indices = ctx.input_shape(1);
  if (!data.has_rank() || !indices.has_rank()) {
    ctx.SetOutput(0, t, Shape());
    return absl::OkStatus();
  }
  if (data.rank() == 0) return ctx.Error("expected data of rank >= 1, got a scalar");
  ASSIGN_OR_RETURN(int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), data.rank()));
  const Dim& d = data[axis];
  if (std::optional<std::vector<int64_t>> idx = ConstantInts(ctx, 1); idx && d.is_static()) {
    for (int64_t v : *idx)
      if (v < -d.value || v >= d.value)
        return ctx.Error("index ", v, " is out of range for axis ", axis, " of size ", d.value,
                         ": expected [", -d.value, ", ", d.value - 1, "]");
  }
  std::vector<Dim> out(data.dims().begin(), data.dims().begin() + axis);
  out.insert(out.end(), indices.dims().begin(), indices.dims().end());
  out.insert(out.end(), data.dims().begin() + axis + 1, data.dims().end());
  ctx.SetOutput(0, t, Shape(std::move(out)));
  return absl::OkStatus();
}

// NonZero (X) -> int64 [rank (1 for a scalar), the count of nonzero elements].
absl::Status InferNonZero(InferContext& ctx) {
  const Shape& x = ctx.input_shape(0);
  ctx.SetOutput(0, DataType::kInt64, Shape({x.has_rank() ? Dim(std::max(x.rank(), 1)) : Dim(), Dim()}));
  return absl::OkStatus();
}

// Unique (X) {axis, sorted} -> Y (X's dtype: [?], or X's dims with the axis dim unknown),
// indices [?], inverse_indices [X's elements or the axis dim], counts [?], all int64.
absl::Status InferUnique(InferContext& ctx) {
  const Node& n = ctx.node();
  const Shape& x = ctx.input_shape(0);
  Shape y({Dim()});
  Dim len;
  if (n.HasAttr("axis")) {
    if (x.has_rank()) {
      ASSIGN_OR_RETURN(const int a, NormalizeAxis(ctx, n.AttrInt("axis", 0), x.rank()));
      std::vector<Dim> dims = x.dims();
      len = dims[static_cast<size_t>(a)];
      dims[static_cast<size_t>(a)] = Dim();
      y = Shape(std::move(dims));
    } else {
      y = Shape();
    }
  } else if (x.is_static()) {
    int64_t count = 1;
    for (int d = 0; d < x.rank(); ++d) count *= x[d].value;
    len = Dim(count);
  }
  ctx.SetOutput(0, ctx.input_dtype(0), y);
  for (int i = 1; i < ctx.num_outputs(); ++i) ctx.SetOutput(i, DataType::kInt64, Shape({i == 2 ? len : Dim()}));
  return absl::OkStatus();
}

// NonMaxSuppression (boxes [batch, boxes, 4], scores [batch, classes, boxes], ...) -> int64
// [selected, 3].
absl::Status InferNonMaxSuppression(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kFloat32, DataType::kFloat64}));
  const Shape& b = ctx.input_shape(0);
  const Shape& s = ctx.input_shape(1);
  if (b.has_rank() && (b.rank() != 3 || (b[2].is_static() && b[2].value != 4)))
    return ctx.Error("boxes is ", b.ToString(), "; expected [batch, boxes, 4]");
  if (s.has_rank() && s.rank() != 3) return ctx.Error("scores is ", s.ToString(), "; expected [batch, classes, boxes]");
  const int64_t centre = ctx.node().AttrInt("center_point_box", 0);
  if (centre != 0 && centre != 1) return ctx.Error("center_point_box is ", centre, "; expected 0 or 1");
  ctx.SetOutput(0, DataType::kInt64, Shape({Dim(), Dim(3)}));
  return absl::OkStatus();
}

// Compress (X, condition bool [n]) -> X's dtype: the kept slices along `axis` (a constant
// condition's count of trues), or X flattened and selected when there is no axis.
absl::Status InferCompress(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kBool}));
  const Shape& c = ctx.input_shape(1);
  if (c.has_rank() && c.rank() != 1) return ctx.Error("condition is ", c.ToString(), "; expected a 1-D tensor");
  Dim kept;
  if (const Tensor* t = ctx.input_constant(1)) {
    int64_t n = 0;
    for (int64_t i = 0; i < t->numel(); ++i) n += t->data<bool>()[i] ? 1 : 0;
    kept = Dim(n);
  }
  const Shape& x = ctx.input_shape(0);
  if (!ctx.node().HasAttr("axis")) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape({kept}));
    return absl::OkStatus();
  }
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const int axis, NormalizeAxis(ctx, ctx.node().AttrInt("axis", 0), x.rank()));
  std::vector<Dim> dims = x.dims();
  dims[static_cast<size_t>(axis)] = kept;
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(dims)));
  return absl::OkStatus();
}

}  // namespace cleave::graph
