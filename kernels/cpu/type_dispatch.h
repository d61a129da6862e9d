// Runtime dtype -> C++ type dispatch for CPU kernels (kernels/).
// A kernel body is written once as a generic lambda over TypeTag<T>; the Visit* helpers
// call it with the C++ type of a DataType, or return false when the dtype is outside the
// family. Bodies use `if constexpr` to skip instantiating ops a type does not have.
#pragma once

#include <cstdint>
#include <type_traits>

#include "base/dtype.h"

namespace cleave::kernels::cpu {

template <typename T>
struct TypeTag {
  using type = T;
};

// float32, float64.
template <typename Fn>
bool VisitFloat(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kFloat32: fn(TypeTag<float>{}); return true;
    case DataType::kFloat64: fn(TypeTag<double>{}); return true;
    default: return false;
  }
}

// Signed and unsigned integers of 8 to 64 bits.
template <typename Fn>
bool VisitInteger(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::kInt8: fn(TypeTag<int8_t>{}); return true;
    case DataType::kInt16: fn(TypeTag<int16_t>{}); return true;
    case DataType::kInt32: fn(TypeTag<int32_t>{}); return true;
    case DataType::kInt64: fn(TypeTag<int64_t>{}); return true;
    case DataType::kUInt8: fn(TypeTag<uint8_t>{}); return true;
    case DataType::kUInt16: fn(TypeTag<uint16_t>{}); return true;
    case DataType::kUInt32: fn(TypeTag<uint32_t>{}); return true;
    case DataType::kUInt64: fn(TypeTag<uint64_t>{}); return true;
    default: return false;
  }
}

// Every float32/float64/integer type: what arithmetic kernels take.
template <typename Fn>
bool VisitNumeric(DataType t, Fn&& fn) {
  return VisitFloat(t, fn) || VisitInteger(t, fn);
}

inline bool IsNumericType(DataType t) {
  return VisitNumeric(t, [](auto) {});
}

// Wrapping integer arithmetic: signed overflow is undefined in C++, while ONNX (like
// numpy) wraps. Computing in the unsigned type of the same width wraps by definition and
// converting back is modular since C++20.
template <typename T>
T WrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<decltype(a + b)>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T WrapSub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<decltype(a - b)>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <typename T>
T WrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<decltype(a * b)>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

}  // namespace cleave::kernels::cpu
