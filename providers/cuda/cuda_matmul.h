// MatMul through cuBLASLt (providers/cuda/), for the MatMul and FusedMatMul kernels.
#pragma once

#include "absl/status/status.h"
#include "base/tensor.h"
#include "kernels/cpu/nn.h"

namespace cleave::providers {

class CudaExecutionProvider;

// C = A op(B) as `plan` describes (shapes from kernels::cpu::PlanMatMul), storage type dt
// (fp32, bf16 or fp16; accumulation in fp32), on the provider's stream. bias [N] (or null)
// and a tanh-form GELU are applied in the product's epilogue.
absl::Status CudaMatMul(const CudaExecutionProvider& p, const kernels::cpu::MatMulPlan& plan, DataType dt,
                        const void* a, const void* b, void* c, const void* bias, bool gelu_tanh);

}  // namespace cleave::providers
