// bf16 matrix products on the CPU through oneDNN (kernels/cpu/): bf16 inputs, fp32
// accumulation and output, as mixed-precision training runs its matmuls. oneDNN picks the
// machine's best bf16 path (AMX tiles, AVX512-BF16 dot products, or a conversion fallback).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

struct GemmBf16Params {
  int64_t batch = 1;    // of A and C
  bool b_batched = false;  // B has A's batch dims (else one B for every batch)
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false;  // A stored [.., K, M]
  bool trans_b = false;  // B stored [.., N, K]
  int64_t lda = 0;        // A's stored row length (M with trans_a, else K) where larger; 0: dense
};

// C[b] = op(A[b]) @ op(B[b or 0]); A and B hold bf16 bits, C is fp32 [batch, M, N]. Split over
// `pool` (whole products, or panels of rows or columns of each), each share one oneDNN call on
// its thread; the sums along K are the same whatever the split.
absl::Status GemmBf16(const GemmBf16Params& p, const uint16_t* A, const uint16_t* B, float* C,
                      ThreadPool* pool = nullptr);

}  // namespace cleave::kernels::cpu
