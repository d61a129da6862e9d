// Unary elementwise kernels and Clip on the CPU (kernels/).
// The float64 path and every non-vectorised op use the std:: functions directly and are
// the reference; the fp32 exp/tanh/erf/sigmoid/GELU paths go through fast_math, which
// tests check against that reference.
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/status.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/type_dispatch.h"

namespace cleave::kernels::cpu {

namespace {

bool IsFloatOnly(UnaryOp op) {
  switch (op) {
    case UnaryOp::kAbs: case UnaryOp::kNeg: case UnaryOp::kRelu: case UnaryOp::kSign: case UnaryOp::kNot:
      return false;
    default:
      return true;
  }
}

bool IsCostly(UnaryOp op) {
  return IsFloatOnly(op) && op != UnaryOp::kReciprocal && op != UnaryOp::kFloor && op != UnaryOp::kCeil &&
         op != UnaryOp::kRound;
}

// y[i] = f(x[i]) over the pool in contiguous blocks.
template <typename T, typename F>
void Map(const TensorView& x, const TensorView& y, int64_t grain, ThreadPool* pool, F f) {
  const T* xp = x.as<T>();
  T* yp = y.as<T>();
  ParallelFor(pool, x.numel(), grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) yp[i] = f(xp[i]);
  });
}

void MapBlocks(const TensorView& x, const TensorView& y, ThreadPool* pool,
               void (*fn)(const float*, float*, int64_t)) {
  const float* xp = x.as<float>();
  float* yp = y.as<float>();
  ParallelFor(pool, x.numel(), kCostlyGrain,
              [&](int64_t b, int64_t e) { fn(xp + b, yp + b, e - b); });
}

// Ops defined for every numeric type. Unsigned types only reach Abs (claimed) and the
// others behave as identity or wrap so that every instantiation is well defined.
template <typename T>
void IntegerOrFloatUnary(UnaryOp op, const TensorView& x, const TensorView& y, ThreadPool* pool) {
  switch (op) {
    case UnaryOp::kAbs:
      if constexpr (std::is_floating_point_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return std::fabs(v); });
      } else if constexpr (std::is_unsigned_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v; });
      } else {
        // The most negative integer maps to itself (wrap-around), as in numpy.
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v < T(0) ? WrapSub(T(0), v) : v; });
      }
      return;
    case UnaryOp::kNeg:
      if constexpr (std::is_floating_point_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return -v; });  // -0 for +0, unlike 0 - v
      } else {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return WrapSub(T(0), v); });
      }
      return;
    case UnaryOp::kRelu:
      if constexpr (std::is_unsigned_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v; });
      } else {
        // `v < 0 ? 0 : v` keeps NaN as NaN, as max(0, x) does in numpy.
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v < T(0) ? T(0) : v; });
      }
      return;
    case UnaryOp::kSign:
      if constexpr (std::is_floating_point_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v > T(0) ? T(1) : v < T(0) ? T(-1) : v; });  // keeps NaN, 0
      } else if constexpr (std::is_unsigned_v<T>) {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v > T(0) ? T(1) : T(0); });
      } else {
        Map<T>(x, y, kCheapGrain, pool, [](T v) { return v > T(0) ? T(1) : v < T(0) ? T(-1) : T(0); });
      }
      return;
    default:
      CLEAVE_CHECK(false && "not an integer unary op");
  }
}

template <typename T>
T GeluReference(T v) {
  // 0.5 v (1 + erf(v / sqrt 2)) written with erfc so negative v keeps relative accuracy.
  return T(0.5) * v * std::erfc(-v * T(0.70710678118654752440));
}

template <typename T>
T GeluTanhReference(T v) {
  const T u = T(0.79788456080286535588) * (v + T(0.044715) * v * v * v);
  return T(0.5) * v * (T(1) + std::tanh(u));
}

// log(1 + exp(v)) without overflow: v + log1p(exp(-v)) for v > 0.
template <typename T>
T Softplus(T v) {
  return v > T(0) ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
}

template <typename T>
void FloatUnary(UnaryOp op, const TensorView& x, const TensorView& y, ThreadPool* pool) {
  const int64_t g = IsCostly(op) ? kCostlyGrain : kCheapGrain;
  switch (op) {
    case UnaryOp::kExp: Map<T>(x, y, g, pool, [](T v) { return std::exp(v); }); return;
    case UnaryOp::kLog: Map<T>(x, y, g, pool, [](T v) { return std::log(v); }); return;
    case UnaryOp::kSqrt: Map<T>(x, y, g, pool, [](T v) { return std::sqrt(v); }); return;
    case UnaryOp::kReciprocal: Map<T>(x, y, g, pool, [](T v) { return T(1) / v; }); return;
    case UnaryOp::kSin: Map<T>(x, y, g, pool, [](T v) { return std::sin(v); }); return;
    case UnaryOp::kCos: Map<T>(x, y, g, pool, [](T v) { return std::cos(v); }); return;
    case UnaryOp::kTanh: Map<T>(x, y, g, pool, [](T v) { return std::tanh(v); }); return;
    case UnaryOp::kErf: Map<T>(x, y, g, pool, [](T v) { return std::erf(v); }); return;
    case UnaryOp::kSigmoid:
      Map<T>(x, y, g, pool, [](T v) { return T(1) / (T(1) + std::exp(-v)); });
      return;
    case UnaryOp::kTan: Map<T>(x, y, g, pool, [](T v) { return std::tan(v); }); return;
    case UnaryOp::kAsin: Map<T>(x, y, g, pool, [](T v) { return std::asin(v); }); return;
    case UnaryOp::kAcos: Map<T>(x, y, g, pool, [](T v) { return std::acos(v); }); return;
    case UnaryOp::kAtan: Map<T>(x, y, g, pool, [](T v) { return std::atan(v); }); return;
    case UnaryOp::kSinh: Map<T>(x, y, g, pool, [](T v) { return std::sinh(v); }); return;
    case UnaryOp::kCosh: Map<T>(x, y, g, pool, [](T v) { return std::cosh(v); }); return;
    case UnaryOp::kAsinh: Map<T>(x, y, g, pool, [](T v) { return std::asinh(v); }); return;
    case UnaryOp::kAcosh: Map<T>(x, y, g, pool, [](T v) { return std::acosh(v); }); return;
    case UnaryOp::kAtanh: Map<T>(x, y, g, pool, [](T v) { return std::atanh(v); }); return;
    case UnaryOp::kSoftplus: Map<T>(x, y, g, pool, Softplus<T>); return;
    case UnaryOp::kSoftsign: Map<T>(x, y, g, pool, [](T v) { return v / (T(1) + std::fabs(v)); }); return;
    case UnaryOp::kMish: Map<T>(x, y, g, pool, [](T v) { return v * std::tanh(Softplus(v)); }); return;
    case UnaryOp::kFloor: Map<T>(x, y, g, pool, [](T v) { return std::floor(v); }); return;
    case UnaryOp::kCeil: Map<T>(x, y, g, pool, [](T v) { return std::ceil(v); }); return;
    // nearbyint under the default rounding mode: halves to even, as ONNX Round asks.
    case UnaryOp::kRound: Map<T>(x, y, g, pool, [](T v) { return std::nearbyint(v); }); return;
    case UnaryOp::kGelu: Map<T>(x, y, g, pool, GeluReference<T>); return;
    case UnaryOp::kGeluTanh: Map<T>(x, y, g, pool, GeluTanhReference<T>); return;
    default: IntegerOrFloatUnary<T>(op, x, y, pool); return;
  }
}

// The vectorised fp32 versions; nullptr where the reference loop is used.
using BlockFn = void (*)(const float*, float*, int64_t);
BlockFn FastF32(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: return ExpF32;
    case UnaryOp::kTanh: return TanhF32;
    case UnaryOp::kErf: return ErfF32;
    case UnaryOp::kSigmoid: return SigmoidF32;
    case UnaryOp::kGelu: return GeluF32;
    case UnaryOp::kGeluTanh: return GeluTanhF32;
    default: return nullptr;
  }
}

}  // namespace

bool UnarySupports(UnaryOp op, DataType t) {
  if (op == UnaryOp::kNot) return t == DataType::kBool;
  if (t == DataType::kFloat32 || t == DataType::kFloat64) return true;
  if (IsFloatOnly(op)) return false;
  bool is_int = VisitInteger(t, [](auto) {});
  bool is_signed = t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kInt32 ||
                   t == DataType::kInt64;
  return op == UnaryOp::kAbs || op == UnaryOp::kSign ? is_int : is_signed;
}

void Unary(UnaryOp op, const TensorView& x, const TensorView& y, ThreadPool* pool) {
  CLEAVE_CHECK(UnarySupports(op, x.dtype) && x.dtype == y.dtype && x.numel() == y.numel());
  if (op == UnaryOp::kNot) {
    // bool is one byte holding 0 or 1; comparing with 0 also normalises other bytes.
    const uint8_t* xp = x.as<uint8_t>();
    uint8_t* yp = y.as<uint8_t>();
    ParallelFor(pool, x.numel(), kCheapGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) yp[i] = xp[i] == 0;
    });
    return;
  }
  if (x.dtype == DataType::kFloat32) {
    if (BlockFn fn = FastF32(op)) return MapBlocks(x, y, pool, fn);
  }
  bool done = VisitFloat(x.dtype, [&]<typename T>(TypeTag<T>) { FloatUnary<T>(op, x, y, pool); }) ||
              VisitInteger(x.dtype, [&]<typename T>(TypeTag<T>) {
                IntegerOrFloatUnary<T>(op, x, y, pool);
              });
  CLEAVE_CHECK(done);
}

bool ActivationSupports(DataType t) { return t == DataType::kFloat32 || t == DataType::kFloat64; }

void ApplyActivation(const ActivationParams& p, const TensorView& x, const TensorView& y, ThreadPool* pool) {
  CLEAVE_CHECK(ActivationSupports(x.dtype) && x.dtype == y.dtype && x.numel() == y.numel());
  VisitFloat(x.dtype, [&]<typename T>(TypeTag<T>) {
    const T alpha = static_cast<T>(p.alpha), beta = static_cast<T>(p.beta), gamma = static_cast<T>(p.gamma);
    const int64_t g = kCostlyGrain;
    switch (p.op) {
      case ActivationOp::kLeakyRelu:
        Map<T>(x, y, kCheapGrain, pool, [alpha](T v) { return v >= T(0) ? v : alpha * v; });
        return;
      case ActivationOp::kElu:
        Map<T>(x, y, g, pool, [alpha](T v) { return v >= T(0) ? v : alpha * std::expm1(v); });
        return;
      case ActivationOp::kSelu:
        Map<T>(x, y, g, pool, [alpha, gamma](T v) { return gamma * (v > T(0) ? v : alpha * std::expm1(v)); });
        return;
      case ActivationOp::kCelu:
        Map<T>(x, y, g, pool, [alpha](T v) { return v > T(0) ? v : alpha * std::expm1(v / alpha); });
        return;
      case ActivationOp::kHardSigmoid:
        Map<T>(x, y, kCheapGrain, pool,
               [alpha, beta](T v) { return std::max(T(0), std::min(T(1), alpha * v + beta)); });
        return;
      case ActivationOp::kHardSwish:
        Map<T>(x, y, kCheapGrain, pool,
               [](T v) { return v * std::max(T(0), std::min(T(1), v / T(6) + T(0.5))); });
        return;
      case ActivationOp::kThresholdedRelu:
        Map<T>(x, y, kCheapGrain, pool, [alpha](T v) { return v > alpha ? v : T(0); });
        return;
    }
  });
}

bool ClipSupports(DataType t) { return IsNumericType(t); }

void Clip(const TensorView& x, const void* lo, const void* hi, const TensorView& out,
          ThreadPool* pool) {
  CLEAVE_CHECK(ClipSupports(x.dtype) && x.dtype == out.dtype && x.numel() == out.numel());
  VisitNumeric(x.dtype, [&]<typename T>(TypeTag<T>) {
    using Limits = std::numeric_limits<T>;
    const T l = lo ? *static_cast<const T*>(lo)
                   : (Limits::has_infinity ? -Limits::infinity() : Limits::lowest());
    const T h = hi ? *static_cast<const T*>(hi)
                   : (Limits::has_infinity ? Limits::infinity() : Limits::max());
    // Comparisons written so that NaN fails both and passes through unchanged; with
    // l > h every element ends at h, as numpy.clip gives.
    Map<T>(x, out, kCheapGrain, pool, [l, h](T v) {
      T r = v < l ? l : v;
      return r > h ? h : r;
    });
  });
}

}  // namespace cleave::kernels::cpu
