// The attributes every ai.cleave collective carries (providers/), read the same way by the CPU
// and CUDA providers' kernels.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "graph/graph.h"
#include "providers/communicator.h"

namespace cleave::providers {

// The attributes every collective carries: the group's global ranks and its mesh axis.
struct GroupAttrs {
  std::vector<int> ranks;
  std::string axis_name;
  int64_t axis = 0;  // the tensor axis gathered or scattered
  ReduceOp op = ReduceOp::kSum;

  static absl::StatusOr<GroupAttrs> Read(const graph::Node& n) {
    GroupAttrs g;
    for (int64_t r : n.AttrInts("group")) g.ranks.push_back(static_cast<int>(r));
    if (g.ranks.empty()) return InvalidArgument(n.Describe(), ": attribute 'group' (the ranks) is missing or empty");
    g.axis_name = n.AttrString("mesh_axis", "");
    g.axis = n.AttrInt("axis", 0);
    const std::string op = n.AttrString("reduction", "sum");
    if (op == "max") g.op = ReduceOp::kMax;
    else if (op != "sum") return InvalidArgument(n.Describe(), ": reduction must be 'sum' or 'max', got '", op, "'");
    return g;
  }
};

}  // namespace cleave::providers
