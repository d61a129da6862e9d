// Cast between element types on the CPU (kernels/).
// Conversions follow the ONNX Cast rules: float -> float rounds to nearest even, float
// -> integer truncates toward zero (saturating here, where ONNX leaves it undefined, and
// NaN -> 0), integer -> integer wraps, anything -> bool tests != 0, bool -> number is 0/1.
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "base/status.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/lanes.h"
#include "kernels/cpu/type_dispatch.h"

namespace cleave::kernels::cpu {

namespace {

// 16-bit float storage types; their values convert through float.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename Fn>
bool VisitCastType(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kBool: fn(TypeTag<bool>{}); return true;
    case DataType::kFloat16: fn(TypeTag<Half>{}); return true;
    case DataType::kBFloat16: fn(TypeTag<BFloat16>{}); return true;
    default: return VisitNumeric(t, fn);
  }
}

// double -> float rounding to odd: the float nearest below in magnitude, with its last
// mantissa bit forced to 1 when the conversion was inexact. Rounding that result to a
// type with at least 2 fewer mantissa bits (f16: 11, bf16: 8, float: 24) gives the same
// answer as rounding the double directly, so f64 -> f16/bf16 rounds only once.
float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f) || static_cast<double>(f) == d) return f;
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) u -= 1;  // step back toward zero
  return std::bit_cast<float>(u | 1u);
}

// Float -> integer truncating toward zero, saturating at the type's range; NaN gives 0.
template <typename TI, typename TF>
TI FloatToInt(TF v) {
  using L = std::numeric_limits<TI>;
  if (v != v) return TI(0);
  if (v <= static_cast<TF>(L::lowest())) return L::lowest();
  if (v >= static_cast<TF>(L::max())) return L::max();
  return static_cast<TI>(v);
}

// The source value as a plain C++ number: 16-bit floats widen to float, bool stays bool.
template <typename From>
auto Widen(From v) {
  if constexpr (std::is_same_v<From, Half>) return HalfToFloat(v.bits);
  else if constexpr (std::is_same_v<From, BFloat16>) return BFloat16ToFloat(v.bits);
  else return v;
}

template <typename To, typename From>
To Convert(From from) {
  auto v = Widen(from);
  using V = decltype(v);
  if constexpr (std::is_same_v<To, bool>) {
    return v != V(0);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    // Through float, rounding once: floats are already float; everything else goes
    // through double (exact for integers up to 2^53) and round-to-odd.
    float f;
    if constexpr (std::is_same_v<V, float>) f = v;
    else f = RoundToOddFloat(static_cast<double>(v));
    if constexpr (std::is_same_v<To, Half>) return Half{FloatToHalf(f)};
    else return BFloat16{FloatToBFloat16(f)};
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<V>) {
    return FloatToInt<To>(v);
  } else {
    return static_cast<To>(v);  // int -> int wraps; int/float -> float rounds to nearest
  }
}

// fp16 <-> float32 eight at a time with the F16C instructions, where the CPU has them (every
// x86-64 CPU with AVX2 does): the same values as the scalar conversions (exact one way, rounded
// to nearest even the other; a NaN stays a NaN, its payload kept as numpy keeps it), which
// finish the tail.
#if defined(__x86_64__)
bool HasF16c() {
  static const bool has = [] {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX);
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = HalfToFloat(x[i]);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16c(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) y[i] = FloatToHalf(x[i]);
}
#else
bool HasF16c() { return false; }
void HalfToFloatF16c(const uint16_t*, float*, int64_t) {}
void FloatToHalfF16c(const float*, uint16_t*, int64_t) {}
#endif

// bf16 <-> float32 sixteen at a time, in GCC vector types built for each vector width
// (lanes.h): the same bits as the scalar conversions (the widening is exact; the narrowing
// rounds to nearest even, a NaN quieted as FloatToBFloat16 quiets it), which finish the tail.
typedef uint16_t Bf16x16 __attribute__((vector_size(32)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));

CLEAVE_SIMD_CLONES void Bf16ToFloatBulk(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Bf16x16 h;
    std::memcpy(&h, x + i, sizeof(h));
    const U32x16 u = __builtin_convertvector(h, U32x16) << 16;
    std::memcpy(y + i, &u, sizeof(u));
  }
  for (; i < n; ++i) y[i] = BFloat16ToFloat(x[i]);
}

CLEAVE_SIMD_CLONES void FloatToBf16Bulk(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    U32x16 u;
    std::memcpy(&u, x + i, sizeof(u));
    const U32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    const U32x16 r = (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
    const Bf16x16 h = __builtin_convertvector(r, Bf16x16);
    std::memcpy(y + i, &h, sizeof(h));
  }
  for (; i < n; ++i) y[i] = FloatToBFloat16(x[i]);
}

template <typename To, typename From>
void CastTyped(const TensorView& x, const TensorView& y, ThreadPool* pool) {
  const From* xp = x.as<const From>();
  To* yp = y.as<To>();
  ParallelFor(pool, x.numel(), kCheapGrain, [&](int64_t b, int64_t e) {
    if constexpr (std::is_same_v<From, Half> && std::is_same_v<To, float>) {
      if (HasF16c()) return HalfToFloatF16c(reinterpret_cast<const uint16_t*>(xp) + b, yp + b, e - b);
    } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, Half>) {
      if (HasF16c()) return FloatToHalfF16c(xp + b, reinterpret_cast<uint16_t*>(yp) + b, e - b);
    } else if constexpr (std::is_same_v<From, BFloat16> && std::is_same_v<To, float>) {
      return Bf16ToFloatBulk(reinterpret_cast<const uint16_t*>(xp) + b, yp + b, e - b);
    } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, BFloat16>) {
      return FloatToBf16Bulk(xp + b, reinterpret_cast<uint16_t*>(yp) + b, e - b);
    }
    for (int64_t i = b; i < e; ++i) yp[i] = Convert<To>(xp[i]);
  });
}

}  // namespace

bool CastSupports(DataType from, DataType to) {
  auto ok = [](DataType t) { return VisitCastType(t, [](auto) {}); };
  return ok(from) && ok(to);
}

void Cast(const TensorView& x, const TensorView& y, ThreadPool* pool) {
  CLEAVE_CHECK(CastSupports(x.dtype, y.dtype) && x.numel() == y.numel());
  if (x.dtype == y.dtype) {
    if (x.data != y.data && x.nbytes()) std::memcpy(y.data, x.data, x.nbytes());
    return;
  }
  VisitCastType(x.dtype, [&]<typename From>(TypeTag<From>) {
    VisitCastType(y.dtype, [&]<typename To>(TypeTag<To>) { CastTyped<To, From>(x, y, pool); });
  });
}

}  // namespace cleave::kernels::cpu
