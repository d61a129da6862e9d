// CenterCropPad, ReverseSequence, MaxUnpool, Col2Im and AffineGrid as index arithmetic over ops
// with kernels on every provider (graph/passes/decomposition.cc). Over static shapes (and a
// constant target) the indices are constants, so inference keeps the output's shape; otherwise
// they come from the input's Shape at run time, so symbolic dims and a target fed as an input
// are fine:
//
//   CenterCropPad:   Slice the centred window where X is larger, then Pad the rest centred
//                    (the odd element of a crop or pad at the end, as the ONNX function).
//   ReverseSequence: a Gather of X's rows flattened over [time, batch], time index len - 1 - t
//                    below each row's length and t from there on (Gather and Flatten exist at
//                    every opset; the positions are constants over static dims).
//   MaxUnpool:       ScatterElements of X into zeros of the pool's input shape, both flattened
//                    (the indices, as MaxPool writes them, address the flattened tensor); a
//                    larger output_shape pads zeros after, as ONNX's reference does.
//   Col2Im:          a ScatterND adding the columns into zeros of the padded image, each
//                    column element at its block position plus its kernel offset (the flat
//                    indices a constant for a constant image_shape and block_shape, else a
//                    Range per dim at run time), then the padding sliced off; ScatterND's
//                    gradient gathers, so it trains.
//   AffineGrid:      the homogeneous base grid (x, y[, z], 1) of the output's points, each
//                    coordinate a Range scaled into [-1, 1] from size at run time, times
//                    theta transposed (one broadcasting MatMul), so theta trains through the
//                    MatMul's gradient.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "graph/passes/emitter.h"
#include "graph/pool_geometry.h"

namespace cleave::graph::decompose {

absl::Status DecomposeCenterCropPad(Graph* g, Node* n) {
  Value* x = n->input(0);
  if (!x->shape().has_rank())
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes CenterCropPad by rank");
  const int rank = x->shape().rank();
  std::vector<int64_t> axes = n->AttrInts("axes");
  if (axes.empty())
    for (int a = 0; a < rank; ++a) axes.push_back(a);
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  Value* shape = n->input(1);
  Value* out = n->output(0);
  // A constant target over static dims: the window and the padding as constants, so the
  // output's shape stays known to inference.
  std::optional<std::vector<int64_t>> fixed;
  if (const Tensor* c = ConstantInput(*n, 1); c && c->numel() == static_cast<int64_t>(axes.size())) {
    fixed = std::vector<int64_t>();
    for (int64_t i = 0; i < c->numel(); ++i) {
      const Dim& d = x->shape()[static_cast<int>(axes[static_cast<size_t>(i)])];
      if (!d.is_static()) {
        fixed.reset();
        break;
      }
      fixed->push_back(d.value);
      fixed->push_back(static_cast<int64_t>(c->DoubleAt(i)));
    }
  }
  Emitter e(g, *n);
  g->RemoveNode(n);
  const DataType i64 = DataType::kInt64;
  if (fixed) {
    const size_t k = axes.size();
    std::vector<int64_t> starts(k), ends(k), pads(2 * k);
    for (size_t i = 0; i < k; ++i) {
      const int64_t in = (*fixed)[2 * i], target = (*fixed)[2 * i + 1];
      starts[i] = std::max<int64_t>(in - target, 0) / 2;
      ends[i] = starts[i] + std::min(in, target);
      const int64_t lack = std::max<int64_t>(target - in, 0);
      pads[i] = lack / 2;
      pads[k + i] = lack - lack / 2;
    }
    ASSIGN_OR_RETURN(Value * y, e.Add("Slice", {x, e.Ints(starts), e.Ints(ends), e.Ints(axes)}));
    ASSIGN_OR_RETURN(y, e.Add("Pad", {y, e.Ints(pads), e.Scalar(x->dtype(), 0), e.Ints(axes)}));
    return e.Finish(y, out);
  }
  Value* zero = e.Scalar(i64, 0);
  Value* two = e.Scalar(i64, 2);
  ASSIGN_OR_RETURN(Value * xs, e.Add("Shape", {x}));
  ASSIGN_OR_RETURN(Value * in, e.Add("Gather", {xs, e.Ints(axes)}));
  ASSIGN_OR_RETURN(Value * target, e.Cast(shape, i64));
  // The crop: start = max(in - target, 0) / 2, length min(in, target).
  ASSIGN_OR_RETURN(Value * excess, e.Add("Sub", {in, target}));
  ASSIGN_OR_RETURN(excess, e.Add("Max", {excess, zero}));
  ASSIGN_OR_RETURN(Value * start, e.Add("Div", {excess, two}));
  ASSIGN_OR_RETURN(Value * keep, e.Add("Min", {in, target}));
  ASSIGN_OR_RETURN(Value * end, e.Add("Add", {start, keep}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Slice", {x, start, end, e.Ints(axes)}));
  // The pad: max(target - in, 0), half before (rounded down) and the rest after.
  ASSIGN_OR_RETURN(Value * lack, e.Add("Sub", {target, in}));
  ASSIGN_OR_RETURN(lack, e.Add("Max", {lack, zero}));
  ASSIGN_OR_RETURN(Value * before, e.Add("Div", {lack, two}));
  ASSIGN_OR_RETURN(Value * after, e.Add("Sub", {lack, before}));
  ASSIGN_OR_RETURN(Value * pads, e.Add("Concat", {before, after}, {{"axis", Attribute::Int(0)}}));
  ASSIGN_OR_RETURN(y, e.Add("Pad", {y, pads, e.Scalar(x->dtype(), 0), e.Ints(axes)}));
  return e.Finish(y, out);
}

namespace {

// Positions 0..n-1 of X's dim `axis` (int64): a constant when the dim is static, else a Range
// (opset 11).
absl::StatusOr<Value*> Positions(Emitter& e, Graph* g, const std::string& node, Value* x, Value* xs, int axis) {
  const Dim& d = x->shape()[axis];
  if (d.is_static()) {
    std::vector<int64_t> v(static_cast<size_t>(d.value));
    for (int64_t i = 0; i < d.value; ++i) v[static_cast<size_t>(i)] = i;
    return e.Ints(v);
  }
  if (g->OpsetFor("") < 11)
    return Unimplemented(node, ": X's dim ", axis, " is symbolic, and counting it at run time needs Range (opset 11)");
  ASSIGN_OR_RETURN(Value * n, e.Add("Gather", {xs, e.Scalar(DataType::kInt64, axis)}));
  return e.Add("Range", {e.Scalar(DataType::kInt64, 0), n, e.Scalar(DataType::kInt64, 1)});
}

}  // namespace

// ReverseSequence over X flattened to [time·batch (in X's order), rest]: row r of the output is
// row f(r) of X, a Gather.
absl::Status DecomposeReverseSequence(Graph* g, Node* n) {
  Value* x = n->input(0);
  Value* lens = n->input(1);
  if (!x->shape().has_rank())
    return Unimplemented(n->Describe(), ": X's rank is unknown; cleave decomposes ReverseSequence by rank");
  const int time_axis = static_cast<int>(n->AttrInt("time_axis", 0));
  const int batch_axis = 1 - time_axis;
  const std::string node = n->Describe();
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  const DataType i64 = DataType::kInt64;
  ASSIGN_OR_RETURN(Value * xs, e.Add("Shape", {x}));
  ASSIGN_OR_RETURN(Value * t, Positions(e, g, node, x, xs, time_axis));
  ASSIGN_OR_RETURN(Value * b, Positions(e, g, node, x, xs, batch_axis));
  ASSIGN_OR_RETURN(Value * len, e.Cast(lens, i64));
  // Laid out as X's first two dims: [time, batch] or [batch, time].
  ASSIGN_OR_RETURN(t, e.Unsqueeze(t, {batch_axis}));
  ASSIGN_OR_RETURN(b, e.Unsqueeze(b, {time_axis}));
  ASSIGN_OR_RETURN(len, e.Unsqueeze(len, {time_axis}));
  ASSIGN_OR_RETURN(Value * inside, e.Add("Less", {t, len}));
  ASSIGN_OR_RETURN(Value * last, e.Add("Sub", {len, e.Scalar(i64, 1)}));
  ASSIGN_OR_RETURN(Value * reversed, e.Add("Sub", {last, t}));
  ASSIGN_OR_RETURN(Value * src, e.Add("Where", {inside, reversed, t}));
  // The flattened row of (src, b): src * batch + b, or b * time + src.
  ASSIGN_OR_RETURN(Value * second, e.Add("Gather", {xs, e.Scalar(i64, 1)}));
  Value* row;
  if (time_axis == 0) {
    ASSIGN_OR_RETURN(row, e.Add("Mul", {src, second}));
    ASSIGN_OR_RETURN(row, e.Add("Add", {row, b}));
  } else {
    ASSIGN_OR_RETURN(row, e.Add("Mul", {b, second}));
    ASSIGN_OR_RETURN(row, e.Add("Add", {row, src}));
  }
  ASSIGN_OR_RETURN(row, e.Reshape(row, {-1}));
  ASSIGN_OR_RETURN(Value * rows, e.Add("Flatten", {x}, {{"axis", Attribute::Int(2)}}));
  ASSIGN_OR_RETURN(Value * y, e.Add("Gather", {rows, row}, {{"axis", Attribute::Int(0)}}));
  // X's shape back: a constant where it is static, so inference keeps it.
  Value* back = xs;
  if (x->shape().is_static()) back = e.Ints(x->shape().StaticDims());
  ASSIGN_OR_RETURN(y, e.Add("Reshape", {y, back}));
  return e.Finish(y, out);
}

namespace {

// X's values scattered to `indices` of zeros of `shape`, both flattened.
absl::StatusOr<Value*> Unpool(Emitter& e, Value* x, Value* indices, Value* shape) {
  Tensor zero(x->dtype(), {1});
  ASSIGN_OR_RETURN(Value * zeros, e.Add("ConstantOfShape", {shape}, {{"value", Attribute::TensorValue(zero)}}));
  ASSIGN_OR_RETURN(Value * flat, e.Reshape(zeros, {-1}));
  ASSIGN_OR_RETURN(Value * at, e.Reshape(indices, {-1}));
  ASSIGN_OR_RETURN(Value * values, e.Reshape(x, {-1}));
  ASSIGN_OR_RETURN(Value * y, e.Add("ScatterElements", {flat, at, values}, {{"axis", Attribute::Int(0)}}));
  return e.Add("Reshape", {y, shape});
}

}  // namespace

absl::Status DecomposeMaxUnpool(Graph* g, Node* n) {
  Value* x = n->input(0);
  Value* indices = n->input(1);
  Value* given = n->num_inputs() > 2 ? n->input(2) : nullptr;
  if (g->OpsetFor("") < 11)
    return Unimplemented(n->Describe(), ": cleave scatters MaxUnpool's values with ScatterElements, which needs opset 11");
  // The pool's input size, (in - 1) * stride - pads + kernel per spatial dim, as in * scale + shift.
  const UnpoolSize size = UnpoolSizeOf(*n);
  const std::vector<int64_t>& scale = size.scale;
  const std::vector<int64_t>& shift = size.shift;
  const int rank = static_cast<int>(scale.size());
  const Shape& xs = x->shape();
  const Tensor* given_constant = given ? ConstantInput(*n, 2) : nullptr;
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  // The shapes as constants over a static X (so inference keeps the output's), else from X's
  // Shape at run time.
  Value* shape;
  if (xs.is_static() && xs.rank() == rank) {
    std::vector<int64_t> dims;
    for (int a = 0; a < rank; ++a) dims.push_back(xs[a].value * scale[a] + shift[a]);
    shape = e.Ints(dims);
    if (given_constant && given_constant->numel() == rank) {
      std::vector<int64_t> grow(rank, 0);
      for (int a = 0; a < rank; ++a) grow.push_back(static_cast<int64_t>(given_constant->DoubleAt(a)) - dims[a]);
      ASSIGN_OR_RETURN(Value * y, Unpool(e, x, indices, shape));
      ASSIGN_OR_RETURN(y, e.Add("Pad", {y, e.Ints(grow)}));
      return e.Finish(y, out);
    }
  } else {
    ASSIGN_OR_RETURN(shape, e.Add("Shape", {x}));
    ASSIGN_OR_RETURN(shape, e.Add("Mul", {shape, e.Ints(scale)}));
    ASSIGN_OR_RETURN(shape, e.Add("Add", {shape, e.Ints(shift)}));
  }
  ASSIGN_OR_RETURN(Value * y, Unpool(e, x, indices, shape));
  if (given) {  // as ONNX's reference: the unpooled tensor in the corner of output_shape's zeros
    ASSIGN_OR_RETURN(Value * target, e.Cast(given, DataType::kInt64));
    ASSIGN_OR_RETURN(Value * grow, e.Add("Sub", {target, shape}));
    ASSIGN_OR_RETURN(Value * pads_in,
                     e.Add("Concat", {e.Ints(std::vector<int64_t>(rank, 0)), grow}, {{"axis", Attribute::Int(0)}}));
    ASSIGN_OR_RETURN(y, e.Add("Pad", {y, pads_in}));
  }
  return e.Finish(y, out);
}

// AffineGrid(theta [N, r, r + 1], size [N, C, spatial...]) -> grid [N, spatial..., r]:
// coordinate k of axis a (of S points) is -1 + 2k / max(S - 1, 1) with align_corners, else
// (2k + 1) / S - 1; the base grid lists them innermost axis first, then a 1.
absl::Status DecomposeAffineGrid(Graph* g, Node* n) {
  Value* theta = n->input(0);
  Value* size = n->input(1);
  const Shape& ts = theta->shape();
  if (!ts.has_rank() || ts.rank() != 3 || !ts[1].is_static())
    return Unimplemented(n->Describe(), ": theta is ", ts.ToString(),
                         "; cleave decomposes AffineGrid for theta [N, 2, 3] or [N, 3, 4] with static rows");
  const int axes = static_cast<int>(ts[1].value);
  const bool align = n->AttrInt("align_corners", 0) != 0;
  const DataType t = theta->dtype();
  const DataType i64 = DataType::kInt64;
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  std::vector<int64_t> spatial_at;
  for (int a = 0; a < axes; ++a) spatial_at.push_back(a + 2);
  ASSIGN_OR_RETURN(Value * spatial, e.Add("Gather", {size, e.Ints(spatial_at)}));
  // Coordinate a, as [1, .., S_a, .., 1] so the coordinates broadcast to the spatial shape.
  std::vector<Value*> columns(static_cast<size_t>(axes) + 1);
  for (int a = 0; a < axes; ++a) {
    ASSIGN_OR_RETURN(Value * count, e.Add("Gather", {size, e.Scalar(i64, a + 2)}));
    ASSIGN_OR_RETURN(Value * k, e.Add("Range", {e.Scalar(i64, 0), count, e.Scalar(i64, 1)}));
    ASSIGN_OR_RETURN(k, e.Cast(k, t));
    ASSIGN_OR_RETURN(Value * s, e.Cast(count, t));
    Value* c;
    if (align) {  // -1 + k * 2 / max(S - 1, 1)
      ASSIGN_OR_RETURN(Value * span, e.Add("Sub", {s, e.Scalar(t, 1)}));
      ASSIGN_OR_RETURN(span, e.Add("Max", {span, e.Scalar(t, 1)}));
      ASSIGN_OR_RETURN(Value * step, e.Add("Div", {e.Scalar(t, 2), span}));
      ASSIGN_OR_RETURN(c, e.Add("Mul", {k, step}));
    } else {  // (2k + 1) / S - 1
      ASSIGN_OR_RETURN(c, e.Add("Mul", {k, e.Scalar(t, 2)}));
      ASSIGN_OR_RETURN(c, e.Add("Add", {c, e.Scalar(t, 1)}));
      ASSIGN_OR_RETURN(c, e.Add("Div", {c, s}));
    }
    ASSIGN_OR_RETURN(c, e.Add("Sub", {c, e.Scalar(t, 1)}));
    std::vector<int64_t> view(static_cast<size_t>(axes), 1);
    view[static_cast<size_t>(a)] = -1;
    ASSIGN_OR_RETURN(c, e.Reshape(c, view));
    ASSIGN_OR_RETURN(c, e.Add("Expand", {c, spatial}));
    ASSIGN_OR_RETURN(c, e.Unsqueeze(c, {axes}));
    columns[static_cast<size_t>(axes - 1 - a)] = c;  // innermost axis first
  }
  ASSIGN_OR_RETURN(Value * ones_shape, e.Add("Concat", {spatial, e.Ints({1})}, {{"axis", Attribute::Int(0)}}));
  Tensor one(t, {1});
  SetElement(one, 0, 1.0);
  ASSIGN_OR_RETURN(columns.back(), e.Add("ConstantOfShape", {ones_shape}, {{"value", Attribute::TensorValue(one)}}));
  ASSIGN_OR_RETURN(Value * base, e.Add("Concat", columns, {{"axis", Attribute::Int(axes)}}));
  ASSIGN_OR_RETURN(base, e.Reshape(base, {1, -1, axes + 1}));
  ASSIGN_OR_RETURN(Value * rows, e.Transpose(theta, {0, 2, 1}));
  ASSIGN_OR_RETURN(Value * grid, e.Add("MatMul", {base, rows}));
  ASSIGN_OR_RETURN(Value * batch, e.Add("Gather", {size, e.Ints({0})}));
  ASSIGN_OR_RETURN(Value * shape,
                   e.Add("Concat", {batch, spatial, e.Ints({axes})}, {{"axis", Attribute::Int(0)}}));
  ASSIGN_OR_RETURN(grid, e.Add("Reshape", {grid, shape}));
  return e.Finish(grid, out);
}

// Col2Im(x [N, C·K, L], image_shape [r], block_shape [r]) -> [N, C, image...], K the block's
// elements and L its positions: element (c, k, l) of x adds into the padded image at block
// position l times the strides plus kernel offset k times the dilations.
absl::Status DecomposeCol2Im(Graph* g, Node* n) {
  Value* x = n->input(0);
  Value* image = n->input(1);
  Value* block = n->input(2);
  int r = 0;
  for (Value* v : {image, block})
    if (v->shape().has_rank() && v->shape().rank() == 1 && v->shape()[0].is_static())
      r = static_cast<int>(v->shape()[0].value);
  if (r < 1)
    return Unimplemented(n->Describe(), ": the length of image_shape is unknown; cleave decomposes Col2Im by rank");
  std::vector<int64_t> dilations = n->AttrInts("dilations"), strides = n->AttrInts("strides"), pads = n->AttrInts("pads");
  dilations.resize(static_cast<size_t>(r), 1);
  strides.resize(static_cast<size_t>(r), 1);
  pads.resize(2 * static_cast<size_t>(r), 0);
  const Tensor* image_constant = ConstantInput(*n, 1);
  const Tensor* block_constant = ConstantInput(*n, 2);
  Value* out = n->output(0);
  Emitter e(g, *n);
  g->RemoveNode(n);
  const DataType i64 = DataType::kInt64;
  Value* index = nullptr;   // [K·L, 1]: the padded image's flat index of each column element
  Value* stride = nullptr;  // [1]: the padded image's elements
  std::vector<Value*> padded(static_cast<size_t>(r)), ends(padded);
  std::vector<int64_t> fixed_padded, fixed_ends;  // with constants: the padded dims and the crop's ends
  int64_t fixed_entries = 0;
  if (image_constant && block_constant && image_constant->numel() == r && block_constant->numel() == r) {
    // Constants: the indices, sizes and crop computed here, so the output's shape stays static.
    std::vector<int64_t> im(static_cast<size_t>(r)), bl(im), pd(im), pos(im);
    int64_t k = 1, l = 1, p = 1;
    for (int d = 0; d < r; ++d) {
      const size_t i = static_cast<size_t>(d);
      im[i] = static_cast<int64_t>(image_constant->DoubleAt(d));
      bl[i] = static_cast<int64_t>(block_constant->DoubleAt(d));
      pd[i] = im[i] + pads[i] + pads[i + static_cast<size_t>(r)];
      pos[i] = (pd[i] - dilations[i] * (bl[i] - 1) - 1) / strides[i] + 1;
      if (bl[i] < 1 || pos[i] < 1)
        return InvalidArgument(out->name(), ": Col2Im's image dim ", d, " of ", im[i], " holds no block of ", bl[i]);
      k *= bl[i];
      l *= pos[i];
      p *= pd[i];
    }
    Tensor flat(i64, {k * l, 1});
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t ll = 0; ll < l; ++ll) {
        int64_t at = 0, step = 1, krest = kk, lrest = ll;
        for (int d = r - 1; d >= 0; --d) {
          const size_t i = static_cast<size_t>(d);
          at += ((lrest % pos[i]) * strides[i] + (krest % bl[i]) * dilations[i]) * step;
          lrest /= pos[i];
          krest /= bl[i];
          step *= pd[i];
        }
        flat.data<int64_t>()[kk * l + ll] = at;
      }
    }
    index = e.Constant("col2im_index", std::move(flat));
    stride = e.Ints({p});
    fixed_padded = pd;
    for (int d = 0; d < r; ++d) fixed_ends.push_back(pads[static_cast<size_t>(d)] + im[static_cast<size_t>(d)]);
    fixed_entries = k * l;
  } else {
    // Per spatial dim ([1] each): the image's size, its padded size, and the block's positions,
    // from image_shape and block_shape at run time.
    std::vector<Value*> positions(static_cast<size_t>(r)), blocks(positions);
    for (int d = 0; d < r; ++d) {
      const size_t i = static_cast<size_t>(d);
      ASSIGN_OR_RETURN(Value * size, e.Add("Gather", {image, e.Ints({d})}));
      ASSIGN_OR_RETURN(blocks[i], e.Add("Gather", {block, e.Ints({d})}));
      ASSIGN_OR_RETURN(padded[i], e.Add("Add", {size, e.Ints({pads[i] + pads[i + static_cast<size_t>(r)]})}));
      ASSIGN_OR_RETURN(ends[i], e.Add("Add", {size, e.Ints({pads[i]})}));
      // (padded - dilation * (block - 1) - 1) / stride + 1
      ASSIGN_OR_RETURN(Value * reach, e.Add("Mul", {blocks[i], e.Ints({dilations[i]})}));
      ASSIGN_OR_RETURN(Value * span, e.Add("Sub", {padded[i], reach}));
      ASSIGN_OR_RETURN(span, e.Add("Add", {span, e.Ints({dilations[i] - 1})}));
      ASSIGN_OR_RETURN(span, e.Add("Div", {span, e.Ints({strides[i]})}));
      ASSIGN_OR_RETURN(positions[i], e.Add("Add", {span, e.Ints({1})}));
    }
    // Over [block..., positions...]: per dim, offset * dilation + position * stride, times the
    // padded image's stride of that dim.
    stride = e.Ints({1});
    auto count = [&](Value* v, int64_t step, std::vector<int64_t> view) -> absl::StatusOr<Value*> {
      ASSIGN_OR_RETURN(Value * end, e.Reshape(v, {}));
      ASSIGN_OR_RETURN(Value * k, e.Add("Range", {e.Scalar(i64, 0), end, e.Scalar(i64, 1)}));
      ASSIGN_OR_RETURN(k, e.Add("Mul", {k, e.Scalar(i64, static_cast<double>(step))}));
      return e.Reshape(k, view);
    };
    for (int d = r - 1; d >= 0; --d) {
      const size_t i = static_cast<size_t>(d);
      std::vector<int64_t> kview(2 * static_cast<size_t>(r), 1), lview(kview);
      kview[i] = -1;
      lview[i + static_cast<size_t>(r)] = -1;
      ASSIGN_OR_RETURN(Value * k, count(blocks[i], dilations[i], kview));
      ASSIGN_OR_RETURN(Value * l, count(positions[i], strides[i], lview));
      ASSIGN_OR_RETURN(Value * at, e.Add("Add", {k, l}));
      ASSIGN_OR_RETURN(at, e.Add("Mul", {at, stride}));
      if (index) {
        ASSIGN_OR_RETURN(index, e.Add("Add", {index, at}));
      } else {
        index = at;
      }
      ASSIGN_OR_RETURN(stride, e.Add("Mul", {stride, padded[i]}));
    }
    ASSIGN_OR_RETURN(index, e.Reshape(index, {-1, 1}));
  }
  // x as [K·L, N, C], its rows in the index's order.
  Value* view = fixed_entries ? e.Ints({0, -1, fixed_entries}) : nullptr;
  if (!view) {
    ASSIGN_OR_RETURN(Value * entries, e.Add("Shape", {index}));
    ASSIGN_OR_RETURN(entries, e.Add("Gather", {entries, e.Ints({0})}));
    ASSIGN_OR_RETURN(view, e.Add("Concat", {e.Ints({0, -1}), entries}, {{"axis", Attribute::Int(0)}}));
  }
  ASSIGN_OR_RETURN(Value * cols, e.Add("Reshape", {x, view}));
  ASSIGN_OR_RETURN(cols, e.Transpose(cols, {2, 0, 1}));
  ASSIGN_OR_RETURN(Value * nc, e.Add("Shape", {cols}));
  ASSIGN_OR_RETURN(nc, e.Add("Slice", {nc, e.Ints({1}), e.Ints({3})}));
  ASSIGN_OR_RETURN(Value * zeros_shape, e.Add("Concat", {stride, nc}, {{"axis", Attribute::Int(0)}}));
  Tensor zero(x->dtype(), {1});
  ASSIGN_OR_RETURN(Value * zeros, e.Add("ConstantOfShape", {zeros_shape}, {{"value", Attribute::TensorValue(zero)}}));
  ASSIGN_OR_RETURN(Value * y, e.Add("ScatterND", {zeros, index, cols}, {{"reduction", Attribute::String("add")}}));
  // [P, N, C] -> [N, C, padded...], then the padding cropped.
  ASSIGN_OR_RETURN(y, e.Transpose(y, {1, 2, 0}));
  Value* shape;
  if (fixed_entries) {
    std::vector<int64_t> full = {0, 0};
    full.insert(full.end(), fixed_padded.begin(), fixed_padded.end());
    shape = e.Ints(full);
  } else {
    std::vector<Value*> full = {e.Ints({0, 0})};
    full.insert(full.end(), padded.begin(), padded.end());
    ASSIGN_OR_RETURN(shape, e.Add("Concat", full, {{"axis", Attribute::Int(0)}}));
  }
  ASSIGN_OR_RETURN(y, e.Add("Reshape", {y, shape}));
  std::vector<int64_t> starts, axes;
  for (int d = 0; d < r; ++d) {
    starts.push_back(pads[static_cast<size_t>(d)]);
    axes.push_back(d + 2);
  }
  Value* end = fixed_entries ? e.Ints(fixed_ends) : nullptr;
  if (!end) {
    ASSIGN_OR_RETURN(end, e.Add("Concat", ends, {{"axis", Attribute::Int(0)}}));
  }
  ASSIGN_OR_RETURN(y, e.Add("Slice", {y, e.Ints(starts), end, e.Ints(axes)}));
  return e.Finish(y, out);
}

}  // namespace cleave::graph::decompose
