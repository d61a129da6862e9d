// The optimizer graph's multi-tensor fusion (graph/passes/): the AdamW (or SGD) nodes that share
// their scalars become one MultiTensorAdamW (or MultiTensorSGD), which also forms the global
// gradient norm they clip with (see pass.h).
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/passes/rewrite.h"

namespace cleave::graph {

namespace {

// The global-norm chain of an optimizer graph that a MultiTensorAdamW over `grads` can absorb:
// norm = Mul(Sqrt(SquaredNorm(grads)), grad_scale), and, with clipping, the update's scale =
// Mul(grad_scale, Min(Div(max, Add(norm, eps)), 1)) with max, eps and 1 constants.
struct NormChain {
  Value* norm = nullptr;
  Value* grad_scale = nullptr;
  float max_norm = 0.0f, epsilon = 1e-6f;
  std::vector<Node*> nodes;
};

const Node* Producer(const Value* v, const char* op) {
  const Node* n = v ? v->producer() : nullptr;
  return n && n->op_type() == op && n->domain().empty() ? n : nullptr;
}

std::optional<float> ScalarConstant(const Value* v) {
  if (!v || !v->is_initializer() || v->initializer()->numel() != 1 ||
      v->initializer()->dtype() != DataType::kFloat32)
    return std::nullopt;
  return *v->initializer()->data<float>();
}

// The operand of a binary `n` other than `known` (either order), or null.
Value* OtherOperand(const Node* n, const Value* known) {
  if (!n || n->num_inputs() != 2) return nullptr;
  if (n->input(0) == known) return n->input(1);
  if (n->input(1) == known) return n->input(0);
  return nullptr;
}

bool OnlyFeeds(const Value* v, const Node* consumer) {
  return v->consumers().size() == 1 && v->consumers()[0].first == consumer;
}

std::optional<NormChain> FindNormChain(const Graph& g, const std::vector<Node*>& group, Value* grad_scale) {
  std::vector<Value*> grads;
  for (const Node* n : group) grads.push_back(n->input(4));
  Value* update_scale = group[0]->input(2);
  // The chain's nodes go away: the update scale must feed the group alone.
  if (update_scale != grad_scale && update_scale->consumers().size() != group.size()) return std::nullopt;
  // The norm: the one SquaredNorm over exactly these gradients, in order.
  for (const auto& owned : g.nodes()) {
    Node* sq = owned.get();
    if (sq->op_type() != "SquaredNorm" || sq->domain() != kCleaveDomain || sq->inputs() != grads) continue;
    Value* sumsq = sq->output(0);
    if (sumsq->consumers().size() != 1) return std::nullopt;
    Node* sqrt = sumsq->consumers()[0].first;
    if (sqrt->op_type() != "Sqrt" || !sqrt->domain().empty() || sqrt->output(0)->consumers().size() != 1)
      return std::nullopt;
    Node* mul = sqrt->output(0)->consumers()[0].first;
    if (mul->op_type() != "Mul" || !mul->domain().empty() || OtherOperand(mul, sqrt->output(0)) != grad_scale)
      return std::nullopt;
    NormChain c;
    c.norm = mul->output(0);
    c.grad_scale = grad_scale;
    c.nodes = {sq, sqrt, mul};
    if (update_scale == grad_scale) return c.norm->consumers().empty() ? std::optional<NormChain>(c) : std::nullopt;
    // Clipping: update_scale = Mul(grad_scale, Min(Div(max, Add(norm, eps)), 1)).
    const Node* scale = Producer(update_scale, "Mul");
    const Node* min = scale ? Producer(OtherOperand(scale, grad_scale), "Min") : nullptr;
    const int one = min && min->num_inputs() == 2 && ScalarConstant(min->input(1)) == 1.0f ? 1 : 0;
    const Node* div = min && min->num_inputs() == 2 ? Producer(min->input(1 - one), "Div") : nullptr;
    const Node* add = div ? Producer(div->input(1), "Add") : nullptr;
    if (!add || ScalarConstant(min->input(one)) != 1.0f || !ScalarConstant(div->input(0)) ||
        !ScalarConstant(OtherOperand(add, c.norm)) || !OnlyFeeds(add->output(0), div) ||
        !OnlyFeeds(div->output(0), min) || !OnlyFeeds(min->output(0), scale))
      return std::nullopt;
    // The norm feeds only the clipping and the graph's outputs.
    for (const auto& [consumer, i] : c.norm->consumers())
      if (consumer != add) return std::nullopt;
    c.max_norm = *ScalarConstant(div->input(0));
    c.epsilon = *ScalarConstant(OtherOperand(add, c.norm));
    for (const Node* n : {add, div, min, scale}) c.nodes.push_back(const_cast<Node*>(n));
    return c;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<bool> MultiTensorFusion::Run(Graph* g) {
  // Groups of AdamW (or of SGD) nodes with the same scalar inputs, attributes and arity, in
  // graph order.
  std::map<std::string, std::vector<Node*>> groups;
  std::vector<std::string> order;
  for (const auto& owned : g->nodes()) {
    Node* n = owned.get();
    const bool adamw = n->op_type() == "AdamW" && n->num_inputs() == 7 && n->num_outputs() == 3;
    const bool sgd = n->op_type() == "SGD" && n->num_inputs() >= 5 && n->num_outputs() == n->num_inputs() - 4;
    if (n->domain() != kCleaveDomain || !(adamw || sgd)) continue;
    std::string key = absl::StrCat(n->op_type(), "/", n->num_inputs(), "|", n->input(0)->name(), "|",
                                   n->input(1)->name(), "|", n->input(2)->name());
    // The optimizers' attributes are scalars (ints and floats, compared by their bits).
    for (const auto& [a, v] : n->attributes()) {
      uint32_t bits = 0;
      std::memcpy(&bits, &v.f, sizeof(bits));
      absl::StrAppend(&key, "|", a, "=", v.type == AttrType::kFloat ? bits : v.i);
    }
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(n);
  }
  bool changed = false;
  for (const std::string& key : order) {
    const std::vector<Node*>& nodes = groups[key];
    if (nodes.size() < 2) continue;
    std::vector<Value*> inputs = {nodes[0]->input(0), nodes[0]->input(1), nodes[0]->input(2)};
    std::vector<Value*> outputs;
    for (Node* n : nodes) {
      for (int i = 3; i < n->num_inputs(); ++i) inputs.push_back(n->input(i));
      for (int o = 0; o < n->num_outputs(); ++o) outputs.push_back(n->output(o));
    }
    const std::string fused_op = nodes[0]->op_type() == "AdamW" ? "MultiTensorAdamW" : "MultiTensorSGD";
    auto attrs = nodes[0]->attributes();
    auto metadata = nodes[0]->metadata();
    metadata.erase("param");
    const std::string name = nodes[0]->name() + "/multi_tensor";
    // With the gradient norm (and the clipping that reads it): every update scale the group
    // shares must be this chain's, whose grad_scale is a graph input.
    std::optional<NormChain> chain;
    for (Value* grad_scale : g->inputs())
      if (!chain && grad_scale->dtype() == DataType::kFloat32 && grad_scale->shape().rank() == 0)
        chain = FindNormChain(*g, nodes, grad_scale);
    if (chain) {
      inputs[2] = chain->grad_scale;
      outputs.push_back(chain->norm);
      for (Node* n : chain->nodes) g->RemoveNode(n);
    }
    for (Node* n : nodes) g->RemoveNode(n);
    Node* fused = g->AddNode(fused_op, inputs, outputs, name, kCleaveDomain);
    for (auto& [k, v] : attrs) fused->SetAttr(k, v);
    if (chain) {
      fused->SetAttr("compute_norm", Attribute::Int(1));
      fused->SetAttr("max_grad_norm", Attribute::Float(chain->max_norm));
      fused->SetAttr("clip_epsilon", Attribute::Float(chain->epsilon));
    }
    fused->metadata() = std::move(metadata);
    changed = true;
  }
  if (changed) RETURN_IF_ERROR(g->SortTopologically());
  return changed;
}

}  // namespace cleave::graph
