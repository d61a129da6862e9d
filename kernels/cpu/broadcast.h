// Numpy-style broadcasting for elementwise CPU kernels (kernels/).
// A BroadcastPlan reduces up to three inputs broadcast to one output to the fewest dims:
// size-1 output dims are dropped and neighbouring dims merge when every input is either
// full or broadcast in both. After that the innermost dim reads each input with stride 1
// (full) or 0 (broadcast), so the hot loops are flat, and only the outer dims need an index.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "base/status.h"
#include "base/tensor.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

constexpr int kMaxBroadcastInputs = 3;

// Writes the broadcast of the inputs' dims to out and returns its rank, or -1 when some
// dims are incompatible. Any number of inputs; no allocation (runs on the step path).
int BroadcastOutputDims(std::span<const TensorView* const> inputs, int64_t out[kMaxRank]);

struct BroadcastPlan {
  int rank = 1;        // collapsed rank, >= 1
  int num_inputs = 0;  // <= kMaxBroadcastInputs
  int64_t numel = 0;   // output elements
  int64_t dims[kMaxRank] = {};
  // Element strides into each input per collapsed output dim; 0 where broadcast.
  int64_t strides[kMaxBroadcastInputs][kMaxRank] = {};

  int64_t inner() const { return dims[rank - 1]; }
  // 1 when input k is read contiguously along the innermost dim, 0 when it repeats.
  int64_t inner_stride(int k) const { return strides[k][rank - 1]; }
};

// Plans reading `inputs` broadcast to `out_dims`. Each input dim must be 1 or equal to the
// matching output dim (checked: returns false otherwise).
bool MakeBroadcastPlan(std::span<const TensorView* const> inputs,
                       std::span<const int64_t> out_dims, BroadcastPlan* plan);

// Calls fn(out_offset, len, in_offsets) for each maximal run of output elements in
// [begin, end) that lies within one innermost row. in_offsets[k] is the element offset of
// input k at out_offset; along the run input k advances by plan.inner_stride(k).
template <typename RunFn>
void ForEachRun(const BroadcastPlan& p, int64_t begin, int64_t end, RunFn&& fn) {
  if (begin >= end) return;
  const int r = p.rank, ni = p.num_inputs;
  int64_t idx[kMaxRank];
  int64_t off[kMaxBroadcastInputs] = {0, 0, 0};
  int64_t rest = begin;
  for (int d = r - 1; d >= 0; --d) {
    idx[d] = rest % p.dims[d];
    rest /= p.dims[d];
    for (int k = 0; k < ni; ++k) off[k] += idx[d] * p.strides[k][d];
  }
  const int64_t inner = p.inner();
  for (int64_t pos = begin; pos < end;) {
    int64_t len = std::min(inner - idx[r - 1], end - pos);
    fn(pos, len, static_cast<const int64_t*>(off));
    pos += len;
    idx[r - 1] += len;
    for (int k = 0; k < ni; ++k) off[k] += len * p.strides[k][r - 1];
    // Carry into the outer dims when the row is finished.
    for (int d = r - 1; d > 0 && idx[d] == p.dims[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
      for (int k = 0; k < ni; ++k)
        off[k] += p.strides[k][d - 1] - p.dims[d] * p.strides[k][d];
    }
  }
}

// o[i] = f(a[i * sa], b[i * sb]) for a run with strides 0 or 1. The four cases are
// separate loops so that the common ones (both contiguous, one side repeated) vectorise.
template <typename TA, typename TB, typename TO, typename F>
inline void BinaryRun(const TA* a, int64_t sa, const TB* b, int64_t sb, TO* o, int64_t n, F f) {
  if (sa && sb) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (sa) {
    const TB bv = b[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (sb) {
    const TA av = a[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    const TO v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  }
}

// out = f(a, b) with a and b broadcast to out's dims, split over the pool in contiguous
// blocks of output elements.
template <typename TA, typename TB, typename TO, typename F>
void BroadcastBinary(const TensorView& a, const TensorView& b, const TensorView& out,
                     int64_t grain, ThreadPool* pool, F f) {
  const TensorView* ins[2] = {&a, &b};
  BroadcastPlan plan;
  CLEAVE_CHECK(MakeBroadcastPlan(ins, out.dim_span(), &plan));
  if (plan.numel == 0) return;
  const TA* ap = a.as<const TA>();
  const TB* bp = b.as<const TB>();
  TO* op = out.as<TO>();
  const int64_t sa = plan.inner_stride(0), sb = plan.inner_stride(1);
  ParallelFor(pool, plan.numel, grain, [&](int64_t begin, int64_t end) {
    ForEachRun(plan, begin, end, [&](int64_t o, int64_t n, const int64_t* off) {
      BinaryRun(ap + off[0], sa, bp + off[1], sb, op + o, n, f);
    });
  });
}

}  // namespace cleave::kernels::cpu
