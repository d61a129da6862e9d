// Partition plans (trainer/): what `cleave partition` builds and writes. From a model, the
// training options and a mesh, it builds the training artifacts, propagates shardings (the
// batch over dp, Megatron's column-parallel weights over tp, gradients pinned to their
// parameters), prepares the optimizer (ZeRO-1 optionally), lowers one training, eval and
// optimizer graph per rank and records every collective and each rank's memory.
//
// A plan directory holds plan.json (mesh, ranks and their files, every parameter's sharding,
// every collective with kind, group, dtype and bytes, memory per rank against the
// unpartitioned graph), report.txt (the same for people) and rank_<r>/ with
// training_model.onnx, eval_model.onnx, optimizer_model.onnx and params.ckpt (this rank's
// initial parameter shards). The directory is written under a temporary name and renamed
// into place, so an existing plan is replaced whole or not at all.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partition/lower.h"
#include "partition/megatron.h"
#include "partition/mesh.h"
#include "partition/pipeline.h"
#include "partition/schedule.h"
#include "trainer/checkpoint.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave::trainer {

struct PlanConfig {
  std::string model;
  std::string mesh = "dp=1";
  int64_t batch = 8, seq = 64;   // global batch; each dp rank gets batch / dp rows
  TrainingSpec spec;             // loss, optimizer, frozen (dims are set from batch and seq)
  bool tp_megatron = true;       // seed tp from graph structure
  // A JSON file of explicit shardings ({"shardings": {"<name or regex>": "[tp,-]", ...}}),
  // used instead of the Megatron seeds; any tensor of the training graph, by exact name or
  // full regex match.
  std::string shard_plan;
  int zero = 0;                  // ZeRO stage: 0, 1 (optimizer state) or 2 (and gradients)
  bool sp = false;               // sequence parallelism over tp (Megatron-SP)
  // The cross-entropy reads the vocabulary-sharded logits where they are (AllReduces of
  // [tokens] vectors) instead of gathering them whole on every tp rank.
  bool vocab_parallel_loss = false;
  // Pipeline (pp > 1 in the mesh): the global batch is split into `microbatches`, each of
  // batch / microbatches rows; `virtual_stages` model chunks per rank (interleaved only);
  // `pp_cuts` "auto" or the first layer of each later stage ("2" or "1,2,3").
  int microbatches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::string pp_cuts = "auto";
  // Data-parallel gradient AllReduces packed into flat buckets of about this size (as
  // PyTorch DDP's 25 MB); 0: one AllReduce per gradient.
  int64_t bucket_bytes = 25 << 20;
};

struct RankMemory {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;  // bytes
  // Forward values the backward reads (saved for backward), times the micro-batches whose
  // backward is still pending at the schedule's peak.
  int64_t activations = 0;
};

struct RankPlan {
  int rank = 0;
  std::vector<int> coords;
  TrainingArtifacts artifacts;  // this rank's graphs, `initial` holding its parameter shards
  std::vector<std::pair<std::string, partition::CollectiveRecord>> collectives;  // (graph, record)
  std::vector<partition::P2PRecord> p2p;  // per micro-batch, training parts
  RankMemory memory;
  // Where each of this rank's parameter and optimizer-state tensors sits in the whole tensor
  // (BlockString), so checkpoints can be resharded onto another mesh.
  std::map<std::string, std::string> blocks;
};

struct Plan {
  PlanConfig config;
  partition::Mesh mesh;
  std::map<std::string, partition::Sharding> param_shardings, data_shardings;
  // Parameters that are parts of a fused weight of the model (SplitFusedProjections).
  std::map<std::string, partition::WeightPart> weight_parts;
  RankMemory unpartitioned;
  int64_t vocab = 0;  // the logits' last dim (0 when the loss reads no [batch, seq, vocab] output)
  std::vector<RankPlan> ranks;
  // Pipeline: the stage of every node, the per-pp-rank action lists and their simulation.
  partition::StageAssignment stages;
  partition::ScheduleKind schedule_kind = partition::ScheduleKind::k1F1B;
  partition::Schedule schedule;
  partition::ScheduleStats schedule_stats;
};

// Rank r's compute work of one step, from the plan's schedule (one item without a pipeline).
std::vector<TrainingSession::PipelineWork> PipelineWorkFor(const Plan& plan, int rank);

absl::StatusOr<Plan> BuildPlan(const PlanConfig& config);

// The seeds a shard plan file gives for `g`'s tensors. Errors name the entry or tensor: a file
// that does not parse, an entry that matches no tensor, a sharding whose rank differs from the
// tensor's or that the mesh cannot split it by, two entries that shard one tensor differently.
absl::StatusOr<std::map<std::string, partition::Sharding>> LoadShardPlan(const std::string& path, const graph::Graph& g,
                                                                         const partition::Mesh& mesh);
absl::Status WritePlan(const Plan& plan, const std::string& dir);

// One rank's part of a plan directory, loaded to train (`mpirun ... cleave train PLAN_DIR`).
struct RankRun {
  partition::Mesh mesh;
  std::string model;             // the model the plan was made from
  int64_t batch = 0, seq = 0;    // global batch and sequence the graphs were built for
  int microbatches = 1;
  int64_t vocab = 0;
  std::string loss;              // cross_entropy, mse or output
  std::string precision;         // fp32, bf16 or fp16
  std::vector<TrainingSession::PipelineWork> work;  // this rank's schedule (one item without a pipeline)
  uint64_t plan_hash = 0;        // of plan.json, to check that every rank runs the same plan
  TrainingArtifacts artifacts;   // this rank's graphs and initial parameter shards
  std::map<std::string, std::string> blocks;  // tensor -> BlockString
};

// A shard's place in its whole tensor: "g=<global dims>;o=<offsets>", e.g. "g=64,32;o=32,0",
// with "t=<name>;" first when the whole tensor has another name.
struct Block {
  std::string tensor;  // the whole tensor's name when it differs (a part of a fused weight)
  std::vector<int64_t> global, offset;
};
std::string BlockString(const Block& b);
absl::StatusOr<Block> ParseBlock(const std::string& s);

// Reshards a checkpoint written under another mesh: `shards` are the checkpoints of every rank
// of the old run, each with a "block:<tensor>" property per tensor; each tensor of `targets`
// (this rank's, with its local dims) is filled from the shards' overlapping blocks, its own
// block given by `blocks`. Fails naming a tensor no shard holds, or whose shards do not cover
// this rank's block, or whose whole shape differs.
absl::Status ReshardInto(const std::vector<Checkpoint>& shards, const std::map<std::string, std::string>& blocks,
                         std::map<std::string, Tensor>& targets);
// Fails naming the file when the directory is not a plan of this version, lacks the rank or
// holds a graph or checkpoint that does not load.
absl::StatusOr<RankRun> LoadRankRun(const std::string& dir, int rank);
inline constexpr const char* kPlanFormat = "cleave-plan-1";

// Per-rank summary read back from a plan directory's ONNX files (for `cleave inspect`).
struct RankSummary {
  int rank = 0;
  std::map<std::string, std::pair<int, int64_t>> collectives;  // "graph kind axis" -> (count, bytes)
  RankMemory memory;
};
absl::StatusOr<std::vector<RankSummary>> ReadPlanSummary(const std::string& dir);
// The plan's pipeline schedule as text: kind, bubble fraction and the step x rank grid.
absl::StatusOr<std::string> DescribePlanSchedule(const std::string& dir);

}  // namespace cleave::trainer
