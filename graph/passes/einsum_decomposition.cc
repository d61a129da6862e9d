// Einsum decomposed into ops every provider runs and autodiff differentiates
// (graph/passes/pass.h OpDecomposition): a diagonal into a product with the identity, summed;
// the operands combined left to right, each product one broadcasting MatMul over operands laid
// out as [batch..., own..., K] and [batch..., 1..., K, N], with symbolic batch and own sizes
// copied through the Reshapes.
#include <algorithm>
#include <set>

#include "graph/einsum_equation.h"
#include "graph/passes/emitter.h"

namespace cleave::graph::decompose {

namespace {

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

}  // namespace

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

}  // namespace cleave::graph::decompose
