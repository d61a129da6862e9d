// Mixed precision (trainer/): bf16 compute with fp32 master weights. The parameters, their
// gradients and the optimizer state stay fp32 (the optimizer graph is untouched); every matrix
// product of the training and eval graphs, forward and backward, takes bf16 operands (each
// value cast once, a transposed operand read through the product's trans flag) and
// accumulates and returns fp32 (ai.cleave MatMulBf16, run by oneDNN on the CPU). Everything
// else (normalisations, softmax, the loss, reductions) stays fp32, as PyTorch's autocast keeps
// them.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::trainer {

enum class Precision { kFp32, kBf16 };
// fp32 | bf16; fp16 (which needs loss scaling) is reported as not implemented.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision p);

// Rewrites the fp32 MatMul / FusedMatMul nodes (without bias or activation) of `g` into casts
// and MatMulBf16; returns how many.
absl::StatusOr<int> ApplyBf16Autocast(graph::Graph& g);

}  // namespace cleave::trainer
