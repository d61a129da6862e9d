// The row steps the CPU attention kernels share (kernels/cpu/attention.cc, attention_bf16.cc):
// which keys a query row sees, how many query rows a block holds, the softmax and score
// gradient of one row of a block's float32 scores, and the zeroing of rows that see no key.
// Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/attention.h"

namespace cleave::kernels::cpu::attention_rows {

// The keys query row i may see.
int64_t Visible(const AttentionParams& p, int64_t i);

// Query rows per block: the block's [rows, S] float32 scores stay within about 256 KiB (a
// core's L2), and no block is smaller than 16 rows or larger than kMaxBlockRows (64 when
// causal: a causal block computes the scores its last row sees for every row).
inline constexpr int64_t kMaxBlockRows = 128;
int64_t BlockRows(const AttentionParams& p);

// One row of a block's scores, of which the first nr are visible: those exponentiated in place
// against their max (set in *m), the rest of its n zeroed. Returns their sum (0 when nr is 0).
double ExpRow(float* sr, int64_t nr, int64_t n, float* m);

// The backward's row of probabilities in place over its scores: exp(s - lse) with the forward's
// lse where there is one (else normalised as the forward does); zeros past nr.
void ProbabilityRow(float* sr, int64_t nr, int64_t n, const float* lse);

// The scores' gradient row in place over dP: dS = P * (dP - delta) * scale.
void ScoreGradRow(const float* pr, float* dsr, int64_t n, float delta, float scale);

// Zeroes `rows` rows of `width` elements, `stride` apart (the rows that see no key).
template <typename T>
void ZeroRows(T* x, int64_t rows, int64_t width, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) std::fill(x + r * stride, x + r * stride + width, T{0});
}

}  // namespace cleave::kernels::cpu::attention_rows
