// Lane-parallel reductions shared by the CPU kernels (kernels/cpu/).
// `for (i) s += x[i]` cannot be vectorised without reassociating floating-point addition,
// which the compiler will not do on its own. Keeping kLanes independent partial results
// makes that reassociation explicit: the loops vectorise, and each result is still a
// fixed function of the input, the same for every thread count.
#pragma once

#include <cstdint>

// Builds a function for AVX-512, AVX2 and baseline x86-64 and picks one at load time.
// (Not under ASan, whose instrumentation does not mix with ifunc resolvers.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define CLEAVE_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLEAVE_SIMD_CLONES
#endif

#define CLEAVE_ALWAYS_INLINE [[gnu::always_inline]] inline

namespace cleave::kernels::cpu {

constexpr int kLanes = 16;

// sum_i x[i] accumulated in Acc.
template <typename Acc, typename T>
CLEAVE_ALWAYS_INLINE Acc LaneSum(const T* x, int64_t n) {
  Acc acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<Acc>(x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += static_cast<Acc>(x[i + j]);
  Acc s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// sum_i (x[i] - center)^2 accumulated in Acc.
template <typename Acc, typename T>
CLEAVE_ALWAYS_INLINE Acc LaneSumSquares(const T* x, int64_t n, Acc center) {
  Acc acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      Acc d = static_cast<Acc>(x[i + j]) - center;
      acc[j] += d * d;
    }
  for (int j = 0; i + j < n; ++j) {
    Acc d = static_cast<Acc>(x[i + j]) - center;
    acc[j] += d * d;
  }
  Acc s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// Max and min that propagate NaN (as numpy's do): once a NaN is seen it stays. The
// conditions are combined with `|`, not `||`: a short-circuit turns into a branch per
// element and stops the loops around these from vectorising.
template <typename T>
CLEAVE_ALWAYS_INLINE T MaxNan(T acc, T v) {
  return ((v > acc) | (v != v)) ? v : acc;
}
template <typename T>
CLEAVE_ALWAYS_INLINE T MinNan(T acc, T v) {
  return ((v < acc) | (v != v)) ? v : acc;
}

// max_i x[i] (NaN if any is NaN), starting from `init`.
template <typename T>
CLEAVE_ALWAYS_INLINE T LaneMax(const T* x, int64_t n, T init) {
  T acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = MaxNan(acc[j], x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] = MaxNan(acc[j], x[i + j]);
  T m = init;
  for (int j = 0; j < kLanes; ++j) m = MaxNan(m, acc[j]);
  return m;
}

template <typename T>
CLEAVE_ALWAYS_INLINE T LaneMin(const T* x, int64_t n, T init) {
  T acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = MinNan(acc[j], x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] = MinNan(acc[j], x[i + j]);
  T m = init;
  for (int j = 0; j < kLanes; ++j) m = MinNan(m, acc[j]);
  return m;
}

}  // namespace cleave::kernels::cpu
