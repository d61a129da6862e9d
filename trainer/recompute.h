// Activation recompute (trainer/): trading compute for memory in the training graph. The
// backward reads forward values ("saved activations"); a recomputed value is instead computed
// again, inside the backward, from the nearest values that are kept (checkpoints), so the
// forward's copy dies as soon as the forward is done with it.
//
//   none       everything the backward reads is kept.
//   selective  Megatron's selective recompute: the attention core, the values between the
//              scores product and the Softmax (scale, mask, the scores themselves), the
//              [.., seq, seq] tensors that grow with the square of the sequence, is recomputed
//              from the kept queries and keys.
//   full       only the residual stream at each layer start (partition/pipeline.h's layers),
//              the parameters and the inputs are kept; each layer's forward runs again in its
//              backward.
//
// Recomputed nodes carry role bwd and `grad_of` of the forward node they repeat, so a
// pipeline stage runs them in its backward part. Dropout is never recomputed (its mask must
// not change): its output is kept.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::trainer {

enum class RecomputeMode { kNone, kSelective, kFull };
absl::StatusOr<RecomputeMode> ParseRecomputeMode(const std::string& name);  // none|selective|full

// Rewrites `training` in place; `params` are its parameters (inputs). Returns how many forward
// nodes were cloned into the backward.
absl::StatusOr<int> ApplyRecompute(graph::Graph& training, RecomputeMode mode, const std::vector<std::string>& params);

// Bytes of the forward values that backward nodes read: what a training step keeps alive
// between its forward and its backward.
int64_t SavedActivationBytes(const graph::Graph& training);

}  // namespace cleave::trainer
