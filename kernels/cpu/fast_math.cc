// Vectorisable fp32 exp, tanh, sigmoid, erf, GELU and the GELU derivative (kernels/).
// Every function is straight-line arithmetic with selects instead of branches, so each
// loop vectorises; target_clones builds AVX-512, AVX2 and baseline copies, picked when
// the library loads (unless the whole build already targets AVX2 or newer). The AVX
// copies may fuse a * b + c into one FMA, so the last bit can differ between machines.
#include "kernels/cpu/fast_math.h"

#include <bit>
#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__AVX2__) && \
    !defined(__SANITIZE_ADDRESS__)
#define CLEAVE_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLEAVE_SIMD_CLONES
#endif

namespace cleave::kernels::cpu {
namespace {

// exp(x) by range reduction: x = n ln2 + r with |r| <= ln2/2, exp(r) from the Cephes
// degree-7 polynomial (max error about 1 ulp), then scaled by 2^n. The scaling is split
// in two factors 2^(n/2) and 2^(n - n/2) so that results down to the subnormal range
// (n as low as -151) come out right, and the clamp bounds are chosen so that the scaling
// itself overflows to inf above ln(FLT_MAX) and underflows to 0 below ln(2^-150): no
// selects are needed afterwards. NaN passes through the clamps and the arithmetic.
inline float ExpCore(float x) {
  constexpr float kHi = 88.8f, kLo = -105.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  // ln2 split in a head with few mantissa bits (n * head is exact) and a tail.
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds v to an integer for |v| < 2^22 and leaves that integer in
  // the low mantissa bits, read back as an int without a float -> int conversion.
  constexpr float kRound = 12582912.0f;
  float xc = x > kHi ? kHi : x;  // min/max that keep NaN
  xc = xc < kLo ? kLo : xc;
  float t = xc * kLog2e + kRound;
  float fn = t - kRound;
  int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  float r = xc - fn * kLn2Hi;
  r = r - fn * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * (r * r) + r + 1.0f;
  int32_t n1 = n >> 1, n2 = n - n1;  // arithmetic shift: floor(n / 2)
  y = y * std::bit_cast<float>((n1 + 127) << 23);
  return y * std::bit_cast<float>((n2 + 127) << 23);
}

// tanh: the Cephes odd polynomial below |x| = 0.625, where 1 - 2/(e^2x + 1) would lose
// relative accuracy to cancellation; that formula above it (exact to float at |x| >= 9).
inline float TanhCore(float x) {
  float ax = std::fabs(x);
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = p * z * x + x;
  float e = ExpCore(2.0f * (ax < 9.0f ? ax : 9.0f));
  float big = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  return ax < 0.625f ? small : (x == x ? big : x);
}

// erfc(z) for z >= 0: the Chebyshev-fitted form of Numerical Recipes (erfcc), fractional
// error below 1.2e-7 over the whole range; float evaluation adds a few 1e-7 relative.
inline float ErfcNonNegative(float z) {
  float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * ExpCore(p - z * z);
}

// erf(x) for |x| < 0.5 from its Maclaurin series 2/sqrt(pi) sum (-1)^k x^(2k+1) /
// (k! (2k+1)), truncated after x^13 (the next term is below 5e-10 there). This keeps
// relative accuracy near 0, where 1 - erfc would cancel.
inline float ErfSmall(float x) {
  float z = x * x;
  float p = 1.0f / 9360.0f;
  p = p * z - 1.0f / 1320.0f;
  p = p * z + 1.0f / 216.0f;
  p = p * z - 1.0f / 42.0f;
  p = p * z + 0.1f;
  p = p * z - 1.0f / 3.0f;
  p = p * z + 1.0f;
  return 1.1283791670955126f * x * p;  // 2/sqrt(pi)
}

inline float ErfCore(float x) {
  float ax = std::fabs(x);
  // erf is 1 in float beyond |x| = 4 (erfc(4) = 1.5e-8 < half an ulp of 1).
  float big = std::copysign(1.0f - ErfcNonNegative(ax < 4.0f ? ax : 4.0f), x);
  return ax < 0.5f ? ErfSmall(x) : (x == x ? big : x);
}

inline float GeluCore(float x) {
  constexpr float kSqrtHalf = 0.70710678118654752f;
  float u = x * kSqrtHalf;
  float au = std::fabs(u);
  // Below u = -9 the result is under 3e-36 in size: return 0 there rather than compute
  // through subnormal intermediates, which are slow on x86 and worth nothing. The clamp
  // on x keeps -inf * 0 from making a NaN.
  float ec = ErfcNonNegative(au < 9.0f ? au : 9.0f);
  // 1 + erf(u) = 2 - erfc(u) for u >= 0 and erfc(|u|) for u < 0.
  float one_plus_erf = x >= 0.0f ? 2.0f - ec : (au < 9.0f ? ec : 0.0f);
  one_plus_erf = au < 0.5f ? 1.0f + ErfSmall(u) : one_plus_erf;
  float xc = x > -20.0f ? x : -20.0f;
  return x == x ? 0.5f * xc * one_plus_erf : x;
}

inline float GeluTanhCore(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  // Below x = -20 the result is 0 in float; clamping keeps -inf / inf from making a NaN.
  float xc = x > -20.0f ? x : -20.0f;
  float u = kSqrt2OverPi * (xc + 0.044715f * xc * xc * xc);
  // 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): no cancellation for negative u.
  return x == x ? xc / (1.0f + ExpCore(-2.0f * u)) : x;
}

// gelu'(x) = Phi(x) + x phi(x). Phi is 0.5 (1 + erf(x / sqrt 2)) computed as GeluCore does;
// the x phi(x) term vanishes below float precision long before |x| = 20, where x is clamped
// so that inf * 0 cannot make a NaN.
inline float GeluDerivativeCore(float x) {
  constexpr float kSqrtHalf = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
  float u = x * kSqrtHalf;
  float au = std::fabs(u);
  float ec = ErfcNonNegative(au < 9.0f ? au : 9.0f);
  float one_plus_erf = x >= 0.0f ? 2.0f - ec : (au < 9.0f ? ec : 0.0f);
  one_plus_erf = au < 0.5f ? 1.0f + ErfSmall(u) : one_plus_erf;
  float xc = x > -20.0f ? x : -20.0f;
  xc = xc < 20.0f ? xc : 20.0f;
  float pdf = kInvSqrt2Pi * ExpCore(-0.5f * xc * xc);
  return x == x ? 0.5f * one_plus_erf + xc * pdf : x;
}

// d/dx of x sigmoid(2u), u = sqrt(2/pi) (x + c x^3): p + 2 x p (1 - p) u'(x), p = sigmoid(2u).
// Beyond |x| = 20 the derivative is 0 or 1 in float; the clamp keeps inf out of x. exp(-2u)
// is capped at exp(80) (finite), so 1 - p = exp(-2u) p never becomes inf * 0.
inline float GeluTanhDerivativeCore(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286536f, kC = 0.044715f;
  float xc = x > -20.0f ? x : -20.0f;
  xc = xc < 20.0f ? xc : 20.0f;
  float x2 = xc * xc;
  float u = kSqrt2OverPi * (xc + kC * x2 * xc);
  float a = -2.0f * u;
  float e = ExpCore(a < 80.0f ? a : 80.0f);
  float p = 1.0f / (1.0f + e);
  float q = e * p;  // 1 - p without cancellation
  float du = kSqrt2OverPi * (1.0f + 3.0f * kC * x2);
  return x == x ? p + 2.0f * xc * p * q * du : x;
}

}  // namespace

CLEAVE_SIMD_CLONES void GeluGradF32(const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluDerivativeCore(x[i]);
}

CLEAVE_SIMD_CLONES void GeluTanhGradF32(const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * GeluTanhDerivativeCore(x[i]);
}

CLEAVE_SIMD_CLONES void ExpF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ExpCore(x[i]);
}

CLEAVE_SIMD_CLONES void TanhF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = TanhCore(x[i]);
}

CLEAVE_SIMD_CLONES void SigmoidF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + ExpCore(-x[i]));
}

CLEAVE_SIMD_CLONES void ErfF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = ErfCore(x[i]);
}

CLEAVE_SIMD_CLONES void GeluF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = GeluCore(x[i]);
}

CLEAVE_SIMD_CLONES void GeluTanhF32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = GeluTanhCore(x[i]);
}

}  // namespace cleave::kernels::cpu
