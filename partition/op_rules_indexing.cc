// Sharding rules of the ops that index or pad along dims (partition/op_rules_internal.h): Pad,
// Tile and PadGrad, GatherElements and ScatterElements, TopK, GatherND and ScatterND.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "partition/op_rules_internal.h"

namespace cleave::partition::internal {

using graph::Node;

// Pad and Tile: one factor per output dim; a dim the pads (or repeats) leave as it is shares it
// with the input, any other must stay whole (its input dim is read whole). Pad's gradient
// ai.cleave.PadGrad (dY, pads of every dim) likewise, dY the padded side; it sums dY, so a
// partial sum stays one.
absl::StatusOr<FactorRule> PadOrTile(const Node& n) {
  const Tensor* amounts = graph::ConstantInput(n, 1);
  if (!amounts) return Unimplemented(n.Describe(), ": pads or repeats known only at run time");
  ASSIGN_OR_RETURN(std::vector<int64_t> in, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> out, Dims(n, n.output(0)));
  const int r = static_cast<int>(in.size());
  const std::vector<int64_t> v = amounts->ToInt64Vector();
  std::vector<bool> same(static_cast<size_t>(r), true);
  if (n.op_type() == "Tile") {
    for (int k = 0; k < r && k < static_cast<int>(v.size()); ++k) same[k] = v[k] == 1;
  } else {
    std::vector<int64_t> axes;
    if (n.num_inputs() > 3 && n.input(3)) {
      const Tensor* a = graph::ConstantInput(n, 3);
      if (!a) return Unimplemented(n.Describe(), ": axes known only at run time");
      axes = a->ToInt64Vector();
    } else {
      for (int k = 0; k < r; ++k) axes.push_back(k);
    }
    for (size_t j = 0; j < axes.size() && 2 * j + 1 <= v.size(); ++j) {
      const int64_t k = axes[j] < 0 ? axes[j] + r : axes[j];
      if (k >= 0 && k < r && (v[j] != 0 || v[axes.size() + j] != 0)) same[k] = false;
    }
  }
  FactorRule rule;
  OperandFactors fi, fo;
  for (int k = 0; k < r; ++k) {
    const int f = rule.AddFactor(out[k]);
    if (!same[k]) rule.no_shard[f] = 1;
    fo.dims.push_back(out[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    fi.dims.push_back(same[k] && in[k] != 1 ? std::vector<int>{f} : std::vector<int>{});
  }
  rule.inputs.push_back(fi);
  for (int i = 1; i < n.num_inputs(); ++i) rule.inputs.push_back(Replicate());
  rule.outputs.push_back(fo);
  rule.output_avg = {0};
  // Zero padding and repeats keep a sum a sum.
  const bool zero_pad = n.op_type() == "Tile" || n.op_type() == "PadGrad" ||
                        (n.AttrString("mode", "constant") == "constant" && (n.num_inputs() < 3 || !n.input(2)));
  rule.linearity = zero_pad ? Linearity::kEach : Linearity::kNone;
  rule.linear_inputs.assign(n.num_inputs(), 0);
  rule.linear_inputs[0] = zero_pad;
  return rule;
}

// GatherElements (data, indices) -> indices' shape and ScatterElements (data, indices, updates)
// -> data's shape: the indexed axis of data stays whole (any element may be read or written);
// the other dims share a factor where data and indices have the same size.
absl::StatusOr<FactorRule> ElementIndexing(const Node& n) {
  const bool gather = n.op_type() == "GatherElements";
  ASSIGN_OR_RETURN(std::vector<int64_t> data, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> idx, Dims(n, n.input(1)));
  const int r = static_cast<int>(data.size());
  int64_t axis = n.AttrInt("axis", 0);
  if (axis < 0) axis += r;
  FactorRule fr;
  OperandFactors fd, fx;
  for (int k = 0; k < r; ++k) {
    const bool shared = k != axis && data[k] == idx[k];
    if (gather) {  // the factors are the output's (indices') dims
      const int f = fr.AddFactor(idx[k]);
      fx.dims.push_back(idx[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
      fd.dims.push_back(shared && data[k] != 1 ? std::vector<int>{f} : std::vector<int>{});
    } else {  // the output's (data's) dims; the axis whole
      const int f = fr.AddFactor(data[k]);
      if (k == axis) fr.no_shard[f] = 1;
      fd.dims.push_back(data[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
      fx.dims.push_back(shared && idx[k] != 1 ? std::vector<int>{f} : std::vector<int>{});
    }
  }
  fr.inputs = {fd, fx};
  if (!gather) fr.inputs.push_back(fx);
  fr.outputs = {gather ? fx : fd};
  fr.output_avg = {0};
  fr.linear_inputs.assign(n.num_inputs(), 0);
  return fr;
}

// TopK (X[, K]) -> Values, Indices: whole along the axis (the first k of the whole line), the
// other dims shared by X and both outputs.
absl::StatusOr<FactorRule> TopKRule(const Node& n) {
  ASSIGN_OR_RETURN(std::vector<int64_t> x, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
  const int r = static_cast<int>(x.size());
  int64_t axis = n.AttrInt("axis", -1);
  if (axis < 0) axis += r;
  FactorRule fr;
  OperandFactors fx, fy;
  for (int k = 0; k < r; ++k) {
    if (k == axis) {
      const int fa = fr.AddFactor(x[k]), fb = fr.AddFactor(y[k]);
      fr.no_shard[fa] = fr.no_shard[fb] = 1;
      fx.dims.push_back(x[k] == 1 ? std::vector<int>{} : std::vector<int>{fa});
      fy.dims.push_back(y[k] == 1 ? std::vector<int>{} : std::vector<int>{fb});
      continue;
    }
    const int f = fr.AddFactor(x[k]);
    fx.dims.push_back(x[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    fy.dims.push_back(fx.dims.back());
  }
  fr.inputs.push_back(fx);
  for (int i = 1; i < n.num_inputs(); ++i) fr.inputs.push_back(Replicate());
  fr.outputs = {fy, fy};
  fr.output_avg = {0, 0};
  fr.linear_inputs.assign(n.num_inputs(), 0);
  return fr;
}

// GatherND (data [batch..., indexed (k)..., slice...], indices [batch..., tuples..., k]) ->
// [batch..., tuples..., slice...] and ScatterND (data, indices, updates [tuples..., slice...]) ->
// data's shape: the batch and slice dims shared where they match, the tuples shared by the
// indices and a gather's output; the indexed dims, the coordinates and a scatter's tuples (a
// rank holding some updates would write only those) stay whole.
absl::StatusOr<FactorRule> NdIndexing(const Node& n) {
  const bool gather = n.op_type() == "GatherND";
  ASSIGN_OR_RETURN(std::vector<int64_t> data, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> idx, Dims(n, n.input(1)));
  const int q = static_cast<int>(idx.size());
  if (q < 1) return InvalidArgument(n.Describe(), ": indices of rank 0");
  const int b = gather ? static_cast<int>(n.AttrInt("batch_dims", 0)) : 0;
  const int k = static_cast<int>(idx[q - 1]);
  FactorRule fr;
  auto dim = [&fr](int64_t size, bool whole) {
    const int f = fr.AddFactor(size);
    if (whole) fr.no_shard[f] = 1;
    return size == 1 ? std::vector<int>{} : std::vector<int>{f};
  };
  OperandFactors fd, fi, fo;  // data, indices, the gathered shape (a gather's output, a scatter's updates)
  for (int d = 0; d < b; ++d) {
    fd.dims.push_back(dim(data[d], false));
    fi.dims.push_back(fd.dims.back());
    fo.dims.push_back(fd.dims.back());
  }
  for (int d = b; d < q - 1; ++d) {
    fi.dims.push_back(dim(idx[d], !gather));
    fo.dims.push_back(fi.dims.back());
  }
  fi.dims.push_back(dim(idx[q - 1], true));
  for (int d = b; d < b + k && d < static_cast<int>(data.size()); ++d) fd.dims.push_back(dim(data[d], true));
  for (int d = b + k; d < static_cast<int>(data.size()); ++d) {
    fd.dims.push_back(dim(data[d], false));
    fo.dims.push_back(fd.dims.back());
  }
  if (gather) {
    fr.inputs = {fd, fi};
    fr.outputs = {fo};
  } else {
    fr.inputs = {fd, fi, fo};
    fr.outputs = {fd};
  }
  fr.output_avg = {0};
  fr.linear_inputs.assign(n.num_inputs(), 0);
  return fr;
}

}  // namespace cleave::partition::internal
