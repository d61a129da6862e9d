// Pow and Where on the CPU (kernels/): the two broadcasting kernels whose inputs do not
// share one dtype. Pow's exponent may have any numeric type; Where selects by a bool
// tensor and only moves bytes, so it runs on any element size.
#include <cmath>
#include <limits>
#include <type_traits>

#include "base/status.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/type_dispatch.h"

namespace cleave::kernels::cpu {

namespace {

// Integer power by repeated squaring, wrapping on overflow. A negative exponent gives
// the real result truncated toward zero: 1 and -1 keep magnitude 1, others give 0.
template <typename TB, typename TE>
TB IntPow(TB base, TE e) {
  if constexpr (std::is_signed_v<TE>) {
    if (e < 0) {
      if (base == TB(1)) return TB(1);
      if constexpr (std::is_signed_v<TB>) {
        if (base == TB(-1)) return (e % 2 == 0) ? TB(1) : TB(-1);
      }
      return TB(0);
    }
  }
  TB result = 1;
  auto n = static_cast<uint64_t>(e);
  while (n) {
    if (n & 1) result = WrapMul(result, base);
    base = WrapMul(base, base);
    n >>= 1;
  }
  return result;
}

// Float -> integer truncating toward zero and saturating; NaN gives 0.
template <typename TI>
TI TruncateToInt(double v) {
  if (v != v) return TI(0);
  if (v <= static_cast<double>(std::numeric_limits<TI>::lowest()))
    return std::numeric_limits<TI>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<TI>::max()))
    return std::numeric_limits<TI>::max();
  return static_cast<TI>(v);
}

template <typename TB, typename TE>
TB PowOp(TB a, TE b) {
  if constexpr (std::is_integral_v<TB> && std::is_integral_v<TE>) {
    return IntPow(a, b);
  } else if constexpr (std::is_same_v<TB, TE>) {
    return std::pow(a, b);  // powf for float, pow for double
  } else if constexpr (std::is_floating_point_v<TB>) {
    // numpy promotes a float base with an integer or wider exponent to double and
    // casts the result back; do the same.
    return static_cast<TB>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  } else {
    return TruncateToInt<TB>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
}

// x^2 and x^3 (variance and tanh-GELU graphs) as plain products: exact to rounding, and
// vectorised, where pow() is a library call per element.
template <typename T>
bool PowByScalarFastPath(const TensorView& a, const TensorView& b, const TensorView& out,
                         ThreadPool* pool) {
  if (b.numel() != 1 || a.numel() != out.numel()) return false;
  const T e = *b.as<const T>();
  const T* x = a.as<const T>();
  T* y = out.as<T>();
  auto run = [&](auto f) {
    ParallelFor(pool, a.numel(), kCheapGrain, [&](int64_t s, int64_t t) {
      for (int64_t i = s; i < t; ++i) y[i] = f(x[i]);
    });
  };
  if (e == T(1)) run([](T v) { return v; });
  else if (e == T(2)) run([](T v) { return v * v; });
  else if (e == T(3)) run([](T v) { return v * v * v; });
  else return false;
  return true;
}

template <typename Fn>
bool VisitPowBase(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFloat32: fn(TypeTag<float>{}); return true;
    case DataType::kFloat64: fn(TypeTag<double>{}); return true;
    case DataType::kInt32: fn(TypeTag<int32_t>{}); return true;
    case DataType::kInt64: fn(TypeTag<int64_t>{}); return true;
    default: return false;
  }
}

// o[i] = c[i] ? x[i] : y[i] with each of c, x, y either contiguous or repeated (the
// template flags), so the common same-shape and fill-with-constant cases vectorise.
template <typename T, bool kC, bool kX, bool kY>
void WhereRun(const uint8_t* c, const T* x, const T* y, T* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = c[kC ? i : 0] ? x[kX ? i : 0] : y[kY ? i : 0];
}

template <typename T>
void WhereTyped(const TensorView& cond, const TensorView& x, const TensorView& y,
                const TensorView& out, ThreadPool* pool) {
  const TensorView* ins[3] = {&cond, &x, &y};
  BroadcastPlan plan;
  CLEAVE_CHECK(MakeBroadcastPlan(ins, out.dim_span(), &plan));
  if (plan.numel == 0) return;
  using RunFn = void (*)(const uint8_t*, const T*, const T*, T*, int64_t);
  static constexpr RunFn kRuns[8] = {
      WhereRun<T, false, false, false>, WhereRun<T, false, false, true>,
      WhereRun<T, false, true, false>,  WhereRun<T, false, true, true>,
      WhereRun<T, true, false, false>,  WhereRun<T, true, false, true>,
      WhereRun<T, true, true, false>,   WhereRun<T, true, true, true>};
  const RunFn run = kRuns[plan.inner_stride(0) * 4 + plan.inner_stride(1) * 2 +
                          plan.inner_stride(2)];
  const uint8_t* cp = cond.as<const uint8_t>();
  const T* xp = x.as<const T>();
  const T* yp = y.as<const T>();
  T* op = out.as<T>();
  ParallelFor(pool, plan.numel, kCheapGrain, [&](int64_t begin, int64_t end) {
    ForEachRun(plan, begin, end, [&](int64_t o, int64_t n, const int64_t* off) {
      run(cp + off[0], xp + off[1], yp + off[2], op + o, n);
    });
  });
}

}  // namespace

bool PowSupports(DataType base, DataType exponent) {
  return VisitPowBase(base, [](auto) {}) && IsNumericType(exponent);
}

void Pow(const TensorView& a, const TensorView& b, const TensorView& out, ThreadPool* pool) {
  CLEAVE_CHECK(PowSupports(a.dtype, b.dtype) && out.dtype == a.dtype);
  VisitPowBase(a.dtype, [&]<typename TB>(TypeTag<TB>) {
    if constexpr (std::is_floating_point_v<TB>) {
      if (a.dtype == b.dtype && PowByScalarFastPath<TB>(a, b, out, pool)) return;
    }
    VisitNumeric(b.dtype, [&]<typename TE>(TypeTag<TE>) {
      BroadcastBinary<TB, TE, TB>(a, b, out, kCostlyGrain, pool,
                                  [](TB x, TE e) { return PowOp(x, e); });
    });
  });
}

bool WhereSupports(DataType t) {
  size_t s = ElementSize(t);
  return t != DataType::kString && (s == 1 || s == 2 || s == 4 || s == 8);
}

void Where(const TensorView& cond, const TensorView& x, const TensorView& y,
           const TensorView& out, ThreadPool* pool) {
  CLEAVE_CHECK(cond.dtype == DataType::kBool && WhereSupports(x.dtype) && x.dtype == y.dtype &&
               out.dtype == x.dtype);
  switch (ElementSize(x.dtype)) {
    case 1: return WhereTyped<uint8_t>(cond, x, y, out, pool);
    case 2: return WhereTyped<uint16_t>(cond, x, y, out, pool);
    case 4: return WhereTyped<uint32_t>(cond, x, y, out, pool);
    case 8: return WhereTyped<uint64_t>(cond, x, y, out, pool);
    default: CLEAVE_CHECK(false && "unsupported element size");
  }
}

}  // namespace cleave::kernels::cpu
