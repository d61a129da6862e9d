// Refinements of the greedy node placement (runtime/): which nodes a device provider claimed
// are better run on the host. Used by the executor after each node has its first claimant.
#pragma once

#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "providers/execution_provider.h"

namespace cleave::runtime {

// The integer shape arithmetic of a dynamic-shape export (Shape -> Gather -> Unsqueeze ->
// Concat -> Reshape's shape input) to run on the host, where it starts and ends, instead of
// bouncing each tiny int64 tensor to the device and back.
//
// A node is moved when the host can run it, every output is int64 or int32, each input is
// made on the host (an initializer, a host node's output; not a feed, which may be the caller's
// device tensor), by another moved node, or is one whose dims alone the host kernel reads
// (Shape's), and each reader of its
// outputs reads on the host (a host node, an input a device kernel reads on the host, a graph
// output) or is moved too. The largest such set is returned: candidates are dropped until those
// conditions hold for all that remain.
struct PlacementQueries {
  std::function<bool(const graph::Node&)> on_device;       // placed on a device provider
  std::function<bool(const graph::Node&)> host_can_run;    // the host provider has a kernel
  std::function<bool(const graph::Node&, int input)> reads_on_host;    // a device kernel's host input
  std::function<bool(const graph::Node&, int input)> host_reads_dims;  // the host kernel's shape-only input
};
std::unordered_set<const graph::Node*> HostPreferredNodes(const std::vector<graph::Node*>& order,
                                                          const PlacementQueries& q);

// Each node's provider and claim, as the executor assigns them.
using Owners =
    std::unordered_map<const graph::Node*, std::pair<providers::ExecutionProvider*, providers::NodeCapability>>;

// Gives `host` (the CPU provider, which claimed the nodes in host_claim) the HostPreferredNodes
// of the device providers' nodes in *owners, and returns them with the host nodes whose every
// input is one the kernel reads only the dims of (KernelDef::shape_only_inputs): the nodes on the
// host by design, which a fallback warning leaves out.
std::unordered_set<const graph::Node*> PlaceOnHostByDesign(
    const std::vector<graph::Node*>& order,
    const std::unordered_map<const graph::Node*, providers::NodeCapability>& host_claim,
    providers::ExecutionProvider* host, Owners* owners);

}  // namespace cleave::runtime
