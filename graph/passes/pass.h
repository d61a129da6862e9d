// Graph passes (graph/passes/). Each pass has the shape StatusOr<bool> Run(Graph*), the
// bool saying whether it changed anything. RunPass verifies the graph after every pass
// when CLEAVE_VERIFY_PASSES is on (debug and default builds).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"

namespace cleave::graph {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  virtual absl::StatusOr<bool> Run(Graph* g) = 0;
};

// Runs one pass and (in verifying builds) the verifier after it.
absl::StatusOr<bool> RunPass(Pass& pass, Graph* g);
// Runs the passes in order, repeating the list until none changes the graph (at most
// max_rounds times). Shapes are re-inferred after each changing pass.
absl::Status RunToFixedPoint(const std::vector<Pass*>& passes, Graph* g, int max_rounds = 8);

// Rewrites the ops the op table marks `decomposed` into ops that every provider runs and
// autodiff differentiates (decomposition.cc): Einsum into Transposes, ReduceSums, Reshapes and
// broadcasting MatMuls, one per operand after the first, left to right (a term repeating a
// letter reads its diagonal: a Mul by the identity over those axes, summed over one, so a
// diagonal of static size); GroupNormalization into InstanceNormalization over X viewed
// as [N, G, rest], then (version 21) the per-channel scale and bias; DepthToSpace and
// SpaceToDepth into Reshape, Transpose, Reshape; OneHot and Hardmax into comparisons with
// positions; EyeLike into a constant; Shrink into Wheres; LRN into an AveragePool over the
// channels. Shapes must be inferred; a symbolic size the rewrite cannot carry through a Reshape
// (more than one in a merged group) is an error naming the node. Every session runs it before
// placement; the training builder once it has chosen the parameters, before autodiff.
class OpDecomposition : public Pass {
 public:
  std::string name() const override { return "OpDecomposition"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// Removes nodes whose outputs nobody reads, then unused values and initializers.
class DeadCodeElimination : public Pass {
 public:
  std::string name() const override { return "DeadCodeElimination"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// Computes a node's outputs from constant inputs (runtime/ supplies one backed by the CPU
// provider, so folding uses the same kernels as execution).
using ConstantEvaluator = std::function<absl::StatusOr<std::vector<Tensor>>(const Node&)>;

// Replaces nodes whose inputs are all constants by initializers holding their outputs, and
// Shape (and Size) nodes whose input shape is static by constants. This is what turns the
// Shape -> Gather -> Concat -> Reshape arithmetic that exporters emit into plain constants
// once input shapes are fixed; with a symbolic batch or sequence, a Reshape whose target is
// known symbolically (graph/dims_value.h) gets a constant target that copies those dims (0),
// and an int64 shape value whose elements are all known numbers there (a static dim gathered
// from the Shape of a value with a symbolic batch) becomes a constant, as what is computed from
// it then does. Random and stateful ops are never folded. `keep_variable` marks initializers that must stay
// variables (trainable parameters).
class ConstantFolding : public Pass {
 public:
  explicit ConstantFolding(ConstantEvaluator eval,
                           std::function<bool(const Value*)> keep_variable = nullptr,
                           int64_t max_output_bytes = 64 << 20)
      : eval_(std::move(eval)), keep_variable_(std::move(keep_variable)),
        max_output_bytes_(max_output_bytes) {}
  std::string name() const override { return "ConstantFolding"; }
  absl::StatusOr<bool> Run(Graph* g) override;

 private:
  ConstantEvaluator eval_;
  std::function<bool(const Value*)> keep_variable_;
  int64_t max_output_bytes_;
};

// Transformer fusions for the CPU provider (fusion.cc): MatMul+Add -> FusedMatMul with bias,
// MatMul(A, Transpose(W)) -> FusedMatMul(transB = 1), and generally any last-two-axes
// Transpose read by a (Fused)MatMul -> transA / transB on that reader,
// FusedMatMul+Gelu -> FusedMatMul(activation=gelu), MatMulBf16 / MatMulF16 + Add of an [N]
// vector of the result's type -> the same product with that bias, decomposed GELU (Erf and tanh forms) -> Gelu,
// decomposed LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add) ->
// LayerNormalization, decomposed RMSNorm (Pow/ReduceMean/Add/Sqrt/Div/Mul/Mul) ->
// RMSNormalization, gate * Sigmoid(gate) * up -> SwiGLU, x * cos + rotate_half(x) * sin ->
// RotaryEmbedding, all in the ai.cleave domain; and RotaryEmbedding(Transpose(x)) (a transpose
// keeping the last axis, read by nothing else) -> Transpose(RotaryEmbedding(x)) with the
// tables laid out against x ([T, D] as [T, 1, D]), so that a head swap meets attention.
class TransformerFusion : public Pass {
 public:
  std::string name() const override { return "TransformerFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// Only the GELU (Erf and tanh forms), LayerNorm, RMSNorm, SwiGLU and rotary rules of
// TransformerFusion, leaving every MatMul, Transpose and Identity alone. The training-graph
// builder runs it on the forward graph before autodiff, so the backward uses the GeluGrad,
// LayerNormalizationGrad, RMSNormalizationGrad, SwiGLUGrad and RotaryEmbeddingGrad ops;
// the graph's values (parameters included) stay the same Value objects.
class ActivationNormFusion : public Pass {
 public:
  std::string name() const override { return "ActivationNormFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// Scaled dot-product attention (attention_fusion.cc: MatMul, scale, causal mask constant or computed from the
// sequence length, an added bias such as a padding mask, Softmax, MatMul) ->
// ai.cleave.Attention, whose kernels never store the [T, S] probabilities (flash-style on both
// providers: the CPU kernel blocks query rows so a block's scores stay in cache; the backward
// recomputes them from the saved log-sum-exp). Run before autodiff on a training graph (the
// backward then uses AttentionGrad), or on an inference graph whose intermediates have no other
// reader. Not part of TransformerFusion, which also runs on training graphs after autodiff,
// where the probabilities have readers.
class AttentionFusion : public Pass {
 public:
  std::string name() const override { return "AttentionFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// ai.cleave.Attention over q, k, v swapped from [B, T, H, D] (as a q/k/v product lays heads
// out) into [B, H, T, D] by Transposes, with its output swapped back, and its AttentionGrads
// likewise -> the same ops with layout "bshd" over the unswapped values: the CUDA provider's
// cuDNN attention reads and writes that layout through its strides, so a layer's eight
// transposes (q, k, v and the output forward; dOut, dq, dk, dv backward) go. Then, where q, k
// and v are the reshaped parts of one Split of the q/k/v product and the gradients' reshapes
// meet in one Concat, layout "bs3hd" over the product reshaped to [B, T, 3, H, D], with one
// packed gradient: the Split and the Concat go too (B and T may be symbolic, as an inference
// export has them, where q, k and v have the product's named dims). Every session runs it.
class AttentionLayoutFusion : public Pass {
 public:
  std::string name() const override { return "AttentionLayoutFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// The residual add feeding a LayerNormalization (RMSNormalization) ->
// ai.cleave.SkipLayerNormalization (SkipRMSNormalization), which also outputs the sum for the
// residual stream's other readers (forward and backward graphs alike); a Cast to bf16 / fp16
// that alone reads its y folds into it (to); and in the backward, the Add of a
// LayerNormalizationGrad's (RMSNormalizationGrad's) dX and the residual stream's gradient folds
// into the gradient (dX_add). Sessions with a device provider run it; the CUDA kernel makes one pass over
// the row.
class SkipLayerNormFusion : public Pass {
 public:
  std::string name() const override { return "SkipLayerNormFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A training graph's SoftmaxCrossEntropyLoss whose log_prob only its gradient reads: the
// gradient (ai.cleave.SoftmaxCrossEntropyLossGrad, from_scores = 1) reads the scores and forms
// each row's log-sum-exp itself, so the forward writes no [N, C] log_prob and the backward
// reads no second [N, C] tensor; a gradient that only a Cast to bf16 / fp16 reads (mixed
// precision's logits product) is written in that type (to). Not for a vocabulary split over
// ranks (class_offset), whose log-sum-exp spans them. The forward loss over the same scores then
// folds into the gradient (its optional loss output), which forms the same log-sum-exps: the
// scores are read once less. Sessions with a device provider run it.
class SoftmaxCrossEntropyFusion : public Pass {
 public:
  std::string name() const override { return "SoftmaxCrossEntropyFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A mixed-precision logits product (MatMulBf16 / MatMulF16 with a float32 result and no bias)
// whose scores, through Reshapes, only from-scores SoftmaxCrossEntropyLossGrads read (the
// forward loss folded into them) -> the product writes them in its operands' type (`to`), and
// the gradients read them as float32, as PyTorch's autocast hands bf16 logits to a float32
// cross-entropy: GPT-2's [tokens, vocab] scores are written and read in half the bytes.
// Sessions with a device provider run it after SoftmaxCrossEntropyFusion.
class LowPrecisionScores : public Pass {
 public:
  std::string name() const override { return "LowPrecisionScores"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A training graph's InPlaceAccumulator(buffer, dW, reset) whose dW is a float32 MatMulBf16 /
// MatMulF16 weight-gradient product (2-D, no bias) that nothing else reads -> the product takes
// the buffer and the flag itself (inputs 3 and 4) and writes the accumulation: the CUDA kernel
// adds the buffer in cuBLASLt's epilogue (beta = 1, or 0 on reset), as Megatron-LM's gradient
// accumulation fusion does, so the float32 gradient is never stored apart and copied. Sessions
// with a device provider run it.
class GradientAccumulationFusion : public Pass {
 public:
  std::string name() const override { return "GradientAccumulationFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A training graph's embedding gradient scattered into its accumulation:
// InPlaceAccumulator(buffer, GatherGrad(shape, ids, dY), reset) -> GatherGrad(shape, ids, dY,
// buffer, reset), so the [V, C] table of zeros the lookup's rows were added to, and the sum
// with the buffer, go. A tied embedding's InPlaceAccumulator(buffer, Add(dW, GatherGrad(...)),
// reset), dW the language-model head's part -> InPlaceAccumulator(buffer, dW, reset) (which
// GradientAccumulationFusion folds into dW's product) and GatherGrad(..., base = its result):
// the [V, C] sum and its operands' copies go, and the rows are added to the accumulated head
// gradient, as llm.c's encoder backward adds into the head's weight gradient. Sessions with a
// device provider run it.
class EmbeddingGradientAccumulation : public Pass {
 public:
  std::string name() const override { return "EmbeddingGradientAccumulation"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A layer's bias gradient, ReduceSum(dz) over every axis but the last (then Reshapes to [C] and
// mixed precision's widening Cast, or none), where dz or its rounding to bf16 / fp16 is, through
// Reshapes, the [K, C] operand of a 2-D float32 weight-gradient product (MatMulBf16 / MatMulF16:
// A with transA, or B without transB) -> that product's dbias output: the CUDA kernel forms the
// sums in cuBLASLt's bias-gradient epilogue while it reads the operand (as Transformer Engine's
// wgrad does), so dz is read once, not twice, and the sums stay float32. Sessions with a device
// provider run it.
class BiasGradientFusion : public Pass {
 public:
  std::string name() const override { return "BiasGradientFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// The Cast to bf16 / fp16 of a float32 LayerNormalizationGrad's dX (the residual stream's
// gradient, which the next products read in the low type and the next LayerNorm's gradient in
// float32) -> the gradient writes that rounding too (dX_low), so dX is not read back for it.
// Sessions with a device provider run it, after BiasGradientFusion (which finds the float32
// gradient through that Cast).
class LayerNormGradCastFusion : public Pass {
 public:
  std::string name() const override { return "LayerNormGradCastFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A float32 MatMulBf16 / MatMulF16 result read only as a SkipLayerNormalization's (or
// SkipRMSNormalization's) skip (the residual branch's last product) or as a
// LayerNormalizationGrad's (RMSNormalizationGrad's) dY (a layer's input gradient) -> the product
// writes bf16 / fp16 (`to`, its bias cast to that type), which the reader widens as it reads
// it, as PyTorch's autocast hands a linear layer's bf16 output to the float32 residual add and
// LayerNorm backward: those [tokens, width] tensors move in half the bytes. Sessions with a device provider run it, once the products are final.
class LowPrecisionNormInputs : public Pass {
 public:
  std::string name() const override { return "LowPrecisionNormInputs"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// A tanh-form GELU around mixed precision's products (MatMulBf16 / MatMulF16): in the forward,
// y = Gelu(x) of a product x (with or without its bias) -> the product with activation =
// gelu_tanh, which keeps x as output 2 where the backward reads it; in the backward, GeluGrad(dy,
// x) of a product dy that nothing else reads -> the product with activation_grad = gelu_tanh over
// x (input 5). The CUDA kernel forms both in cuBLASLt's epilogue (GELU_AUX_BIAS, DGELU), as
// Transformer Engine's MLP does: the GELU's output is written without reading its input back, and
// its output gradient is never stored. cuBLASLt has no erf-form epilogue, so device sessions
// leave the erf form as it is (it would gain nothing there); CPU sessions fold both forms, the
// CPU kernel applying the GELU to the float32 result before it rounds it once.
class GeluEpilogueFusion : public Pass {
 public:
  // erf_too: the erf form as well (activation "gelu"), for the CPU kernel, which forms either.
  explicit GeluEpilogueFusion(bool erf_too = false) : erf_too_(erf_too) {}
  std::string name() const override { return "GeluEpilogueFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;

 private:
  bool erf_too_;
};

// Mixed precision's logits product y = h · Wᵀ (MatMulBf16 / MatMulF16, transB = 1) over a
// vocabulary of V >= 1024 classes that is not a multiple of 8 (GPT-2's 50257): its [N, V]
// scores and their gradient have a row pitch that is not 16-byte aligned, which keeps
// cuBLASLt off its fastest (TMA) kernels for the product and for the two gradient products
// that read the scores' gradient, about a third of a GPT-2 step's FLOPs. The classes are
// padded to Vp (a multiple of 128 where that adds at most 1%, else of 8; 50304 for GPT-2): W
// gains zero rows (Concat), and the product a bias of 0 for the real classes and -inf for the
// padding, so the cross-entropy's softmax gives the padding probability 0. The loss and the
// gradients are those of the unpadded graph: the padded gradient columns are 0, and the
// weight gradient's product forms only the real classes' rows (its `rows`, reading the padded
// gradient's first V columns), so dW keeps its [V, C] shape and is never copied. It applies
// only where the scores reach nothing but the cross-entropy (the forward loss, no log_prob
// read, and the from-scores gradient, without class weights or a split vocabulary) through
// Reshapes that keep the classes last, and their gradient nothing but the products
// dh = dy · W and dW = dyᵀ · h. A label in the padding then gives an infinite loss instead of
// a NaN one. Sessions with a device provider run it last.
class ClassPadding : public Pass {
 public:
  std::string name() const override { return "ClassPadding"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

// The optimizer graph's AdamW (or SGD) nodes that share their scalar inputs and attributes ->
// one ai.cleave.MultiTensorAdamW (or MultiTensorSGD): one launch for all parameters on CUDA.
// When the graph forms the global gradient norm of exactly those gradients (SquaredNorm, Sqrt,
// Mul by grad_scale) and clips with it (Add eps, Div, Min 1, Mul), the fused op computes the
// norm itself (compute_norm = 1, an extra output) and clips with it: no separate norm pass, and
// on CUDA no host round trip between the norm and the update. Device training sessions run it
// on their optimizer graph.
class MultiTensorFusion : public Pass {
 public:
  std::string name() const override { return "MultiTensorFusion"; }
  absl::StatusOr<bool> Run(Graph* g) override;
};

}  // namespace cleave::graph
