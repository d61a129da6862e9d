// Megatron tensor-parallel seeds by graph structure (partition/): see megatron.h.
#include "partition/megatron.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::partition {

namespace {

using graph::Node;
using graph::Value;

bool Is(const Node* n, const char* op) { return n && n->op_type() == op; }

// Follows views and casts back to where a value is computed.
const Value* Source(const Value* v) {
  while (v && v->producer()) {
    const Node* p = v->producer();
    if ((Is(p, "Cast") || Is(p, "Identity") || Is(p, "Reshape")) && p->domain().empty()) v = p->input(0);
    else break;
  }
  return v;
}

bool IsNormalized(const Value* v, const std::set<std::string>& params) {
  const Node* p = Source(v) ? Source(v)->producer() : nullptr;
  if (!p) return false;
  if (p->op_type() == "LayerNormalization") return true;
  // RMSNorm as exported: x * rsqrt(mean(x^2) + eps) * weight, the weight a 1-D parameter.
  if (Is(p, "Mul") && p->domain().empty())
    for (const Value* in : p->inputs())
      if (in && params.count(in->name()) && in->shape().has_rank() && in->shape().rank() == 1) return true;
  return false;
}

// The 2-D parameter B reads and whether it is read transposed.
const Value* Weight(const Value* b, const std::set<std::string>& params, bool* transposed) {
  *transposed = false;
  const Node* t = b->producer();
  if (Is(t, "Transpose") && t->domain().empty()) {
    std::vector<int64_t> perm = t->AttrInts("perm", {1, 0});
    if (perm == std::vector<int64_t>{1, 0}) {
      *transposed = true;
      b = t->input(0);
    }
  }
  if (!params.count(b->name()) || !b->shape().has_rank() || b->shape().rank() != 2) return nullptr;
  return b;
}

}  // namespace

absl::StatusOr<std::vector<MegatronSeed>> FindMegatronSeeds(const graph::Graph& g, const std::vector<std::string>& params,
                                                            const Mesh& mesh) {
  const std::set<std::string> pset(params.begin(), params.end());
  const int tp = mesh.size("tp");
  std::vector<MegatronSeed> seeds;
  std::set<std::string> seen;
  for (const auto& n : g.nodes()) {
    const bool mm = n->domain().empty() && n->op_type() == "MatMul";
    const bool fused = n->domain() == graph::kCleaveDomain && n->op_type() == "FusedMatMul";
    if (!(mm || fused) || n->metadata().count("role") && n->metadata().at("role") != "fwd") continue;
    if (!IsNormalized(n->input(0), pset)) continue;
    bool transposed;
    const Value* w = Weight(n->input(1), pset, &transposed);
    if (!w) continue;
    if (fused && n->AttrInt("transB", 0)) transposed = !transposed;
    const int dim = transposed ? 0 : 1;
    if (!seen.insert(w->name()).second) continue;
    const int64_t size = w->shape()[dim].value;
    if (size % tp != 0)
      return InvalidArgument("--tp megatron: tp=", tp, " does not divide dim ", dim, " of weight '", w->name(), "' (",
                             w->shape().ToString(), ", output features of ", n->Describe(), ")");
    seeds.push_back({w->name(), dim, n->name()});
  }
  if (seeds.empty())
    return InvalidArgument("--tp megatron found no column-parallel layer (a matrix product of a normalised input "
                           "and a 2-D parameter)");
  return seeds;
}

absl::StatusOr<std::pair<std::string, Sharding>> FindSequenceParallelSeed(const graph::Graph& g,
                                                                          const std::vector<std::string>& params,
                                                                          const Mesh& mesh) {
  const std::set<std::string> pset(params.begin(), params.end());
  auto order = g.TopologicalOrder();
  if (!order.ok()) return order.status();
  const Value* stream = nullptr;
  for (const Node* n : *order) {
    if (n->op_type() == "LayerNormalization") {
      stream = n->input(0);
    } else if (Is(n, "Mul") && n->domain().empty()) {
      // RMSNorm: weight * (x * rsqrt(...)); the residual x is the larger operand inside.
      const Value* inner = nullptr;
      bool has_weight = false;
      for (const Value* in : n->inputs()) {
        if (!in) continue;
        if (pset.count(in->name())) has_weight |= in->shape().has_rank() && in->shape().rank() == 1;
        else inner = in;
      }
      const Node* m = inner && has_weight ? inner->producer() : nullptr;
      if (Is(m, "Mul") && m->num_inputs() == 2 && m->input(0)->shape().is_static() && m->input(1)->shape().is_static())
        stream = m->input(0)->shape().NumElements() >= m->input(1)->shape().NumElements() ? m->input(0) : m->input(1);
    }
    if (stream) break;
  }
  if (!stream || !stream->shape().is_static() || stream->shape().rank() != 3)
    return InvalidArgument("--sp found no residual stream ([batch, seq, hidden] input of a normalisation)");
  const int64_t seq = stream->shape()[1].value;
  if (seq % mesh.size("tp") != 0)
    return InvalidArgument("--sp: tp=", mesh.size("tp"), " does not divide the sequence dim (", seq, ") of '",
                           stream->name(), "' ", stream->shape().ToString());
  Sharding s = Sharding::Replicated(3);
  if (mesh.size("dp") > 1) s.dims[0] = {"dp"};
  s.dims[1] = {"tp"};
  return std::make_pair(stream->name(), s);
}

std::map<std::string, Sharding> SeedShardings(const graph::Graph& g, const std::vector<MegatronSeed>& seeds) {
  std::map<std::string, Sharding> out;
  for (const MegatronSeed& s : seeds) {
    Sharding sh = Sharding::Replicated(g.FindValue(s.param)->shape().rank());
    sh.dims[s.dim] = {"tp"};
    out[s.param] = sh;
  }
  return out;
}

}  // namespace cleave::partition
