// Shape and type inference of GridSample, its gradient ai.cleave.GridSampleGrad, AffineGrid, and
// the random ops RandomNormal, RandomUniform (and their Like forms), Bernoulli and Multinomial,
// the signal ops DFT, STFT and MelWeightMatrix, and RoiAlign (graph/).
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_shape_util.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

constexpr std::initializer_list<DataType> kFloatTypes = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                                         DataType::kBFloat16};

// X [N, C, in...] and grid [N, out..., r] (r = X's rank - 2) from inputs x and x + 1: the error
// naming what disagrees, where the ranks and dims are known.
absl::Status CheckGrid(const InferContext& ctx, int x_input) {
  RETURN_IF_ERROR(ExpectDtype(ctx, x_input, kFloatTypes));
  RETURN_IF_ERROR(ExpectDtype(ctx, x_input + 1, kFloatTypes));
  const Shape& x = ctx.input_shape(x_input);
  const Shape& grid = ctx.input_shape(x_input + 1);
  if (x.has_rank() && x.rank() < 3) return ctx.Error("X is ", x.ToString(), "; expected [N, C, spatial...]");
  if (!x.has_rank() || !grid.has_rank()) return absl::OkStatus();
  if (grid.rank() != x.rank())
    return ctx.Error("grid is ", grid.ToString(), "; expected rank ", x.rank(), " ([N, out..., ", x.rank() - 2,
                     "]) for X ", x.ToString());
  const Dim& last = grid[grid.rank() - 1];
  if (last.is_static() && last.value != x.rank() - 2)
    return ctx.Error("grid is ", grid.ToString(), "; expected its last dim ", x.rank() - 2,
                     " (a coordinate per spatial axis of X ", x.ToString(), ")");
  if (x[0].is_static() && grid[0].is_static() && x[0].value != grid[0].value)
    return ctx.Error("grid ", grid.ToString(), " and X ", x.ToString(), " differ in the batch");
  return absl::OkStatus();
}

}  // namespace

// GridSample (X, grid) -> Y [N, C, out...] of X's dtype.
absl::Status InferGridSample(InferContext& ctx) {
  RETURN_IF_ERROR(CheckGrid(ctx, 0));
  const Shape& x = ctx.input_shape(0);
  const Shape& grid = ctx.input_shape(1);
  if (!x.has_rank() || !grid.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), x.has_rank() ? UnknownDims(x.rank()) : Shape());
    return absl::OkStatus();
  }
  std::vector<Dim> y = {x[0].is_static() ? x[0] : grid[0], x[1]};
  for (int d = 1; d + 1 < grid.rank(); ++d) y.push_back(grid[d]);
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(y)));
  return absl::OkStatus();
}

// ai.cleave.GridSampleGrad (dY, X, grid) -> dX of X's shape, dGrid of the grid's.
absl::Status InferGridSampleGrad(InferContext& ctx) {
  RETURN_IF_ERROR(CheckGrid(ctx, 1));
  ctx.SetOutput(0, ctx.input_dtype(1), ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.SetOutput(1, ctx.input_dtype(2), ctx.input_shape(2));
  return absl::OkStatus();
}

// AffineGrid (theta [N, 2, 3] or [N, 3, 4], size int64 [4] or [5]) -> grid [N, H, W, 2] or
// [N, D, H, W, 3] of theta's dtype; its dims size's values where it is a constant.
absl::Status InferAffineGrid(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kFloatTypes));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  const Shape& theta = ctx.input_shape(0);
  const Shape& size = ctx.input_shape(1);
  if (size.has_rank() && size.rank() != 1) return ctx.Error("size is ", size.ToString(), "; expected a 1-D tensor");
  int axes = 0;  // spatial axes, 2 or 3, where known
  if (size.has_rank() && size[0].is_static()) {
    if (size[0].value != 4 && size[0].value != 5)
      return ctx.Error("size is ", size.ToString(), "; expected [4] (N, C, H, W) or [5] (N, C, D, H, W)");
    axes = static_cast<int>(size[0].value) - 2;
  }
  if (theta.has_rank()) {
    if (theta.rank() != 3) return ctx.Error("theta is ", theta.ToString(), "; expected [N, 2, 3] or [N, 3, 4]");
    const int rows = theta[1].is_static() ? static_cast<int>(theta[1].value) : axes;
    if ((rows != 0 && rows != 2 && rows != 3) || (axes != 0 && rows != 0 && rows != axes) ||
        (theta[2].is_static() && rows != 0 && theta[2].value != rows + 1))
      return ctx.Error("theta is ", theta.ToString(), " and size ", size.ToString(),
                       "; expected theta [N, 2, 3] with size [4], or [N, 3, 4] with size [5]");
    if (axes == 0) axes = rows;
  }
  if (axes == 0) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  std::vector<Dim> out(static_cast<size_t>(axes) + 2);
  const std::optional<std::vector<int64_t>> values = ConstantInts(ctx, 1);
  if (values) {
    for (int64_t v : *values)
      if (v < 0) return ctx.Error("size holds ", v, "; expected sizes >= 0");
    out[0] = Dim((*values)[0]);
    for (int d = 0; d < axes; ++d) out[static_cast<size_t>(d) + 1] = Dim((*values)[static_cast<size_t>(d) + 2]);
  } else if (theta.has_rank()) {
    out[0] = theta[0];
  }
  out.back() = Dim(axes);
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// RandomNormal and RandomUniform (shape attribute), their Like forms (the input's shape),
// Bernoulli (the input's shape) -> `dtype` (default float32, or the input's dtype);
// Multinomial (input [batch, classes]) -> [batch, sample_size] of `dtype` (default int32).
absl::Status InferRandom(InferContext& ctx) {
  const Node& n = ctx.node();
  const std::string& op = n.op_type();
  const bool multinomial = op == "Multinomial";
  if (ctx.num_inputs() > 0) {
    RETURN_IF_ERROR(ExpectDtype(ctx, 0, op == "Bernoulli" || multinomial ? kFloatTypes : std::initializer_list<DataType>{
        DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16, DataType::kInt8,
        DataType::kInt16, DataType::kInt32, DataType::kInt64, DataType::kUInt8, DataType::kUInt16,
        DataType::kUInt32, DataType::kUInt64, DataType::kBool}));
  }
  DataType t = multinomial ? DataType::kInt32 : ctx.num_inputs() > 0 ? ctx.input_dtype(0) : DataType::kFloat32;
  if (n.HasAttr("dtype")) t = DataTypeFromInt(static_cast<int>(n.AttrInt("dtype", 0)));
  const bool floats_only = op != "Bernoulli" && !multinomial;
  if (t == DataType::kUndefined || t == DataType::kString ||
      (floats_only && !IsFloat(t)) || (multinomial && t != DataType::kInt32 && t != DataType::kInt64))
    return ctx.Error("dtype ", n.AttrInt("dtype", 0), " (", DataTypeName(t), ") is not an output type it produces");
  if (multinomial) {
    const Shape& x = ctx.input_shape(0);
    if (x.has_rank() && x.rank() != 2) return ctx.Error("input is ", x.ToString(), "; expected [batch, classes]");
    const int64_t samples = n.AttrInt("sample_size", 1);
    if (samples < 1) return ctx.Error("sample_size is ", samples, "; expected >= 1");
    ctx.SetOutput(0, t, Shape({x.has_rank() ? x[0] : Dim(), Dim(samples)}));
    return absl::OkStatus();
  }
  if (ctx.num_inputs() > 0) {
    ctx.SetOutput(0, t, ctx.input_shape(0));
    return absl::OkStatus();
  }
  if (!n.HasAttr("shape")) return ctx.Error("has no 'shape' attribute");
  std::vector<Dim> dims;
  for (int64_t d : n.AttrInts("shape")) {
    if (d < 0) return ctx.Error("shape holds ", d, "; expected sizes >= 0");
    dims.push_back(Dim(d));
  }
  ctx.SetOutput(0, t, Shape(std::move(dims)));
  return absl::OkStatus();
}

namespace {

// Input i's single integer value where it is a constant and not negative, else -1.
int64_t KnownCount(const InferContext& ctx, int i) {
  if (ctx.num_inputs() <= i || !ctx.has_input(i)) return -1;
  const std::optional<std::vector<int64_t>> v = ConstantInts(ctx, i);
  return v && v->size() == 1 && (*v)[0] >= 0 ? (*v)[0] : -1;
}

}  // namespace

// DFT (input [..., signal, 1 | 2][, dft_length][, axis]) -> the input's dims with the signal
// axis holding the bins (dft_length, or its half plus one when onesided) and the last dim 2.
absl::Status InferDft(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kFloatTypes));
  const Node& n = ctx.node();
  const Shape& x = ctx.input_shape(0);
  if (!x.has_rank()) {
    ctx.SetOutput(0, ctx.input_dtype(0), Shape());
    return absl::OkStatus();
  }
  const int rank = x.rank();
  const Dim& parts = x[rank - 1];
  if (rank < 2 || (parts.is_static() && parts.value != 1 && parts.value != 2))
    return ctx.Error("input is ", x.ToString(), "; expected [..., signal, 1 or 2] (real, or real and imaginary)");
  int64_t axis = ctx.version() < 20 ? n.AttrInt("axis", 1) : -2;
  bool axis_known = true;
  if (ctx.version() >= 20 && ctx.num_inputs() > 2 && ctx.has_input(2)) {
    const std::optional<std::vector<int64_t>> v = ConstantInts(ctx, 2);
    axis_known = v && v->size() == 1;
    if (axis_known) axis = (*v)[0];
  }
  std::vector<Dim> out = x.dims();
  out.back() = Dim(2);
  if (!axis_known) {
    for (int d = 0; d + 1 < rank; ++d) out[static_cast<size_t>(d)] = Dim();
    ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
    return absl::OkStatus();
  }
  if (axis < -rank || axis >= rank - 1 || axis == -1)
    return ctx.Error("axis ", axis, " is not a signal dim of input ", x.ToString(),
                     " (the last dim holds the real and imaginary parts)");
  const size_t a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  int64_t length = x[static_cast<int>(a)].is_static() ? x[static_cast<int>(a)].value : -1;
  if (ctx.num_inputs() > 1 && ctx.has_input(1)) length = KnownCount(ctx, 1);
  const bool onesided = n.AttrInt("onesided", 0) != 0;
  out[a] = length >= 0 ? Dim(onesided ? length / 2 + 1 : length) : Dim();
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// STFT (signal [batch, length, 1 | 2], frame_step[, window][, frame_length]) -> [batch, frames,
// bins, 2] where frame_step and the frame's length are known.
absl::Status InferStft(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kFloatTypes));
  const Shape& x = ctx.input_shape(0);
  if (x.has_rank() && (x.rank() != 3 || (x[2].is_static() && x[2].value != 1 && x[2].value != 2)))
    return ctx.Error("signal is ", x.ToString(), "; expected [batch, length, 1 or 2]");
  const bool window = ctx.num_inputs() > 2 && ctx.has_input(2);
  int64_t frame = KnownCount(ctx, 3);
  if (frame < 0 && window) {
    const Shape& w = ctx.input_shape(2);
    if (w.has_rank() && w.rank() == 1 && w[0].is_static()) frame = w[0].value;
  }
  const bool frame_input = ctx.num_inputs() > 3 && ctx.has_input(3);
  if (frame < 0 && !window && !frame_input && x.has_rank() && x[1].is_static()) frame = x[1].value;
  const int64_t step = KnownCount(ctx, 1);
  std::vector<Dim> out(4);
  if (x.has_rank()) out[0] = x[0];
  if (frame >= 0 && step > 0 && x.has_rank() && x[1].is_static() && frame <= x[1].value)
    out[1] = Dim((x[1].value - frame) / step + 1);
  if (frame >= 0) out[2] = Dim(ctx.node().AttrInt("onesided", 1) != 0 ? frame / 2 + 1 : frame);
  out[3] = Dim(2);
  ctx.SetOutput(0, ctx.input_dtype(0), Shape(std::move(out)));
  return absl::OkStatus();
}

// MelWeightMatrix (num_mel_bins, dft_length, sample_rate, lower, upper) -> [dft_length / 2 + 1,
// num_mel_bins] of output_datatype (float32 by default).
absl::Status InferMelWeightMatrix(InferContext& ctx) {
  const DataType t = DataTypeFromInt(static_cast<int>(ctx.node().AttrInt("output_datatype", 1)));
  if (!IsFloat(t)) return ctx.Error("output_datatype ", ctx.node().AttrInt("output_datatype", 1), " is not a float type");
  const int64_t mels = KnownCount(ctx, 0), dft = KnownCount(ctx, 1);
  ctx.SetOutput(0, t, Shape({dft >= 0 ? Dim(dft / 2 + 1) : Dim(), mels >= 0 ? Dim(mels) : Dim()}));
  return absl::OkStatus();
}

// RoiAlign (X [N, C, H, W], rois [num_rois, 4], batch_indices [num_rois]) -> [num_rois, C,
// output_height, output_width] of X's dtype.
absl::Status InferRoiAlign(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16}));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kInt64, DataType::kInt32}));
  const Node& n = ctx.node();
  const std::string mode = n.AttrString("mode", "avg");
  if (mode != "avg" && mode != "max") return ctx.Error("mode \"", mode, "\"; expected avg or max");
  const std::string coords = n.AttrString("coordinate_transformation_mode", "half_pixel");
  if (coords != "half_pixel" && coords != "output_half_pixel")
    return ctx.Error("coordinate_transformation_mode \"", coords, "\"; expected half_pixel or output_half_pixel");
  const Shape& x = ctx.input_shape(0);
  const Shape& rois = ctx.input_shape(1);
  if (x.has_rank() && x.rank() != 4) return ctx.Error("X is ", x.ToString(), "; expected [N, C, H, W]");
  if (rois.has_rank() && (rois.rank() != 2 || (rois[1].is_static() && rois[1].value != 4)))
    return ctx.Error("rois is ", rois.ToString(), "; expected [num_rois, 4]");
  ctx.SetOutput(0, ctx.input_dtype(0),
                Shape({rois.has_rank() ? rois[0] : Dim(), x.has_rank() ? x[1] : Dim(), Dim(n.AttrInt("output_height", 1)),
                       Dim(n.AttrInt("output_width", 1))}));
  return absl::OkStatus();
}

}  // namespace cleave::graph
