// Scaled dot-product attention on the CPU (kernels/cpu/), the reference for ai.cleave.Attention
// and ai.cleave.AttentionGrad: for each of `batch` (batch x heads) slices, queries q [T, D],
// keys k [S, D] and values v [S, Dv], out [T, Dv] = softmax(scale * q k^T (+ causal mask)) v, and
// lse [T] = the log-sum-exp of each row of scaled scores, which the backward uses to recompute
// the probabilities instead of storing them. Causal: query i sees keys j <= i + (S - T).
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"

#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

struct AttentionParams {
  int64_t batch = 1, T = 0, S = 0, D = 0, Dv = 0;
  double scale = 1.0;
  bool causal = false;
};

// The slices and sizes of q [..., T, D], k [..., S, D], v [..., S, Dv] (one set of leading dims),
// or InvalidArgument naming the three shapes. Device providers plan with it too.
absl::StatusOr<AttentionParams> PlanAttention(std::span<const int64_t> q, std::span<const int64_t> k,
                                              std::span<const int64_t> v, double scale, bool causal);

// lse may be null. Instantiated for float and double.
template <typename T>
void AttentionForward(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse,
                      ThreadPool* pool);
// From dout, the forward inputs, out and lse: dq, dk, dv (each may be null).
template <typename T>
void AttentionBackward(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v, const T* out,
                       const float* lse, T* dq, T* dk, T* dv, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
