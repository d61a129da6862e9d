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

// lse may be null. float32 runs blocks of query rows through sgemm, keeping one block's
// [rows, S] scores per thread; float64 is the reference below.
void AttentionForward(const AttentionParams& p, const float* q, const float* k, const float* v, float* out,
                      float* lse, ThreadPool* pool);
void AttentionForward(const AttentionParams& p, const double* q, const double* k, const double* v, double* out,
                      float* lse, ThreadPool* pool);
// From dout, the forward inputs, out and lse: dq, dk, dv (each may be null). float32 recomputes
// the probabilities from lse (from the scores where lse is null); float64 recomputes them in
// double from the scores and ignores lse.
void AttentionBackward(const AttentionParams& p, const float* dout, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, float* dq, float* dk, float* dv, ThreadPool* pool);
void AttentionBackward(const AttentionParams& p, const double* dout, const double* q, const double* k,
                       const double* v, const double* out, const float* lse, double* dq, double* dk, double* dv,
                       ThreadPool* pool);

// The definition computed one query row at a time in double accumulation, for tests.
// Instantiated for float and double.
template <typename T>
void AttentionForwardReference(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse,
                               ThreadPool* pool);
template <typename T>
void AttentionBackwardReference(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v,
                                const T* out, T* dq, T* dk, T* dv, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
