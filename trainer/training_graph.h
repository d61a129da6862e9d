// The training graph builder (trainer/). From a forward model, a loss, the trainable
// parameters and an optimizer it builds the three graphs ONNX Runtime's training artifacts
// hold, with the same names:
//
//   training_model.onnx  inputs:  the model's inputs, `labels` (when a loss is attached), every
//                                 parameter, every `<p>_grad.accumulation.buffer`, the bool
//                                 scalar `lazy_reset_grad`, then each buffer `<b>` (the running
//                                 statistics of training-mode BatchNormalization)
//                        outputs: `loss`, then every `<p>_grad.accumulation.out`, then each
//                                 `<b>.updated`
//   eval_model.onnx      inputs:  the model's inputs, `labels`, every parameter, every buffer
//                        outputs: `loss`, then the model's outputs
//   optimizer_model.onnx inputs:  `learning_rate` (f32), `step` (i64, 1-based), `grad_scale`
//                                 (f32), then per parameter `<p>`, `<p>_grad` and its state
//                                 (`<p>.exp_avg`, `<p>.exp_avg_sq` for AdamW;
//                                 `<p>.momentum_buffer` for SGD with momentum)
//                        outputs: `grad_norm` (of the scaled gradients, before clipping), then
//                                 per parameter `<p>.updated` and each `<state>.updated`
//
// Parameters become graph inputs so that the session owns their memory and updates it in
// place: the accumulation output is bound to its buffer, the optimizer outputs to the
// parameter and state they replace. Every node carries metadata role=fwd|bwd|opt; backward
// nodes carry grad_of=<forward value>, optimizer nodes param=<parameter>. The partitioner
// reads only this metadata.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "trainer/mixed_precision.h"
#include "trainer/recompute.h"

namespace cleave::trainer {

enum class LossKind {
  kCrossEntropy,  // SoftmaxCrossEntropyLoss (mean) of `output` (classes last) vs int64 labels
  kMse,           // mean of (output - labels)^2, labels float with output's shape
  kModelOutput,   // `output` is already a scalar loss computed by the model
};

struct LossSpec {
  LossKind kind = LossKind::kCrossEntropy;
  std::string output;              // the logits / prediction / loss output; empty: the first
  std::string labels = "labels";   // name of the new labels input
  int64_t ignore_index = -100;     // cross-entropy positions with this label count for nothing
};

struct OptimizerConfig {
  enum class Kind { kAdamW, kSgd };
  Kind kind = Kind::kAdamW;
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float weight_decay = 0.0f;       // AdamW: decoupled; SGD: L2 added to the gradient
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
  float max_grad_norm = 0.0f;      // global-norm clipping; 0 turns it off
};

struct TrainingSpec {
  LossSpec loss;
  OptimizerConfig optimizer;
  // Parameters: every float32 initializer with more than one element (scalars are taken for
  // folded constants), except those whose name equals or fully matches (ECMAScript regex) one
  // of these. Freeze float buffers (rotary tables, masks) here.
  std::vector<std::string> frozen;
  // Fixes named symbolic dims of the model inputs (e.g. batch=8, seq=64): training graphs
  // have static shapes.
  std::map<std::string, int64_t> dims;
  // Activation recompute (trainer/recompute.h).
  RecomputeMode recompute = RecomputeMode::kNone;
  // bf16: matrix products in bf16 with fp32 master weights (trainer/mixed_precision.h).
  Precision precision = Precision::kFp32;
  // Fuse scaled dot-product attention into ai.cleave.Attention before autodiff (the backward
  // then runs AttentionGrad and never stores the probabilities); cleave train sets it where
  // FusesAttentionByDefault unless told (TrainConfig::fuse_attention).
  bool fuse_attention = false;
};

// Whether training fuses attention when not told either way: on CUDA, and on the CPU in fp32
// and bf16.
bool FusesAttentionByDefault(bool cuda, Precision precision);

// One pipeline stage a rank holds (partition/pipeline.h): the forward and backward parts of
// the training graph, split at the stage's boundaries with Send/Recv, and the forward part of
// the eval graph. `stash`: what the forward part hands the backward part per micro-batch.
struct PipelineStage {
  int stage = 0;  // virtual stage
  int chunk = 0;  // its index among this rank's stages
  std::unique_ptr<graph::Graph> forward, backward, eval;
  std::vector<std::string> stash;
};

struct TrainingArtifacts {
  // Under pipeline parallelism `training` and `eval` are empty and `stages` holds this
  // rank's parts of them.
  std::unique_ptr<graph::Graph> training, eval, optimizer;
  std::vector<PipelineStage> stages;
  std::vector<std::string> params;          // trainable, sorted by name
  std::vector<std::string> unreached;       // candidates the loss does not reach: not trained
  std::vector<std::string> state_suffixes;  // optimizer state per parameter, e.g. ".exp_avg"
  // Training-mode BatchNormalization's running statistics (input_mean, input_var): inputs of the
  // training and eval graphs, replaced after each training run by the training graph's outputs
  // `<name>.updated` (after the accumulation outputs), their initial values in `initial`.
  std::vector<std::string> buffers;
  std::vector<std::string> data_inputs;     // what the caller feeds: model inputs + labels
  std::map<std::string, Tensor> initial;    // initial parameter values
  std::unique_ptr<graph::Graph> forward;    // the forward model, parameters as initializers
};

// Names used by the artifacts.
std::string AccumulationBuffer(const std::string& param);  // <p>_grad.accumulation.buffer
std::string AccumulationOut(const std::string& param);     // <p>_grad.accumulation.out
std::string Updated(const std::string& name);              // <name>.updated
inline constexpr const char* kLazyResetGrad = "lazy_reset_grad";
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kGradNorm = "grad_norm";

// Whether `name` is frozen by one of `patterns` (exact name or full regex match).
absl::StatusOr<bool> IsFrozen(const std::string& name, const std::vector<std::string>& patterns);

absl::StatusOr<TrainingArtifacts> BuildTrainingArtifacts(const graph::Graph& forward,
                                                         const TrainingSpec& spec);

// Writes training_model.onnx, eval_model.onnx and optimizer_model.onnx into `dir`.
absl::Status SaveArtifacts(const TrainingArtifacts& a, const std::string& dir);

}  // namespace cleave::trainer
