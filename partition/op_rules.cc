// Sharding rules of ops as factors (partition/): see op_rules.h.
#include "partition/op_rules.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "partition/op_rules_internal.h"

namespace cleave::partition {

namespace internal {

absl::StatusOr<std::vector<int64_t>> Dims(const graph::Node& n, const graph::Value* v) {
  if (!v->shape().is_static())
    return InvalidArgument(n.Describe(), ": '", v->name(), "' has shape ", v->shape().ToString(),
                           "; partitioning needs static shapes (fix the batch and sequence dims)");
  return v->shape().StaticDims();
}

OperandFactors Replicate() {
  OperandFactors o;
  o.replicate = true;
  return o;
}

}  // namespace internal

namespace {

using graph::Node;
using graph::Value;
using namespace internal;

// One factor per output dim; inputs aligned to the right, broadcast (size-1) dims unrelated.
absl::StatusOr<FactorRule> Elementwise(const Node& n, std::vector<int> inputs, Linearity lin,
                                       std::vector<int> linear) {
  FactorRule r;
  ASSIGN_OR_RETURN(std::vector<int64_t> out, Dims(n, n.output(0)));
  std::vector<int> f;
  for (int64_t d : out) f.push_back(r.AddFactor(d));
  r.inputs.resize(n.num_inputs());
  for (int i = 0; i < n.num_inputs(); ++i) {
    if (!n.input(i)) continue;
    if (std::find(inputs.begin(), inputs.end(), i) == inputs.end()) {
      r.inputs[i] = Replicate();
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> in, Dims(n, n.input(i)));
    const int off = static_cast<int>(out.size() - in.size());
    for (size_t k = 0; k < in.size(); ++k) {
      const int o = off + static_cast<int>(k);
      r.inputs[i].dims.push_back(in[k] == out[o] && out[o] != 1 ? std::vector<int>{f[o]} : std::vector<int>{});
    }
  }
  for (int o = 0; o < n.num_outputs(); ++o) {
    OperandFactors of;
    if (n.output(o)) {
      ASSIGN_OR_RETURN(std::vector<int64_t> od, Dims(n, n.output(o)));
      if (od != out) return InvalidArgument(n.Describe(), ": outputs of different shapes");
      for (size_t k = 0; k < od.size(); ++k) of.dims.push_back(od[k] == 1 ? std::vector<int>{} : std::vector<int>{f[k]});
    }
    r.outputs.push_back(of);
  }
  r.output_avg.assign(n.num_outputs(), 0);
  r.linearity = lin;
  r.linear_inputs.assign(n.num_inputs(), 0);
  for (int i : linear) r.linear_inputs[i] = 1;
  return r;
}

// Factors of a view (Reshape, Squeeze, Unsqueeze, Flatten): dims are matched in runs of equal
// product; in a run of one dim against several, the one dim is the compound of the several.
// A run of several against several becomes one unshardable factor.
absl::StatusOr<FactorRule> View(const Node& n) {
  FactorRule r;
  ASSIGN_OR_RETURN(std::vector<int64_t> in, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> out, Dims(n, n.output(0)));
  OperandFactors fi, fo;
  fi.dims.resize(in.size());
  fo.dims.resize(out.size());
  size_t i = 0, o = 0;
  while (i < in.size() || o < out.size()) {
    if (i < in.size() && in[i] == 1) { ++i; continue; }
    if (o < out.size() && out[o] == 1) { ++o; continue; }
    if (i >= in.size() || o >= out.size()) return InvalidArgument(n.Describe(), ": element counts differ");
    size_t i1 = i + 1, o1 = o + 1;
    int64_t pi = in[i], po = out[o];
    while (pi != po) {
      if (pi < po) {
        if (i1 >= in.size()) return InvalidArgument(n.Describe(), ": element counts differ");
        pi *= in[i1++];
      } else {
        if (o1 >= out.size()) return InvalidArgument(n.Describe(), ": element counts differ");
        po *= out[o1++];
      }
    }
    // Size-1 dims inside the run carry no factor.
    std::vector<size_t> ri, ro;
    for (size_t k = i; k < i1; ++k) if (in[k] != 1) ri.push_back(k);
    for (size_t k = o; k < o1; ++k) if (out[k] != 1) ro.push_back(k);
    if (ri.size() == 1) {
      for (size_t k : ro) {
        int f = r.AddFactor(out[k]);
        fo.dims[k] = {f};
        fi.dims[ri[0]].push_back(f);
      }
    } else if (ro.size() == 1) {
      for (size_t k : ri) {
        int f = r.AddFactor(in[k]);
        fi.dims[k] = {f};
        fo.dims[ro[0]].push_back(f);
      }
    } else {
      int f = r.AddFactor(pi);
      r.no_shard[f] = 1;
      for (size_t k : ri) fi.dims[k] = {f};
      for (size_t k : ro) fo.dims[k] = {f};
    }
    i = i1;
    o = o1;
  }
  r.inputs.push_back(fi);
  for (int k = 1; k < n.num_inputs(); ++k) r.inputs.push_back(Replicate());
  r.outputs.push_back(fo);
  r.output_avg = {0};
  r.linearity = Linearity::kEach;
  r.linear_inputs.assign(n.num_inputs(), 0);
  r.linear_inputs[0] = 1;
  return r;
}

// One factor per dim of input 0; the listed axes are reduced away (or kept as size 1).
absl::StatusOr<FactorRule> Reduce(const Node& n, const std::vector<int64_t>& axes_in, bool keepdims, bool avg,
                                  bool shardable_axes) {
  FactorRule r;
  ASSIGN_OR_RETURN(std::vector<int64_t> in, Dims(n, n.input(0)));
  const int rank = static_cast<int>(in.size());
  std::set<int> axes;
  for (int64_t a : axes_in) axes.insert(static_cast<int>(a < 0 ? a + rank : a));
  if (axes_in.empty())
    for (int k = 0; k < rank; ++k) axes.insert(k);
  OperandFactors fi, fo;
  for (int k = 0; k < rank; ++k) {
    int f = r.AddFactor(in[k]);
    if (axes.count(k) && !shardable_axes) r.no_shard[f] = 1;
    fi.dims.push_back(in[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    if (!axes.count(k)) fo.dims.push_back(in[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    else if (keepdims) fo.dims.push_back({});
  }
  r.inputs.push_back(fi);
  for (int k = 1; k < n.num_inputs(); ++k) r.inputs.push_back(Replicate());
  r.outputs.push_back(fo);
  r.output_avg = {static_cast<char>(avg)};
  r.linearity = shardable_axes ? Linearity::kEach : Linearity::kNone;
  r.linear_inputs.assign(n.num_inputs(), 0);
  r.linear_inputs[0] = shardable_axes;
  return r;
}

absl::StatusOr<std::vector<int64_t>> ReduceAxes(const graph::Graph& g, const Node& n, int axes_input_from) {
  auto op = graph::ResolveNode(g, n);
  if (!op.ok()) return op.status();
  if (op->version >= axes_input_from) {
    if (n.num_inputs() < 2 || !n.input(1)) return std::vector<int64_t>{};
    const Tensor* t = graph::ConstantInput(n, 1);
    if (!t) return InvalidArgument(n.Describe(), ": the axes input must be a constant to partition");
    std::vector<int64_t> axes;
    for (int64_t k = 0; k < t->numel(); ++k) axes.push_back(t->data<int64_t>()[k]);
    return axes;
  }
  return n.AttrInts("axes");
}

// A matrix product over [..., M, K] x [..., K, N] with optional bias [N]; trans flags select
// each operand's storage order.
absl::StatusOr<FactorRule> MatMulRule(const Node& n, bool trans_a, bool trans_b, bool bias_forbids_k) {
  FactorRule r;
  ASSIGN_OR_RETURN(std::vector<int64_t> a, Dims(n, n.input(0)));
  ASSIGN_OR_RETURN(std::vector<int64_t> b, Dims(n, n.input(1)));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
  if (a.size() < 2 || b.size() < 2) return InvalidArgument(n.Describe(), ": 1-D matmul operands are not partitioned");
  const int batch = static_cast<int>(y.size()) - 2;
  std::vector<int> fb;
  for (int k = 0; k < batch; ++k) fb.push_back(r.AddFactor(y[k]));
  const int64_t M = y[batch], N = y[batch + 1];
  const int64_t K = a[a.size() - (trans_a ? 2 : 1)];
  const int fm = r.AddFactor(M), fk = r.AddFactor(K), fn = r.AddFactor(N);
  if (bias_forbids_k) r.no_shard[fk] = 1;
  auto operand = [&](const std::vector<int64_t>& d, int f_row, int f_col, bool trans) {
    OperandFactors o;
    const int ob = static_cast<int>(d.size()) - 2;
    for (int k = 0; k < ob; ++k) {
      const int yk = batch - ob + k;
      o.dims.push_back(d[k] == y[yk] && d[k] != 1 ? std::vector<int>{fb[yk]} : std::vector<int>{});
    }
    o.dims.push_back({trans ? f_col : f_row});
    o.dims.push_back({trans ? f_row : f_col});
    return o;
  };
  r.inputs.push_back(operand(a, fm, fk, trans_a));
  r.inputs.push_back(operand(b, fk, fn, trans_b));
  if (n.num_inputs() > 2 && n.input(2)) {
    OperandFactors bias;
    bias.dims.push_back({fn});
    r.inputs.push_back(bias);
  }
  OperandFactors out;
  for (int k = 0; k < batch; ++k) out.dims.push_back(y[k] == 1 ? std::vector<int>{} : std::vector<int>{fb[k]});
  out.dims.push_back({fm});
  out.dims.push_back({fn});
  r.outputs.push_back(out);
  r.output_avg = {0};
  if (!bias_forbids_k) {
    r.linearity = Linearity::kEach;
    r.linear_inputs = {1, 1};
  }
  r.linear_inputs.resize(n.num_inputs(), 0);
  return r;
}

// Softmax-like ops over one axis (from opset 13) or over [axis, rank) (before): those stay
// whole, the rest is elementwise.
absl::StatusOr<FactorRule> AlongAxis(const graph::Graph& g, const Node& n, int num_tensor_inputs, bool coerced2d) {
  ASSIGN_OR_RETURN(FactorRule r, Elementwise(n, [&] {
    std::vector<int> v(num_tensor_inputs);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }(), Linearity::kNone, {}));
  ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
  const int rank = static_cast<int>(y.size());
  int64_t axis = n.AttrInt("axis", coerced2d ? 1 : -1);
  if (axis < 0) axis += rank;
  for (int k = 0; k < rank; ++k)
    if (k == axis || (coerced2d && k > axis)) r.no_shard[k] = 1;
  (void)g;
  return r;
}

// One factor per dim of `full`; a dim where `cut` is smaller (a sliced axis) stays whole.
// Returns the factors of `full` and of `cut` (Slice reads full and writes cut, SliceGrad the
// reverse).
absl::StatusOr<std::pair<OperandFactors, OperandFactors>> SliceFactors(const Node& n, const Value* full,
                                                                       const Value* cut, FactorRule* r) {
  ASSIGN_OR_RETURN(std::vector<int64_t> big, Dims(n, full));
  ASSIGN_OR_RETURN(std::vector<int64_t> small, Dims(n, cut));
  OperandFactors fb, fs;
  for (size_t k = 0; k < big.size(); ++k) {
    const int f = r->AddFactor(big[k]);
    if (big[k] != small[k]) r->no_shard[f] = 1;
    fb.dims.push_back(big[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    fs.dims.push_back(small[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
  }
  return std::make_pair(fb, fs);
}

// Factors of a normalisation over dims [axis, rank) of x: the normalised dims stay whole.
struct NormFactors {
  OperandFactors x;     // every dim
  OperandFactors norm;  // the normalised dims (scale, bias and their gradients)
  OperandFactors stat;  // x's dims with the normalised ones size 1 (mean, inv_std_dev)
};
absl::StatusOr<NormFactors> NormalizationFactors(const Node& n, const Value* x, FactorRule* r) {
  ASSIGN_OR_RETURN(std::vector<int64_t> d, Dims(n, x));
  const int rank = static_cast<int>(d.size());
  int64_t axis = n.AttrInt("axis", -1);
  if (axis < 0) axis += rank;
  NormFactors nf;
  for (int k = 0; k < rank; ++k) {
    const int f = r->AddFactor(d[k]);
    if (k >= axis) r->no_shard[f] = 1;
    nf.x.dims.push_back(d[k] == 1 ? std::vector<int>{} : std::vector<int>{f});
    if (k >= axis) nf.norm.dims.push_back(nf.x.dims.back());
    nf.stat.dims.push_back(k >= axis ? std::vector<int>{} : nf.x.dims.back());
  }
  return nf;
}

// Factors of a lookup along `axis` of `table` with `indices`: the table's dims, the index dims,
// and the rows read (table[:axis] + indices + table[axis+1:]). Gather reads the table and
// writes the rows; GatherGrad reads the rows' gradient and writes the table's.
struct LookupFactors {
  OperandFactors table, indices, rows;
  int table_axis_factor;
};
absl::StatusOr<LookupFactors> Lookup(const Node& n, const Value* table, const Value* indices, FactorRule* r) {
  ASSIGN_OR_RETURN(std::vector<int64_t> data, Dims(n, table));
  ASSIGN_OR_RETURN(std::vector<int64_t> idx, Dims(n, indices));
  const int rank = static_cast<int>(data.size());
  int64_t axis = n.AttrInt("axis", 0);
  if (axis < 0) axis += rank;
  LookupFactors lf;
  std::vector<int> f;
  for (int k = 0; k < rank; ++k) f.push_back(r->AddFactor(data[k]));
  for (int k = 0; k < rank; ++k) lf.table.dims.push_back(data[k] == 1 ? std::vector<int>{} : std::vector<int>{f[k]});
  for (int64_t s : idx) lf.indices.dims.push_back(s == 1 ? std::vector<int>{} : std::vector<int>{r->AddFactor(s)});
  for (int k = 0; k < axis; ++k) lf.rows.dims.push_back(lf.table.dims[k]);
  for (const auto& d : lf.indices.dims) lf.rows.dims.push_back(d);
  for (int k = static_cast<int>(axis) + 1; k < rank; ++k) lf.rows.dims.push_back(lf.table.dims[k]);
  lf.table_axis_factor = f[axis];
  return lf;
}

}  // namespace

int MarkVocabParallelLoss(graph::Graph& g) {
  int marked = 0;
  for (const auto& n : g.nodes()) {
    const bool fwd = n->domain().empty() && n->op_type() == "SoftmaxCrossEntropyLoss";
    const bool bwd = n->domain() == graph::kCleaveDomain && n->op_type() == "SoftmaxCrossEntropyLossGrad";
    if (!fwd && !bwd) continue;
    n->metadata()[kVocabParallel] = std::string("1");  // (a const char* assignment trips GCC 12's -Wrestrict)
    ++marked;
  }
  return marked;
}

absl::StatusOr<FactorRule> RuleFor(const graph::Graph& g, const Node& n) {
  const std::string& op = n.op_type();
  const bool cleave = n.domain() == graph::kCleaveDomain;
  if (!n.domain().empty() && !cleave) return Unimplemented(n.Describe(), ": no sharding rule for domain ", n.domain());
  auto version = [&]() -> int {
    auto r = graph::ResolveNode(g, n);
    return r.ok() ? r->version : 0;
  };
  static const std::set<std::string> kUnary = {
      "Abs",   "Exp",      "Log",      "Sqrt",      "Reciprocal", "Sin",  "Cos",         "Tanh",      "Erf",
      "Relu",  "Sigmoid",  "Gelu",     "Not",       "Trilu",      "Tan",  "Asin",        "Acos",      "Atan",
      "Sinh",  "Cosh",     "Asinh",    "Acosh",     "Atanh",      "Sign", "Softplus",    "Softsign",  "Mish",
      "Floor", "Ceil",     "Round",    "LeakyRelu", "Elu",        "Selu", "Celu",        "HardSigmoid",
      "HardSwish", "ThresholdedRelu", "IsNaN", "IsInf"};
  static const std::set<std::string> kLinearUnary = {"Neg", "Identity", "Cast"};
  static const std::set<std::string> kCompare = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                                                 "And", "Or", "Xor", "Max", "Min", "Pow", "Mod", "PRelu"};
  if (!cleave && kUnary.count(op)) return Elementwise(n, {0}, Linearity::kNone, {});
  if (!cleave && kLinearUnary.count(op)) return Elementwise(n, {0}, Linearity::kEach, {0});
  if (!cleave && kCompare.count(op)) return Elementwise(n, {0, 1}, Linearity::kNone, {});
  if (!cleave && (op == "Add" || op == "Sub")) return Elementwise(n, {0, 1}, Linearity::kAll, {0, 1});
  if (!cleave && op == "CastLike") return Elementwise(n, {0}, Linearity::kEach, {0});  // input 1: its type only
  if ((!cleave && (op == "Pad" || op == "Tile")) || (cleave && op == "PadGrad")) return PadOrTile(n);
  if (!cleave && (op == "GatherElements" || op == "ScatterElements")) return ElementIndexing(n);
  if (!cleave && op == "TopK") return TopKRule(n);
  if (!cleave && (op == "GatherND" || op == "ScatterND")) return NdIndexing(n);
  if ((!cleave && (op == "Conv" || op == "ConvTranspose")) || (cleave && (op == "ConvGrad" || op == "ConvTransposeGrad")))
    return Convolution(n);
  if ((!cleave && (op == "MaxPool" || op == "AveragePool" || op == "GlobalMaxPool" || op == "GlobalAveragePool")) ||
      (cleave && (op == "MaxPoolGrad" || op == "AveragePoolGrad")))
    return Pooling(n);
  if ((!cleave && op == "Resize") || (cleave && op == "ResizeGrad")) return ResizeRule(n);
  if ((!cleave && op == "GridSample") || (cleave && op == "GridSampleGrad")) return GridSampleRule(n);
  if ((!cleave && (op == "BatchNormalization" || op == "InstanceNormalization")) ||
      (cleave && (op == "BatchNormalizationGrad" || op == "InstanceNormalizationGrad")))
    return BatchNorm(n);
  if (!cleave && (op == "Sum" || op == "Mean")) {
    std::vector<int> all(static_cast<size_t>(n.num_inputs()));
    std::iota(all.begin(), all.end(), 0);
    return Elementwise(n, all, Linearity::kAll, all);
  }
  if (!cleave && op == "Mul") return Elementwise(n, {0, 1}, Linearity::kEach, {0, 1});
  if (!cleave && op == "Div") return Elementwise(n, {0, 1}, Linearity::kEach, {0});
  if (!cleave && op == "Where") return Elementwise(n, {0, 1, 2}, Linearity::kNone, {});
  if (!cleave && op == "Clip") return Elementwise(n, {0}, Linearity::kNone, {});
  if (!cleave && op == "Dropout") return Elementwise(n, {0}, Linearity::kEach, {0});
  if (cleave && op == "Gelu") return Elementwise(n, {0}, Linearity::kNone, {});
  if (cleave && (op == "GeluGrad")) return Elementwise(n, {0, 1}, Linearity::kEach, {0});
  if (cleave && op == "SwiGLU") return Elementwise(n, {0, 1}, Linearity::kEach, {1});
  if (cleave && (op == "RotaryEmbedding" || op == "RotaryEmbeddingGrad")) {
    // Elementwise over the leading dims with cos / sin broadcast; the last axis pairs its halves.
    ASSIGN_OR_RETURN(FactorRule r, Elementwise(n, {0, 1, 2}, Linearity::kEach, {0}));
    ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
    if (!y.empty()) r.no_shard[static_cast<int>(y.size()) - 1] = 1;
    return r;
  }
  if (cleave && op == "SwiGLUGrad") return Elementwise(n, {0, 1, 2}, Linearity::kEach, {0});
  if (cleave && op == "InPlaceAccumulator") {
    ASSIGN_OR_RETURN(FactorRule r, Elementwise(n, {0, 1}, Linearity::kAll, {0, 1}));
    r.partial_inputs_follow = true;
    return r;
  }
  if (cleave && (op == "AdamW" || op == "SGD")) {
    std::vector<int> tensors;
    for (int i = 3; i < n.num_inputs(); ++i) tensors.push_back(i);
    return Elementwise(n, tensors, Linearity::kNone, {});
  }
  if (!cleave && (op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten")) return View(n);
  if (!cleave && op == "Expand") return Elementwise(n, {0}, Linearity::kEach, {0});
  if (!cleave && op == "Transpose") {
    ASSIGN_OR_RETURN(std::vector<int64_t> in, Dims(n, n.input(0)));
    const int rank = static_cast<int>(in.size());
    std::vector<int64_t> perm = n.AttrInts("perm");
    if (perm.empty())
      for (int k = rank - 1; k >= 0; --k) perm.push_back(k);
    FactorRule r;
    OperandFactors fi, fo;
    for (int k = 0; k < rank; ++k) fi.dims.push_back(in[k] == 1 ? std::vector<int>{} : std::vector<int>{r.AddFactor(in[k])});
    for (int k = 0; k < rank; ++k) fo.dims.push_back(fi.dims[perm[k]]);
    r.inputs = {fi};
    r.outputs = {fo};
    r.output_avg = {0};
    r.linearity = Linearity::kEach;
    r.linear_inputs = {1};
    return r;
  }
  if (!cleave && (op == "Concat" || op == "Split")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ref, Dims(n, op == "Concat" ? n.output(0) : n.input(0)));
    int64_t axis = n.AttrInt("axis", 0);
    if (axis < 0) axis += static_cast<int64_t>(ref.size());
    FactorRule r;
    std::vector<int> f;
    for (size_t k = 0; k < ref.size(); ++k) {
      f.push_back(r.AddFactor(ref[k]));
      if (static_cast<int64_t>(k) == axis) r.no_shard[f.back()] = 1;
    }
    auto operand = [&](const Value* v) -> absl::StatusOr<OperandFactors> {
      ASSIGN_OR_RETURN(std::vector<int64_t> d, Dims(n, v));
      OperandFactors o;
      for (size_t k = 0; k < d.size(); ++k) o.dims.push_back(d[k] == 1 && ref[k] != 1 ? std::vector<int>{} : std::vector<int>{f[k]});
      return o;
    };
    const int tensor_inputs = op == "Concat" ? n.num_inputs() : 1;
    for (int i = 0; i < n.num_inputs(); ++i) {
      if (i < tensor_inputs && n.input(i)) {
        ASSIGN_OR_RETURN(OperandFactors o, operand(n.input(i)));
        r.inputs.push_back(o);
      } else {
        r.inputs.push_back(Replicate());
      }
    }
    for (int o = 0; o < n.num_outputs(); ++o) {
      ASSIGN_OR_RETURN(OperandFactors of, operand(n.output(o)));
      r.outputs.push_back(of);
    }
    r.output_avg.assign(n.num_outputs(), 0);
    r.linearity = op == "Concat" ? Linearity::kAll : Linearity::kEach;
    r.linear_inputs.assign(n.num_inputs(), 0);
    for (int i = 0; i < tensor_inputs; ++i) r.linear_inputs[i] = 1;
    return r;
  }
  if ((cleave && op == "SliceGrad") || (!cleave && op == "Slice")) {
    // Slice(data, ...) -> y; SliceGrad(dY, shape, ...) -> dX: the sliced axes stay whole.
    FactorRule r;
    const bool grad = cleave;
    ASSIGN_OR_RETURN(auto f, SliceFactors(n, grad ? n.output(0) : n.input(0), grad ? n.input(0) : n.output(0), &r));
    r.inputs.push_back(grad ? f.second : f.first);
    for (int k = 1; k < n.num_inputs(); ++k) r.inputs.push_back(Replicate());
    r.outputs = {grad ? f.first : f.second};
    r.output_avg = {0};
    r.linearity = Linearity::kEach;
    r.linear_inputs.assign(n.num_inputs(), 0);
    r.linear_inputs[0] = 1;
    return r;
  }
  if (!cleave && op == "MatMul") return MatMulRule(n, false, false, false);
  if (cleave && op == "FusedMatMul")
    return MatMulRule(n, n.AttrInt("transA", 0) != 0, n.AttrInt("transB", 0) != 0,
                      (n.num_inputs() > 2 && n.input(2)) || !n.AttrString("activation", "").empty());
  if (!cleave && op == "Gemm") {
    ASSIGN_OR_RETURN(FactorRule r, MatMulRule(n, n.AttrInt("transA", 0) != 0, n.AttrInt("transB", 0) != 0,
                                              n.num_inputs() > 2 && n.input(2)));
    if (n.num_inputs() > 2 && n.input(2)) {  // C broadcasts to [M, N]
      ASSIGN_OR_RETURN(std::vector<int64_t> c, Dims(n, n.input(2)));
      ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
      OperandFactors fc;
      const int off = 2 - static_cast<int>(c.size());
      const int fm = r.outputs[0].dims[0][0], fn = r.outputs[0].dims[1][0];
      for (size_t k = 0; k < c.size(); ++k) {
        const int yk = off + static_cast<int>(k);
        fc.dims.push_back(c[k] == y[yk] && c[k] != 1 ? std::vector<int>{yk == 0 ? fm : fn} : std::vector<int>{});
      }
      r.inputs[2] = fc;
    }
    return r;
  }
  if (!cleave && (op == "ReduceSum" || op == "ReduceMean")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReduceAxes(g, n, op == "ReduceSum" ? 13 : 18));
    if (axes.empty() && n.AttrInt("noop_with_empty_axes", 0)) return Elementwise(n, {0}, Linearity::kEach, {0});
    return Reduce(n, axes, n.AttrInt("keepdims", 1) != 0, op == "ReduceMean", /*shardable_axes=*/true);
  }
  static const std::set<std::string> kNonlinearReduce = {"ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                                                         "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp",
                                                         "ReduceProd"};
  if (!cleave && kNonlinearReduce.count(op)) {
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReduceAxes(g, n, 18));
    if (axes.empty() && n.AttrInt("noop_with_empty_axes", 0)) return Elementwise(n, {0}, Linearity::kNone, {});
    return Reduce(n, axes, n.AttrInt("keepdims", 1) != 0, false, /*shardable_axes=*/false);
  }
  if (cleave && op == "SquaredNorm") {
    // Every dim of every input is summed away.
    FactorRule r;
    for (int i = 0; i < n.num_inputs(); ++i) {
      ASSIGN_OR_RETURN(std::vector<int64_t> d, Dims(n, n.input(i)));
      OperandFactors o;
      for (int64_t s : d) o.dims.push_back(s == 1 ? std::vector<int>{} : std::vector<int>{r.AddFactor(s)});
      r.inputs.push_back(o);
    }
    r.outputs.push_back(OperandFactors{});
    r.output_avg = {0};
    r.linear_inputs.assign(n.num_inputs(), 0);
    return r;
  }
  if (cleave && (op == "Attention" || op == "AttentionGrad")) {
    // q [b..., T, D], k [b..., S, D], v [b..., S, Dv][, bias] -> out [b..., T, Dv], lse [b..., T];
    // the grad takes (dOut, q, k, v, out, lse[, bias]) and gives (dq, dk, dv[, dbias]). The
    // leading dims (batch, heads) shard freely; T, S, D and Dv stay whole (the softmax runs along
    // S over all of D).
    const bool grad = op == "AttentionGrad";
    // The other layouts are device sessions' own, made after partitioning.
    if (n.AttrString("layout", "bhsd") != "bhsd")
      return Unimplemented(n.Describe(), ": layout \"", n.AttrString("layout", ""),
                           "\" is not partitioned (it is made after partitioning, by device sessions)");
    ASSIGN_OR_RETURN(std::vector<int64_t> qd, Dims(n, n.input(grad ? 1 : 0)));
    ASSIGN_OR_RETURN(std::vector<int64_t> kd, Dims(n, n.input(grad ? 2 : 1)));
    ASSIGN_OR_RETURN(std::vector<int64_t> vd, Dims(n, n.input(grad ? 3 : 2)));
    const size_t rank = qd.size();
    if (rank < 2 || kd.size() != rank || vd.size() != rank)
      return InvalidArgument(n.Describe(), ": q, k and v must have one rank >= 2");
    FactorRule r;
    std::vector<int> lead;
    for (size_t d = 0; d + 2 < rank; ++d) lead.push_back(r.AddFactor(qd[d]));
    const int T = r.AddFactor(qd[rank - 2]), D = r.AddFactor(qd[rank - 1]);
    const int S = r.AddFactor(kd[rank - 2]), Dv = r.AddFactor(vd[rank - 1]);
    for (int f : {T, D, S, Dv}) r.no_shard[f] = 1;
    auto operand = [&](std::vector<int> last) {
      OperandFactors o;
      for (int f : lead) o.dims.push_back({f});
      for (int f : last) o.dims.push_back({f});
      return o;
    };
    const OperandFactors q = operand({T, D}), k = operand({S, D}), v = operand({S, Dv}), out = operand({T, Dv}),
                         lse = operand({T});
    if (grad) {
      r.inputs = {out, q, k, v, out, lse};
      r.outputs = {q, k, v};
      r.linearity = Linearity::kEach;  // linear in dOut
      r.linear_inputs = {1, 0, 0, 0, 0, 0};
    } else {
      r.inputs = {q, k, v};
      r.outputs = {out, lse};
      r.outputs.resize(n.num_outputs());
      r.linear_inputs.assign(3, 0);
    }
    // The bias over the scores [b..., T, S], broadcast along its dims of 1 (a padding mask
    // [B, 1, 1, S] shards with the batch and goes whole to each head's shard).
    if (const int at = grad ? 6 : 3; n.num_inputs() > at && n.input(at)) {
      ASSIGN_OR_RETURN(std::vector<int64_t> bd, Dims(n, n.input(at)));
      std::vector<int> full = lead;
      full.push_back(T);
      full.push_back(S);
      if (bd.size() > full.size()) return InvalidArgument(n.Describe(), ": the bias has a higher rank than the scores");
      OperandFactors b;
      for (size_t d = 0; d < bd.size(); ++d)
        b.dims.push_back(bd[d] == 1 ? std::vector<int>{} : std::vector<int>{full[full.size() - bd.size() + d]});
      r.inputs.push_back(b);
      r.linear_inputs.push_back(0);
    }
    if (grad && n.num_outputs() > 3) {  // dbias, the scores' gradient [b..., T, S]
      OperandFactors scores = operand({T, S});
      r.outputs.push_back(scores);
    }
    r.output_avg.assign(n.num_outputs(), 0);
    return r;
  }
  if (!cleave && (op == "Softmax" || op == "LogSoftmax")) return AlongAxis(g, n, 1, version() < 13);
  if (!cleave && op == "CumSum") {  // linear, and whole along its (constant) axis
    const Tensor* a = graph::ConstantInput(n, 1);
    if (!a || a->numel() != 1) return Unimplemented(n.Describe(), ": a CumSum axis known only at run time");
    ASSIGN_OR_RETURN(FactorRule r, Elementwise(n, {0}, Linearity::kEach, {0}));
    ASSIGN_OR_RETURN(std::vector<int64_t> y, Dims(n, n.output(0)));
    const int64_t rank = static_cast<int64_t>(y.size());
    int64_t axis = a->DoubleAt(0) < 0 ? static_cast<int64_t>(a->DoubleAt(0)) + rank : static_cast<int64_t>(a->DoubleAt(0));
    if (axis < 0 || axis >= rank) return InvalidArgument(n.Describe(), ": axis out of range");
    r.no_shard[axis] = 1;
    return r;
  }
  if (!cleave && (op == "ArgMax" || op == "ArgMin"))
    return Reduce(n, {n.AttrInt("axis", 0)}, n.AttrInt("keepdims", 1) != 0, false, /*shardable_axes=*/false);
  if (cleave && (op == "SoftmaxGrad" || op == "LogSoftmaxGrad")) return AlongAxis(g, n, 2, false);
  if (op == "LayerNormalization" || (cleave && op == "RMSNormalization")) {
    // (X, scale[, bias]) -> (Y[, Mean, InvStdDev]); RMSNormalization (X, scale) -> (Y[, InvStdDev]).
    FactorRule r;
    ASSIGN_OR_RETURN(NormFactors nf, NormalizationFactors(n, n.input(0), &r));
    r.inputs.push_back(nf.x);
    for (int i = 1; i < n.num_inputs(); ++i) r.inputs.push_back(nf.norm);
    r.outputs.push_back(nf.x);
    for (int o = 1; o < n.num_outputs(); ++o) r.outputs.push_back(nf.stat);
    r.output_avg.assign(n.num_outputs(), 0);
    r.linear_inputs.assign(n.num_inputs(), 0);
    return r;
  }
  if (cleave && (op == "LayerNormalizationGrad" || op == "RMSNormalizationGrad")) {
    // (dY, X, scale, mean, inv_std_dev) -> (dX, dScale, dBias): the leading dims are summed
    // away for dScale and dBias. RMSNormalizationGrad: (dY, X, scale, inv_std_dev) -> (dX, dScale).
    FactorRule r;
    ASSIGN_OR_RETURN(NormFactors nf, NormalizationFactors(n, n.input(1), &r));
    r.inputs = {nf.x, nf.x, nf.norm, nf.stat};
    if (op == "LayerNormalizationGrad") r.inputs.push_back(nf.stat);
    r.outputs = {nf.x, nf.norm, nf.norm};
    r.outputs.resize(n.num_outputs());
    r.output_avg.assign(n.num_outputs(), 0);
    r.linear_inputs.assign(n.num_inputs(), 0);
    return r;
  }
  if (!cleave && op == "Gather") {
    FactorRule r;
    ASSIGN_OR_RETURN(LookupFactors lf, Lookup(n, n.input(0), n.input(1), &r));
    r.inputs = {lf.table, lf.indices};
    r.outputs = {lf.rows};
    r.output_avg = {0};
    r.gathered_factor = lf.table_axis_factor;  // a vocab-sharded table: masked lookup, then a Partial sum
    r.linear_inputs = {1, 0};
    r.linearity = Linearity::kEach;
    return r;
  }
  if (cleave && op == "GatherGrad") {
    // (shape, indices, dY) -> dX of shape: the index dims are summed away (scatter-add).
    if (n.num_inputs() > 3 && n.input(3))
      return InvalidArgument(n.Describe(), ": a GatherGrad onto a base (a device session's fused accumulation) ",
                             "is not partitioned; expected the training graph's (shape, indices, dY)");
    FactorRule r;
    ASSIGN_OR_RETURN(LookupFactors lf, Lookup(n, n.output(0), n.input(1), &r));
    r.no_shard[lf.table_axis_factor] = 1;
    r.inputs = {Replicate(), lf.indices, lf.rows};
    r.outputs = {lf.table};
    r.output_avg = {0};
    r.linearity = Linearity::kEach;
    r.linear_inputs = {0, 0, 1};
    return r;
  }
  if (!cleave && (op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss")) {
    // scores [N, C, d...], labels [N, d...] -> loss (scalar for mean/sum), log_prob like scores.
    ASSIGN_OR_RETURN(std::vector<int64_t> s, Dims(n, n.input(0)));
    FactorRule r;
    std::vector<int> f;
    for (int64_t d : s) f.push_back(r.AddFactor(d));
    const bool vocab_parallel = n.metadata().count(kVocabParallel) > 0;
    if (vocab_parallel) {
      if (n.num_inputs() > 2 && n.input(2))
        return Unimplemented(n.Describe(), ": a vocabulary-parallel cross-entropy with class weights");
      if (s.size() != 2)
        return Unimplemented(n.Describe(), ": a vocabulary-parallel cross-entropy over scores of rank ", s.size(),
                             " (expected [N, C])");
      r.collective_factor = f[1];
    } else {
      r.no_shard[f[1]] = 1;
    }
    OperandFactors fs, fl;
    for (size_t k = 0; k < s.size(); ++k) fs.dims.push_back({f[k]});
    for (size_t k = 0; k < s.size(); ++k)
      if (k != 1) fl.dims.push_back({f[k]});
    r.inputs = {fs, fl};
    if (n.num_inputs() > 2 && n.input(2)) r.inputs.push_back(OperandFactors{false, {{f[1]}}});
    const std::string red = n.AttrString("reduction", "mean");
    r.outputs.push_back(red == "none" ? fl : OperandFactors{});
    if (n.num_outputs() > 1) r.outputs.push_back(fs);
    r.output_avg.assign(n.num_outputs(), 0);
    r.output_avg[0] = red == "mean";
    if (red == "mean" && n.num_inputs() > 2 && n.input(2))
      return Unimplemented(n.Describe(), ": a weighted mean cross-entropy is not partitioned");
    r.linear_inputs.assign(n.num_inputs(), 0);
    return r;
  }
  if (cleave && (op == "SoftmaxCrossEntropyLossGrad" || op == "NegativeLogLikelihoodLossGrad")) {
    // (dY, log_prob [N, C, ...], label [N, ...]) -> d_scores like log_prob. The mean's
    // divisor is the local row count, so a batch-sharded call computes the gradient of the
    // local mean; the partitioner scales the seed of an averaged loss instead.
    ASSIGN_OR_RETURN(std::vector<int64_t> s, Dims(n, n.input(1)));
    FactorRule r;
    std::vector<int> f;
    for (int64_t d : s) f.push_back(r.AddFactor(d));
    // Vocabulary-parallel: each class shard's gradient needs only its own log_prob columns
    // (the lowering tells the node which classes it holds).
    const bool vocab_parallel = n.metadata().count(kVocabParallel) > 0 && s.size() == 2 &&
                                !(n.num_inputs() > 3 && n.input(3));
    if (!vocab_parallel) r.no_shard[f[1]] = 1;
    OperandFactors fs, fl;
    for (size_t k = 0; k < s.size(); ++k) fs.dims.push_back({f[k]});
    for (size_t k = 0; k < s.size(); ++k)
      if (k != 1) fl.dims.push_back({f[k]});
    const std::string red = n.AttrString("reduction", "mean");
    r.inputs = {red == "none" ? fl : Replicate(), fs, fl};
    if (n.num_inputs() > 3 && n.input(3)) r.inputs.push_back(OperandFactors{false, {{f[1]}}});
    r.outputs = {fs};
    r.output_avg = {0};
    r.linearity = Linearity::kEach;
    r.linear_inputs.assign(n.num_inputs(), 0);
    r.linear_inputs[0] = 1;
    return r;
  }
  if (!cleave && (op == "Shape" || op == "Size" || op == "ConstantOfShape" || op == "Range" || op == "Constant")) {
    FactorRule r;
    for (int i = 0; i < n.num_inputs(); ++i) r.inputs.push_back(Replicate());
    for (int o = 0; o < n.num_outputs(); ++o) r.outputs.push_back(Replicate());
    r.output_avg.assign(n.num_outputs(), 0);
    r.linear_inputs.assign(n.num_inputs(), 0);
    return r;
  }
  return Unimplemented(n.Describe(), ": no sharding rule for ", cleave ? "ai.cleave." : "", op);
}

}  // namespace cleave::partition
