// Gradient rules for linear algebra, normalisation and data movement (trainer/).
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "trainer/gradient_rules.h"

namespace cleave::trainer {

namespace {

using graph::Attribute;
using graph::Value;

// C = A @ B over [..., M, K] x [..., K, N]: dA = dC @ B^T, dB = A^T @ dC, each summed back
// over the batch dims its operand was broadcast along. For the common linear layer (A of
// rank > 2, B a 2-D weight) the batch sum is folded into one GEMM over all rows:
// dB = reshape(A, [-1, K])^T @ reshape(dC, [-1, N]).
absl::Status MatMulGrad(GradBuilder& b) {
  const Shape& sa = b.x(0)->shape();
  const Shape& sb = b.x(1)->shape();
  if (sa.rank() < 2 || sb.rank() < 2)
    return b.Error("the gradient of MatMul with a 1-D operand is not implemented");
  ASSIGN_OR_RETURN(Value * da, b.ReduceTo(b.Op("MatMul", {b.dy(), b.TransposeLast2(b.x(1))}), b.x(0)));
  Value* db;
  if (sb.rank() == 2 && sa.rank() > 2 && sb.is_static()) {
    const int64_t k = sb[0].value, n = sb[1].value;
    Value* rows_a = b.Op("Reshape", {b.x(0), b.Ints({-1, k})});
    Value* rows_dy = b.Op("Reshape", {b.dy(), b.Ints({-1, n})});
    db = b.Op("MatMul", {b.TransposeLast2(rows_a), rows_dy});
  } else {
    ASSIGN_OR_RETURN(db, b.ReduceTo(b.Op("MatMul", {b.TransposeLast2(b.x(0)), b.dy()}), b.x(1)));
  }
  b.SetGrad(0, da);
  b.SetGrad(1, db);
  return absl::OkStatus();
}

absl::Status TransposeGrad(GradBuilder& b) {  // the inverse permutation
  int r = b.x(0)->shape().rank();
  std::vector<int64_t> perm = b.fwd().AttrInts("perm");
  if (perm.empty())
    for (int k = r - 1; k >= 0; --k) perm.push_back(k);
  std::vector<int64_t> inv(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inv[perm[k]] = static_cast<int64_t>(k);
  b.SetGrad(0, b.Op("Transpose", {b.dy()}, {{"perm", Attribute::Ints(inv)}}));
  return absl::OkStatus();
}

// Reshape, Squeeze, Unsqueeze, Flatten, Expand-free views: the gradient takes x's shape back
// (a constant where it is static, as SpreadOverReduced's).
absl::Status ReshapeLikeGrad(GradBuilder& b) {
  b.SetGrad(0, b.Op("Reshape", {b.dy(), b.ShapeOf(b.x(0))}));
  return absl::OkStatus();
}

absl::Status IdentityGrad(GradBuilder& b) {
  b.SetGrad(0, b.dy());
  return absl::OkStatus();
}

absl::Status ExpandGrad(GradBuilder& b) {  // sum over the broadcast axes
  ASSIGN_OR_RETURN(Value * dx, b.ReduceTo(b.dy(), b.x(0)));
  b.SetGrad(0, dx);
  return absl::OkStatus();
}

absl::Status CastGrad(GradBuilder& b) {  // cast the gradient back to x's type
  b.SetGrad(0, b.Op("Cast", {b.dy()}, {{"to", Attribute::Int(static_cast<int64_t>(b.x(0)->dtype()))}}));
  return absl::OkStatus();
}

absl::Status WhereGrad(GradBuilder& b) {  // dy flows to the branch each element took
  Value* zero = b.Const(0, b.dy());
  ASSIGN_OR_RETURN(Value * dx, b.ReduceTo(b.Op("Where", {b.x(0), b.dy(), zero}), b.x(1)));
  ASSIGN_OR_RETURN(Value * dz, b.ReduceTo(b.Op("Where", {b.x(0), zero, b.dy()}), b.x(2)));
  b.SetGrad(1, dx);
  b.SetGrad(2, dz);
  return absl::OkStatus();
}

// The reduced axes of a Reduce* node, normalised, or an error.
absl::StatusOr<std::vector<int64_t>> ReducedAxes(GradBuilder& b) {
  int r = b.x(0)->shape().rank();
  std::vector<int64_t> axes = b.fwd().AttrInts("axes");
  if (b.x(1)) {
    if (!b.x(1)->initializer()) return b.Error("the gradient needs constant reduction axes");
    axes = b.x(1)->initializer()->ToInt64Vector();
  }
  if (axes.empty()) {
    if (b.fwd().AttrInt("noop_with_empty_axes", 0)) return axes;
    for (int k = 0; k < r; ++k) axes.push_back(k);
  }
  for (int64_t& a : axes) a = a < 0 ? a + r : a;
  return axes;
}

// v (dy, or the reduced output) broadcast back over the reduced axes to x's shape.
absl::StatusOr<Value*> SpreadOverReduced(GradBuilder& b, const std::vector<int64_t>& axes,
                                         Value* v = nullptr) {
  Value* dy = v ? v : b.dy();
  if (b.fwd().AttrInt("keepdims", 1) == 0 && !axes.empty()) {
    dy = b.Unsqueeze(dy, axes);
  }
  // A static shape is a constant (the partitioner gives each rank its local one), so the
  // gradient never reads x itself, which a Shape of it would (and a sharded x be gathered for).
  return b.Op("Expand", {dy, b.ShapeOf(b.x(0))});
}

absl::Status ReduceSumGrad(GradBuilder& b) {  // 1 for every reduced element
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReducedAxes(b));
  ASSIGN_OR_RETURN(Value * dx, SpreadOverReduced(b, axes));
  b.SetGrad(0, dx);
  return absl::OkStatus();
}

absl::Status ReduceMeanGrad(GradBuilder& b) {  // 1 / (elements reduced into each output)
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReducedAxes(b));
  const Shape& s = b.x(0)->shape();
  int64_t count = 1;
  for (int64_t a : axes) {
    if (!s[static_cast<int>(a)].is_static()) return b.Error("the gradient of ReduceMean needs static reduced dims");
    count *= s[static_cast<int>(a)].value;
  }
  ASSIGN_OR_RETURN(Value * spread, SpreadOverReduced(b, axes));
  b.SetGrad(0, b.Op("Mul", {spread, b.Const(1.0 / static_cast<double>(count), b.dy())}));
  return absl::OkStatus();
}

// max (min) over axes: dy goes to the elements equal to the result, split evenly among ties
// as PyTorch's amax does.
absl::Status ReduceMaxMinGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReducedAxes(b));
  ASSIGN_OR_RETURN(Value * result, SpreadOverReduced(b, axes, b.y(0)));
  ASSIGN_OR_RETURN(Value * dy, SpreadOverReduced(b, axes));
  Value* hit = b.Op("Equal", {b.x(0), result});
  Value* ones = b.Op("Cast", {hit}, {{"to", Attribute::Int(static_cast<int64_t>(b.dy()->dtype()))}});
  Value* ties = b.ReduceSum(ones, axes, /*keepdims=*/true);
  b.SetGrad(0, b.Op("Where", {hit, b.Op("Div", {dy, ties}), b.Const(0, b.dy())}));
  return absl::OkStatus();
}

// Product over axes: dx_i = dy times the product of the other elements, formed without dividing
// by a zero (as PyTorch's prod backward): with no zero in the slice it is prod / x_i; with one,
// only that element's is nonzero, the product of the rest; with more, all are 0.
absl::Status ReduceProdGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReducedAxes(b));
  Value* x = b.x(0);
  if (axes.empty()) {  // noop_with_empty_axes: the identity
    b.SetGrad(0, b.dy());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Value * dy, SpreadOverReduced(b, axes));
  Value* zero = b.Op("Equal", {x, b.Const(0, x)});
  Value* nonzero = b.Op("Where", {zero, b.Const(1, x), x});
  const Attribute keep = Attribute::Int(1);
  Value* rest = b.graph_opset() >= 18 ? b.Op("ReduceProd", {nonzero, b.Ints(axes)}, {{"keepdims", keep}})
                                      : b.Op("ReduceProd", {nonzero}, {{"axes", Attribute::Ints(axes)}, {"keepdims", keep}});
  Value* zeros = b.ReduceSum(b.Op("Cast", {zero}, {{"to", Attribute::Int(static_cast<int64_t>(x->dtype()))}}), axes,
                             /*keepdims=*/true);
  Value* none = b.Op("Equal", {zeros, b.Const(0, x)});
  Value* one = b.Op("Equal", {zeros, b.Const(1, x)});
  Value* others = b.Op("Where", {zero, b.Op("Where", {one, rest, b.Const(0, x)}),
                                 b.Op("Where", {none, b.Op("Div", {rest, nonzero}), b.Const(0, x)})});
  b.SetGrad(0, b.Op("Mul", {dy, others}));
  return absl::OkStatus();
}

// The reductions around a sum: dx = dy times L1's sign(x), L2's x / y (0 where y is 0, as
// PyTorch's norm), SumSquare's 2x, LogSum's 1 / sum = exp(-y), LogSumExp's exp(x - y). With
// noop_with_empty_axes and no axes the forward is the identity (SumSquare's x^2).
absl::Status ReduceAroundSumGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ReducedAxes(b));
  const std::string& op = b.fwd().op_type();
  Value* x = b.x(0);
  if (axes.empty()) {
    b.SetGrad(0, op == "ReduceSumSquare" ? b.Op("Mul", {b.dy(), b.Op("Mul", {x, b.Const(2, x)})}) : b.dy());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Value * dy, SpreadOverReduced(b, axes));
  ASSIGN_OR_RETURN(Value * y, SpreadOverReduced(b, axes, b.y(0)));
  Value* d = nullptr;
  if (op == "ReduceL1") d = b.Op("Sign", {x});
  else if (op == "ReduceL2")
    d = b.Op("Where", {b.Op("Equal", {y, b.Const(0, y)}), b.Const(0, x), b.Op("Div", {x, y})});
  else if (op == "ReduceSumSquare") d = b.Op("Mul", {x, b.Const(2, x)});
  else if (op == "ReduceLogSum") d = b.Op("Exp", {b.Op("Neg", {y})});
  else d = b.Op("Exp", {b.Op("Sub", {x, y})});
  b.SetGrad(0, b.Op("Mul", {dy, d}));
  return absl::OkStatus();
}

// GatherElements: each element of dy goes back to the data element it was read from, summed
// where several read one (ScatterElements with reduction add, which needs opset 16).
absl::Status GatherElementsGrad(GradBuilder& b) {
  if (b.graph_opset() < 16)
    return b.Error("the gradient of GatherElements scatters with ScatterElements' reduction, which needs opset >= 16");
  if (!b.x(0)->shape().is_static()) return b.Error("the gradient of GatherElements needs data of a static shape");
  const Attribute axis = Attribute::Int(b.fwd().AttrInt("axis", 0));
  b.SetGrad(0, b.Op("ScatterElements", {b.Zeros(b.x(0)), b.x(1), b.dy()},
                    {{"axis", axis}, {"reduction", Attribute::String("add")}}));
  return absl::OkStatus();
}

// TopK: each value's gradient goes back to the element it was taken from; the indices are
// distinct along the axis, so ScatterElements (no reduction, opset 11) writes each once. The
// indices have no gradient.
absl::Status TopKGrad(GradBuilder& b) {
  if (b.graph_opset() < 11)
    return b.Error("the gradient of TopK scatters with ScatterElements, which needs opset >= 11");
  if (!b.x(0)->shape().is_static()) return b.Error("the gradient of TopK needs an input of a static shape");
  if (!b.dy(0)) return absl::OkStatus();
  const Attribute axis = Attribute::Int(b.fwd().AttrInt("axis", -1));
  b.SetGrad(0, b.Op("ScatterElements", {b.Zeros(b.x(0)), b.y(1), b.dy(0)}, {{"axis", axis}}));
  return absl::OkStatus();
}

// GatherND: dy's slices go back to the slices they were read from, summed where tuples repeat
// (ScatterND with reduction add, opset 16). batch_dims must be 0.
absl::Status GatherNdGrad(GradBuilder& b) {
  if (b.fwd().AttrInt("batch_dims", 0) != 0)
    return b.Error("no gradient rule for GatherND with batch_dims > 0");
  if (b.graph_opset() < 16)
    return b.Error("the gradient of GatherND scatters with ScatterND's reduction, which needs opset >= 16");
  if (!b.x(0)->shape().is_static()) return b.Error("the gradient of GatherND needs data of a static shape");
  b.SetGrad(0, b.Op("ScatterND", {b.Zeros(b.x(0)), b.x(1), b.dy()}, {{"reduction", Attribute::String("add")}}));
  return absl::OkStatus();
}

// ScatterND: the updates get dy's slices at their tuples; the data gets dy where nothing
// overwrote it (reduction none), or all of dy (add). mul, max and min have no rule.
absl::Status ScatterNdGrad(GradBuilder& b) {
  const std::string reduction = b.fwd().AttrString("reduction", "none");
  if (reduction != "none" && reduction != "add") return b.Error("no gradient rule for ScatterND with reduction " + reduction);
  if (b.NeedsGrad(0)) {
    if (reduction == "add") {
      b.SetGrad(0, b.dy());
    } else {
      if (!b.x(2)->shape().is_static()) return b.Error("the gradient of ScatterND needs updates of a static shape");
      b.SetGrad(0, b.Op("ScatterND", {b.dy(), b.x(1), b.Zeros(b.x(2))}));
    }
  }
  if (b.NeedsGrad(2)) b.SetGrad(2, b.Op("GatherND", {b.dy(), b.x(1)}));
  return absl::OkStatus();
}

// ScatterElements: the updates get dy where they were written; data gets dy where nothing
// overwrote it (reduction none), or all of dy (add). mul, max and min have no rule.
absl::Status ScatterElementsGrad(GradBuilder& b) {
  const std::string reduction = b.fwd().AttrString("reduction", "none");
  if (reduction != "none" && reduction != "add")
    return b.Error("no gradient rule for ScatterElements with reduction " + reduction);
  const Attribute axis = Attribute::Int(b.fwd().AttrInt("axis", 0));
  if (b.NeedsGrad(0)) {
    if (reduction == "add") {
      b.SetGrad(0, b.dy());
    } else {
      if (!b.x(2)->shape().is_static()) return b.Error("the gradient of ScatterElements needs updates of a static shape");
      b.SetGrad(0, b.Op("ScatterElements", {b.dy(), b.x(1), b.Zeros(b.x(2))}, {{"axis", axis}}));
    }
  }
  if (b.NeedsGrad(2)) b.SetGrad(2, b.Op("GatherElements", {b.dy(), b.x(1)}, {{"axis", axis}}));
  return absl::OkStatus();
}

// Pad in reflect, edge or wrap mode (which read some elements more than once):
// ai.cleave.PadGrad, each input element's gradient the sum of the dY elements that read it, the
// pads given for every dim (from `axes` when there are).
absl::Status PaddedModeGrad(GradBuilder& b, const std::string& mode, const std::vector<int64_t>& pads) {
  const Shape& x = b.x(0)->shape();
  if (!x.has_rank()) return b.Error(absl::StrCat("the gradient of Pad in mode ", mode, " needs an input of known rank"));
  const int r = x.rank();
  std::vector<int64_t> axes;
  if (b.fwd().num_inputs() > 3 && b.x(3)) {
    const Tensor* a = graph::ConstantInput(b.fwd(), 3);
    if (!a) return b.Error("the gradient of Pad needs constant axes");
    for (int64_t v : a->ToInt64Vector()) axes.push_back(v < 0 ? v + r : v);
  } else {
    for (int k = 0; k < r; ++k) axes.push_back(k);
  }
  if (pads.size() != 2 * axes.size())
    return b.Error(absl::StrCat("expected ", 2 * axes.size(), " pads for ", axes.size(), " axes, got ", pads.size()));
  std::vector<int64_t> full(static_cast<size_t>(2 * r), 0);
  for (size_t j = 0; j < axes.size(); ++j) {
    if (axes[j] < 0 || axes[j] >= r) return b.Error(absl::StrCat("axis ", axes[j], " is out of range for rank ", r));
    full[static_cast<size_t>(axes[j])] = pads[j];
    full[static_cast<size_t>(r + axes[j])] = pads[axes.size() + j];
  }
  b.SetGrad(0, b.Op("ai.cleave.PadGrad", {b.dy(), b.Ints(full)}, {{"mode", Attribute::String(mode)}}));
  return absl::OkStatus();
}

// Pad (constant mode): dx is dy with the padding cropped off (and what the pads cropped padded
// back with 0): Pad of dy by the negated pads. The other modes: PaddedModeGrad.
absl::Status PadGrad(GradBuilder& b) {
  const Tensor* pads = graph::ConstantInput(b.fwd(), 1);
  if (!pads) return b.Error("the gradient of Pad needs constant pads");
  const std::string mode = b.fwd().AttrString("mode", "constant");
  if (mode != "constant") return PaddedModeGrad(b, mode, pads->ToInt64Vector());
  std::vector<int64_t> negated = pads->ToInt64Vector();
  for (int64_t& p : negated) p = -p;
  std::vector<Value*> ins = {b.dy(), b.Ints(negated)};
  if (b.fwd().num_inputs() > 3 && b.x(3)) {
    ins.push_back(nullptr);  // the constant: 0
    ins.push_back(b.x(3));
  }
  b.SetGrad(0, b.Op("Pad", ins));
  return absl::OkStatus();
}

// Tile: dy [r0 d0, r1 d1, ...] viewed as [r0, d0, r1, d1, ...] and summed over the repeats.
absl::Status TileGrad(GradBuilder& b) {
  const Tensor* reps = graph::ConstantInput(b.fwd(), 1);
  if (!reps) return b.Error("the gradient of Tile needs constant repeats");
  if (!b.x(0)->shape().is_static()) return b.Error("the gradient of Tile needs an input of a static shape");
  const std::vector<int64_t> d = b.x(0)->shape().StaticDims(), r = reps->ToInt64Vector();
  std::vector<int64_t> split, axes;
  for (size_t k = 0; k < d.size(); ++k) {
    axes.push_back(static_cast<int64_t>(split.size()));
    split.push_back(r[k]);
    split.push_back(d[k]);
  }
  Value* view = b.Op("Reshape", {b.dy(), b.Ints(split)});
  b.SetGrad(0, b.ReduceSum(view, axes, /*keepdims=*/false));
  return absl::OkStatus();
}

// CumSum: each x_k reaches the sums after it (exclusive: strictly after), so dx is the
// cumulative sum of dy taken the other way along the axis.
absl::Status CumSumGrad(GradBuilder& b) {
  const int64_t exclusive = b.fwd().AttrInt("exclusive", 0), reverse = b.fwd().AttrInt("reverse", 0);
  b.SetGrad(0, b.Op("CumSum", {b.dy(), b.x(1)},
                    {{"exclusive", Attribute::Int(exclusive)}, {"reverse", Attribute::Int(reverse ? 0 : 1)}}));
  return absl::OkStatus();
}

// Softmax: dx = y (dy - sum(dy y)); LogSoftmax: dx = dy - exp(y) sum(dy), both along the
// axis, computed by ai.cleave.SoftmaxGrad / LogSoftmaxGrad from the forward output. Before
// version 13 the forward normalises x[axis:] flattened into one row, so the gradient is taken
// over x flattened to 2-D at the axis and reshaped back.
absl::Status SoftmaxFamilyGrad(GradBuilder& b) {
  const std::string op = absl::StrCat(graph::kCleaveDomain, ".", b.fwd().op_type(), "Grad");
  if (b.fwd_version() >= 13) {
    b.SetGrad(0, b.Op(op, {b.dy(), b.y(0)}, {{"axis", Attribute::Int(b.fwd().AttrInt("axis", -1))}}));
    return absl::OkStatus();
  }
  const Shape& s = b.x(0)->shape();
  if (!s.has_rank() || s.rank() == 0)
    return b.Error("the gradient of Softmax before opset 13 needs an input of known rank >= 1");
  int64_t axis = b.fwd().AttrInt("axis", 1);
  if (axis < 0) axis += s.rank();
  const Attribute at = Attribute::Int(axis);
  Value* dy2 = b.Op("Flatten", {b.dy()}, {{"axis", at}});
  Value* y2 = b.Op("Flatten", {b.y(0)}, {{"axis", at}});
  Value* dx2 = b.Op(op, {dy2, y2}, {{"axis", Attribute::Int(1)}});
  b.SetGrad(0, b.Op("Reshape", {dx2, b.Op("Shape", {b.x(0)})}));
  return absl::OkStatus();
}

}  // namespace

void RegisterStructuralRules(std::map<std::string, GradRule>& rules) {
  rules["::MatMul"] = MatMulGrad;
  rules["::Transpose"] = TransposeGrad;
  for (const char* op : {"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
    rules[absl::StrCat("::", op)] = ReshapeLikeGrad;
  rules["::Identity"] = IdentityGrad;
  rules["::Expand"] = ExpandGrad;
  rules["::Cast"] = CastGrad;
  rules["::CastLike"] = CastGrad;  // input 1 gives only the type
  rules["::Where"] = WhereGrad;
  rules["::ReduceSum"] = ReduceSumGrad;
  rules["::ReduceMean"] = ReduceMeanGrad;
  rules["::CumSum"] = CumSumGrad;
  rules["::Pad"] = PadGrad;
  rules["::Tile"] = TileGrad;
  rules["::GatherElements"] = GatherElementsGrad;
  rules["::TopK"] = TopKGrad;
  rules["::GatherND"] = GatherNdGrad;
  rules["::ScatterND"] = ScatterNdGrad;
  rules["::ScatterElements"] = ScatterElementsGrad;
  for (const char* op : {"::ReduceL1", "::ReduceL2", "::ReduceSumSquare", "::ReduceLogSum", "::ReduceLogSumExp"})
    rules[op] = ReduceAroundSumGrad;
  rules["::ReduceMax"] = ReduceMaxMinGrad;
  rules["::ReduceProd"] = ReduceProdGrad;
  rules["::ReduceMin"] = ReduceMaxMinGrad;
  rules["::Softmax"] = SoftmaxFamilyGrad;
  rules["::LogSoftmax"] = SoftmaxFamilyGrad;
}

}  // namespace cleave::trainer
