// Sharding propagation (partition/): see propagation.h.
#include "partition/propagation.h"

#include <algorithm>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::partition {

namespace {

using graph::Node;
using graph::Value;

int64_t Bytes(const Value* v) {
  if (!v->shape().is_static()) return 0;
  return v->shape().NumElements() * static_cast<int64_t>(ElementSize(v->dtype()));
}

int Rank(const Value* v) { return v->shape().has_rank() ? v->shape().rank() : 0; }

struct Operand {
  const Value* value;
  const OperandFactors* factors;
};

std::vector<Operand> Operands(const Node& n, const FactorRule& r) {
  std::vector<Operand> out;
  for (int i = 0; i < n.num_inputs(); ++i)
    if (n.input(i) && i < static_cast<int>(r.inputs.size())) out.push_back({n.input(i), &r.inputs[i]});
  for (int o = 0; o < n.num_outputs(); ++o)
    if (n.output(o) && o < static_cast<int>(r.outputs.size())) out.push_back({n.output(o), &r.outputs[o]});
  return out;
}

std::set<int> FactorsOf(const OperandFactors& of) {
  std::set<int> s;
  for (const auto& d : of.dims) s.insert(d.begin(), d.end());
  return s;
}

// Axes for each factor from the operands whose sharding is known; heavier operands first.
std::vector<std::vector<std::string>> AssignFactors(const Node& n, const FactorRule& r, const Mesh& mesh,
                                                    const std::map<const Value*, Sharding>& known,
                                                    const std::set<const Value*>& seeded) {
  struct Candidate {
    int factor;
    const std::vector<std::string>* axes;
    int64_t weight;
  };
  std::vector<Candidate> cands;
  for (const Operand& op : Operands(n, r)) {
    auto it = known.find(op.value);
    if (it == known.end() || op.factors->replicate) continue;
    const Sharding& s = it->second;
    for (size_t d = 0; d < s.dims.size() && d < op.factors->dims.size(); ++d)
      if (!s.dims[d].empty() && !op.factors->dims[d].empty())
        // A seeded value's sharding is what the user (or the planner) asked for: it wins.
        cands.push_back({op.factors->dims[d][0], &s.dims[d],
                         seeded.count(op.value) ? std::numeric_limits<int64_t>::max() : Bytes(op.value)});
  }
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.weight > b.weight; });
  // A mesh axis may shard only one dim of any one tensor: track the axes each operand's dims
  // use. A factor an output lacks makes that output Partial over its axes, which then cannot
  // also split one of the output's dims (several lacking factors may share an axis: their
  // partial sums simply add).
  const std::vector<Operand> operands = Operands(n, r);
  std::vector<std::vector<int>> holders(r.num_factors), lackers(r.num_factors);
  for (size_t k = 0; k < operands.size(); ++k)
    for (const auto& d : operands[k].factors->dims)
      for (int f : d) holders[f].push_back(static_cast<int>(k));
  size_t outputs = 0;
  for (int o = 0; o < n.num_outputs(); ++o) outputs += n.output(o) && o < static_cast<int>(r.outputs.size());
  for (size_t k = operands.size() - outputs; k < operands.size(); ++k) {
    if (operands[k].factors->replicate) continue;
    const std::set<int> present = FactorsOf(*operands[k].factors);
    for (int f = 0; f < r.num_factors; ++f)
      if (!present.count(f)) lackers[f].push_back(static_cast<int>(k));
  }
  std::vector<std::set<std::string>> used_dims(operands.size()), used_partial(operands.size());
  std::vector<std::vector<std::string>> fa(r.num_factors);
  for (const Candidate& c : cands) {
    if (r.no_shard[c.factor]) continue;
    // A finer sharding that extends the one assigned wins: the coarser operand reaches it by a
    // local slice, while the reverse would need a gather.
    const auto& cur = fa[c.factor];
    const bool extends = !cur.empty() && c.axes->size() > cur.size() && std::equal(cur.begin(), cur.end(), c.axes->begin());
    if (!cur.empty() && !extends) continue;
    int64_t parts = 1;
    bool clash = false;
    for (size_t i = 0; i < c.axes->size(); ++i) {
      const std::string& a = (*c.axes)[i];
      parts *= mesh.size(a);
      if (i < cur.size()) continue;
      for (int k : holders[c.factor]) clash |= used_dims[k].count(a) > 0 || used_partial[k].count(a) > 0;
      for (int k : lackers[c.factor]) clash |= used_dims[k].count(a) > 0;
    }
    if (clash || r.factor_size[c.factor] % parts != 0) continue;
    fa[c.factor] = *c.axes;
    for (int k : holders[c.factor]) used_dims[k].insert(c.axes->begin(), c.axes->end());
    for (int k : lackers[c.factor]) used_partial[k].insert(c.axes->begin(), c.axes->end());
  }
  // A compound dim (a view merging dims) can be split only through its leading factor: an
  // inner factor's sharding has no contiguous block, so the op needs that factor whole.
  for (const Operand& op : operands)
    for (const auto& d : op.factors->dims)
      for (size_t k = 1; k < d.size(); ++k) fa[d[k]].clear();
  return fa;
}

// The dims an operand gets from the factor assignment: a dim takes its leading factor's
// axes, provided no other factor of a compound dim is sharded.
std::vector<std::vector<std::string>> DimsFrom(const OperandFactors& of, const std::vector<std::vector<std::string>>& fa,
                                               int rank) {
  std::vector<std::vector<std::string>> dims(rank);
  for (int d = 0; d < rank && d < static_cast<int>(of.dims.size()); ++d) {
    const auto& fs = of.dims[d];
    if (fs.empty()) continue;
    bool inner_sharded = false;
    for (size_t k = 1; k < fs.size(); ++k) inner_sharded |= !fa[fs[k]].empty();
    if (!inner_sharded) dims[d] = fa[fs[0]];
  }
  return dims;
}


// Partial axes the linear inputs pass on to the outputs, given the inputs' shardings.
void LinearPartial(const Node& n, const FactorRule& r, const std::map<const Value*, Sharding>& known,
                   std::set<std::string>* sum, std::set<std::string>* avg) {
  if (r.linearity == Linearity::kNone) return;
  std::vector<const Sharding*> partial_linear;
  int linear_known = 0, linear_total = 0;
  bool nonlinear_partial = false;
  for (int i = 0; i < n.num_inputs(); ++i) {
    if (!n.input(i)) continue;
    auto it = known.find(n.input(i));
    const bool linear = i < static_cast<int>(r.linear_inputs.size()) && r.linear_inputs[i];
    if (linear) ++linear_total;
    if (it == known.end()) continue;
    if (linear) ++linear_known;
    if (!it->second.IsPartial()) continue;
    // A partial value read by several nodes is reduced once where it is made rather than
    // carried into each reader (which would reduce it once per reader).
    const bool sole_reader = n.input(i)->consumers().size() == 1;
    if (linear && sole_reader) partial_linear.push_back(&it->second);
    else nonlinear_partial = true;
  }
  if (partial_linear.empty() || nonlinear_partial) return;
  if (r.linearity == Linearity::kEach && partial_linear.size() == 1) {
    *sum = partial_linear[0]->partial;
    *avg = partial_linear[0]->partial_avg;
    return;
  }
  if (r.linearity == Linearity::kAll) {
    // A sum stays Partial only when every term is Partial over the same axes (a replicated
    // term would be counted once per rank).
    if (static_cast<int>(partial_linear.size()) != linear_total || linear_known != linear_total) return;
    for (const Sharding* s : partial_linear)
      if (s->partial != partial_linear[0]->partial || s->partial_avg != partial_linear[0]->partial_avg) return;
    *sum = partial_linear[0]->partial;
    *avg = partial_linear[0]->partial_avg;
  }
}

bool Visit(const Node& n, const FactorRule& r, const Mesh& mesh, std::map<const Value*, Sharding>& known,
           const std::set<const Value*>& seeded) {
  bool any_known = false;
  for (const Operand& op : Operands(n, r)) any_known |= known.count(op.value) > 0;
  if (!any_known) return false;
  const auto fa = AssignFactors(n, r, mesh, known, seeded);
  bool changed = false;
  // Inputs: dims from the factors; the Partial of a sum's other inputs for kAll.
  std::set<std::string> peer_sum, peer_avg;
  bool has_peer = false;
  if (r.linearity == Linearity::kAll && r.partial_inputs_follow)
    for (int i = 0; i < n.num_inputs(); ++i) {
      auto it = n.input(i) ? known.find(n.input(i)) : known.end();
      if (it != known.end() && r.linear_inputs[i] && it->second.IsPartial()) {
        peer_sum = it->second.partial;
        peer_avg = it->second.partial_avg;
        has_peer = true;
      }
    }
  for (int i = 0; i < n.num_inputs() && i < static_cast<int>(r.inputs.size()); ++i) {
    const Value* v = n.input(i);
    if (!v || known.count(v)) continue;
    Sharding s = Sharding::Replicated(Rank(v));
    if (!r.inputs[i].replicate) s.dims = DimsFrom(r.inputs[i], fa, Rank(v));
    if (has_peer && r.linear_inputs[i]) {
      s.partial = peer_sum;
      s.partial_avg = peer_avg;
    }
    known[v] = s;
    changed = true;
  }
  std::set<std::string> lin_sum, lin_avg;
  LinearPartial(n, r, known, &lin_sum, &lin_avg);
  // Partial sums cannot pass through an op that shards anything over the same axis.
  for (const auto& axes : fa)
    for (const auto& a : axes) {
      lin_sum.erase(a);
      lin_avg.erase(a);
    }
  for (int o = 0; o < n.num_outputs() && o < static_cast<int>(r.outputs.size()); ++o) {
    const Value* v = n.output(o);
    if (!v || known.count(v)) continue;
    Sharding s = Sharding::Replicated(Rank(v));
    if (!r.outputs[o].replicate) {
      s.dims = DimsFrom(r.outputs[o], fa, Rank(v));
      const std::set<int> present = FactorsOf(r.outputs[o]);
      for (int f = 0; f < r.num_factors; ++f)
        if (!fa[f].empty() && !present.count(f) && f != r.collective_factor) {
          auto& target = r.output_avg[o] ? s.partial_avg : s.partial;
          target.insert(fa[f].begin(), fa[f].end());
        }
      s.partial.insert(lin_sum.begin(), lin_sum.end());
      s.partial_avg.insert(lin_avg.begin(), lin_avg.end());
    }
    known[v] = s;
    changed = true;
  }
  return changed;
}

}  // namespace

absl::StatusOr<Propagation> Propagate(const graph::Graph& g, const Mesh& mesh,
                                      const std::map<std::string, Sharding>& seeds) {
  Propagation p;
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  std::vector<std::string> errors;
  for (const auto& [name, s] : seeds) {
    const Value* v = g.FindValue(name);
    if (!v) {
      errors.push_back(absl::StrCat("the sharding of '", name, "' names a tensor the graph does not have"));
      continue;
    }
    absl::Status ok = ValidateSharding(mesh, name, v->shape(), s);
    if (!ok.ok()) errors.emplace_back(ok.message());
    else {
      p.sharding[v] = s;
      p.seeded.insert(v);
    }
  }
  for (const Node* n : order) {
    auto r = RuleFor(g, *n);
    if (!r.ok()) errors.emplace_back(r.status().message());
    else p.rules.emplace(n, std::move(*r));
  }
  if (!errors.empty())
    return InvalidArgument("cannot partition: ", errors.size(), " problem(s):\n  ", absl::StrJoin(errors, "\n  "));
  for (int sweep = 0; sweep < 64; ++sweep) {
    bool changed = false;
    for (const Node* n : order) changed |= Visit(*n, p.rules.at(n), mesh, p.sharding, p.seeded);
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      changed |= Visit(**it, p.rules.at(*it), mesh, p.sharding, p.seeded);
    if (!changed) break;
  }
  for (const Value* v : g.AllValues())
    if (!p.sharding.count(v)) p.sharding[v] = Sharding::Replicated(Rank(v));
  for (const Node* n : order) p.factor_axes[n] = AssignFactors(*n, p.rules.at(n), mesh, p.sharding, p.seeded);
  return p;
}

std::optional<Sharding> ZeroShard(const Sharding& s, const std::vector<int64_t>& dims, const Mesh& mesh) {
  const int d = mesh.size("dp");
  if (d == 1) return std::nullopt;
  for (size_t k = 0; k < dims.size() && k < s.dims.size(); ++k) {
    int64_t parts = 1;
    for (const auto& a : s.dims[k]) parts *= mesh.size(a);
    if (dims[k] % (parts * d) == 0) {
      Sharding out = s;
      out.partial.clear();
      out.partial_avg.clear();
      out.dims[k].push_back("dp");
      return out;
    }
  }
  return std::nullopt;
}

absl::StatusOr<Propagation> PropagateTraining(const graph::Graph& g, const std::vector<std::string>& params,
                                              const Mesh& mesh, std::map<std::string, Sharding> seeds,
                                              int zero_stage) {
  ASSIGN_OR_RETURN(Propagation first, Propagate(g, mesh, seeds));
  for (const std::string& p : params) {
    const Value* v = g.FindValue(p);
    if (!v) return NotFound("parameter '", p, "' is not in the training graph");
    Sharding s = first.sharding.at(v);
    s.partial.clear();
    s.partial_avg.clear();
    seeds.emplace(p, s);
    Sharding grad = s;
    if (mesh.size("dp") > 1) grad.partial = {"dp"};
    Sharding accumulated = grad;
    if (zero_stage >= 2 && v->shape().is_static())
      if (auto shard = ZeroShard(s, v->shape().StaticDims(), mesh)) accumulated = *shard;
    if (g.FindValue(p + "_grad")) seeds[p + "_grad"] = grad;
    for (const std::string& name : {p + "_grad.accumulation.buffer", p + "_grad.accumulation.out"})
      if (g.FindValue(name)) seeds[name] = accumulated;
  }
  return Propagate(g, mesh, seeds);
}

const char* ReshardName(ReshardKind k) {
  switch (k) {
    case ReshardKind::kAllReduce: return "AllReduce";
    case ReshardKind::kAllGather: return "AllGather";
    case ReshardKind::kReduceScatter: return "ReduceScatter";
    case ReshardKind::kAllToAll: return "AllToAll";
    case ReshardKind::kSlice: return "Slice";
  }
  return "?";
}

Sharding WantedInput(const Propagation& p, const Node* n, int i) {
  const FactorRule& r = p.rules.at(n);
  const Value* v = n->input(i);
  Sharding want = Sharding::Replicated(Rank(v));
  if (i >= static_cast<int>(r.inputs.size()) || r.inputs[i].replicate) return want;
  want.dims = DimsFrom(r.inputs[i], p.factor_axes.at(n), Rank(v));
  // A Partial input may stay Partial where the op is linear in it.
  const Sharding& have = p.sharding.at(v);
  if (have.IsPartial() && i < static_cast<int>(r.linear_inputs.size()) && r.linear_inputs[i]) {
    std::set<std::string> sum, avg;
    LinearPartial(*n, r, p.sharding, &sum, &avg);
    // ... and only over the axes the outputs are Partial over too (an output pinned to fewer
    // partial axes, such as a gradient whose sharding was given, needs the others reduced).
    if (sum == have.partial && avg == have.partial_avg) {
      for (const Value* o : n->outputs())
        if (o) {
          const Sharding& os = p.sharding.at(o);
          std::erase_if(sum, [&](const std::string& a) { return !os.partial.count(a); });
          std::erase_if(avg, [&](const std::string& a) { return !os.partial_avg.count(a); });
        }
      want.partial = sum;
      want.partial_avg = avg;
    }
  }
  // A view-like op (one linear input) whose output was pinned Partial over axes its input is
  // not Partial over (a replicated gradient named as a Partial(dp) one): the input must become
  // Partial there too, which lowering does by letting one rank of each group keep the value.
  if (i < static_cast<int>(r.linear_inputs.size()) && r.linear_inputs[i] && n->num_outputs() == 1 && n->output(0) &&
      std::count(r.linear_inputs.begin(), r.linear_inputs.end(), 1) == 1) {
    const Sharding& os = p.sharding.at(n->output(0));
    for (const auto& a : os.partial)
      if (!have.partial.count(a) && !have.partial_avg.count(a)) want.partial.insert(a);
  }
  // An axis that shards a dim cannot also hold partial sums: those are reduced (scattered);
  // nor can partial sums pass through an op that shards anything over that axis.
  for (const auto& d : want.dims)
    for (const auto& a : d) {
      want.partial.erase(a);
      want.partial_avg.erase(a);
    }
  for (const auto& axes : p.factor_axes.at(n))
    for (const auto& a : axes) {
      want.partial.erase(a);
      want.partial_avg.erase(a);
    }
  return want;
}

std::vector<Reshard> Reshards(const graph::Graph& g, const Mesh& mesh, const Propagation& p) {
  std::vector<Reshard> out;
  auto order = g.TopologicalOrder();
  if (!order.ok()) return out;
  for (const Node* n : *order) {
    for (int i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      if (!v) continue;
      const Sharding& have = p.sharding.at(v);
      const Sharding want = WantedInput(p, n, i);
      if (have == want) continue;
      Reshard r{n, i, v, have, want, ReshardKind::kSlice, {}, Bytes(v)};
      std::set<std::string> resolved;
      for (const auto& a : have.partial)
        if (!want.partial.count(a)) resolved.insert(a);
      for (const auto& a : have.partial_avg)
        if (!want.partial_avg.count(a)) resolved.insert(a);
      std::set<std::string> have_dims, want_dims;
      for (const auto& d : have.dims) have_dims.insert(d.begin(), d.end());
      for (const auto& d : want.dims) want_dims.insert(d.begin(), d.end());
      if (!resolved.empty()) {
        bool scatter = false;
        for (const auto& a : resolved) scatter |= want_dims.count(a) && !have_dims.count(a);
        r.kind = scatter ? ReshardKind::kReduceScatter : ReshardKind::kAllReduce;
        r.axes.assign(resolved.begin(), resolved.end());
      } else {
        // An axis stays put when the wanted dim lists the same axes up to it (a refinement
        // such as [tp] -> [tp*dp] only adds inner axes); any other axis must be gathered.
        std::vector<std::string> gathered;
        for (size_t d = 0; d < have.dims.size(); ++d)
          for (size_t i = 0; i < have.dims[d].size(); ++i) {
            const bool kept = d < want.dims.size() && want.dims[d].size() > i &&
                              std::equal(have.dims[d].begin(), have.dims[d].begin() + i + 1, want.dims[d].begin());
            if (!kept) gathered.push_back(have.dims[d][i]);
          }
        if (!gathered.empty()) {
          bool elsewhere = false;
          for (const auto& a : gathered) elsewhere |= want_dims.count(a) > 0;
          r.kind = elsewhere ? ReshardKind::kAllToAll : ReshardKind::kAllGather;
          r.axes = gathered;
        } else {
          r.kind = ReshardKind::kSlice;
          for (const auto& a : want_dims)
            if (!have_dims.count(a)) r.axes.push_back(a);
        }
      }
      int64_t parts = 1;
      for (const auto& d : have.dims)
        for (const auto& a : d) parts *= mesh.size(a);
      r.bytes /= parts;
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace cleave::partition
