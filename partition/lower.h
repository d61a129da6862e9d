// Local lowering (partition/): one rank's graph from a propagated graph. Every value gets its
// per-rank shape; sharded initializers keep this rank's block; each reshard that
// Reshards() lists becomes an ai.cleave collective over this rank's group (or a local Slice
// for Replicate -> Shard); shape constants (Reshape, Expand, GatherGrad, ConstantOfShape)
// are rewritten to the local shapes. An averaged loss (Partial mean over a mesh axis, as a
// batch-sharded mean is) has its backward seed scaled by 1/|group|, so the gradients are
// exact global sums; its graph output is all-reduced and scaled, so every rank reports the
// global loss.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "partition/mesh.h"
#include "partition/propagation.h"

namespace cleave::partition {

struct CollectiveRecord {
  std::string kind;           // AllReduce, AllGather, ReduceScatter
  std::string value;          // the tensor it converts
  std::string reader;         // the node that needed it (the first, when shared)
  std::string mesh_axis;      // the axes it spans, "*"-joined
  std::vector<int> group;
  int64_t bytes = 0;          // this rank's input bytes
  std::string node;           // the collective's node in the lowered graph ("" when not kept)
};

struct LoweredGraph {
  std::unique_ptr<graph::Graph> graph;
  std::vector<CollectiveRecord> collectives;
};

// `loss`: the name of an averaged scalar loss output to make global (empty: none).
// `output_wants`: shardings some graph outputs must have (a ZeRO optimizer's updated
// parameters are gathered back whole); the collective is added at the end.
// `bucket_bytes` > 0: sum-AllReduces of fp32 graph inputs over the same axes (the data-parallel
// gradients an optimizer graph receives) are packed, in reverse input order as PyTorch DDP packs
// parameters, into flat buckets of about that many bytes (the first at most 1 MiB): one
// AllReduce per bucket instead of one per tensor.
absl::StatusOr<LoweredGraph> LowerForRank(const graph::Graph& g, const Mesh& mesh, const Propagation& p, int rank,
                                          const std::string& loss = "",
                                          const std::map<std::string, Sharding>& output_wants = {},
                                          int64_t bucket_bytes = 0);

// Seeds for an optimizer graph whose parameters and gradients come sharded from the training
// graph (`param_shardings`, `grad_shardings` by parameter name; absent: replicated). With
// zero_stage 1 or 2 (where the gradient arrives already dp-sharded, ZeroShard of the
// parameter's sharding) each gradient is also reduce-scattered over dp inside its own sharding (an
// Identity marks the point), the optimizer state keeps only that shard, the update runs on it,
// and the updated parameter is all-gathered back to its training sharding (filled into
// `output_wants` for LowerForRank).
absl::StatusOr<std::map<std::string, Sharding>> PrepareOptimizer(
    graph::Graph& optimizer, const std::vector<std::string>& params, const std::vector<std::string>& state_suffixes,
    const Mesh& mesh, const std::map<std::string, Sharding>& param_shardings,
    const std::map<std::string, Sharding>& grad_shardings, int zero_stage,
    std::map<std::string, Sharding>* output_wants);

// ZeRO stage 1 for an optimizer graph of replicated parameters: each parameter's gradient is reduce-scattered over dp
// (an Identity marks the point), its optimizer state lives in dp shards, the update runs on
// the shard, and the updated parameter is all-gathered whole. A parameter with no dim that
// dp divides keeps a replicated update. Returns the propagation seeds and fills the output
// shardings to pass to LowerForRank.
absl::StatusOr<std::map<std::string, Sharding>> PrepareZero1(graph::Graph& optimizer, const std::vector<std::string>& params,
                                                             const std::vector<std::string>& state_suffixes,
                                                             const Mesh& mesh,
                                                             std::map<std::string, Sharding>* output_wants);

// This rank's block of a tensor under a sharding.
absl::StatusOr<Tensor> ShardTensor(const Tensor& t, const Mesh& mesh, const Sharding& s, int rank,
                                   const std::string& name);

}  // namespace cleave::partition
