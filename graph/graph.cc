// Graph construction and editing (graph/).
#include "graph/graph.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cleave::graph {

const Attribute* Node::FindAttr(const std::string& name) const {
  auto it = attrs_.find(name);
  return it == attrs_.end() ? nullptr : &it->second;
}
int64_t Node::AttrInt(const std::string& name, int64_t dflt) const {
  const Attribute* a = FindAttr(name);
  return a ? a->i : dflt;
}
float Node::AttrFloat(const std::string& name, float dflt) const {
  const Attribute* a = FindAttr(name);
  return a ? a->f : dflt;
}
std::string Node::AttrString(const std::string& name, const std::string& dflt) const {
  const Attribute* a = FindAttr(name);
  return a ? a->s : dflt;
}
std::vector<int64_t> Node::AttrInts(const std::string& name, std::vector<int64_t> dflt) const {
  const Attribute* a = FindAttr(name);
  return a ? a->ints : dflt;
}
std::vector<float> Node::AttrFloats(const std::string& name, std::vector<float> dflt) const {
  const Attribute* a = FindAttr(name);
  return a ? a->floats : dflt;
}
std::string Node::Describe() const {
  return absl::StrCat(domain_.empty() ? "" : domain_ + ".", op_type_, " '", name_, "'");
}

Value* Graph::FindValue(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : it->second.get();
}

Value* Graph::GetOrCreateValue(const std::string& name) {
  auto& slot = values_[name];
  if (!slot) {
    slot = std::make_unique<Value>();
    slot->name_ = name;
  }
  return slot.get();
}

std::string Graph::UniqueName(const std::string& hint) {
  if (!values_.count(hint)) return hint;
  for (;;) {
    std::string n = absl::StrCat(hint, "_", ++name_counter_);
    if (!values_.count(n)) return n;
  }
}

Value* Graph::CreateUniqueValue(const std::string& hint) { return GetOrCreateValue(UniqueName(hint)); }

Value* Graph::AddInput(const std::string& name, DataType t, Shape s) {
  Value* v = GetOrCreateValue(name);
  v->dtype_ = t;
  v->shape_ = std::move(s);
  if (!v->is_graph_input_) inputs_.push_back(v);
  v->is_graph_input_ = true;
  return v;
}

Value* Graph::AddInitializer(const std::string& name, Tensor t) {
  Value* v = GetOrCreateValue(name);
  SetInitializer(v, std::move(t));
  return v;
}

void Graph::SetInitializer(Value* v, Tensor t) {
  v->dtype_ = t.dtype();
  v->shape_ = Shape::FromDims(t.dims());
  v->initializer_ = std::make_shared<Tensor>(std::move(t));
}

void Graph::AddOutput(Value* v) {
  outputs_.push_back(v);
  v->is_graph_output_ = true;
}

void Graph::RemoveInput(Value* v) {
  inputs_.erase(std::remove(inputs_.begin(), inputs_.end(), v), inputs_.end());
  v->is_graph_input_ = false;
}

void Graph::ClearOutputs() {
  for (Value* v : outputs_) v->is_graph_output_ = false;
  outputs_.clear();
}

void Graph::SetOutputs(std::vector<Value*> outs) {
  ClearOutputs();
  for (Value* v : outs) AddOutput(v);
}

Node* Graph::AddNode(const std::string& op_type, const std::vector<Value*>& inputs,
                     const std::vector<Value*>& outputs, const std::string& name,
                     const std::string& domain) {
  auto n = std::make_unique<Node>();
  n->op_type_ = op_type;
  n->domain_ = domain == "ai.onnx" ? "" : domain;
  n->name_ = name;
  n->inputs_ = inputs;
  n->outputs_ = outputs;
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i)
    if (inputs[i]) inputs[i]->consumers_.push_back({n.get(), i});
  for (int i = 0; i < static_cast<int>(outputs.size()); ++i) {
    if (!outputs[i]) continue;
    outputs[i]->producer_ = n.get();
    outputs[i]->producer_output_ = i;
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

void Graph::SetNodeInput(Node* n, int i, Value* v) {
  if (i >= static_cast<int>(n->inputs_.size())) n->inputs_.resize(i + 1, nullptr);
  if (Value* old = n->inputs_[i]) {
    auto& c = old->consumers_;
    auto it = std::find(c.begin(), c.end(), std::make_pair(n, i));
    if (it != c.end()) c.erase(it);
  }
  n->inputs_[i] = v;
  if (v) v->consumers_.push_back({n, i});
}

void Graph::SetNodeOutput(Node* n, int i, Value* v) {
  if (i >= static_cast<int>(n->outputs_.size())) n->outputs_.resize(i + 1, nullptr);
  if (Value* old = n->outputs_[i]; old && old->producer_ == n) {
    old->producer_ = nullptr;
    old->producer_output_ = -1;
  }
  n->outputs_[i] = v;
  if (v) {
    v->producer_ = n;
    v->producer_output_ = i;
  }
}

Node* Graph::RebuildNode(Node* n, std::vector<Value*> inputs, std::vector<Value*> outputs) {
  const std::string name = n->name(), domain = n->domain(), op = n->op_type();
  const auto attrs = n->attributes();
  const auto metadata = n->metadata();
  RemoveNode(n);
  Node* m = AddNode(op, inputs, outputs, name, domain);
  for (const auto& [key, attr] : attrs) m->SetAttr(key, attr);
  m->metadata() = metadata;
  return m;
}

void Graph::RemoveNode(Node* n) {
  for (int i = 0; i < n->num_inputs(); ++i) SetNodeInput(n, i, nullptr);
  for (Value* o : n->outputs_) {
    if (o && o->producer_ == n) {
      o->producer_ = nullptr;
      o->producer_output_ = -1;
    }
  }
  nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(),
                              [n](const std::unique_ptr<Node>& p) { return p.get() == n; }),
               nodes_.end());
}

void Graph::ReplaceAllUsesWith(Value* from, Value* to) {
  auto consumers = from->consumers_;
  for (auto [node, idx] : consumers) SetNodeInput(node, idx, to);
  for (Value*& o : outputs_) {
    if (o == from) {
      o = to;
      from->is_graph_output_ = false;
      to->is_graph_output_ = true;
    }
  }
}

void Graph::RemoveUnusedValues() {
  for (auto it = values_.begin(); it != values_.end();) {
    Value* v = it->second.get();
    if (!v->producer_ && v->consumers_.empty() && !v->is_graph_input_ && !v->is_graph_output_ &&
        !v->is_initializer())
      it = values_.erase(it);
    else
      ++it;
  }
}

std::vector<Value*> Graph::Initializers() const {
  std::vector<Value*> out;
  for (auto& [name, v] : values_)
    if (v->is_initializer()) out.push_back(v.get());
  std::sort(out.begin(), out.end(), [](Value* a, Value* b) { return a->name() < b->name(); });
  return out;
}

std::vector<Value*> Graph::AllValues() const {
  std::vector<Value*> out;
  for (auto& [name, v] : values_) out.push_back(v.get());
  std::sort(out.begin(), out.end(), [](Value* a, Value* b) { return a->name() < b->name(); });
  return out;
}

absl::StatusOr<std::vector<Node*>> Graph::TopologicalOrder() const {
  std::unordered_map<const Node*, int> pending;
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node* n = nodes_[i].get();
    position[n] = i;
    int deps = 0;
    for (Value* in : n->inputs_)
      if (in && in->producer_) ++deps;
    pending[n] = deps;
  }
  // Kahn's algorithm, taking ready nodes in insertion order so the result is stable.
  std::vector<Node*> ready, order;
  for (auto& n : nodes_)
    if (pending[n.get()] == 0) ready.push_back(n.get());
  std::make_heap(ready.begin(), ready.end(),
                 [&](Node* a, Node* b) { return position[a] > position[b]; });
  auto cmp = [&](Node* a, Node* b) { return position[a] > position[b]; };
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), cmp);
    Node* n = ready.back();
    ready.pop_back();
    order.push_back(n);
    for (Value* out : n->outputs_) {
      if (!out) continue;
      for (auto [c, idx] : out->consumers_) {
        if (--pending[c] == 0) {
          ready.push_back(c);
          std::push_heap(ready.begin(), ready.end(), cmp);
        }
      }
    }
  }
  if (order.size() != nodes_.size()) {
    for (auto& n : nodes_)
      if (pending[n.get()] > 0)
        return InvalidArgument("graph has a cycle through ", n->Describe());
  }
  return order;
}

absl::Status Graph::SortTopologically() {
  ASSIGN_OR_RETURN(std::vector<Node*> order, TopologicalOrder());
  std::unordered_map<Node*, std::unique_ptr<Node>> owned;
  for (auto& n : nodes_) owned[n.get()] = std::move(n);
  nodes_.clear();
  for (Node* n : order) nodes_.push_back(std::move(owned[n]));
  return absl::OkStatus();
}

int64_t Graph::OpsetFor(const std::string& domain) const {
  auto it = opsets_.find(domain == "ai.onnx" ? "" : domain);
  return it == opsets_.end() ? -1 : it->second;
}

std::unique_ptr<Graph> Graph::Clone() const {
  auto g = std::make_unique<Graph>();
  for (auto& [name, v] : values_) {
    Value* c = g->GetOrCreateValue(name);
    c->dtype_ = v->dtype_;
    c->shape_ = v->shape_;
    c->initializer_ = v->initializer_;  // initializers are immutable once built: share them
    c->dims_value_ = v->dims_value_;
    c->doc_ = v->doc_;
  }
  for (Value* in : inputs_) g->AddInput(in->name(), in->dtype(), in->shape());
  for (auto& n : nodes_) {
    std::vector<Value*> ins, outs;
    for (Value* v : n->inputs_) ins.push_back(v ? g->FindValue(v->name()) : nullptr);
    for (Value* v : n->outputs_) outs.push_back(v ? g->FindValue(v->name()) : nullptr);
    Node* c = g->AddNode(n->op_type_, ins, outs, n->name_, n->domain_);
    c->attrs_ = n->attrs_;
    c->metadata_ = n->metadata_;
    c->doc_ = n->doc_;
  }
  for (Value* o : outputs_) g->AddOutput(g->FindValue(o->name()));
  g->opsets_ = opsets_;
  g->info_ = info_;
  g->name_counter_ = name_counter_;
  return g;
}

}  // namespace cleave::graph
