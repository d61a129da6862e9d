// CUDA elementwise kernels (kernels/cuda/): binary ops with broadcasting, unary ops, Cast and
// the GELU gradient, each templated over the storage type and computing in fp32. Same-shape
// maps read and write 16 bytes per access (8 bf16 values) where the pointers are aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kernels.h"
#include "kernels/philox.h"

namespace cleave::kernels::cuda {

__global__ void AddF32Kernel(const float* a, const float* b, float* c, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    c[i] = a[i] + b[i];
}

void AddF32(const float* a, const float* b, float* c, int64_t n, void* stream) {
  if (n == 0) return;
  AddF32Kernel<<<Blocks(n), kThreads, 0, Stream(stream)>>>(a, b, c, n);
}

namespace {

__device__ __forceinline__ float ApplyBinary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    // NaN propagates, as on the CPU (fmaxf and fminf would drop it).
    case BinaryOp::kMax: return a != a || b != b ? a + b : fmaxf(a, b);
    case BinaryOp::kMin: return a != a || b != b ? a + b : fminf(a, b);
    case BinaryOp::kPow: return powf(a, b);
    case BinaryOp::kFmod: return fmodf(a, b);
    case BinaryOp::kPRelu: return a < 0.f ? a * b : a;
    case BinaryOp::kMod: {
      const float r = fmodf(a, b);
      return r != 0.f && ((r < 0.f) != (b < 0.f)) ? r + b : r;
    }
    default: return 0.f;  // the integer ops (not offered for floats)
  }
}

// Phi(x) as 0.5 erfc(-x / sqrt 2): 1 + erf(x / sqrt 2) would cancel for x below about -3.
__device__ __forceinline__ float Phi(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
__device__ __forceinline__ float GeluExact(float x) { return x * Phi(x); }
__device__ __forceinline__ float GeluTanh(float x) {
  const float k = 0.79788456080286536f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// log(1 + e^x) without overflow.
__device__ __forceinline__ float Softplus(float x) { return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x)); }

__device__ __forceinline__ float ApplyUnary(UnaryOp op, float x, const UnaryParams& p = {}) {
  switch (op) {
    case UnaryOp::kTan: return tanf(x);
    case UnaryOp::kAsin: return asinf(x);
    case UnaryOp::kAcos: return acosf(x);
    case UnaryOp::kAtan: return atanf(x);
    case UnaryOp::kSinh: return sinhf(x);
    case UnaryOp::kCosh: return coshf(x);
    case UnaryOp::kAsinh: return asinhf(x);
    case UnaryOp::kAcosh: return acoshf(x);
    case UnaryOp::kAtanh: return atanhf(x);
    case UnaryOp::kSoftplus: return Softplus(x);
    case UnaryOp::kSoftsign: return x / (1.f + fabsf(x));
    case UnaryOp::kMish: return x * tanhf(Softplus(x));
    case UnaryOp::kFloor: return floorf(x);
    case UnaryOp::kCeil: return ceilf(x);
    case UnaryOp::kRound: return rintf(x);  // halves to even under the default rounding mode
    case UnaryOp::kSign: return x > 0.f ? 1.f : x < 0.f ? -1.f : x;  // keeps 0 and NaN
    case UnaryOp::kLeakyRelu: return x >= 0.f ? x : p.alpha * x;
    case UnaryOp::kElu: return x >= 0.f ? x : p.alpha * expm1f(x);
    case UnaryOp::kSelu: return p.gamma * (x > 0.f ? x : p.alpha * expm1f(x));
    case UnaryOp::kCelu: return x > 0.f ? x : p.alpha * expm1f(x / p.alpha);
    case UnaryOp::kHardSigmoid: return fmaxf(0.f, fminf(1.f, p.alpha * x + p.beta));
    case UnaryOp::kHardSwish: return x * fmaxf(0.f, fminf(1.f, x / 6.f + 0.5f));
    case UnaryOp::kThresholdedRelu: return x > p.alpha ? x : 0.f;
    case UnaryOp::kIdentity: return x;
    case UnaryOp::kRelu: return x > 0.f ? x : 0.f;
    case UnaryOp::kGelu: return GeluExact(x);
    case UnaryOp::kGeluTanh: return GeluTanh(x);
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return logf(x);
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kSigmoid: return 1.f / (1.f + expf(-x));
    case UnaryOp::kErf: return erff(x);
    case UnaryOp::kReciprocal: return 1.f / x;
    case UnaryOp::kAbs: return fabsf(x);
    case UnaryOp::kSin: return sinf(x);
    case UnaryOp::kCos: return cosf(x);
  }
  return 0.f;
}

// The elementwise functions, per storage type.
template <typename T>
struct BinaryFn {
  BinaryOp op;
  __device__ T operator()(T a, T b) const { return FromFloat<T>(ApplyBinary(op, ToFloat(a), ToFloat(b))); }
};
template <typename T>
struct UnaryFn {
  UnaryOp op;
  UnaryParams params;
  __device__ T operator()(T x) const { return FromFloat<T>(ApplyUnary(op, ToFloat(x), params)); }
};
template <typename T>
struct ClipFn {
  float lo, hi;
  __device__ T operator()(T x) const {
    const float v = ToFloat(x);
    float r = v < lo ? lo : v;
    r = r > hi ? hi : r;
    return FromFloat<T>(r);
  }
};
// Cast between any two of the element types, as the CPU's Cast (kernels/cpu/cast.cc) converts:
// float -> integer truncates toward zero, saturating, NaN -> 0; integer -> integer wraps;
// anything -> bool tests != 0; bool -> number is 0 / 1; integer -> bf16 / fp16 goes through
// double and float rounded to odd, so it rounds once (float64 -> bf16 / fp16 likewise).
template <typename T>
constexpr bool kFloatStorage =
    std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

__device__ __forceinline__ float RoundToOddFloat(double d) {
  const float f = static_cast<float>(d);
  if (f != f || fabsf(f) == INFINITY || static_cast<double>(f) == d) return f;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if (fabs(static_cast<double>(f)) > fabs(d)) u -= 1;  // step back toward zero
  u |= 1u;
  float odd;
  memcpy(&odd, &u, sizeof odd);
  return odd;
}

// An integer type's range, as constants the device code may read.
template <typename T>
struct IntRange {
  static constexpr T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
};

// v is float or double.
template <typename To, typename F>
__device__ __forceinline__ To FloatToInt(F v) {
  constexpr To lo = IntRange<To>::lo, hi = IntRange<To>::hi;
  if (v != v) return To(0);
  if (v <= static_cast<F>(lo)) return lo;
  if (v >= static_cast<F>(hi)) return hi;
  return static_cast<To>(v);
}

template <typename From, typename To>
struct ConvertFn {
  __device__ To operator()(From x) const {
    if constexpr (std::is_same_v<To, bool>) {
      if constexpr (kFloatStorage<From>) return ToFloat(x) != 0.f;
      else return x != From(0);
    } else if constexpr (kFloatStorage<To>) {
      if constexpr (kFloatStorage<From>) return FromFloat<To>(ToFloat(x));
      else if constexpr (std::is_same_v<From, bool>) return FromFloat<To>(x ? 1.f : 0.f);
      else if constexpr (std::is_same_v<To, float>) return static_cast<float>(x);  // rounds to nearest
      else return FromFloat<To>(RoundToOddFloat(static_cast<double>(x)));
    } else if constexpr (std::is_same_v<To, double>) {
      if constexpr (kFloatStorage<From>) return static_cast<double>(ToFloat(x));
      else if constexpr (std::is_same_v<From, bool>) return x ? 1.0 : 0.0;
      else return static_cast<double>(x);
    } else if constexpr (kFloatStorage<From>) {
      return FloatToInt<To>(ToFloat(x));
    } else if constexpr (std::is_same_v<From, double>) {
      return FloatToInt<To>(x);
    } else {
      return static_cast<To>(x);  // integers wrap; bool is 0 / 1
    }
  }
};

template <typename T>
struct GeluGradFn {
  bool tanh_form;
  __device__ T operator()(T dy, T x) const {
    const float v = ToFloat(x);
    float d;
    if (tanh_form) {
      const float k = 0.79788456080286536f;
      const float u = k * (v + 0.044715f * v * v * v);
      const float t = tanhf(u);
      d = 0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * v * v);
    } else {
      // d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
      d = Phi(v) + v * 0.39894228040143268f * expf(-0.5f * v * v);
    }
    return FromFloat<T>(ToFloat(dy) * d);
  }
};

// silu(gate) * up, as the exported (gate * sigmoid(gate)) * up rounds it in float32.
template <typename T>
struct SwiGluFn {
  __device__ T operator()(T gate, T up) const {
    const float g = ToFloat(gate);
    return FromFloat<T>(g * (1.f / (1.f + expf(-g))) * ToFloat(up));
  }
};

// dgate = dy * up * silu'(gate), dup = dy * silu(gate); either output may be null.
template <typename T>
__global__ void SwiGluGradKernel(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToFloat(gate[i]), d = ToFloat(dy[i]);
    const float s = 1.f / (1.f + expf(-g));
    if (dup) dup[i] = FromFloat<T>(d * (g * s));
    if (dgate) dgate[i] = FromFloat<T>(d * ToFloat(up[i]) * (s + g * s * (1.f - s)));
  }
}

// One thread per element of x: its row's offset into the tables, then the element and its
// partner in the other half.
template <typename T>
__global__ void RotaryKernel(RotaryLayout l, bool backward, const T* x, const T* cos, const T* sin, T* y) {
  const int64_t n = l.rows * l.dim, h = l.dim / 2, cs = l.table_col;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = e / l.dim, off = 0;
    const int64_t i = e - r * l.dim;
    for (int k = l.lead_rank - 1; k >= 0; --k) {
      const int64_t d = l.lead_dims[k];
      off += (r % d) * l.table_strides[k];
      r /= d;
    }
    const T* c = cos + off;
    const T* s = sin + off;
    const float xi = ToFloat(x[e]);
    float v;
    if (!backward)
      v = i < h ? xi * ToFloat(c[i * cs]) - ToFloat(x[e + h]) * ToFloat(s[i * cs])
                : xi * ToFloat(c[i * cs]) + ToFloat(x[e - h]) * ToFloat(s[i * cs]);
    else
      v = i < h ? xi * ToFloat(c[i * cs]) + ToFloat(x[e + h]) * ToFloat(s[(i + h) * cs])
                : xi * ToFloat(c[i * cs]) - ToFloat(x[e - h]) * ToFloat(s[(i - h) * cs]);
    y[e] = FromFloat<T>(v);
  }
}

// y[i] = f(x[i]) (Map1) or f(a[i], b[i]) (Map2), P elements per access: the first n / P * P
// elements in whole vectors, the rest one by one. y may be x (an in-place Gelu).
template <int P, typename X, typename Y, typename F>
__global__ void Map1(F f, const X* x, Y* y, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, vecs = n / P;
  for (int64_t i = first; i < vecs; i += step) {
    const Vec<X, P> in = reinterpret_cast<const Vec<X, P>*>(x)[i];
    Vec<Y, P> out;
#pragma unroll
    for (int e = 0; e < P; ++e) out.v[e] = f(in.v[e]);
    reinterpret_cast<Vec<Y, P>*>(y)[i] = out;
  }
  for (int64_t i = vecs * P + first; i < n; i += step) y[i] = f(x[i]);
}
template <int P, typename X, typename Y, typename F>
__global__ void Map2(F f, const X* a, const X* b, Y* y, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x, vecs = n / P;
  for (int64_t i = first; i < vecs; i += step) {
    const Vec<X, P> u = reinterpret_cast<const Vec<X, P>*>(a)[i], w = reinterpret_cast<const Vec<X, P>*>(b)[i];
    Vec<Y, P> out;
#pragma unroll
    for (int e = 0; e < P; ++e) out.v[e] = f(u.v[e], w.v[e]);
    reinterpret_cast<Vec<Y, P>*>(y)[i] = out;
  }
  for (int64_t i = vecs * P + first; i < n; i += step) y[i] = f(a[i], b[i]);
}

// A map in 16-byte accesses where every pointer allows it, else element by element (a view at
// an odd offset).
template <typename X, typename Y, typename F>
int LaunchMap1(F f, const void* x, void* y, int64_t n, cudaStream_t s) {
  constexpr int P = VecWidth(sizeof(X), sizeof(Y));
  if (AlignedTo(x, sizeof(X) * P) && AlignedTo(y, sizeof(Y) * P))
    Map1<P><<<Blocks((n + P - 1) / P), kThreads, 0, s>>>(f, static_cast<const X*>(x), static_cast<Y*>(y), n);
  else
    Map1<1><<<Blocks(n), kThreads, 0, s>>>(f, static_cast<const X*>(x), static_cast<Y*>(y), n);
  return static_cast<int>(cudaGetLastError());
}
template <typename X, typename Y, typename F>
int LaunchMap2(F f, const void* a, const void* b, void* y, int64_t n, cudaStream_t s) {
  constexpr int P = VecWidth(sizeof(X), sizeof(Y));
  if (AlignedTo(a, sizeof(X) * P) && AlignedTo(b, sizeof(X) * P) && AlignedTo(y, sizeof(Y) * P))
    Map2<P><<<Blocks((n + P - 1) / P), kThreads, 0, s>>>(f, static_cast<const X*>(a), static_cast<const X*>(b),
                                                         static_cast<Y*>(y), n);
  else
    Map2<1><<<Blocks(n), kThreads, 0, s>>>(f, static_cast<const X*>(a), static_cast<const X*>(b), static_cast<Y*>(y),
                                           n);
  return static_cast<int>(cudaGetLastError());
}

// A thread per pair of elements (2j, 2j + 1), both draws of Philox counter j, as the CPU draws;
// the keep test on the integers behind the uniforms (DropoutKeepThreshold), with no double
// arithmetic.
template <typename T>
__global__ void DropoutKernel(uint64_t key, uint64_t threshold, float scale, const T* x, T* y, bool* mask,
                              int64_t n) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t m[2];
    PhiloxBitsPair(key, static_cast<uint64_t>(j), &m[0], &m[1]);
    for (int h = 0; h < 2 && 2 * j + h < n; ++h) {
      const int64_t i = 2 * j + h;
      const bool keep = m[h] >= threshold;
      y[i] = keep ? FromFloat<T>(ToFloat(x[i]) * scale) : FromFloat<T>(0.f);
      if (mask) mask[i] = keep;
    }
  }
}

template <typename T>
__global__ void DropoutMaskedKernel(const bool* keep, float scale, const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = keep[i] ? FromFloat<T>(ToFloat(x[i]) * scale) : FromFloat<T>(0.f);
}

// A comparison's operand as it is compared: float storage types as float32, integers and bool
// as themselves.
__device__ __forceinline__ float Num(float x) { return x; }
__device__ __forceinline__ float Num(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float Num(__half x) { return __half2float(x); }
__device__ __forceinline__ int64_t Num(int64_t x) { return x; }
__device__ __forceinline__ int32_t Num(int32_t x) { return x; }
__device__ __forceinline__ bool Num(bool x) { return x; }
__device__ __forceinline__ double Num(double x) { return x; }
__device__ __forceinline__ int32_t Num(int8_t x) { return x; }
__device__ __forceinline__ int32_t Num(int16_t x) { return x; }
__device__ __forceinline__ uint32_t Num(uint8_t x) { return x; }
__device__ __forceinline__ uint32_t Num(uint16_t x) { return x; }
__device__ __forceinline__ uint32_t Num(uint32_t x) { return x; }
__device__ __forceinline__ uint64_t Num(uint64_t x) { return x; }

template <typename T>
struct CompareFn {
  CompareOp op;
  __device__ bool operator()(T a, T b) const {
    const auto u = Num(a), w = Num(b);
    switch (op) {
      case CompareOp::kEqual: return u == w;
      case CompareOp::kLess: return u < w;
      case CompareOp::kGreater: return u > w;
      case CompareOp::kLessOrEqual: return u <= w;
      case CompareOp::kGreaterOrEqual: return u >= w;
      case CompareOp::kAnd: return u && w;
      case CompareOp::kOr: return u || w;
      case CompareOp::kXor: return u != w;
    }
    return false;
  }
};

// Integer arithmetic in an unsigned type at least as wide as int (wrapping, as the CPU's
// WrapAdd and friends; a narrower one would promote to int, whose products can overflow).
template <typename T>
struct IntBinaryFn {
  using U = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
  BinaryOp op;
  __device__ T operator()(T a, T b) const {
    switch (op) {
      case BinaryOp::kAdd: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case BinaryOp::kSub: return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
      case BinaryOp::kMul: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case BinaryOp::kDiv:
        if (b == 0) return 0;
        if constexpr (std::is_signed_v<T>) {
          if (b == -1) return static_cast<T>(U{0} - static_cast<U>(a));  // the most negative value wraps
        }
        return static_cast<T>(a / b);
      case BinaryOp::kMax: return a > b ? a : b;
      case BinaryOp::kMin: return a < b ? a : b;
      case BinaryOp::kMod:
      case BinaryOp::kFmod: {
        if (b == 0) return 0;
        if constexpr (std::is_signed_v<T>) {
          if (b == -1) return 0;  // also MIN % -1, which traps
          const T r = static_cast<T>(a % b);
          return op == BinaryOp::kMod && r != 0 && ((r < 0) != (b < 0)) ? static_cast<T>(r + b) : r;
        } else {
          return static_cast<T>(a % b);
        }
      }
      case BinaryOp::kPRelu:
        if constexpr (std::is_signed_v<T>) {
          if (a < 0) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
        }
        return a;
      case BinaryOp::kBitAnd: return static_cast<T>(a & b);
      case BinaryOp::kBitOr: return static_cast<T>(a | b);
      case BinaryOp::kBitXor: return static_cast<T>(a ^ b);
      case BinaryOp::kShiftLeft:
      case BinaryOp::kShiftRight: {
        using V = std::make_unsigned_t<T>;
        if constexpr (std::is_signed_v<T>) {
          if (b < 0) return 0;
        }
        if (static_cast<uint64_t>(b) >= sizeof(T) * 8) return 0;
        const V v = static_cast<V>(a);
        return static_cast<T>(op == BinaryOp::kShiftLeft ? static_cast<V>(v << b) : static_cast<V>(v >> b));
      }
      case BinaryOp::kPow: return 0;  // not offered (the launcher refuses it)
    }
    return 0;
  }
};

struct NotFn {
  __device__ bool operator()(bool x) const { return !x; }
};

template <typename T>
struct FloatClassFn {
  bool nan, pos, neg;
  __device__ bool operator()(T x) const {
    const float v = ToFloat(x);
    if (nan) return v != v;
    return isinf(v) && (v > 0.f ? pos : neg);
  }
};

// y[i] = f(a[ia], b[ib]) with broadcasting.
template <typename X, typename Y, typename F>
__global__ void Map2Broadcast(F f, const X* a, const X* b, Y* y, int64_t n, Broadcast bc) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, ia = 0, ib = 0;
    for (int d = bc.rank - 1; d >= 0; --d) {
      const int64_t c = rest % bc.out_dims[d];
      rest /= bc.out_dims[d];
      ia += c * bc.a_strides[d];
      ib += c * bc.b_strides[d];
    }
    y[i] = f(a[ia], b[ib]);
  }
}

template <typename X, typename Y, typename F>
int LaunchMap2Any(F f, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc, cudaStream_t s) {
  if (!bc) return LaunchMap2<X, Y>(f, a, b, y, n, s);
  Map2Broadcast<X, Y><<<Blocks(n), kThreads, 0, s>>>(f, static_cast<const X*>(a), static_cast<const X*>(b),
                                                      static_cast<Y*>(y), n, *bc);
  return static_cast<int>(cudaGetLastError());
}

template <typename To>
int ConvertFrom(Elem from, const void* x, void* y, int64_t n, cudaStream_t s) {
  switch (from) {
    case Elem::kF32: return LaunchMap1<float, To>(ConvertFn<float, To>{}, x, y, n, s);
    case Elem::kBf16: return LaunchMap1<__nv_bfloat16, To>(ConvertFn<__nv_bfloat16, To>{}, x, y, n, s);
    case Elem::kF16: return LaunchMap1<__half, To>(ConvertFn<__half, To>{}, x, y, n, s);
    case Elem::kI64: return LaunchMap1<int64_t, To>(ConvertFn<int64_t, To>{}, x, y, n, s);
    case Elem::kI32: return LaunchMap1<int32_t, To>(ConvertFn<int32_t, To>{}, x, y, n, s);
    case Elem::kBool: return LaunchMap1<bool, To>(ConvertFn<bool, To>{}, x, y, n, s);
    case Elem::kF64: return LaunchMap1<double, To>(ConvertFn<double, To>{}, x, y, n, s);
    case Elem::kI8: return LaunchMap1<int8_t, To>(ConvertFn<int8_t, To>{}, x, y, n, s);
    case Elem::kI16: return LaunchMap1<int16_t, To>(ConvertFn<int16_t, To>{}, x, y, n, s);
    case Elem::kU8: return LaunchMap1<uint8_t, To>(ConvertFn<uint8_t, To>{}, x, y, n, s);
    case Elem::kU16: return LaunchMap1<uint16_t, To>(ConvertFn<uint16_t, To>{}, x, y, n, s);
    case Elem::kU32: return LaunchMap1<uint32_t, To>(ConvertFn<uint32_t, To>{}, x, y, n, s);
    case Elem::kU64: return LaunchMap1<uint64_t, To>(ConvertFn<uint64_t, To>{}, x, y, n, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int Binary(BinaryOp op, Dt dt, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  DISPATCH_DT(dt, T, { return LaunchMap2Any<T, T>(BinaryFn<T>{op}, a, b, y, n, bc, s); });
  return static_cast<int>(cudaErrorInvalidValue);
}

int Compare(CompareOp op, Elem t, const void* a, const void* b, bool* y, int64_t n, const Broadcast* bc, void* stream) {
  if (n == 0) return 0;
  const bool logical = op == CompareOp::kAnd || op == CompareOp::kOr || op == CompareOp::kXor;
  if (logical && t != Elem::kBool) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = Stream(stream);
  switch (t) {
    case Elem::kF32: return LaunchMap2Any<float, bool>(CompareFn<float>{op}, a, b, y, n, bc, s);
    case Elem::kBf16: return LaunchMap2Any<__nv_bfloat16, bool>(CompareFn<__nv_bfloat16>{op}, a, b, y, n, bc, s);
    case Elem::kF16: return LaunchMap2Any<__half, bool>(CompareFn<__half>{op}, a, b, y, n, bc, s);
    case Elem::kI64: return LaunchMap2Any<int64_t, bool>(CompareFn<int64_t>{op}, a, b, y, n, bc, s);
    case Elem::kI32: return LaunchMap2Any<int32_t, bool>(CompareFn<int32_t>{op}, a, b, y, n, bc, s);
    case Elem::kBool: return LaunchMap2Any<bool, bool>(CompareFn<bool>{op}, a, b, y, n, bc, s);
    case Elem::kF64: return LaunchMap2Any<double, bool>(CompareFn<double>{op}, a, b, y, n, bc, s);
    case Elem::kI8: return LaunchMap2Any<int8_t, bool>(CompareFn<int8_t>{op}, a, b, y, n, bc, s);
    case Elem::kI16: return LaunchMap2Any<int16_t, bool>(CompareFn<int16_t>{op}, a, b, y, n, bc, s);
    case Elem::kU8: return LaunchMap2Any<uint8_t, bool>(CompareFn<uint8_t>{op}, a, b, y, n, bc, s);
    case Elem::kU16: return LaunchMap2Any<uint16_t, bool>(CompareFn<uint16_t>{op}, a, b, y, n, bc, s);
    case Elem::kU32: return LaunchMap2Any<uint32_t, bool>(CompareFn<uint32_t>{op}, a, b, y, n, bc, s);
    case Elem::kU64: return LaunchMap2Any<uint64_t, bool>(CompareFn<uint64_t>{op}, a, b, y, n, bc, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int IntBinary(BinaryOp op, Elem t, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc,
              void* stream) {
  if (op == BinaryOp::kPow) return static_cast<int>(cudaErrorInvalidValue);
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  switch (t) {
    case Elem::kI64: return LaunchMap2Any<int64_t, int64_t>(IntBinaryFn<int64_t>{op}, a, b, y, n, bc, s);
    case Elem::kI32: return LaunchMap2Any<int32_t, int32_t>(IntBinaryFn<int32_t>{op}, a, b, y, n, bc, s);
    case Elem::kI16: return LaunchMap2Any<int16_t, int16_t>(IntBinaryFn<int16_t>{op}, a, b, y, n, bc, s);
    case Elem::kI8: return LaunchMap2Any<int8_t, int8_t>(IntBinaryFn<int8_t>{op}, a, b, y, n, bc, s);
    case Elem::kU64: return LaunchMap2Any<uint64_t, uint64_t>(IntBinaryFn<uint64_t>{op}, a, b, y, n, bc, s);
    case Elem::kU32: return LaunchMap2Any<uint32_t, uint32_t>(IntBinaryFn<uint32_t>{op}, a, b, y, n, bc, s);
    case Elem::kU16: return LaunchMap2Any<uint16_t, uint16_t>(IntBinaryFn<uint16_t>{op}, a, b, y, n, bc, s);
    case Elem::kU8: return LaunchMap2Any<uint8_t, uint8_t>(IntBinaryFn<uint8_t>{op}, a, b, y, n, bc, s);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}

int Not(const bool* x, bool* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  return LaunchMap1<bool, bool>(NotFn{}, x, y, n, Stream(stream));
}

int FloatClass(Dt dt, const void* x, bool* y, int64_t n, bool nan, bool pos, bool neg, void* stream) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, { return LaunchMap1<T, bool>(FloatClassFn<T>{nan, pos, neg}, x, y, n, Stream(stream)); });
  return static_cast<int>(cudaErrorInvalidValue);
}

int Unary(UnaryOp op, Dt dt, const void* x, void* y, int64_t n, void* stream, UnaryParams params) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, { return LaunchMap1<T, T>(UnaryFn<T>{op, params}, x, y, n, Stream(stream)); });
  return static_cast<int>(cudaErrorInvalidValue);
}

int Clip(Dt dt, const void* x, void* y, int64_t n, float lo, float hi, void* stream) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, { return LaunchMap1<T, T>(ClipFn<T>{lo, hi}, x, y, n, Stream(stream)); });
  return static_cast<int>(cudaErrorInvalidValue);
}

// Dt's values are Elem's first three.
int Cast(Dt from, Dt to, const void* x, void* y, int64_t n, void* stream) {
  return CastElem(static_cast<Elem>(from), static_cast<Elem>(to), x, y, n, stream);
}

int CastElem(Elem from, Elem to, const void* x, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = Stream(stream);
  switch (to) {
    case Elem::kF32: return ConvertFrom<float>(from, x, y, n, s);
    case Elem::kBf16: return ConvertFrom<__nv_bfloat16>(from, x, y, n, s);
    case Elem::kF16: return ConvertFrom<__half>(from, x, y, n, s);
    case Elem::kI64: return ConvertFrom<int64_t>(from, x, y, n, s);
    case Elem::kI32: return ConvertFrom<int32_t>(from, x, y, n, s);
    case Elem::kBool: return ConvertFrom<bool>(from, x, y, n, s);
    case Elem::kF64: return ConvertFrom<double>(from, x, y, n, s);
    case Elem::kI8: return ConvertFrom<int8_t>(from, x, y, n, s);
    case Elem::kI16: return ConvertFrom<int16_t>(from, x, y, n, s);
    case Elem::kU8: return ConvertFrom<uint8_t>(from, x, y, n, s);
    case Elem::kU16: return ConvertFrom<uint16_t>(from, x, y, n, s);
    case Elem::kU32: return ConvertFrom<uint32_t>(from, x, y, n, s);
    case Elem::kU64: return ConvertFrom<uint64_t>(from, x, y, n, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

namespace {

template <typename T>
__global__ void ScaleAddKernel(T* y, float alpha, const T* c, float beta, int64_t rows, int64_t cols,
                               int64_t c_row_step, int64_t c_col_step) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = alpha * ToFloat(y[i]);
    if (c) v += beta * ToFloat(c[i / cols * c_row_step + i % cols * c_col_step]);
    y[i] = FromFloat<T>(v);
  }
}

}  // namespace

int GemmScaleAdd(Dt dt, void* y, float alpha, const void* c, float beta, int64_t rows, int64_t cols, int64_t c_rows,
                 int64_t c_cols, void* stream) {
  if (rows * cols == 0) return 0;
  if (c && ((c_rows != 1 && c_rows != rows) || (c_cols != 1 && c_cols != cols)))
    return static_cast<int>(cudaErrorInvalidValue);
  const int64_t col_step = c_cols == 1 ? 0 : 1, row_step = c_rows == 1 ? 0 : c_cols;
  DISPATCH_DT(dt, T, {
    ScaleAddKernel<T><<<Blocks(rows * cols), kThreads, 0, Stream(stream)>>>(
        static_cast<T*>(y), alpha, static_cast<const T*>(c), beta, rows, cols, row_step, col_step);
  });
  return static_cast<int>(cudaGetLastError());
}

int DropoutKeyed(Dt dt, uint64_t key, float ratio, const void* x, void* y, bool* mask, int64_t n, void* stream) {
  if (n == 0) return 0;
  const double r = static_cast<double>(ratio);
  const float scale = static_cast<float>(1.0 / (1.0 - r));
  const uint64_t threshold = DropoutKeepThreshold(r);
  DISPATCH_DT(dt, T, {
    DropoutKernel<T><<<Blocks((n + 1) / 2), kThreads, 0, Stream(stream)>>>(
        key, threshold, scale, static_cast<const T*>(x), static_cast<T*>(y), mask, n);
  });
  return static_cast<int>(cudaGetLastError());
}

int DropoutMasked(Dt dt, const bool* keep, float ratio, const void* x, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(ratio)));
  DISPATCH_DT(dt, T, {
    DropoutMaskedKernel<T><<<Blocks(n), kThreads, 0, Stream(stream)>>>(keep, scale, static_cast<const T*>(x),
                                                                        static_cast<T*>(y), n);
  });
  return static_cast<int>(cudaGetLastError());
}

int Rotary(Dt dt, const RotaryLayout& l, bool backward, const void* x, const void* cos, const void* sin, void* y,
           void* stream) {
  const int64_t n = l.rows * l.dim;
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, {
    RotaryKernel<T><<<Blocks(n), kThreads, 0, Stream(stream)>>>(l, backward, static_cast<const T*>(x),
                                                                static_cast<const T*>(cos),
                                                                static_cast<const T*>(sin), static_cast<T*>(y));
  });
  return static_cast<int>(cudaGetLastError());
}

int SwiGlu(Dt dt, const void* gate, const void* up, void* y, int64_t n, void* stream) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, { return LaunchMap2<T, T>(SwiGluFn<T>{}, gate, up, y, n, Stream(stream)); });
  return static_cast<int>(cudaErrorInvalidValue);
}

int SwiGluGrad(Dt dt, const void* dy, const void* gate, const void* up, void* dgate, void* dup, int64_t n,
               void* stream) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, {
    SwiGluGradKernel<T><<<Blocks(n), kThreads, 0, Stream(stream)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(dgate),
        static_cast<T*>(dup), n);
  });
  return static_cast<int>(cudaGetLastError());
}

int GeluGrad(Dt dt, const void* dy, const void* x, void* dx, int64_t n, bool tanh_form, void* stream) {
  if (n == 0) return 0;
  DISPATCH_DT(dt, T, { return LaunchMap2<T, T>(GeluGradFn<T>{tanh_form}, dy, x, dx, n, Stream(stream)); });
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace cleave::kernels::cuda
