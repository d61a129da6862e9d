// Mixed precision (trainer/): bf16 or fp16 compute with fp32 master weights. The parameters,
// their gradients and the optimizer state stay fp32 (the optimizer graph is untouched); every
// matrix product of the training and eval graphs, forward and backward, takes low-precision
// operands (each value cast once, a transposed operand read through the product's trans flag)
// and accumulates and returns fp32 (ai.cleave MatMulBf16, run by oneDNN on the CPU, or
// MatMulF16). The fused attention (ai.cleave Attention, its gradient) runs on low-precision
// q, k and v, as PyTorch's autocast runs scaled_dot_product_attention, which lets the CUDA
// provider use cuDNN's flash attention. Conv, ConvTranspose and their gradients run on
// low-precision operands as well (their results rounded once from float32 accumulation and
// widened for their readers), as autocast runs convolutions. Between the products, the activations that were only
// cast to the low type anyway move to it, as PyTorch's autocast keeps a linear layer's output:
// a product that only casts read writes the low type itself (MatMulBf16 `to`), and the bias
// Add, GELU and its gradient, the q/k/v Split and the layout ops between products run on it;
// the bias gradients sum low-precision gradients (fp32 accumulation, the [N] sum rounded).
// The normalisations, the residual stream and its gradient, and the loss stay fp32, as PyTorch's
// autocast keeps them.
//
// fp16's narrow range needs loss scaling: the backward's seed becomes the input `loss_scale`
// (times the seed the graph had, 1/|dp| under data parallelism), so every gradient is scaled by
// S; TrainingSession divides the update by S, and skips the update and halves S when a
// gradient overflowed, doubling S after a run of clean steps (PyTorch's GradScaler).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::trainer {

enum class Precision { kFp32, kBf16, kFp16 };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);  // fp32 | bf16 | fp16
const char* PrecisionName(Precision p);

// Rewrites the fp32 MatMul / FusedMatMul nodes (without bias or activation) and the 2-D Gemms
// with alpha 1 and no C or a C of [N] (which becomes the bias) of `g` into casts and MatMulBf16
// (MatMulF16 for kFp16), and the fused ai.cleave Attention / AttentionGrad into
// the same ops over low-precision q, k, v (and out, dOut), their outputs widened back to fp32
// (lse stays fp32), and the convolutions likewise, then moves casts between the products as
// above; returns how many products, attention nodes and convolutions it rewrote. kFp32 changes nothing.
absl::StatusOr<int> ApplyAutocast(graph::Graph& g, Precision precision);

inline constexpr const char* kLossScale = "loss_scale";
// Makes the backward seed of `loss` (the initializer <loss>_grad) S times itself, S the new
// scalar input `loss_scale`. Fails when the graph has no such seed.
absl::Status AddLossScaleInput(graph::Graph& training, const std::string& loss);

}  // namespace cleave::trainer
