// Shared pieces of the CPU neural-network kernels (providers/cpu/). The kernels are split
// by concept over matmul_ops.cc (MatMul, Gemm, FusedMatMul), norm_ops.cc (Softmax,
// LogSoftmax, LayerNormalization), reduce_ops.cc (Reduce*, SoftmaxCrossEntropyLoss) and
// nn_ops.cc (Dropout, Trilu); RegisterNnKernels in nn_ops.cc registers all four families.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "kernels/cpu/nn.h"
#include "providers/kernel.h"

namespace cleave::providers {

// SoftmaxCrossEntropyLoss's attributes, shared by the loss and its gradient kernel.
struct LossAttrs {
  kernels::cpu::LossReduction reduction = kernels::cpu::LossReduction::kMean;
  std::optional<int64_t> ignore_index;
};
absl::StatusOr<LossAttrs> ParseLossAttrs(const graph::Node& n);  // reduce_ops.cc

void RegisterMatMulKernels(KernelRegistry& r);  // matmul_ops.cc
void RegisterNormKernels(KernelRegistry& r);    // norm_ops.cc
void RegisterReduceKernels(KernelRegistry& r);  // reduce_ops.cc

}  // namespace cleave::providers
