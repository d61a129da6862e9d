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
//
// With `dbias` (one 2-D product with a float32 C, no bias or activation), the float32 sums over
// K of A [K, M] (of_a, with transA: [M]) or of B [K, N] (without transB: [N]) are formed in
// cuBLASLt's bias-gradient epilogue while it reads that operand (BGRADB, BGRADA: the operands
// swap in the column-major call); where the library has no such kernel for the shape (its
// heuristic or the call refuses it; remembered per shape), *formed is false, the product runs
// plain and the caller sums the operand itself (kernels::cuda::ColumnSums).
//
// lda > 0 (one 2-D product): A's stored row length where it is wider than op(A) needs (M with
// transA, else K), so that the product reads the first M columns of a wider [K, lda] A (a
// padded operand's product that leaves out its padding).
//
// With `gelu_aux` (formed set; one product, or a batch that folds into M, with N a multiple of 8;
// no accumulate, dbias or lda): pre_out with gelu_tanh writes the GELU input (the product plus the
// bias, C's type and shape) there as C gets its GELU (cuBLASLt's GELU_AUX_BIAS), as a training
// graph's forward needs it for the backward; pre_in (no bias or activation) makes C the product
// times the tanh-GELU's derivative at pre_in (DGELU: the GELU's backward folded into the product
// of its output gradient). *formed says whether it ran; where not (another shape, or the library
// refuses the epilogue: remembered per shape), nothing ran and the caller does the work.
struct DbiasRequest {
  float* dbias = nullptr;
  bool of_a = false;
  bool* formed = nullptr;
};
struct GeluAuxRequest {
  void* pre_out = nullptr;
  const void* pre_in = nullptr;
  bool* formed = nullptr;
};
absl::Status CudaMatMul(const CudaExecutionProvider& p, const kernels::cpu::MatMulPlan& plan, DataType dt,
                        DataType out_dt, const void* a, const void* b, void* c, const void* bias, bool gelu_tanh,
                        const float* accumulate = nullptr, bool reset = false, const DbiasRequest& dbias = {},
                        int64_t lda = 0, const GeluAuxRequest& gelu_aux = {});

// How many product shapes the library has refused the bias-gradient epilogue, and the GELU-input
// ones, for so far (in this process): what a report says of the fallback.
int64_t RefusedBiasGradientEpilogues();
int64_t RefusedGeluAuxEpilogues();

}  // namespace cleave::providers
