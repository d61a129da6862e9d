// MatMul through cuBLASLt (providers/cuda/), for the MatMul and FusedMatMul kernels.
#pragma once

#include "absl/status/status.h"
#include "base/tensor.h"
#include "kernels/cpu/nn.h"

namespace cleave::providers {

class CudaExecutionProvider;

// C = A op(B) as `plan` describes (shapes from kernels::cpu::PlanMatMul), operands of storage
// type dt (fp32, bf16 or fp16; accumulation in fp32) and C of out_dt (dt, or fp32 for
// MatMulBf16 and MatMulF16), on the provider's stream. bias [N] (or null, of type out_dt) and a
// tanh-form GELU are applied in the product's epilogue. With `accumulate` (a float32 buffer of
// C's shape, which may be C itself; one product, no bias or activation), C = the product plus
// the buffer, or with `reset` the product alone.
absl::Status CudaMatMul(const CudaExecutionProvider& p, const kernels::cpu::MatMulPlan& plan, DataType dt,
                        DataType out_dt, const void* a, const void* b, void* c, const void* bias, bool gelu_tanh,
                        const float* accumulate = nullptr, bool reset = false);

}  // namespace cleave::providers
