// Broadcasting binary kernels on the CPU (kernels/): arithmetic, Max/Min, comparisons,
// logic, and the integers' bitwise ops and shifts. One generic loop (BroadcastBinary) serves all; each op is a small functor.
// Integer arithmetic wraps like two's complement hardware, as ONNX and numpy do.
#include <cmath>
#include <type_traits>

#include "base/status.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/type_dispatch.h"

namespace cleave::kernels::cpu {

namespace {

template <typename T>
T DivOp(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a / b;
  } else {
    // ONNX's reference divides in float and casts back, which truncates toward zero as
    // C's integer division does. x / 0 has no defined result; 0 avoids a trap. The one
    // signed overflow, MIN / -1, wraps to MIN.
    if (b == T(0)) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return WrapSub(T(0), a);
    }
    return static_cast<T>(a / b);
  }
}

// a mod b with the sign of b (floor) or, for fmod, of a (truncation).
template <typename T>
T ModOp(T a, T b, bool fmod) {
  if constexpr (std::is_floating_point_v<T>) {
    if (fmod) return std::fmod(a, b);
    const T r = std::fmod(a, b);
    return r != T(0) && ((r < T(0)) != (b < T(0))) ? r + b : r;
  } else {
    if (b == T(0)) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);  // also MIN % -1, which traps in C
      const T r = static_cast<T>(a % b);
      return !fmod && r != T(0) && ((r < T(0)) != (b < T(0))) ? static_cast<T>(r + b) : r;
    } else {
      return static_cast<T>(a % b);
    }
  }
}

// a << b or a >> b (logical for unsigned types), 0 once b reaches the type's width (where C's
// shift is undefined) or is negative.
template <typename T>
T ShiftOp(T a, T b, bool left) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (b < T(0)) return T(0);
  }
  if (static_cast<uint64_t>(b) >= sizeof(T) * 8) return T(0);
  const U u = static_cast<U>(a);
  return static_cast<T>(left ? static_cast<U>(u << b) : static_cast<U>(u >> b));
}

// NaN-propagating max/min (numpy.maximum/minimum): a NaN in either operand wins.
template <typename T>
T MaxOp(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return (a > b || a != a) ? a : b;
  else return a > b ? a : b;
}
template <typename T>
T MinOp(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) return (a < b || a != a) ? a : b;
  else return a < b ? a : b;
}

// Ops are passed as lambdas (not function pointers) so that they inline into the loops.
template <typename T>
void Arithmetic(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out,
                ThreadPool* pool) {
  const int64_t g = kCheapGrain;
  switch (op) {
    case BinaryOp::kAdd:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return WrapAdd(x, y); });
      return;
    case BinaryOp::kSub:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return WrapSub(x, y); });
      return;
    case BinaryOp::kMul:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return WrapMul(x, y); });
      return;
    case BinaryOp::kDiv:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return DivOp(x, y); });
      return;
    case BinaryOp::kMax:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return MaxOp(x, y); });
      return;
    case BinaryOp::kMin:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return MinOp(x, y); });
      return;
    case BinaryOp::kMod:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return ModOp(x, y, false); });
      return;
    case BinaryOp::kFmod:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return ModOp(x, y, true); });
      return;
    case BinaryOp::kPRelu:
      BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return x < T(0) ? WrapMul(x, y) : x; });
      return;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case BinaryOp::kBitAnd:
        BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return static_cast<T>(x & y); });
        return;
      case BinaryOp::kBitOr:
        BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return static_cast<T>(x | y); });
        return;
      case BinaryOp::kBitXor:
        BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return static_cast<T>(x ^ y); });
        return;
      case BinaryOp::kShiftLeft:
        BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return ShiftOp(x, y, true); });
        return;
      case BinaryOp::kShiftRight:
        BroadcastBinary<T, T, T>(a, b, out, g, pool, [](T x, T y) { return ShiftOp(x, y, false); });
        return;
      default: break;
    }
  }
  CLEAVE_CHECK(false && "not an arithmetic op of this type");
}

// Comparisons write bool (Equal on bool inputs goes through Logical).
template <typename T>
void Compare(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out,
             ThreadPool* pool) {
  const int64_t g = kCheapGrain;
  switch (op) {
    case BinaryOp::kEqual:
      BroadcastBinary<T, T, bool>(a, b, out, g, pool, [](T x, T y) { return x == y; });
      return;
    case BinaryOp::kLess:
      BroadcastBinary<T, T, bool>(a, b, out, g, pool, [](T x, T y) { return x < y; });
      return;
    case BinaryOp::kGreater:
      BroadcastBinary<T, T, bool>(a, b, out, g, pool, [](T x, T y) { return x > y; });
      return;
    case BinaryOp::kLessOrEqual:
      BroadcastBinary<T, T, bool>(a, b, out, g, pool, [](T x, T y) { return x <= y; });
      return;
    case BinaryOp::kGreaterOrEqual:
      BroadcastBinary<T, T, bool>(a, b, out, g, pool, [](T x, T y) { return x >= y; });
      return;
    default: CLEAVE_CHECK(false && "not a comparison");
  }
}

// And, Or and Equal on bool. Inputs are read as bytes and tested against 0, so the result
// is always 0 or 1.
void Logical(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out,
             ThreadPool* pool) {
  const int64_t g = kCheapGrain;
  if (op == BinaryOp::kAnd) {
    BroadcastBinary<uint8_t, uint8_t, uint8_t>(
        a, b, out, g, pool, [](uint8_t x, uint8_t y) -> uint8_t { return (x != 0) & (y != 0); });
  } else if (op == BinaryOp::kOr) {
    BroadcastBinary<uint8_t, uint8_t, uint8_t>(
        a, b, out, g, pool, [](uint8_t x, uint8_t y) -> uint8_t { return (x | y) != 0; });
  } else if (op == BinaryOp::kXor) {
    BroadcastBinary<uint8_t, uint8_t, uint8_t>(
        a, b, out, g, pool, [](uint8_t x, uint8_t y) -> uint8_t { return (x != 0) != (y != 0); });
  } else {
    BroadcastBinary<uint8_t, uint8_t, uint8_t>(
        a, b, out, g, pool, [](uint8_t x, uint8_t y) -> uint8_t { return (x != 0) == (y != 0); });
  }
}

}  // namespace

bool IsComparison(BinaryOp op) {
  switch (op) {
    case BinaryOp::kEqual: case BinaryOp::kLess: case BinaryOp::kGreater:
    case BinaryOp::kLessOrEqual: case BinaryOp::kGreaterOrEqual:
      return true;
    default:
      return false;
  }
}

bool BinarySupports(BinaryOp op, DataType t) {
  if (op == BinaryOp::kAnd || op == BinaryOp::kOr || op == BinaryOp::kXor) return t == DataType::kBool;
  if (op == BinaryOp::kEqual && t == DataType::kBool) return true;
  if (op == BinaryOp::kBitAnd || op == BinaryOp::kBitOr || op == BinaryOp::kBitXor || op == BinaryOp::kShiftLeft ||
      op == BinaryOp::kShiftRight)
    return IsInteger(t);
  return IsNumericType(t);
}

void Binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out,
            ThreadPool* pool) {
  CLEAVE_CHECK(BinarySupports(op, a.dtype) && a.dtype == b.dtype);
  CLEAVE_CHECK(out.dtype == (IsComparison(op) ? DataType::kBool : a.dtype));
  if (a.dtype == DataType::kBool) return Logical(op, a, b, out, pool);
  bool done = VisitNumeric(a.dtype, [&]<typename T>(TypeTag<T>) {
    if (IsComparison(op)) Compare<T>(op, a, b, out, pool);
    else Arithmetic<T>(op, a, b, out, pool);
  });
  CLEAVE_CHECK(done);
}

}  // namespace cleave::kernels::cpu
