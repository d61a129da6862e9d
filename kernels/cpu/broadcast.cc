// Broadcast planning for elementwise CPU kernels (kernels/).
// Dims are right-aligned as in numpy; the plan drops size-1 output dims and merges runs
// of dims that every input treats alike, so [B,T,C] + [C] becomes [B*T, C] + [C].
#include "kernels/cpu/broadcast.h"

namespace cleave::kernels::cpu {

int BroadcastOutputDims(std::span<const TensorView* const> inputs, int64_t out[kMaxRank]) {
  int rank = 0;
  for (const TensorView* t : inputs) rank = std::max(rank, t->rank);
  for (int d = 0; d < rank; ++d) out[d] = 1;
  for (const TensorView* t : inputs) {
    for (int j = 0; j < t->rank; ++j) {
      int64_t d = t->dims[j];
      int64_t& o = out[rank - t->rank + j];
      if (d == o || d == 1) continue;
      if (o != 1) return -1;
      o = d;
    }
  }
  return rank;
}

bool MakeBroadcastPlan(std::span<const TensorView* const> inputs,
                       std::span<const int64_t> out_dims, BroadcastPlan* plan) {
  const int rank = static_cast<int>(out_dims.size());
  const int ni = static_cast<int>(inputs.size());
  if (ni > kMaxBroadcastInputs || rank > kMaxRank) return false;
  // full[k][d]: input k spans output dim d (true) or repeats along it (false).
  bool full[kMaxBroadcastInputs][kMaxRank];
  for (int k = 0; k < ni; ++k) {
    const TensorView& t = *inputs[k];
    if (t.rank > rank) return false;
    for (int d = 0; d < rank; ++d) {
      int j = d - (rank - t.rank);
      int64_t in = j >= 0 ? t.dims[j] : 1;
      if (in != out_dims[d] && in != 1) return false;
      full[k][d] = in == out_dims[d];
    }
  }
  BroadcastPlan& p = *plan;
  p = BroadcastPlan();
  p.num_inputs = ni;
  p.numel = 1;
  for (int64_t d : out_dims) p.numel *= d;
  // Collapse: keep output dims > 1, merging a dim into the previous kept one when every
  // input has the same full/broadcast status in both.
  int kept = 0;
  bool kept_full[kMaxBroadcastInputs][kMaxRank];
  for (int d = 0; d < rank; ++d) {
    if (out_dims[d] == 1) continue;
    bool merge = kept > 0;
    for (int k = 0; k < ni && merge; ++k) merge = full[k][d] == kept_full[k][kept - 1];
    if (merge) {
      p.dims[kept - 1] *= out_dims[d];
    } else {
      p.dims[kept] = out_dims[d];
      for (int k = 0; k < ni; ++k) kept_full[k][kept] = full[k][d];
      ++kept;
    }
  }
  if (kept == 0) {  // a single element (or all dims 1): one dim of size numel
    p.rank = 1;
    p.dims[0] = p.numel;
    for (int k = 0; k < ni; ++k) p.strides[k][0] = 0;
    return true;
  }
  p.rank = kept;
  for (int k = 0; k < ni; ++k) {
    int64_t s = 1;
    for (int d = kept - 1; d >= 0; --d) {
      p.strides[k][d] = kept_full[k][d] ? s : 0;
      if (kept_full[k][d]) s *= p.dims[d];
    }
  }
  return true;
}

}  // namespace cleave::kernels::cpu
