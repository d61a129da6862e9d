// Scaled dot-product attention on the CPU (kernels/cpu/), the reference for ai.cleave.Attention
// and ai.cleave.AttentionGrad: for each of `batch` (batch x heads) slices, queries q [T, D],
// keys k [S, D] and values v [S, Dv], out [T, Dv] = softmax(scale * q k^T (+ causal mask)) v, and
// lse [T] = the log-sum-exp of each row of scaled scores, which the backward uses to recompute
// the probabilities instead of storing them. Causal: query i sees keys j <= i + (S - T). An
// additive bias (a padding mask, a position bias) joins the scaled scores before the softmax;
// a row whose every score is -inf attends to nothing (zeros out, lse -inf).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

#include "base/fixed_vector.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

// Where row t of slice b of an operand starts, in elements: slice b is (b / heads, b % heads)
// of the leading dims, at (b / heads) * batch + (b % heads) * head + t * row.
struct AttentionStrides {
  int64_t batch = 0, head = 0, row = 0;
};

// The additive bias of the scores, float32 (or float64 for float64 operands): for query row i and
// key j of slice b at (b / heads) * batch + (b % heads) * head + i * row + j * col, so that a
// stride of 0 broadcasts it (a [B, 1, 1, S] padding mask over heads and query rows, say). No
// bias where data is null.
struct AttentionBias {
  const float* data = nullptr;
  const double* data64 = nullptr;  // instead of data, a float64 bias of float64 operands
  int64_t heads = 1, batch = 0, head = 0, row = 0, col = 0;

  int64_t At(int64_t b, int64_t i) const { return b / heads * batch + b % heads * head + i * row; }
};

struct AttentionParams {
  int64_t batch = 1, T = 0, S = 0, D = 0, Dv = 0;
  double scale = 1.0;
  bool causal = false;
  AttentionBias bias;
  // Where the backward writes the scores' gradient before the scale, P * (dP - delta), as
  // float32 [batch, T, S] (zeros where a key is hidden), for a bias that needs a gradient; null
  // for none.
  float* dscores = nullptr;
  // The operands' layouts: q, k, v and o (out and dOut); dq, dk and dv are laid out as q, k
  // and v, and lse is always [batch, T]. PlanAttention sets the contiguous [..., T, D] one;
  // SetLayout the others.
  int64_t heads = 1;
  AttentionStrides q, k, v, o;

  int64_t At(const AttentionStrides& s, int64_t b, int64_t t) const {
    return b / heads * s.batch + b % heads * s.head + t * s.row;
  }
};

// ai.cleave.Attention's layouts: "bhsd", contiguous [..., T, D]; "bshd", q [B, T, H, D],
// k [B, S, H, D], v [B, S, H, Dv] and out [B, T, H, Dv]; "bs3hd", q, k and v the parts of one
// [B, T, 3, H, D] (k starts H * D elements after q, v 2 H D), out [B, T, H, D].
enum class AttentionLayout { kBhsd, kBshd, kBs3hd };

// Lays the slices of p (planned over [B, H, T, D] operands, so batch = B H) out as `layout`,
// with `heads` = H.
void SetLayout(AttentionParams& p, AttentionLayout layout, int64_t heads);

// The layout a `layout` attribute names: "bshd", "bs3hd", else "bhsd".
AttentionLayout AttentionLayoutNamed(std::string_view name);

// The plan of an ai.cleave.Attention / AttentionGrad over its operands in `layout`, laid out
// (SetLayout) for it, with the element offsets of k and v in the packed "bs3hd" input and the
// dims of the output and the lse. Every provider's kernels plan with it.
struct AttentionOperands {
  AttentionParams p;
  bool packed = false;  // "bs3hd"
  int64_t k_offset = 0, v_offset = 0;
  DimVector out, lse;
};
// q, k, v: the operands' dims (k and v unused with "bs3hd", whose q is the packed product), or
// InvalidArgument naming what it expected.
absl::StatusOr<AttentionOperands> PlanAttentionOperands(AttentionLayout layout, std::span<const int64_t> q,
                                                        std::span<const int64_t> k, std::span<const int64_t> v,
                                                        double scale, bool causal);

// The dims of a's scores, [lead..., T, S] (lse's dims, then S): what a bias broadcasts to and
// the shape of AttentionGrad's dbias.
DimVector ScoreDims(const AttentionOperands& a);

// Lays a's bias out (all but its data) from the bias' dims, which must broadcast (numpy rules)
// to the scores [lead..., T, S], lead being lse's leading dims; of the lead dims before the
// last, either all broadcast or none does. InvalidArgument naming both shapes otherwise.
absl::Status PlanAttentionBias(AttentionOperands& a, std::span<const int64_t> bias);

// The slices and sizes of q [..., T, D], k [..., S, D], v [..., S, Dv] (one set of leading dims),
// or InvalidArgument naming the three shapes. Device providers plan with it too.
absl::StatusOr<AttentionParams> PlanAttention(std::span<const int64_t> q, std::span<const int64_t> k,
                                              std::span<const int64_t> v, double scale, bool causal);

// lse may be null, and so may out for float32 (lse alone). float32 runs blocks of query rows
// through sgemm, keeping one block's [rows, S] scores per thread; float64 is the reference
// below. Both read and write every layout in place.
void AttentionForward(const AttentionParams& p, const float* q, const float* k, const float* v, float* out,
                      float* lse, ThreadPool* pool);
void AttentionForward(const AttentionParams& p, const double* q, const double* k, const double* v, double* out,
                      float* lse, ThreadPool* pool);
// From dout, the forward inputs, out and lse: dq, dk, dv (each may be null). float32 splits
// each slice's keys into chunks, so that a few slices still fill the pool, and recomputes the
// probabilities from lse (from the scores where lse is null); its results do not depend on the
// pool's size. float64 recomputes them in double from the scores and ignores lse.
void AttentionBackward(const AttentionParams& p, const float* dout, const float* q, const float* k, const float* v,
                       const float* out, const float* lse, float* dq, float* dk, float* dv, ThreadPool* pool);
void AttentionBackward(const AttentionParams& p, const double* dout, const double* q, const double* k,
                       const double* v, const double* out, const float* lse, double* dq, double* dk, double* dv,
                       ThreadPool* pool);

// bf16 q, k, v (and out, dOut, dq, dk, dv) on CPUs with AVX-512 BF16 dot products: the block
// products take bf16 operands and accumulate in float32, as cuDNN's flash attention does,
// so the probabilities and the scores' gradient enter the products rounded to bf16; the
// scores, the softmax, lse and the gradients' sums stay float32. Bf16AttentionSupported says
// whether this CPU and p (even D and Dv) can take it; else the callers widen to float32.
// Elements are bf16 bit patterns; out may be null in the forward (lse alone). The results do not
// depend on the pool's size.
bool Bf16AttentionSupported(const AttentionParams& p);
void AttentionForwardBf16(const AttentionParams& p, const uint16_t* q, const uint16_t* k, const uint16_t* v,
                          uint16_t* out, float* lse, ThreadPool* pool);
void AttentionBackwardBf16(const AttentionParams& p, const uint16_t* dout, const uint16_t* q, const uint16_t* k,
                           const uint16_t* v, const uint16_t* out, const float* lse, uint16_t* dq, uint16_t* dk,
                           uint16_t* dv, ThreadPool* pool);

// The definition computed one query row at a time in double accumulation, for tests.
// Instantiated for float and double.
template <typename T>
void AttentionForwardReference(const AttentionParams& p, const T* q, const T* k, const T* v, T* out, float* lse,
                               ThreadPool* pool);
template <typename T>
void AttentionBackwardReference(const AttentionParams& p, const T* dout, const T* q, const T* k, const T* v,
                                const T* out, T* dq, T* dk, T* dv, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
