// The `cleave train` loop (trainer/): a token file, a causal language model with one
// integer [batch, seq] input, and everything around TrainingSession: batching, gradient
// accumulation, validation, progress lines, JSONL metrics, checkpoints and resume, and the
// loss-curve picture.
//
// Data: a `.bin` file is raw little-endian uint16 tokens (nanoGPT's format); any other file
// is read as bytes (vocab 256). The last `val_fraction` of the tokens is the validation split.
// Step s (0-based), row r of the global batch reads the window at offset o:
//   no shuffle: o = ((s*B + r) * T) mod (len - T - 1)
//   shuffle:    o = SplitMix64(seed, s*B + r) mod (len - T - 1)
// with inputs tokens[o, o+T) and labels tokens[o+1, o+T+1). Either way the window depends only
// on (seed, s, r), so a resumed run reads exactly what an uninterrupted one would.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "providers/communicator.h"
#include "runtime/inference_session.h"
#include "trainer/lr_schedule.h"
#include "trainer/training_graph.h"

namespace cleave::trainer {

struct TokenData {
  std::vector<uint16_t> train, val;
  int64_t vocab_hint = 256;  // 65536 for .bin files
};

// Loads and splits the file. Fails when a split is shorter than one window (seq + 2 tokens).
absl::StatusOr<TokenData> LoadTokens(const std::string& path, double val_fraction, int64_t seq);

// Offset of the window for row `index` = s*B + r (see above).
int64_t WindowOffset(bool shuffle, uint64_t seed, int64_t index, int64_t seq, int64_t len);

struct TrainConfig {
  std::string model, data;
  LossKind loss = LossKind::kCrossEntropy;
  OptimizerConfig optimizer;
  LrSchedule::Kind schedule = LrSchedule::Kind::kCosine;
  double lr = 3e-4;
  double min_lr = -1;  // < 0: lr / 10
  int64_t warmup = 0;
  int64_t batch = 8, seq = 64, steps = 100, grad_accum = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  double val_fraction = 0.1;
  int64_t eval_every = 0;    // 0: only at the end
  int64_t eval_batches = 4;  // validation windows are eval_batches x micro-batch rows
  std::string metrics;       // JSONL, one object per step
  std::string plot;          // PNG loss curve; empty: next to the metrics, else train_loss.png; "none": no picture
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int keep_checkpoints = 3;
  bool resume = false;
  std::string save_model;        // the trained model for inference
  std::string artifacts_dir;     // also write the training artifacts here
  std::vector<std::string> frozen;
  RecomputeMode recompute = RecomputeMode::kNone;
  // Each layer's attention fused into ai.cleave.Attention before autodiff (TrainingSpec):
  // --fuse-attention / --no-fuse-attention; unset, in fp32 and on CUDA (see RunTraining).
  std::optional<bool> fuse_attention;
  Precision precision = Precision::kFp32;
  // fp16's dynamic loss scaling: the first scale and the clean steps that double it.
  float loss_scale = 65536.0f;
  int64_t loss_scale_window = 2000;
  int threads = 0;
  // --device cpu|cuda|auto (auto: CUDA when a usable device is present).
  DeviceChoice device = DeviceChoice::kCpu;
  int64_t log_every = 1;
  int64_t exit_at = 0;  // > 0: stop after this step (checkpointing it), e.g. to split a run into jobs
  // A Chrome trace (chrome://tracing, Perfetto) of `profile_steps` steps after two warm-up
  // steps: every node on the "compute" track, the overlapped gradient reductions on theirs.
  // One file per rank under mpirun (.rank<r> before the extension); rank 0 logs its summary.
  std::string profile;
  int64_t profile_steps = 3;
  // Plans: start the data-parallel gradient reductions during the backward (on a second thread
  // or stream) rather than in the optimizer step (TrainingSessionOptions::overlap_grad_reduce).
  bool overlap_grad_reduce = true;
  // The graphs' collectives run asynchronously, overlapping the compute that does not need
  // them (TrainingSessionOptions::overlap_collectives).
  bool overlap_collectives = true;
  // Distributed: `model` is a plan directory (cleave partition) and this process is rank
  // communicator->rank() of its mesh. batch / seq 0: the plan's. The optimizer's settings
  // other than the learning rate schedule were fixed when the plan was made.
  Communicator* communicator = nullptr;
  // With --device cuda on a plan: the rank's device provider and its NCCL communicator (made by
  // the launcher; null: the session makes the provider, collectives run over `communicator`).
  std::shared_ptr<providers::ExecutionProvider> device_provider;
  Communicator* device_communicator = nullptr;
};

struct TrainResult {
  int64_t first_step = 0;         // 0, or the step a resumed run started from
  std::vector<double> losses;     // per optimizer step run here (mean over micro-batches)
  std::vector<double> grad_norms;
  double val_loss = -1;           // last validation loss, -1 without a split
  std::string plot;               // the PNG written, empty if none
};

absl::StatusOr<TrainResult> RunTraining(const TrainConfig& c, std::ostream& log);

// Whether `path` is a plan directory (holds plan.json).
bool IsPlanDirectory(const std::string& path);

// The distributed loop over a plan (RunTraining calls it for a plan directory). The global
// batch of each step is split into the plan's micro-batches and then over dp, so the same
// flags read the same windows as a single-rank run. Every rank checks the launch against the
// plan (world size, the same plan on every rank: a hash exchange) before the first step.
// Rank 0 prints the progress line, with compute, communication and idle time; every rank
// writes its own metrics (`.rank<r>` before the extension). Checkpoints: each rank writes
// <dir>/rank_<r>/step_<N>.ckpt, then rank 0 writes <dir>/step_<N>.manifest once every shard
// is in place; --resume takes the newest manifest.
absl::StatusOr<TrainResult> RunPlanTraining(const TrainConfig& c, std::ostream& log);
// The status payload on errors that every rank of a plan run reports together (start-up
// checks): the launcher need not abort the job to free the others.
inline constexpr const char* kAllRanksFailed = "cleave/all-ranks-failed";

// The model's token input: its only non-parameter input, integer [batch, seq]; `path` names
// the model in errors.
absl::StatusOr<const graph::Value*> TokenInput(const graph::Graph& g, const std::string& path);
// Fixes the token input's symbolic dims to (micro, seq) in `dims`; errors when a static dim
// disagrees.
absl::Status FixTokenDims(const graph::Value& in, int64_t micro, int64_t seq, std::map<std::string, int64_t>* dims);

}  // namespace cleave::trainer
