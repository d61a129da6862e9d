// Reverse-mode autodiff: path finding, rule application in reverse topological order, and
// gradient summation (trainer/).
#include "trainer/autodiff.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "trainer/gradient_rules.h"

namespace cleave::trainer {

using graph::Graph;
using graph::Node;
using graph::Value;

std::string GradName(const std::string& value) { return value + "_grad"; }

bool HasGradientRule(const std::string& domain, const std::string& op) {
  return FindGradRule(domain, op) != nullptr;
}

namespace {

bool Differentiable(const Value* v) { return v && IsFloat(v->dtype()); }

// Nodes that lie between `wrt` and `loss`: they read a value that depends on some wrt value,
// and the loss depends on them through float values (a comparison feeding a Where's condition
// is not on the path). `depends` gets the values that depend on some wrt value.
std::vector<Node*> GradientPath(const Graph& g, const std::vector<Node*>& order, Value* loss,
                                const std::vector<Value*>& wrt, std::unordered_set<const Value*>& depends) {
  depends.insert(wrt.begin(), wrt.end());
  std::unordered_set<const Node*> forward;
  for (Node* n : order) {
    bool reads = false;
    for (const Value* v : n->inputs()) reads |= v && depends.count(v) && Differentiable(v);
    if (!reads) continue;
    forward.insert(n);
    for (const Value* o : n->outputs())
      if (o) depends.insert(o);
  }
  std::unordered_set<const Node*> needed;
  std::vector<const Value*> work = {loss};
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    const Node* p = v->producer();
    if (!p || !forward.count(p) || !needed.insert(p).second) continue;
    for (const Value* in : p->inputs())
      if (Differentiable(in)) work.push_back(in);  // no gradient flows through integers or bools
  }
  std::vector<Node*> path;
  for (Node* n : order)
    if (needed.count(n)) path.push_back(n);
  return path;
}

// Sums the contributions to one value's gradient with Add nodes (a value read by several
// nodes, such as a tied embedding, gets the sum of their gradients).
absl::StatusOr<Value*> Sum(Graph& g, const std::vector<Value*>& parts, const std::string& of) {
  Value* total = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    Value* out = g.CreateUniqueValue(absl::StrCat(of, "_grad/sum"));
    Node* n = g.AddNode("Add", {total, parts[i]}, {out}, out->name());
    // grad_sum: adds contributions; runs where they meet (pipeline stages).
    n->metadata() = {{"role", "bwd"}, {"grad_of", of}, {"grad_sum", "1"}};
    RETURN_IF_ERROR(graph::InferNode(g, *n));
    total = out;
  }
  return total;
}

Value* Named(Graph& g, Value* v, const std::string& name, const std::string& of) {
  Value* out = g.GetOrCreateValue(g.UniqueName(name));
  Node* n = g.AddNode("Identity", {v}, {out}, out->name());
  n->metadata()["role"] = "bwd";
  n->metadata()["grad_of"] = of;
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, Value*>> BuildBackward(Graph& g, Value* loss,
                                                            const std::vector<Value*>& wrt,
                                                            std::vector<std::string>* unreached) {
  if (!loss) return InvalidArgument("no loss value given");
  if (!Differentiable(loss))
    return InvalidArgument("loss '", loss->name(), "' has dtype ", DataTypeName(loss->dtype()),
                           ", expected a float type");
  if (!loss->shape().is_static())
    return InvalidArgument("loss '", loss->name(), "' has shape ", loss->shape().ToString(),
                           ", expected a static shape (a scalar)");
  ASSIGN_OR_RETURN(std::vector<Node*> order, g.TopologicalOrder());
  for (Node* n : order)
    if (!n->metadata().count("role")) n->metadata()["role"] = "fwd";
  std::unordered_set<const Value*> depends;
  std::vector<Node*> path = GradientPath(g, order, loss, wrt, depends);
  std::vector<std::string> missing;
  for (Node* n : path)
    if (!FindGradRule(n->domain(), n->op_type())) missing.push_back(n->Describe());
  if (!missing.empty())
    return Unimplemented(missing.size(), " op(s) on the gradient path have no gradient rule:\n  ",
                         absl::StrJoin(missing, "\n  "));

  std::unordered_map<const Value*, std::vector<Value*>> parts;
  Tensor ones(loss->dtype(), loss->shape().StaticDims());
  for (int64_t i = 0; i < ones.numel(); ++i) {
    if (loss->dtype() == DataType::kFloat64) ones.data<double>()[i] = 1.0;
    else ones.data<float>()[i] = 1.f;
  }
  parts[loss].push_back(g.AddInitializer(g.UniqueName(GradName(loss->name())), std::move(ones)));

  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    Node* n = *it;
    std::vector<Value*> dys;
    bool any = false;
    for (Value* o : n->outputs()) {
      auto p = o ? parts.find(o) : parts.end();
      Value* dy = nullptr;
      if (p != parts.end()) {
        ASSIGN_OR_RETURN(dy, Sum(g, p->second, o->name()));
      }
      dys.push_back(dy);
      any |= dy != nullptr;
    }
    if (!any) continue;
    ASSIGN_OR_RETURN(graph::ResolvedOp op, graph::ResolveNode(g, *n));
    GradBuilder b(g, *n, op.version, std::move(dys), &depends);
    RETURN_IF_ERROR(FindGradRule(n->domain(), n->op_type())(b));
    RETURN_IF_ERROR(b.status());
    const auto& dx = b.input_grads();
    for (size_t i = 0; i < dx.size(); ++i)
      if (dx[i] && Differentiable(n->input(static_cast<int>(i))))
        parts[n->input(static_cast<int>(i))].push_back(dx[i]);
  }

  std::map<std::string, Value*> grads;
  for (Value* w : wrt) {
    auto p = parts.find(w);
    Value* total;
    if (p == parts.end()) {  // no path from w to the loss: its gradient is zero
      if (unreached) unreached->push_back(w->name());
      if (!w->shape().is_static())
        return InvalidArgument("'", w->name(), "' does not reach the loss and its shape ",
                               w->shape().ToString(), " is not static");
      total = g.AddInitializer(g.UniqueName(GradName(w->name()) + "/zero"),
                               Tensor(w->dtype(), w->shape().StaticDims()));
    } else {
      ASSIGN_OR_RETURN(total, Sum(g, p->second, w->name()));
    }
    Value* named = Named(g, total, GradName(w->name()), w->name());
    RETURN_IF_ERROR(graph::InferNode(g, *named->producer()));
    grads[w->name()] = named;
  }
  RETURN_IF_ERROR(graph::InferShapes(g));
  return grads;
}

}  // namespace cleave::trainer
