// Decomposition of the ops the op table marks `decomposed` into other ops of the table
// (graph/passes/pass.h): Einsum into Transposes, Reshapes, ReduceSums and batched MatMuls
// (a diagonal into a product with the identity, summed);
// GroupNormalization into an InstanceNormalization over the groups; DepthToSpace and
// SpaceToDepth into Reshape, Transpose, Reshape. What they become has kernels on every
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
  absl::StatusOr<Value*> Reshape(Value* x, const std::vector<int64_t>& target) { return Add("Reshape", {x, Ints(target)}); }
  absl::StatusOr<Value*> Transpose(Value* x, const std::vector<int64_t>& perm) {
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
    if (identity) return x;
    return Add("Transpose", {x}, {{"perm", Attribute::Ints(perm)}});
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
    else RETURN_IF_ERROR(DecomposeDepthSpace(g, n));
  }
  if (todo.empty()) return false;
  g->RemoveUnusedValues();
  RETURN_IF_ERROR(g->SortTopologically());
  return true;
}

}  // namespace cleave::graph
