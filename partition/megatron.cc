// Megatron tensor-parallel seeds by graph structure (partition/): see megatron.h.
#include "partition/megatron.h"

#include <algorithm>
#include <optional>
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
  if (p->op_type() == "LayerNormalization" || p->op_type() == "RMSNormalization") return true;
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
    if (!(mm || fused) || (n->metadata().count("role") && n->metadata().at("role") != "fwd")) continue;
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
    if (n->op_type() == "LayerNormalization" || n->op_type() == "RMSNormalization") {
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

absl::StatusOr<std::map<std::string, WeightPart>> SplitFusedProjections(graph::Graph& g) {
  std::map<std::string, WeightPart> parts;
  RETURN_IF_ERROR(graph::InferShapes(g));
  std::vector<Node*> splits;
  for (const auto& n : g.nodes())
    if (Is(n.get(), "Split") && n->domain().empty()) splits.push_back(n.get());
  for (Node* split : splits) {
    Value* fused = split->input(0);
    const int k = split->num_outputs();
    if (!fused || k < 2 || fused->consumers().size() != 1 || !fused->shape().has_rank() ||
        fused->shape().rank() < 1 || !fused->shape()[fused->shape().rank() - 1].is_static())
      continue;
    const int rank = fused->shape().rank();
    int64_t axis = split->AttrInt("axis", 0);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) continue;
    const int64_t out = fused->shape()[rank - 1].value;
    if (out % k != 0) continue;
    const int64_t each = out / k;
    // Equal parts: no sizes, or sizes all `each` (an initializer or a Constant node's value).
    if (split->num_inputs() > 1 && split->input(1)) {
      const Value* sizes = split->input(1);
      const Tensor* t = sizes->is_initializer() ? sizes->initializer() : nullptr;
      if (!t && Is(sizes->producer(), "Constant")) {
        const graph::Attribute* v = sizes->producer()->FindAttr("value");
        if (v && v->type == graph::AttrType::kTensor) t = &v->t;
      }
      if (!t) continue;
      bool equal = t->dtype() == DataType::kInt64 && t->numel() == k;
      for (int64_t i = 0; equal && i < k; ++i) equal = t->data<int64_t>()[i] == each;
      if (!equal) continue;
    } else if (split->HasAttr("split")) {
      const std::vector<int64_t> sizes = split->AttrInts("split");
      if (static_cast<int>(sizes.size()) != k || std::any_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s != each; }))
        continue;
    }
    // Optional bias.
    Node* add = fused->producer();
    Value* bias = nullptr;
    Value* product = fused;
    if (Is(add, "Add") && add->domain().empty()) {
      for (int i = 0; i < 2; ++i) {
        Value* b = add->input(i);
        if (b && b->is_initializer() && b->shape().is_static() && b->shape().rank() == 1 && b->shape()[0].value == out &&
            b->dtype() == DataType::kFloat32) {
          bias = b;
          product = add->input(1 - i);
        }
      }
      if (!bias || product->consumers().size() != 1) continue;
    } else {
      add = nullptr;
    }
    Node* mm = product->producer();
    if (!Is(mm, "MatMul") || !mm->domain().empty()) continue;
    Value* wv = mm->input(1);
    Node* tr = wv->producer();
    bool transposed = false;
    if (Is(tr, "Transpose") && tr->domain().empty() && tr->AttrInts("perm", {1, 0}) == std::vector<int64_t>{1, 0}) {
      if (wv->consumers().size() != 1) continue;
      wv = tr->input(0);
      transposed = true;
    }
    if (!wv->is_initializer() || wv->dtype() != DataType::kFloat32 || !wv->shape().is_static() ||
        wv->shape().rank() != 2 || wv->consumers().size() != 1)
      continue;
    if (bias && bias->consumers().size() != 1) continue;
    const int w_axis = transposed ? 0 : 1;  // the weight's output-feature dim
    if (wv->shape()[w_axis].value != out) continue;
    const Tensor w = CopyToTensor(wv->initializer()->view());
    const int64_t rows = w.dims()[0], cols = w.dims()[1];
    Value* x = mm->input(0);
    std::vector<Value*> outs(split->outputs().begin(), split->outputs().end());
    const std::string wname = wv->name();
    const std::optional<Tensor> b = bias ? std::optional<Tensor>(CopyToTensor(bias->initializer()->view())) : std::nullopt;
    const std::string bname = bias ? bias->name() : "";
    const std::string mm_name = mm->name();
    // Remove the fused nodes first (their values stay for the new producers to take).
    g.RemoveNode(split);
    if (add) g.RemoveNode(add);
    g.RemoveNode(mm);
    if (transposed) g.RemoveNode(tr);
    for (int j = 0; j < k; ++j) {
      std::vector<int64_t> dims = {transposed ? each : rows, transposed ? cols : each};
      Tensor wj(DataType::kFloat32, dims);
      for (int64_t r = 0; r < dims[0]; ++r)
        for (int64_t c = 0; c < dims[1]; ++c)
          wj.data<float>()[r * dims[1] + c] =
              transposed ? w.data<float>()[(j * each + r) * cols + c] : w.data<float>()[r * cols + j * each + c];
      const std::string wj_name = absl::StrCat(wname, ".part", j);
      Value* wjv = g.AddInitializer(wj_name, std::move(wj));
      parts[wj_name] = {wname, w_axis, j * each, {rows, cols}};
      Value* rhs = wjv;
      if (transposed) {
        rhs = g.CreateUniqueValue(wj_name + "/T");
        Node* t = g.AddNode("Transpose", {wjv}, {rhs}, g.UniqueName(wj_name + "/Transpose"));
        t->SetAttr("perm", graph::Attribute::Ints({1, 0}));
      }
      Value* y = bias ? g.CreateUniqueValue(outs[j]->name() + "/matmul") : outs[j];
      g.AddNode("MatMul", {x, rhs}, {y}, g.UniqueName(absl::StrCat(mm_name, ".part", j)));
      if (bias) {
        Tensor bj(DataType::kFloat32, {each});
        for (int64_t c = 0; c < each; ++c) bj.data<float>()[c] = b->data<float>()[j * each + c];
        const std::string bj_name = absl::StrCat(bname, ".part", j);
        Value* bjv = g.AddInitializer(bj_name, std::move(bj));
        parts[bj_name] = {bname, 0, j * each, {out}};
        g.AddNode("Add", {y, bjv}, {outs[j]}, g.UniqueName(absl::StrCat(bname, ".part", j, "/Add")));
      }
    }
  }
  if (!parts.empty()) {
    g.RemoveUnusedValues();
    RETURN_IF_ERROR(graph::InferShapes(g));
    RETURN_IF_ERROR(g.SortTopologically());
  }
  return parts;
}

}  // namespace cleave::partition
