// Sharding rules of ops as factors (partition/), after Shardy: each dim of each operand is
// a list of factors (major first; a Reshape that merges [B, T] into B*T gives that dim the
// compound [B, T]), and sharding a factor over a mesh axis shards every dim it leads.
//
// - A factor an output lacks (MatMul's contracting K, a reduced axis, the rows a loss
//   averages) makes that output Partial over the factor's axes when it is sharded: a sum,
//   or a mean for averaging reductions.
// - `no_shard` factors must stay whole (a softmax or normalisation axis, a concat axis).
// - Operands marked `replicate` (shape tensors, scalars fed to optimizers) are never sharded.
// - `linear` says which inputs may arrive Partial and pass that on: Partial inputs of a sum
//   (Add, Sub, the gradient accumulator) when all of them are Partial over the same axes; the
//   one Partial operand of a product (MatMul, Mul, Div's numerator) when the other is not;
//   views and sums (Reshape, Transpose, ReduceSum, ...). Any other Partial input is reduced
//   first.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::partition {

struct OperandFactors {
  bool replicate = false;              // must be replicated whole
  std::vector<std::vector<int>> dims;  // per dim: factor ids, major first; empty: size-1 or unrelated
};

enum class Linearity { kNone, kEach, kAll };

struct FactorRule {
  int num_factors = 0;
  std::vector<int64_t> factor_size;  // static size of each factor
  std::vector<OperandFactors> inputs, outputs;
  std::vector<char> no_shard;         // per factor
  std::vector<char> output_avg;       // per output: a missing factor makes it a mean (else a sum)
  // kEach: one input in `linear_inputs` may be Partial (the others must not be); kAll: every
  // input in `linear_inputs` Partial over the same axes; kNone: no Partial input.
  Linearity linearity = Linearity::kNone;
  std::vector<char> linear_inputs;    // per input
  // An input whose sharding is unknown takes the Partial of the other linear inputs (the
  // gradient accumulator: its buffer accumulates the same partial sums as the gradient).
  bool partial_inputs_follow = false;
  // A vocabulary-parallel lookup: sharding this factor of input 0 needs a masked gather.
  int gathered_factor = -1;
  // A factor the lowering reduces with collectives of its own (the classes of a
  // vocabulary-parallel cross-entropy): sharding it makes no output Partial.
  int collective_factor = -1;

  int AddFactor(int64_t size) {
    factor_size.push_back(size);
    no_shard.push_back(0);
    return num_factors++;
  }
};

// Marks the cross-entropy losses of `g` (SoftmaxCrossEntropyLoss and its gradient) as
// vocabulary-parallel: their class dim may then stay sharded, the lowering computing the
// log-sum-exp and the target's score with AllReduces over the class shards instead of
// gathering the scores. Returns how many nodes were marked.
int MarkVocabParallelLoss(graph::Graph& g);
inline constexpr char kVocabParallel[] = "vocab_parallel";

// The rule for `n` (shapes inferred and static), or an error naming the node when the op has
// no rule or its shapes are not static.
absl::StatusOr<FactorRule> RuleFor(const graph::Graph& g, const graph::Node& n);

}  // namespace cleave::partition
