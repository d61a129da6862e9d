// Sharding propagation (partition/): from a few seeds (the batch dim of the data over dp,
// Megatron's column-parallel weights over tp, anything a plan file names) to a sharding for
// every value of a graph, through the factor rules of op_rules.h, to a fixed point.
//
// Each sweep visits the nodes in order, then in reverse. At a node, every operand whose
// sharding is known proposes axes for the factors that lead its dims; when two operands
// disagree, the larger tensor wins (the smaller one is the cheaper to reshard), and a factor
// that must stay whole or does not divide takes none. Operands still unknown then take the
// sharding those factors imply: outputs become Partial over the axes of factors they lack
// (a mean for averaging reductions), and Partial passes through linear inputs. Values no seed
// reaches end replicated.
//
// Reshards() then lists, for every node input whose sharding differs from what the node's
// factors want, the collective that converts it (DESIGN section 6):
//   Partial -> Replicate: AllReduce, Shard -> Replicate: AllGather,
//   Partial -> Shard: ReduceScatter, Shard(i) -> Shard(j): AllToAll, Replicate -> Shard: slice.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "partition/mesh.h"
#include "partition/op_rules.h"

namespace cleave::partition {

struct Propagation {
  std::map<const graph::Value*, Sharding> sharding;  // every value of the graph
  std::map<const graph::Node*, FactorRule> rules;
  std::map<const graph::Node*, std::vector<std::vector<std::string>>> factor_axes;  // per node, per factor
  std::set<const graph::Value*> seeded;  // values whose sharding was given, not derived
};

// `seeds` by value name. Fails listing every node without a rule and every invalid seed.
absl::StatusOr<Propagation> Propagate(const graph::Graph& g, const Mesh& mesh,
                                      const std::map<std::string, Sharding>& seeds);

enum class ReshardKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSlice };
const char* ReshardName(ReshardKind k);

struct Reshard {
  const graph::Node* node;    // the reader
  int input;                  // which input
  const graph::Value* value;
  Sharding from, to;
  ReshardKind kind;
  std::vector<std::string> axes;  // the mesh axes the collective spans
  int64_t bytes;                  // of the value, per rank, before the collective
};

// Propagation over a training graph: `seeds` first, then again with every parameter's
// gradient (`<p>_grad`, its accumulation buffer and output, as the training artifacts name
// them) pinned to the parameter's own sharding, Partial over dp when the mesh has one, so
// the accumulated gradients line up with the parameters the optimizer updates. With
// zero_stage 2 the accumulation buffer keeps only this rank's dp shard (ZeroShard): each
// micro-batch's gradient is reduce-scattered into it.
absl::StatusOr<Propagation> PropagateTraining(const graph::Graph& g, const std::vector<std::string>& params,
                                              const Mesh& mesh, std::map<std::string, Sharding> seeds,
                                              int zero_stage = 0);

// ZeRO's dp shard of a tensor of `dims` sharded as `s`: the first dim whose local size dp
// divides gets dp appended (innermost). None when dp is 1 or no dim divides.
std::optional<Sharding> ZeroShard(const Sharding& s, const std::vector<int64_t>& dims, const Mesh& mesh);

// What every node input needs converted, in node order.
std::vector<Reshard> Reshards(const graph::Graph& g, const Mesh& mesh, const Propagation& p);

// The sharding a node wants for input i (or output i) under its factor assignment.
Sharding WantedInput(const Propagation& p, const graph::Node* n, int i);

}  // namespace cleave::partition
