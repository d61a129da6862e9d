// ReduceSum / Mean / Max / Min / Prod on the CPU (kernels/cpu/).
// After PlanReduce collapses the dims, two loop shapes cover every case:
//  - row mode (innermost dim reduced): each output reduces contiguous runs, lane-parallel;
//  - column mode (innermost dim kept): blocks of adjacent outputs accumulate whole input
//    rows, so reducing leading axes ([B*T, C] -> [C]) streams memory in order.
// Each output is reduced by one thread in a fixed order: results do not depend on threads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

ReducePlan PlanReduce(std::span<const int64_t> dims, std::span<const int> axes) {
  ReducePlan p;
  bool is_reduced[kMaxRank] = {};
  for (int a : axes) is_reduced[a] = true;
  p.in_numel = p.out_numel = p.count = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    p.in_numel *= dims[i];
    (is_reduced[i] ? p.count : p.out_numel) *= dims[i];
    if (dims[i] == 1) continue;  // a size-1 dim changes no index, reduced or not
    if (p.rank > 0 && p.reduced[p.rank - 1] == is_reduced[i]) {
      p.dims[p.rank - 1] *= dims[i];
    } else {
      p.dims[p.rank] = dims[i];
      p.reduced[p.rank] = is_reduced[i];
      ++p.rank;
    }
  }
  return p;
}

namespace {

// A subset of the collapsed dims with their input strides: maps a row-major index over
// the subset to an input offset.
struct SubIndex {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  int64_t count = 1;

  void Add(int64_t dim, int64_t stride) {
    dims[rank] = dim;
    strides[rank] = stride;
    ++rank;
    count *= dim;
  }
  int64_t Offset(int64_t idx) const {
    int64_t off = 0;
    for (int k = rank - 1; k >= 0; --k) {
      off += (idx % dims[k]) * strides[k];
      idx /= dims[k];
    }
    return off;
  }
};

// Accumulator type and the reduction's algebra. Float sums accumulate in double, integer
// sums in int64 (wrapping only past int64, where numpy's would too).
template <typename T>
struct Algebra {
  using SumAcc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

  static T Lowest() {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  static T Highest() {
    if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
  // acc * v, an integer product wrapping (unsigned arithmetic) rather than overflowing.
  static SumAcc Times(SumAcc acc, T v) {
    if constexpr (std::is_floating_point_v<T>) {
      return acc * static_cast<double>(v);
    } else {
      return static_cast<SumAcc>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(static_cast<SumAcc>(v)));
    }
  }
  static T Mean(SumAcc sum, int64_t count) {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(sum / static_cast<double>(count));  // count 0 gives NaN
    } else {
      return count == 0 ? T(0) : static_cast<T>(sum / count);  // truncates, as numpy's cast
    }
  }
};

template <typename T>
void FillEmpty(ReduceKind kind, T* y, int64_t n) {
  T v{};
  if (kind == ReduceKind::kMax) v = Algebra<T>::Lowest();
  if (kind == ReduceKind::kMin) v = Algebra<T>::Highest();
  if (kind == ReduceKind::kMean) v = Algebra<T>::Mean(0, 0);
  if (kind == ReduceKind::kProd) v = T(1);
  std::fill(y, y + n, v);
}

// Row mode: y[o] reduces, for every index of the outer reduced dims, a contiguous run of
// `run` elements.
template <typename T>
void ReduceRows(ReduceKind kind, const ReducePlan& p, const T* x, T* y, ThreadPool* pool) {
  using Acc = typename Algebra<T>::SumAcc;
  SubIndex kept, outer;
  const int64_t run = p.dims[p.rank - 1];
  int64_t stride = run;
  for (int d = p.rank - 2; d >= 0; --d) {
    (p.reduced[d] ? outer : kept).Add(p.dims[d], stride);
    stride *= p.dims[d];
  }
  // Add() appended right-to-left; flip to row-major order for Offset().
  std::reverse(kept.dims, kept.dims + kept.rank);
  std::reverse(kept.strides, kept.strides + kept.rank);
  std::reverse(outer.dims, outer.dims + outer.rank);
  std::reverse(outer.strides, outer.strides + outer.rank);
  const bool is_sum = kind == ReduceKind::kSum || kind == ReduceKind::kMean;
  int64_t grain = std::max<int64_t>(1, 32768 / p.count);
  ParallelFor(pool, p.out_numel, grain, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const T* base = x + kept.Offset(o);
      Acc sum = kind == ReduceKind::kProd ? 1 : 0;
      T ext = kind == ReduceKind::kMax ? Algebra<T>::Lowest() : Algebra<T>::Highest();
      for (int64_t j = 0; j < outer.count; ++j) {
        const T* r = base + outer.Offset(j);
        if (is_sum) sum += LaneSum<Acc>(r, run);
        else if (kind == ReduceKind::kProd) for (int64_t i = 0; i < run; ++i) sum = Algebra<T>::Times(sum, r[i]);
        else if (kind == ReduceKind::kMax) ext = LaneMax(r, run, ext);
        else ext = LaneMin(r, run, ext);
      }
      if (kind == ReduceKind::kSum || kind == ReduceKind::kProd) y[o] = static_cast<T>(sum);
      else if (kind == ReduceKind::kMean) y[o] = Algebra<T>::Mean(sum, p.count);
      else y[o] = ext;
    }
  });
}

constexpr int64_t kColumnBlock = 256;

// Column mode: outputs [outer_kept, L]; each work item owns up to kColumnBlock adjacent
// outputs and adds one input row segment per reduced index.
template <typename T>
void ReduceColumns(ReduceKind kind, const ReducePlan& p, const T* x, T* y, ThreadPool* pool) {
  using Acc = typename Algebra<T>::SumAcc;
  SubIndex kept, red;
  const int64_t L = p.dims[p.rank - 1];
  int64_t stride = L;
  for (int d = p.rank - 2; d >= 0; --d) {
    (p.reduced[d] ? red : kept).Add(p.dims[d], stride);
    stride *= p.dims[d];
  }
  std::reverse(kept.dims, kept.dims + kept.rank);
  std::reverse(kept.strides, kept.strides + kept.rank);
  std::reverse(red.dims, red.dims + red.rank);
  std::reverse(red.strides, red.strides + red.rank);
  const int64_t blocks = (L + kColumnBlock - 1) / kColumnBlock;
  const bool is_sum = kind == ReduceKind::kSum || kind == ReduceKind::kMean;
  int64_t grain = std::max<int64_t>(1, 32768 / (p.count * std::min(L, kColumnBlock)));
  ParallelFor(pool, kept.count * blocks, grain, [&](int64_t w0, int64_t w1) {
    Acc sum[kColumnBlock];
    T ext[kColumnBlock];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t o = w / blocks, c0 = (w % blocks) * kColumnBlock;
      const int64_t len = std::min(kColumnBlock, L - c0);
      const T* base = x + kept.Offset(o) + c0;
      const T init = kind == ReduceKind::kMax ? Algebra<T>::Lowest() : Algebra<T>::Highest();
      std::fill(sum, sum + len, Acc(kind == ReduceKind::kProd ? 1 : 0));
      std::fill(ext, ext + len, init);
      for (int64_t j = 0; j < red.count; ++j) {
        const T* r = base + red.Offset(j);
        if (is_sum) for (int64_t c = 0; c < len; ++c) sum[c] += static_cast<Acc>(r[c]);
        else if (kind == ReduceKind::kProd) for (int64_t c = 0; c < len; ++c) sum[c] = Algebra<T>::Times(sum[c], r[c]);
        else if (kind == ReduceKind::kMax) for (int64_t c = 0; c < len; ++c) ext[c] = MaxNan(ext[c], r[c]);
        else for (int64_t c = 0; c < len; ++c) ext[c] = MinNan(ext[c], r[c]);
      }
      T* out = y + o * L + c0;
      for (int64_t c = 0; c < len; ++c) {
        if (kind == ReduceKind::kSum || kind == ReduceKind::kProd) out[c] = static_cast<T>(sum[c]);
        else if (kind == ReduceKind::kMean) out[c] = Algebra<T>::Mean(sum[c], p.count);
        else out[c] = ext[c];
      }
    }
  });
}

}  // namespace

template <typename T>
void Reduce(ReduceKind kind, const ReducePlan& p, const T* x, T* y, ThreadPool* pool) {
  if (p.out_numel == 0) return;
  if (p.count == 0) return FillEmpty(kind, y, p.out_numel);
  if (p.count == 1) {  // every reduced dim has size 1: y has x's layout and values
    std::memcpy(y, x, p.out_numel * sizeof(T));
    return;
  }
  if (p.reduced[p.rank - 1]) ReduceRows(kind, p, x, y, pool);
  else ReduceColumns(kind, p, x, y, pool);
}

template void Reduce<float>(ReduceKind, const ReducePlan&, const float*, float*, ThreadPool*);
template void Reduce<double>(ReduceKind, const ReducePlan&, const double*, double*, ThreadPool*);
template void Reduce<int32_t>(ReduceKind, const ReducePlan&, const int32_t*, int32_t*, ThreadPool*);
template void Reduce<int64_t>(ReduceKind, const ReducePlan&, const int64_t*, int64_t*, ThreadPool*);

// Bool reduces by max (any) and min (all) only; the sum branches compile but are unused.
template void Reduce<bool>(ReduceKind, const ReducePlan&, const bool*, bool*, ThreadPool*);

}  // namespace cleave::kernels::cpu
