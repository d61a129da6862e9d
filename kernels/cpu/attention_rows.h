// The row steps the CPU attention kernels share (kernels/cpu/attention.cc, attention_bf16.cc):
// which keys a query row sees, how many query rows a block holds, the softmax and score
// gradient of one row of a block's float32 scores, the zeroing of rows that see no key, and
// the backward's chunks of keys with the partial query gradients they leave. Internal to
// kernels/cpu.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_buffer.h"

namespace cleave::kernels::cpu::attention_rows {

// The keys query row i may see: [0, Visible).
int64_t Visible(const AttentionParams& p, int64_t i);

// The first query row that sees key j (T where none does).
int64_t FirstRowSeeing(const AttentionParams& p, int64_t j);

// How many of the w keys from j0 query row i sees.
inline int64_t SeenOf(const AttentionParams& p, int64_t i, int64_t j0, int64_t w) {
  return std::clamp<int64_t>(Visible(p, i) - j0, 0, w);
}

// Query rows per block: the block's [rows, S] float32 scores stay within about 256 KiB (a
// core's L2), and no block is smaller than 16 rows or larger than kMaxBlockRows (64 when
// causal: a causal block computes the scores its last row sees for every row).
inline constexpr int64_t kMaxBlockRows = 128;
int64_t BlockRows(const AttentionParams& p);

// One row of a block's scores, of which the first nr are visible: those exponentiated in place
// against their max (set in *m), the rest of its n zeroed. Returns their sum (0 when nr is 0
// or every visible score is -inf, when the row is all zeros).
double ExpRow(float* sr, int64_t nr, int64_t n, float* m);

// The backward's row of probabilities in place over its scores: exp(s - lse), zeros past nr
// (all zeros where lse is -inf: the row attended to nothing).
void ProbabilityRow(float* sr, int64_t nr, int64_t n, float lse);

// Adds the bias of query row i of slice b, keys j0 .. j0 + n, to the scores sr (nothing when p
// has none).
inline void AddBias(const AttentionParams& p, int64_t b, int64_t i, int64_t j0, float* sr, int64_t n) {
  if (!p.bias.data) return;
  const float* x = p.bias.data + p.bias.At(b, i) + j0 * p.bias.col;
  if (p.bias.col == 0)
    for (int64_t j = 0; j < n; ++j) sr[j] += x[0];
  else
    for (int64_t j = 0; j < n; ++j) sr[j] += x[j];
}

// Zeroes p.dscores (the positions no query row sees stay zero).
void ZeroScoreGrads(const AttentionParams& p, ThreadPool* pool);

// Copies the unscaled scores' gradient of query row i of slice b, keys j0 .. j0 + n, into
// p.dscores, then scales the row in place by `scale` (as ScoreGradRow would have).
inline void StoreScoreGrads(const AttentionParams& p, int64_t b, int64_t i, int64_t j0, float* dsr, int64_t n,
                            float scale) {
  std::copy(dsr, dsr + n, p.dscores + (b * p.T + i) * p.S + j0);
  for (int64_t j = 0; j < n; ++j) dsr[j] *= scale;
}

// The scores' gradient row in place over dP: dS = P * (dP - delta) * scale.
void ScoreGradRow(const float* pr, float* dsr, int64_t n, float delta, float scale);

// Zeroes `rows` rows of `width` elements, `stride` apart (the rows that see no key).
template <typename T>
void ZeroRows(T* x, int64_t rows, int64_t width, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) std::fill(x + r * stride, x + r * stride + width, T{0});
}

// The backward's split of each slice's keys into chunks, one task per (slice, chunk), so that
// a few slices still keep every thread busy: as many chunks as bring the tasks to about
// kBackwardTasks (at most kMaxKeyChunks, and no more than one per kMinChunkKeys keys), cut on
// multiples of 16 keys where each holds about the same share of the (query row, key) pairs
// that are seen: when causal, the first keys (which every row sees) in narrower chunks than
// the last. A task owns its chunk's dK and dV rows; each chunk leaves a partial dQ, summed
// over the chunks in their order. The chunks follow from the shapes alone, so the gradients
// do not depend on the pool's size.
inline constexpr int kMaxKeyChunks = 16;
inline constexpr int64_t kBackwardTasks = 16, kMinChunkKeys = 128;
// Task t of the backward: chunk c of slice b, w keys from j0, seen from query row `first` on.
struct ChunkTask {
  int64_t b;
  int c;
  int64_t j0, w, first;
};
struct KeyChunks {
  int count = 1;
  int64_t begin[kMaxKeyChunks + 1] = {};  // chunk c holds keys [begin[c], begin[c + 1])
  int64_t first_row[kMaxKeyChunks] = {};  // the first query row that sees chunk c
  int64_t widest = 0;

  ChunkTask Task(int64_t t) const {
    const int c = static_cast<int>(t % count);
    return {t / count, c, begin[c], begin[c + 1] - begin[c], first_row[c]};
  }
};
KeyChunks PlanKeyChunks(const AttentionParams& p);

// Each query row's float32 statistics for the backward: its lse (the one given, else the one
// form_lse(into) writes into [batch, T]) and, where `deltas`, delta = rowsum(dO * O), from
// row_dot(at) of the row at element `at` of dO and O.
class BackwardRowStats {
 public:
  template <typename RowDot, typename FormLse>
  BackwardRowStats(const AttentionParams& p, const float* lse, bool deltas, ThreadPool* pool, RowDot&& row_dot,
                   FormLse&& form_lse)
      : data_(static_cast<size_t>(p.batch * p.T * (lse ? 1 : 2))), lse_(lse) {
    if (!lse_) {
      form_lse(data_.data() + p.batch * p.T);
      lse_ = data_.data() + p.batch * p.T;
    }
    if (deltas)
      ParallelFor(pool, p.batch * p.T, 64, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) data_[r] = row_dot(p.At(p.o, r / p.T, r % p.T));
      });
  }
  // Of row r of [batch, T].
  float lse(int64_t r) const { return lse_[r]; }
  float delta(int64_t r) const { return data_[r]; }

 private:
  std::vector<float> data_;  // delta, then the lse formed here
  const float* lse_;
};

// The float32 partial dQ that each chunk of keys leaves, for more than one chunk: rows
// first_row[c] .. T of each slice, D wide, each written whole by the chunk's task.
class QueryGradPartials {
 public:
  QueryGradPartials(const AttentionParams& p, const KeyChunks& chunks);
  // Row i (at least first_row[c]) of chunk c's partial in slice b; the rows are D apart.
  float* Row(int c, int64_t b, int64_t i) const {
    return data_.get() + offset_[c] + (b * (p_.T - chunks_.first_row[c]) + i - chunks_.first_row[c]) * p_.D;
  }
  // store(b, i, sum) for each query row, with the sum of its partials in chunk order (zeros
  // for a row that sees no key).
  template <typename Store>
  void Sum(ThreadPool* pool, Store&& store) const {
    ParallelFor(pool, p_.batch * p_.T, 16, [&](int64_t r0, int64_t r1) {
      float* sum = ThreadBuffer(0, static_cast<size_t>(p_.D));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / p_.T, i = r % p_.T;
        std::fill(sum, sum + p_.D, 0.f);
        for (int c = 0; c < chunks_.count && chunks_.first_row[c] <= i; ++c) {
          const float* x = Row(c, b, i);
          for (int64_t d = 0; d < p_.D; ++d) sum[d] += x[d];
        }
        store(b, i, static_cast<const float*>(sum));
      }
    });
  }

 private:
  const AttentionParams& p_;
  const KeyChunks& chunks_;
  int64_t offset_[kMaxKeyChunks] = {};
  std::unique_ptr<float[]> data_;
};

}  // namespace cleave::kernels::cpu::attention_rows
