// Lane-parallel reductions shared by the CPU kernels (kernels/cpu/).
// `for (i) s += x[i]` cannot be vectorised without reassociating floating-point addition,
// which the compiler will not do on its own. Keeping independent partial results per lane
// makes that reassociation explicit: each result is a fixed function of the input, the
// same for every thread count. float and double use GCC 32-byte vector types, which both
// the AVX2 and the AVX-512 clones compile to packed instructions (the auto-vectoriser
// leaves a NaN-aware max as one branch per element); other types use plain lane arrays.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

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

namespace lanes {
typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef double D4 __attribute__((vector_size(32)));

// Vectors are filled through out-parameters, not returned, so no vector crosses a call
// boundary whose ABI would differ between clones (everything here is inlined anyway).
template <typename V, typename T>
CLEAVE_ALWAYS_INLINE void Load(V* v, const T* p) {
  std::memcpy(v, p, sizeof(V));
}
template <typename V, typename T>
CLEAVE_ALWAYS_INLINE void Splat(V* v, T s) {
  for (size_t j = 0; j < sizeof(V) / sizeof(T); ++j) (*v)[j] = s;
}
// Four doubles from x[0..3] (float or double).
template <typename T>
CLEAVE_ALWAYS_INLINE void LoadD4(D4* v, const T* x) {
  if constexpr (std::is_same_v<T, float>) {
    F4 f;
    Load(&f, x);
    *v = __builtin_convertvector(f, D4);
  } else {
    Load(v, x);
  }
}
template <typename T>
constexpr bool kVectorFloat = std::is_same_v<T, float> || std::is_same_v<T, double>;
}  // namespace lanes

// Max and min that propagate NaN (as numpy's do): once a NaN is seen it stays. The
// conditions are combined with `|`, not `||`, so no branch is needed.
template <typename T>
CLEAVE_ALWAYS_INLINE T MaxNan(T acc, T v) {
  return ((v > acc) | (v != v)) ? v : acc;
}
template <typename T>
CLEAVE_ALWAYS_INLINE T MinNan(T acc, T v) {
  return ((v < acc) | (v != v)) ? v : acc;
}

// sum_i x[i] accumulated in Acc.
template <typename Acc, typename T>
CLEAVE_ALWAYS_INLINE Acc LaneSum(const T* x, int64_t n) {
  int64_t i = 0;
  Acc s = 0;
  if constexpr (std::is_same_v<Acc, double> && lanes::kVectorFloat<T>) {
    lanes::D4 a[4] = {}, v;
    for (; i + 16 <= n; i += 16)
      for (int k = 0; k < 4; ++k) {
        lanes::LoadD4(&v, x + i + 4 * k);
        a[k] += v;
      }
    a[0] += a[1];
    a[2] += a[3];
    a[0] += a[2];
    for (int j = 0; j < 4; ++j) s += a[0][j];
  } else {
    Acc acc[kLanes] = {};
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] += static_cast<Acc>(x[i + j]);
    for (int j = 0; j < kLanes; ++j) s += acc[j];
  }
  for (; i < n; ++i) s += static_cast<Acc>(x[i]);
  return s;
}

// sum_i (x[i] - center)^2 accumulated in double, for float or double x.
template <typename T>
CLEAVE_ALWAYS_INLINE double LaneSumSquares(const T* x, int64_t n, double center) {
  int64_t i = 0;
  double s = 0;
  lanes::D4 c, a[4] = {}, v;
  lanes::Splat(&c, center);
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) {
      lanes::LoadD4(&v, x + i + 4 * k);
      v -= c;
      a[k] += v * v;
    }
  a[0] += a[1];
  a[2] += a[3];
  a[0] += a[2];
  for (int j = 0; j < 4; ++j) s += a[0][j];
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - center;
    s += d * d;
  }
  return s;
}

// max_i x[i] and min_i x[i] (NaN if any is NaN), starting from `init`.
template <bool kMax, typename T>
CLEAVE_ALWAYS_INLINE T LaneExtreme(const T* x, int64_t n, T init) {
  auto pick = [](T a, T v) { return kMax ? MaxNan(a, v) : MinNan(a, v); };
  int64_t i = 0;
  T m = init;
  if constexpr (lanes::kVectorFloat<T>) {
    using V = std::conditional_t<std::is_same_v<T, float>, lanes::F8, lanes::D4>;
    constexpr int kN = sizeof(V) / sizeof(T);
    V a0, a1, v, w;
    lanes::Splat(&a0, init);
    a1 = a0;
    for (; i + 2 * kN <= n; i += 2 * kN) {
      lanes::Load(&v, x + i);
      lanes::Load(&w, x + i + kN);
      a0 = ((kMax ? v > a0 : v < a0) | (v != v)) ? v : a0;
      a1 = ((kMax ? w > a1 : w < a1) | (w != w)) ? w : a1;
    }
    for (int j = 0; j < kN; ++j) m = pick(pick(m, a0[j]), a1[j]);
  } else {
    T acc[kLanes];
    for (int j = 0; j < kLanes; ++j) acc[j] = init;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] = pick(acc[j], x[i + j]);
    for (int j = 0; j < kLanes; ++j) m = pick(m, acc[j]);
  }
  for (; i < n; ++i) m = pick(m, x[i]);
  return m;
}

template <typename T>
CLEAVE_ALWAYS_INLINE T LaneMax(const T* x, int64_t n, T init) {
  return LaneExtreme<true>(x, n, init);
}
template <typename T>
CLEAVE_ALWAYS_INLINE T LaneMin(const T* x, int64_t n, T init) {
  return LaneExtreme<false>(x, n, init);
}

}  // namespace cleave::kernels::cpu
