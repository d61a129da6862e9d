// Sharding rules of the convolutional networks' ops (partition/op_rules_internal.h): Conv and
// ConvTranspose, the batch and instance normalisations, Resize and the pools, with their
// gradients: images and channels may be sharded, spatial dims stay whole.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "partition/op_rules_internal.h"
#include "graph/resize_geometry.h"

namespace cleave::partition::internal {

using graph::Node;
using graph::Value;

// Conv (X [N, C, in...], W [M, C / group, kernel...][, B [M]]) -> Y [N, M, out...] and
// ai.cleave.ConvGrad (dY, X, W) -> dX, dW, dB: the images N and (without groups) the output
// channels M may be sharded; the spatial dims and input channels stay whole. dW and dB lack N
// (sums over the images: Partial when N is sharded), dX lacks M (a sum over the channels).
// ConvTranspose and ai.cleave.ConvTransposeGrad alike, with W [C, M / group, kernel...]: the
// output channels M are W's dim 1, and B's.
absl::StatusOr<FactorRule> Convolution(const Node& n) {
  const bool grad = n.domain() == graph::kCleaveDomain;
  const bool transposed = n.op_type() == "ConvTranspose" || n.op_type() == "ConvTransposeGrad";
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, n.input(grad ? 1 : 0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> w, Dims(n, n.input(grad ? 2 : 1)));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, grad ? n.input(0) : n.output(0)));
  if (x.size() < 3 || w.size() != x.size() || y.size() != x.size())
    return InvalidArgument(n.Describe(), ": expected X, W and Y of one rank >= 3");
  const int wm = transposed ? 1 : 0, wc = 1 - wm;  // W's dims of the output and the input channels
  FactorRule r;
  const int fn = r.AddFactor(x[0]), fm = r.AddFactor(y[1]), fc = r.AddFactor(x[1]);
  r.no_shard[fc] = 1;
  if (n.AttrInt("group", 1) != 1) r.no_shard[fm] = 1;
  auto operand = [](std::vector<int> first, std::vector<int> second, size_t rank) {
    OperandFactors o;
    o.dims = {std::move(first), std::move(second)};
    o.dims.resize(rank);
    return o;
  };
  auto f = [](int64_t size, int factor) { return size == 1 ? std::vector<int>{} : std::vector<int>{factor}; };
  const OperandFactors fx = operand(f(x[0], fn), f(x[1], fc), x.size());
  OperandFactors fw;
  fw.dims.resize(w.size());
  fw.dims[static_cast<size_t>(wm)] = f(w[static_cast<size_t>(wm)], fm);
  fw.dims[static_cast<size_t>(wc)] = f(w[static_cast<size_t>(wc)], fc);
  const OperandFactors fy = operand(f(y[0], fn), f(y[1], fm), y.size());
  const OperandFactors fb = OperandFactors{false, {f(y[1], fm)}};
  if (grad) {
    r.inputs = {fy, fx, fw};
    r.outputs = {fx, fw, fb};
    r.outputs.resize(static_cast<size_t>(n.num_outputs()));
  } else {
    r.inputs = {fx, fw};
    if (n.num_inputs() > 2 && n.input(2)) r.inputs.push_back(fb);
    r.outputs = {fy};
  }
  r.output_avg.assign(n.num_outputs(), 0);
  r.linear_inputs.assign(n.num_inputs(), 0);
  return r;
}

// BatchNormalization (X [N, C, ...], scale, B, input_mean, input_var [C]) -> Y[, running_mean,
// running_var] and ai.cleave.BatchNormalizationGrad (dY, X, scale, input_mean, input_var) -> dX,
// dScale, dB: the channels C may be sharded with their per-channel operands. In inference mode the
// images N may be too (the gradient's dScale and dB, sums over N, come out Partial); training
// mode's batch statistics need every image, so N stays whole there. InstanceNormalization (X,
// scale, B) and its gradient (dY, X, scale), whose statistics are each image's, as inference mode.
absl::StatusOr<FactorRule> BatchNorm(const Node& n) {
  const bool grad = n.domain() == graph::kCleaveDomain;
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, n.input(grad ? 1 : 0)));
  if (x.size() < 2) return InvalidArgument(n.Describe(), ": expected X [N, C, ...] of rank >= 2");
  FactorRule r;
  const int fn = r.AddFactor(x[0]), fc = r.AddFactor(x[1]);
  if (n.AttrInt("training_mode", 0) != 0) r.no_shard[fn] = 1;
  auto f = [](int64_t size, int factor) { return size == 1 ? std::vector<int>{} : std::vector<int>{factor}; };
  OperandFactors fx, fp;
  fx.dims = {f(x[0], fn), f(x[1], fc)};
  fx.dims.resize(x.size());
  fp.dims = {f(x[1], fc)};
  if (grad) {
    r.inputs = {fx, fx, fp, fp, fp};
    r.outputs = {fx, fp, fp};
    r.outputs.resize(static_cast<size_t>(n.num_outputs()));
  } else {
    r.inputs = {fx, fp, fp, fp, fp};
    r.outputs = {fx, fp, fp};
    r.outputs.resize(static_cast<size_t>(n.num_outputs()), fp);
  }
  r.inputs.resize(static_cast<size_t>(n.num_inputs()));  // InstanceNormalization: the first three
  r.output_avg.assign(n.num_outputs(), 0);
  r.linear_inputs.assign(n.num_inputs(), 0);
  if (grad) {  // linear in dY
    r.linearity = Linearity::kEach;
    r.linear_inputs[0] = 1;
  }
  return r;
}

// Resize (X, roi, scales, sizes) -> Y and ai.cleave.ResizeGrad (dY, X's shape, roi, scales,
// sizes) -> dX: a dim may be sharded where it maps each coordinate to itself by a constant scale
// of 1 or by not being among the axes resized (graph/resize_geometry.h); a dim named by sizes
// stays whole (its size is the whole tensor's). Linear in X (dY).
absl::StatusOr<FactorRule> ResizeRule(const Node& n) {
  const bool grad = n.domain() == graph::kCleaveDomain;
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, grad ? n.output(0) : n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, grad ? n.input(0) : n.output(0)));
  if (x.size() != y.size()) return InvalidArgument(n.Describe(), ": expected X and Y of one rank");
  const int first = grad ? 2 : 1;  // roi; then scales, sizes
  auto input = [&](int i) { return n.num_inputs() > i ? n.input(i) : nullptr; };
  const Tensor* scales = input(first + 1) ? graph::ConstantInput(n, first + 1) : nullptr;
  const bool by_scales = !input(first + 2) && scales && scales->dtype() == DataType::kFloat32;
  std::vector<bool> whole(x.size(), true);
  auto attrs = graph::ResizeAttrsOf(n);
  if (attrs.ok() && attrs->coordinates != "tf_crop_and_resize") {
    std::vector<int64_t> named = attrs->axes;
    for (int64_t& v : named) v = v < 0 ? v + static_cast<int64_t>(x.size()) : v;
    if (named.empty())
      for (size_t d = 0; d < x.size(); ++d) named.push_back(static_cast<int64_t>(d));
    for (size_t d = 0; d < x.size(); ++d) {
      const auto at = std::find(named.begin(), named.end(), static_cast<int64_t>(d));
      if (at == named.end()) whole[d] = false;  // not resized
      else if (by_scales && scales->numel() == static_cast<int64_t>(named.size()))
        whole[d] = scales->data<float>()[at - named.begin()] != 1.f;  // out = in, each coordinate itself
    }
  }
  FactorRule r;
  OperandFactors fx, fy;
  fx.dims.resize(x.size());
  fy.dims.resize(y.size());
  for (size_t d = 0; d < x.size(); ++d) {
    if (whole[d] || x[d] == 1) continue;
    const int f = r.AddFactor(x[d]);
    fx.dims[d] = fy.dims[d] = {f};
  }
  r.inputs.assign(static_cast<size_t>(n.num_inputs()), Replicate());
  r.inputs[0] = grad ? fy : fx;
  r.outputs = {grad ? fx : fy};
  r.output_avg.assign(n.num_outputs(), 0);
  r.linear_inputs.assign(n.num_inputs(), 0);
  r.linearity = Linearity::kEach;
  r.linear_inputs[0] = 1;
  return r;
}

// GridSample (X [N, C, in...], grid [N, out..., r]) -> Y [N, C, out...] and ai.cleave.GridSampleGrad
// (dY, X, grid) -> dX, dGrid: the images N shard every operand, the channels C shard X and Y
// (the grid's gradient then a sum over them), the output points shard the grid and Y (X's
// gradient then a sum over them); X's spatial dims stay whole, since any point may read any of
// them. Linear in X (dY).
absl::StatusOr<FactorRule> GridSampleRule(const Node& n) {
  const bool grad = n.domain() == graph::kCleaveDomain;
  const int xi = grad ? 1 : 0;
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, n.input(xi)));
  ASSIGN_OR_RETURN(std::vector<int64_t> grid, Dims(n, n.input(xi + 1)));
  if (x.size() < 3 || grid.size() != x.size())
    return InvalidArgument(n.Describe(), ": expected X [N, C, spatial...] and a grid of its rank");
  FactorRule r;
  auto f = [](int64_t size, int factor) { return size == 1 ? std::vector<int>{} : std::vector<int>{factor}; };
  const int fn = r.AddFactor(x[0]), fc = r.AddFactor(x[1]);
  OperandFactors fx, fg, fy;
  fx.dims = {f(x[0], fn), f(x[1], fc)};
  fx.dims.resize(x.size());
  fg.dims = {f(x[0], fn)};
  fy.dims = {f(x[0], fn), f(x[1], fc)};
  for (size_t d = 1; d + 1 < grid.size(); ++d) {
    const int fo = r.AddFactor(grid[d]);
    fg.dims.push_back(f(grid[d], fo));
    fy.dims.push_back(f(grid[d], fo));
  }
  fg.dims.emplace_back();
  if (grad) {
    r.inputs = {fy, fx, fg};
    r.outputs = {fx};
    if (n.num_outputs() > 1) r.outputs.push_back(fg);
  } else {
    r.inputs = {fx, fg};
    r.outputs = {fy};
  }
  r.output_avg.assign(n.num_outputs(), 0);
  r.linear_inputs.assign(n.num_inputs(), 0);
  r.linearity = Linearity::kEach;
  r.linear_inputs[0] = 1;
  return r;
}

// MaxPool, AveragePool and the global pools (X [N, C, spatial...] -> Y [N, C, out...]
// [, Indices]) and their gradients ai.cleave.MaxPoolGrad (dY, X) -> dX and AveragePoolGrad (dY,
// X's shape) -> dX: the images N and channels C may be sharded, the windows' spatial dims stay
// whole. MaxPool's Indices count from the whole tensor's start, so a node that outputs them keeps
// N and C whole. AveragePool and both gradients are linear in their first input.
absl::StatusOr<FactorRule> Pooling(const Node& n) {
  const bool cleave = n.domain() == graph::kCleaveDomain;
  const Value* xv = cleave ? n.output(0) : n.input(0);
  const Value* yv = cleave ? n.input(0) : n.output(0);
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, xv));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, yv));
  if (x.size() < 3 || y.size() != x.size())
    return InvalidArgument(n.Describe(), ": expected X and Y [N, C, spatial...] of one rank >= 3");
  FactorRule r;
  const int fn = r.AddFactor(x[0]), fc = r.AddFactor(x[1]);
  if (!cleave && n.num_outputs() > 1 && n.output(1)) r.no_shard[fn] = r.no_shard[fc] = 1;
  auto f = [](int64_t size, int factor) { return size == 1 ? std::vector<int>{} : std::vector<int>{factor}; };
  OperandFactors fx, fy;
  fx.dims = {f(x[0], fn), f(x[1], fc)};
  fx.dims.resize(x.size());
  fy.dims = {f(y[0], fn), f(y[1], fc)};
  fy.dims.resize(y.size());
  const std::string& op = n.op_type();
  if (cleave) {
    r.inputs = {fy, op == "MaxPoolGrad" ? fx : Replicate()};
    r.outputs = {fx};
  } else {
    r.inputs = {fx};
    r.outputs.assign(static_cast<size_t>(n.num_outputs()), fy);
  }
  r.output_avg.assign(n.num_outputs(), 0);
  r.linear_inputs.assign(n.num_inputs(), 0);
  if (cleave || op == "AveragePool" || op == "GlobalAveragePool") {
    r.linearity = Linearity::kEach;
    r.linear_inputs[0] = 1;
  }
  return r;
}

}  // namespace cleave::partition::internal
