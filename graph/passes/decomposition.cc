// Decomposition of the ops the op table marks `decomposed` into other ops of the table
// (graph/passes/pass.h): Einsum into Transposes, Reshapes, ReduceSums and batched MatMuls
// (a diagonal into a product with the identity, summed);
// GroupNormalization into an InstanceNormalization over the groups; DepthToSpace and
// SpaceToDepth into Reshape, Transpose, Reshape; OneHot and Hardmax into comparisons with
// positions; EyeLike into a constant; Shrink into Wheres; LRN into an AveragePool over the
// channels. What they become has kernels on every
// provider and gradient rules, so the decomposed ops run and train wherever those do. Each
// rewrite writes the node's own output value, so graph outputs keep their names.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/einsum_equation.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"

namespace cleave::graph {

namespace {

// Adds the nodes that replace one node, each inferred as it is added.
class Emitter {
 public:
  Emitter(Graph* g, const Node& n)
      : g_(g), base_(n.name().empty() ? n.op_type() : n.name()), opset_(g->OpsetFor("")) {}

  absl::StatusOr<Value*> Add(const std::string& op, const std::vector<Value*>& inputs,
                             const std::map<std::string, Attribute>& attrs = {}) {
    Value* out = g_->CreateUniqueValue(absl::StrCat(base_, "/", op));
    Node* m = g_->AddNode(op, inputs, {out}, g_->UniqueName(absl::StrCat(base_, "/", op)));
    for (const auto& [k, a] : attrs) m->SetAttr(k, a);
    RETURN_IF_ERROR(InferNode(*g_, *m));
    made_.insert(out);
    return out;
  }
  Value* Ints(const std::vector<int64_t>& v) {
    return g_->AddInitializer(g_->UniqueName(base_ + "/shape"),
                              Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  Value* Filled(DataType t, int64_t n, float value);
  // Ones on the diagonal of axes p and q (both n), zeros elsewhere, every other axis 1.
  Value* Eye(DataType t, int rank, int p, int q, int64_t n);
  // A 0-D constant of type t (a float type or int64).
  Value* Scalar(DataType t, double v);
  absl::StatusOr<Value*> Reshape(Value* x, const std::vector<int64_t>& target) { return Add("Reshape", {x, Ints(target)}); }
  // Unsqueeze and Squeeze take their axes as an input from version 13.
  absl::StatusOr<Value*> Unsqueeze(Value* x, const std::vector<int64_t>& axes) { return Axes("Unsqueeze", x, axes); }
  absl::StatusOr<Value*> Squeeze(Value* x, const std::vector<int64_t>& axes) { return Axes("Squeeze", x, axes); }
  absl::StatusOr<Value*> Cast(Value* x, DataType to) {
    if (x->dtype() == to) return x;
    return Add("Cast", {x}, {{"to", Attribute::Int(static_cast<int64_t>(to))}});
  }
  int64_t opset() const { return opset_; }
  absl::StatusOr<Value*> Transpose(Value* x, const std::vector<int64_t>& perm) {
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
    if (identity) return x;
    return Add("Transpose", {x}, {{"perm", Attribute::Ints(perm)}});
  }
  absl::StatusOr<Value*> Axes(const std::string& op, Value* x, const std::vector<int64_t>& axes) {
    if (opset_ >= 13) return Add(op, {x, Ints(axes)});
    return Add(op, {x}, {{"axes", Attribute::Ints(axes)}});
  }
  // Sums over `axes` and drops them (ReduceSum takes its axes as an input from version 13).
  absl::StatusOr<Value*> ReduceSum(Value* x, const std::vector<int64_t>& axes) {
    if (axes.empty()) return x;
    if (opset_ >= 13) return Add("ReduceSum", {x, Ints(axes)}, {{"keepdims", Attribute::Int(0)}});
    return Add("ReduceSum", {x}, {{"axes", Attribute::Ints(axes)}, {"keepdims", Attribute::Int(0)}});
  }
  // Makes `v` the replaced node's output `out`: its producer (added here) writes `out`, or an
  // Identity copies v there when v is not one of ours.
  absl::Status Finish(Value* v, Value* out) {
    if (made_.count(v)) {
      Node* p = v->producer();
      g_->SetNodeOutput(p, 0, out);
      return InferNode(*g_, *p);
    }
    Node* m = g_->AddNode("Identity", {v}, {out}, g_->UniqueName(base_ + "/Identity"));
    return InferNode(*g_, *m);
  }

 private:
  Graph* g_;
  std::string base_;
  int64_t opset_;
  std::set<const Value*> made_;
};

// Sets element i of a float tensor (of any float type) to v.
void SetElement(Tensor& t, int64_t i, float v) {
  switch (t.dtype()) {
    case DataType::kFloat64: t.data<double>()[i] = v; break;
    case DataType::kFloat16: t.data<uint16_t>()[i] = FloatToHalf(v); break;
    case DataType::kBFloat16: t.data<uint16_t>()[i] = FloatToBFloat16(v); break;
    default: t.data<float>()[i] = v; break;
  }
}

Value* Emitter::Filled(DataType t, int64_t n, float value) {
  Tensor tensor(t, {n});
  for (int64_t i = 0; i < n; ++i) SetElement(tensor, i, value);
  return g_->AddInitializer(g_->UniqueName(base_ + (value == 0.f ? "/zeros" : "/ones")), std::move(tensor));
}

Value* Emitter::Scalar(DataType t, double v) {
  Tensor tensor(t, {});
  if (t == DataType::kInt64) tensor.data<int64_t>()[0] = static_cast<int64_t>(v);
  else SetElement(tensor, 0, static_cast<float>(v));
  return g_->AddInitializer(g_->UniqueName(base_ + "/scalar"), std::move(tensor));
}

Value* Emitter::Eye(DataType t, int rank, int p, int q, int64_t n) {
  std::vector<int64_t> dims(rank, 1);
  dims[p] = dims[q] = n;
  Tensor tensor(t, dims);  // zeros
  // Element (i, i) of the [n, n] plane sits at i * (stride of p + stride of q).
  int64_t sp = 1, sq = 1;
  for (int a = rank - 1; a > p; --a) sp *= dims[a];
  for (int a = rank - 1; a > q; --a) sq *= dims[a];
  for (int64_t i = 0; i < n; ++i) SetElement(tensor, i * (sp + sq), 1.f);
  return g_->AddInitializer(g_->UniqueName(base_ + "/eye"), std::move(tensor));
}

// A Reshape target from sizes that may be unknown: at most one unknown size becomes -1.
absl::StatusOr<std::vector<int64_t>> Target(const std::string& node, const std::vector<std::optional<int64_t>>& sizes,
                                            const std::string& what) {
  std::vector<int64_t> t;
  int unknown = 0;
  for (const auto& s : sizes) {
    t.push_back(s ? *s : -1);
    unknown += !s;
  }
  if (unknown > 1)
    return Unimplemented(node, ": ", what, " has ", unknown,
                         " symbolic sizes, and cleave decomposes the op over a shape with at most one; fix the "
                         "model's dims (free_dimension_overrides, or --dim when training)");
  return t;
}

std::optional<int64_t> StaticDim(const Value* v, int axis) {
  const Dim& d = v->shape()[axis];
  return d.is_static() ? std::optional<int64_t>(d.value) : std::nullopt;
}

// ---- Einsum ----

// An operand of the contraction: a value and the label of each of its axes.
struct Operand {
  Value* v;
  std::vector<int> labels;
  int Find(int l) const {
    auto it = std::find(labels.begin(), labels.end(), l);
    return it == labels.end() ? -1 : static_cast<int>(it - labels.begin());
  }
  std::optional<int64_t> Size(int l) const { return StaticDim(v, Find(l)); }
};

// A label repeated within a term reads the diagonal of those axes: the operand times the
// identity over them, summed over the second.
absl::StatusOr<Operand> TakeDiagonals(const std::string& node, Emitter& e, Operand op) {
  for (;;) {
    int p = -1, q = -1;
    for (int i = 0; i < static_cast<int>(op.labels.size()) && q < 0; ++i)
      for (int j = i + 1; j < static_cast<int>(op.labels.size()); ++j)
        if (op.labels[i] == op.labels[j]) {
          p = i;
          q = j;
          break;
        }
    if (q < 0) return op;
    auto n = StaticDim(op.v, p);
    if (!n) n = StaticDim(op.v, q);
    if (!n)
      return Unimplemented(node, ": the diagonal over label '", EinsumEquation::LabelName(op.labels[p]),
                           "' has a symbolic size; cleave forms a diagonal over a static one");
    const int rank = static_cast<int>(op.labels.size());
    ASSIGN_OR_RETURN(Value * masked, e.Add("Mul", {op.v, e.Eye(op.v->dtype(), rank, p, q, *n)}));
    ASSIGN_OR_RETURN(op.v, e.ReduceSum(masked, {q}));
    op.labels.erase(op.labels.begin() + q);
  }
}

// Sums `op` over the axes whose labels `drop` holds.
absl::StatusOr<Operand> SumOut(Emitter& e, Operand op, const std::set<int>& drop) {
  std::vector<int64_t> axes;
  std::vector<int> kept;
  for (size_t a = 0; a < op.labels.size(); ++a)
    if (drop.count(op.labels[a])) axes.push_back(static_cast<int64_t>(a));
    else kept.push_back(op.labels[a]);
  ASSIGN_OR_RETURN(Value * v, e.ReduceSum(op.v, axes));
  return Operand{v, kept};
}

std::optional<int64_t> Product(const Operand& op, const std::vector<int>& labels) {
  int64_t p = 1;
  for (int l : labels) {
    auto s = op.Size(l);
    if (!s) return std::nullopt;
    p *= *s;
  }
  return p;
}

// a · b over their shared labels, keeping those `needed` holds: a laid out as
// [batch..., a-only..., K] and b as [batch..., 1..., K, N], so that one broadcasting MatMul
// forms [batch..., a-only..., N] with symbolic batch and a-only sizes copied through (0).
absl::StatusOr<Operand> Contract(const std::string& node, Emitter& e, Operand a, Operand b, const std::set<int>& needed) {
  // Labels neither needed later nor shared are summed first; so is a shared one that one side
  // broadcasts (size 1), which each side then sums on its own.
  auto drops = [&](const Operand& x, const Operand& y) {
    std::set<int> d;
    for (int l : x.labels) {
      if (needed.count(l)) continue;
      const auto sx = x.Size(l), sy = y.Size(l);
      if (y.Find(l) < 0 || (sx && *sx == 1) != (sy && *sy == 1)) d.insert(l);
    }
    return d;
  };
  const std::set<int> drop_a = drops(a, b), drop_b = drops(b, a);
  ASSIGN_OR_RETURN(a, SumOut(e, a, drop_a));
  ASSIGN_OR_RETURN(b, SumOut(e, b, drop_b));
  std::vector<int> batch, contracted, a_only, b_only;
  for (int l : a.labels) (b.Find(l) < 0 ? a_only : needed.count(l) ? batch : contracted).push_back(l);
  for (int l : b.labels)
    if (a.Find(l) < 0) b_only.push_back(l);
  const int nb = static_cast<int>(batch.size()), na = static_cast<int>(a_only.size());
  const int nc = static_cast<int>(contracted.size()), nn = static_cast<int>(b_only.size());

  std::vector<int64_t> perm;
  for (const auto* group : {&batch, &a_only, &contracted})
    for (int l : *group) perm.push_back(a.Find(l));
  ASSIGN_OR_RETURN(Value * av, e.Transpose(a.v, perm));
  if (!(na >= 1 && nc == 1)) {
    std::vector<int64_t> t(nb + na, 0);
    if (na == 0) t.push_back(1);
    t.push_back(-1);
    ASSIGN_OR_RETURN(av, e.Reshape(av, t));
  }
  perm.clear();
  for (const auto* group : {&batch, &contracted, &b_only})
    for (int l : *group) perm.push_back(b.Find(l));
  ASSIGN_OR_RETURN(Value * bv, e.Transpose(b.v, perm));
  if (!(na <= 1 && nc == 1 && nn == 1)) {
    std::vector<int64_t> t(nb, 0);
    t.insert(t.end(), std::max(na, 1) - 1, 1);
    ASSIGN_OR_RETURN(std::vector<int64_t> kn,
                     Target(node, {Product(a, contracted), Product(b, b_only)},
                            "the product of its summed labels and of its other operand's own labels"));
    t.insert(t.end(), kn.begin(), kn.end());
    ASSIGN_OR_RETURN(bv, e.Reshape(bv, t));
  }
  ASSIGN_OR_RETURN(Value * c, e.Add("MatMul", {av, bv}));
  if (na == 0 || nn != 1) {
    std::vector<std::optional<int64_t>> sizes;
    for (int l : b_only) sizes.push_back(b.Size(l));
    ASSIGN_OR_RETURN(std::vector<int64_t> t, Target(node, sizes, "the product's result"));
    t.insert(t.begin(), nb + na, 0);
    ASSIGN_OR_RETURN(c, e.Reshape(c, t));
  }
  Operand out{c, batch};
  out.labels.insert(out.labels.end(), a_only.begin(), a_only.end());
  out.labels.insert(out.labels.end(), b_only.begin(), b_only.end());
  return out;
}

absl::Status DecomposeEinsum(Graph* g, Node* n) {
  std::vector<int> ranks;
  const std::vector<Value*> inputs = n->inputs();
  for (int i = 0; i < n->num_inputs(); ++i) {
    if (!n->input(i)->shape().has_rank())
      return Unimplemented(n->Describe(), ": input ", i, "'s rank is unknown; cleave decomposes Einsum by ranks");
    ranks.push_back(n->input(i)->shape().rank());
  }
  auto eq = ParseEinsumEquation(n->AttrString("equation", ""), ranks);
  if (!eq.ok()) return absl::Status(eq.status().code(), absl::StrCat(n->Describe(), ": ", eq.status().message()));
  std::vector<Operand> ops;
  Value* out = n->output(0);
  Emitter e(g, *n);
  const std::string described = n->Describe();
  g->RemoveNode(n);
  for (size_t i = 0; i < eq->inputs.size(); ++i) {
    ASSIGN_OR_RETURN(Operand op, TakeDiagonals(described, e, Operand{inputs[i], eq->inputs[i]}));
    ops.push_back(std::move(op));
  }
  // The labels still wanted once operands [0, next) are combined.
  auto needed_from = [&](size_t next) {
    std::set<int> s(eq->output.begin(), eq->output.end());
    for (size_t j = next; j < ops.size(); ++j) s.insert(ops[j].labels.begin(), ops[j].labels.end());
    return s;
  };
  Operand acc = ops[0];
  for (size_t i = 1; i < ops.size(); ++i) {
    ASSIGN_OR_RETURN(acc, Contract(described, e, acc, ops[i], needed_from(i + 1)));
  }
  std::set<int> unwanted;
  for (int l : acc.labels)
    if (std::find(eq->output.begin(), eq->output.end(), l) == eq->output.end()) unwanted.insert(l);
  ASSIGN_OR_RETURN(acc, SumOut(e, acc, unwanted));
  std::vector<int64_t> perm;
  for (int l : eq->output) perm.push_back(acc.Find(l));
  ASSIGN_OR_RETURN(Value * v, e.Transpose(acc.v, perm));
  return e.Finish(v, out);
}

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
// positions are a constant where depth is one, else Range(0, depth) (opset 11).
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
    if (IsFloat(t)) SetElement(eye, i * dims[1] + j, 1.f);
    else static_cast<uint8_t*>(eye.raw())[(i * dims[1] + j) * ElementSize(t)] = 1;  // little-endian 1
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

}  // namespace

absl::StatusOr<bool> OpDecomposition::Run(Graph* g) {
  std::vector<Node*> todo;
  for (const auto& n : g->nodes()) {
    const OpDef* def = FindOp(n->domain(), n->op_type());
    if (def && def->decomposed) todo.push_back(n.get());
  }
  for (Node* n : todo) {
    ASSIGN_OR_RETURN(ResolvedOp op, ResolveNode(*g, *n));
    if (n->op_type() == "Einsum") RETURN_IF_ERROR(DecomposeEinsum(g, n));
    else if (n->op_type() == "GroupNormalization") RETURN_IF_ERROR(DecomposeGroupNormalization(g, n, op.version));
    else if (n->op_type() == "OneHot") RETURN_IF_ERROR(DecomposeOneHot(g, n));
    else if (n->op_type() == "Hardmax") RETURN_IF_ERROR(DecomposeHardmax(g, n, op.version));
    else if (n->op_type() == "EyeLike") RETURN_IF_ERROR(DecomposeEyeLike(g, n));
    else if (n->op_type() == "Shrink") RETURN_IF_ERROR(DecomposeShrink(g, n));
    else if (n->op_type() == "LRN") RETURN_IF_ERROR(DecomposeLrn(g, n));
    else RETURN_IF_ERROR(DecomposeDepthSpace(g, n));
  }
  if (todo.empty()) return false;
  g->RemoveUnusedValues();
  RETURN_IF_ERROR(g->SortTopologically());
  return true;
}

}  // namespace cleave::graph
