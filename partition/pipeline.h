// Pipeline stages (partition/): cutting a training graph into virtual stages and splitting
// one rank's lowered graph into the forward and backward part of each of its stages, with
// ai.cleave Send/Recv for every value that crosses a stage boundary.
//
// Layers are found by structure: a layer starts at the residual stream value that every other
// normalisation of the stream reads (a pre-norm block has two, and the final norm closes the
// last block), counted in topological order. A forward node belongs to the latest layer among
// its producers' and the stream values it reads; nodes that depend on no layer (the embedding
// lookup, constants computed from inputs) sink to the first layer that reads them. Stage s
// holds the layers from its cut to the next. A backward node follows the forward node whose
// output it differentiates (`grad_of`), except the sums of gradient contributions
// (`grad_sum`), which run where their parts meet; nodes added by lowering take the stage of
// their producers (backward ones: the earliest backward producer), or of their first consumer
// when they read only graph inputs. So the residual stream is the only value that crosses a
// layer boundary, once forward and once backward.
//
// A parameter read in several stages (a tied embedding read by the first and last stage) is
// held by each of them: each accumulates the gradient of its own readers, and the optimizer
// all-reduces the parts over the stages that hold it (Megatron's embedding group).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::partition {

struct StageAssignment {
  int num_stages = 1;               // virtual stages (pp x virtual stages per rank)
  int num_layers = 0;
  std::vector<int> first_layer;     // per stage, the first layer it holds
  std::map<std::string, int> node_stage;  // forward and backward nodes of the training graph
  std::vector<double> stage_flops;        // forward + backward, per micro-batch
  std::vector<int64_t> stage_param_bytes;
  // Parameter -> the stages whose forward reads it (more than one: tied).
  std::map<std::string, std::set<int>> param_stages;
};

// The residual stream values that start the layers of a training (or forward) graph, in
// order; fails when it finds no normalisation of the residual stream.
absl::StatusOr<std::vector<const graph::Value*>> FindLayerStarts(const graph::Graph& g,
                                                                 const std::vector<std::string>& params);

// Assigns every node of `training` to one of `num_stages` stages. `cuts`: the first layer of
// stages 1..num_stages-1 (strictly increasing, each in [1, layers)); empty: balance the cost
// model (a stage's share of the FLOPs plus half its share of the parameter bytes, minimised
// for the most loaded stage). Errors: more stages than layers, a cut that leaves a stage
// empty or lies outside the layers.
absl::StatusOr<StageAssignment> AssignStages(const graph::Graph& training, const std::vector<std::string>& params,
                                             int num_stages, const std::vector<int>& cuts = {});

// "auto" -> {}; "2,4" -> {2, 4}.
absl::StatusOr<std::vector<int>> ParseCuts(const std::string& spec);

struct P2PRecord {
  std::string kind;    // Send or Recv
  std::string value;
  int peer = -1;       // global rank
  int tag = 0;
  int64_t bytes = 0;
  bool backward = false;  // a gradient (backward direction) rather than an activation
};

struct StagePart {
  int stage = 0;                              // virtual stage
  std::unique_ptr<graph::Graph> forward;      // Recv, forward nodes, Send
  std::unique_ptr<graph::Graph> backward;     // Recv, backward nodes, Send (null for eval)
  // Forward values the backward part reads: outputs of `forward`, inputs of `backward`, kept
  // per micro-batch between the two.
  std::vector<std::string> stash;
  std::vector<P2PRecord> p2p;
};

// Splits `lowered` (one rank's whole training graph, or an eval graph with forward nodes only)
// into the parts of virtual stage `stage`. `prev_rank` / `next_rank`: the global ranks holding
// stages stage-1 and stage+1 (-1 at the ends). Every crossing value gets a Recv in the part
// that needs it and a Send in the part before, relayed through the stages in between; tags
// are derived from the boundary, the direction and the value's index, so both ends agree.
absl::StatusOr<StagePart> SplitStage(const graph::Graph& lowered, const StageAssignment& assignment, int stage,
                                     int prev_rank, int next_rank);

// The optimizer of one pipeline rank, before lowering: keeps the updates of `keep` (the
// parameters its stages hold) and counts each parameter held by k > 1 stages 1/k times in the
// gradient norm.
absl::Status PrepareStageOptimizer(graph::Graph& optimizer, const std::set<std::string>& keep,
                                   const std::map<std::string, int>& holders);

// After lowering: the gradient of each parameter in `tied_groups` is all-reduced over its
// group first, and the squared gradient norm over `pp_group` (when it has more than one rank).
absl::Status AddPipelineReductions(graph::Graph& optimizer, const std::map<std::string, std::vector<int>>& tied_groups,
                                   const std::vector<int>& pp_group);

}  // namespace cleave::partition
