// Activation recompute (trainer/): see recompute.h.
#include "trainer/recompute.h"

#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "partition/pipeline.h"

namespace cleave::trainer {

namespace {

using graph::Node;
using graph::Value;

bool IsBwd(const Node* n) {
  auto it = n->metadata().find("role");
  return it != n->metadata().end() && it->second == "bwd";
}

bool IsFwd(const Node* n) {
  auto it = n->metadata().find("role");
  return it == n->metadata().end() || it->second == "fwd";
}

// The attention core by structure: for each Softmax, the values from it back to the matrix
// product that made the scores (through scaling, masking and the like), and the Softmax output.
std::set<const Value*> AttentionCore(const graph::Graph& g) {
  std::set<const Value*> core;
  for (const auto& n : g.nodes()) {
    if (!IsFwd(n.get()) || n->op_type() != "Softmax") continue;
    core.insert(n->output(0));
    std::vector<const Value*> todo = {n->input(0)};
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      if (!v || core.count(v) || !v->producer() || !IsFwd(v->producer())) continue;
      const Node* p = v->producer();
      core.insert(v);
      if (p->op_type() == "MatMul" || p->op_type() == "FusedMatMul") continue;  // the scores: stop
      // Follow the operand of the scores' shape (not masks or scalars).
      for (const Value* in : p->inputs())
        if (in && in->shape().is_static() && v->shape().is_static() &&
            in->shape().NumElements() == v->shape().NumElements())
          todo.push_back(in);
    }
  }
  return core;
}

}  // namespace

int64_t SavedActivationBytes(const graph::Graph& g) {
  int64_t total = 0;
  for (const auto& n : g.nodes()) {
    if (!IsFwd(n.get())) continue;
    for (const Value* v : n->outputs()) {
      if (!v || !v->shape().is_static()) continue;
      bool saved = false;
      for (const auto& [c, idx] : v->consumers()) saved |= IsBwd(c);
      if (saved) total += v->shape().NumElements() * static_cast<int64_t>(ElementSize(v->dtype()));
    }
  }
  return total;
}

absl::StatusOr<RecomputeMode> ParseRecomputeMode(const std::string& name) {
  if (name == "none") return RecomputeMode::kNone;
  if (name == "selective") return RecomputeMode::kSelective;
  if (name == "full") return RecomputeMode::kFull;
  return InvalidArgument("--recompute '", name, "': expected none, selective or full");
}

absl::StatusOr<int> ApplyRecompute(graph::Graph& g, RecomputeMode mode, const std::vector<std::string>& params) {
  if (mode == RecomputeMode::kNone) return 0;
  // Saved activations: forward values a backward node reads.
  std::vector<std::pair<Node*, int>> uses;  // (backward node, input index)
  std::set<const Value*> saved;
  for (const auto& n : g.nodes()) {
    if (!IsBwd(n.get())) continue;
    for (int i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      if (v && v->producer() && IsFwd(v->producer())) {
        uses.emplace_back(n.get(), i);
        saved.insert(v);
      }
    }
  }
  std::function<bool(const Value*)> recompute;
  std::set<const Value*> kept_starts;
  if (mode == RecomputeMode::kSelective) {
    const std::set<const Value*> core = AttentionCore(g);
    recompute = [core](const Value* v) { return core.count(v) > 0; };
  } else {
    ASSIGN_OR_RETURN(std::vector<const Value*> starts, partition::FindLayerStarts(g, params));
    kept_starts.insert(starts.begin(), starts.end());
    recompute = [&kept_starts](const Value* v) { return !kept_starts.count(v); };
  }
  auto recomputable = [&](const Value* v) {
    const Node* p = v->producer();
    return p && IsFwd(p) && p->op_type() != "Dropout" && !v->is_graph_output() && recompute(v);
  };
  std::map<const Value*, Value*> copies;
  int cloned = 0;
  std::function<Value*(Value*)> again = [&](Value* v) -> Value* {
    if (!recomputable(v)) return v;
    if (auto it = copies.find(v); it != copies.end()) return it->second;
    const Node* p = v->producer();
    std::vector<Value*> ins;
    for (Value* in : p->inputs()) ins.push_back(in ? again(in) : nullptr);
    std::vector<Value*> outs;
    for (Value* o : p->outputs()) {
      if (!o) {
        outs.push_back(nullptr);
        continue;
      }
      Value* c = g.CreateUniqueValue(o->name() + "/recompute");
      c->set_dtype(o->dtype());
      c->set_shape(o->shape());
      copies[o] = c;
      outs.push_back(c);
    }
    Node* n = g.AddNode(p->op_type(), ins, outs, g.UniqueName(p->name() + "/recompute"), p->domain());
    for (const auto& [k, attr] : p->attributes()) n->SetAttr(k, attr);
    // The original's metadata, but for what marks a recomputation (insert keeps these keys).
    std::map<std::string, std::string> meta = {{"role", "bwd"}, {"recompute", "1"}};
    if (p->output(0)) meta.emplace("grad_of", p->output(0)->name());
    meta.insert(p->metadata().begin(), p->metadata().end());
    n->metadata() = std::move(meta);
    ++cloned;
    return copies.at(v);
  };
  for (auto [node, i] : uses) {
    Value* v = node->input(i);
    if (!saved.count(v) || !recomputable(v)) continue;
    g.SetNodeInput(node, i, again(v));
  }
  RETURN_IF_ERROR(g.SortTopologically());
  return cloned;
}

}  // namespace cleave::trainer
