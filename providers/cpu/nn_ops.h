// Shared pieces of the CPU neural-network kernels (providers/cpu/). The kernels are split
// by concept over matmul_ops.cc (MatMul, Gemm, FusedMatMul), norm_ops.cc (Softmax,
// LogSoftmax, LayerNormalization), reduce_ops.cc (Reduce*, SoftmaxCrossEntropyLoss) and
// nn_ops.cc (Dropout, Trilu); RegisterNnKernels in nn_ops.cc registers all four families.
#pragma once

#include "providers/kernel.h"

namespace cleave::providers {

void RegisterMatMulKernels(KernelRegistry& r);  // matmul_ops.cc
void RegisterNormKernels(KernelRegistry& r);    // norm_ops.cc
void RegisterReduceKernels(KernelRegistry& r);  // reduce_ops.cc

}  // namespace cleave::providers
