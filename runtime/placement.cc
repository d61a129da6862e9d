// Host placement of the integer shape arithmetic (see placement.h).
#include "runtime/placement.h"

#include <algorithm>

namespace cleave::runtime {

using graph::Node;
using graph::Value;

std::unordered_set<const Node*> HostPreferredNodes(const std::vector<Node*>& order, const PlacementQueries& q) {
  std::unordered_set<const Node*> moved;
  for (const Node* n : order) {
    if (!q.on_device(*n) || !q.host_can_run(*n) || n->num_outputs() == 0) continue;
    bool integer = true;
    for (const Value* v : n->outputs())
      integer &= !v || v->dtype() == DataType::kInt64 || v->dtype() == DataType::kInt32;
    if (integer) moved.insert(n);
  }
  // Drop candidates until every one left reads and feeds only the host or each other; each
  // pass can only shrink the set, so this ends.
  auto stays_on_device = [&](const Node* p) { return p && q.on_device(*p) && !moved.count(p); };
  for (bool changed = true; changed;) {
    changed = false;
    for (const Node* n : order) {
      if (!moved.count(n)) continue;
      bool ok = true;
      for (int i = 0; i < n->num_inputs(); ++i) {
        const Value* v = n->input(i);
        if (!v || q.host_reads_dims(*n, i)) continue;
        // A feed may be the caller's device tensor (read where it is by device kernels): the
        // host reads only constants and what host nodes make.
        const bool feed = !v->producer() && !v->initializer();
        ok &= !feed && !stays_on_device(v->producer());
      }
      for (const Value* v : n->outputs()) {
        if (!ok || !v) continue;
        for (const auto& [reader, idx] : v->consumers())
          ok &= !stays_on_device(reader) || q.reads_on_host(*reader, idx);
      }
      if (!ok) {
        moved.erase(n);
        changed = true;
      }
    }
  }
  return moved;
}

std::unordered_set<const Node*> PlaceOnHostByDesign(
    const std::vector<Node*>& order, const std::unordered_map<const Node*, providers::NodeCapability>& host_claim,
    providers::ExecutionProvider* host, Owners* owners) {
  auto has = [](const std::vector<int>& inputs, int i) {
    return std::find(inputs.begin(), inputs.end(), i) != inputs.end();
  };
  auto on_device = [&](const Node& n) { return owners->at(&n).first->device() != providers::DeviceKind::kCpu; };
  PlacementQueries q;
  q.on_device = on_device;
  q.host_can_run = [&](const Node& n) {
    return host->device() == providers::DeviceKind::kCpu && host_claim.count(&n) > 0;
  };
  q.reads_on_host = [&](const Node& n, int i) { return has(owners->at(&n).second.kernel->host_inputs, i); };
  q.host_reads_dims = [&](const Node& n, int i) { return has(host_claim.at(&n).kernel->shape_only_inputs, i); };
  std::unordered_set<const Node*> by_design = HostPreferredNodes(order, q);
  for (const Node* n : by_design) owners->at(n) = std::make_pair(host, host_claim.at(n));
  for (const Node* n : order) {
    const std::vector<int>& shape_only = owners->at(n).second.kernel->shape_only_inputs;
    if (!on_device(*n) && n->num_inputs() > 0 && static_cast<int>(shape_only.size()) == n->num_inputs())
      by_design.insert(n);
  }
  return by_design;
}

}  // namespace cleave::runtime
