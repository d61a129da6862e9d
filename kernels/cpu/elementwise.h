// Elementwise CPU kernels (kernels/): unary math, broadcasting binary arithmetic,
// comparisons and logic, Pow, Where, Clip and Cast. Each works on dense row-major
// TensorViews whose dtypes the caller has checked with the matching *Supports function;
// outputs are preallocated by the caller with the broadcast dims. Big tensors are split
// over the thread pool in contiguous blocks, so results do not depend on the thread count.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "base/tensor.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

// Elements per parallel block for cheap (memory-bound) and for transcendental ops.
constexpr int64_t kCheapGrain = 16384;
constexpr int64_t kCostlyGrain = 4096;

enum class UnaryOp {
  kAbs, kNeg, kRelu,                        // float and integer types
  kSign,                                    // -1, 0 or 1 (NaN stays NaN); float and integer types
  kExp, kLog, kSqrt, kReciprocal, kSin, kCos, kTanh, kErf, kSigmoid,
  kTan, kAsin, kAcos, kAtan, kSinh, kCosh, kAsinh, kAcosh, kAtanh,
  kSoftplus,                                // log(1 + exp(x))
  kSoftsign,                                // x / (1 + |x|)
  kMish,                                    // x tanh(softplus(x))
  kFloor, kCeil,
  kRound,                                   // to nearest, halves to even
  kGelu,                                    // 0.5 x (1 + erf(x / sqrt 2))
  kGeluTanh,                                // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  kNot,                                     // bool only
};
bool UnarySupports(UnaryOp op, DataType t);
// y = op(x); y has x's dims and dtype. y may alias x.
void Unary(UnaryOp op, const TensorView& x, const TensorView& y, ThreadPool* pool);

// The ONNX activations with attributes (float32 and float64), applied elementwise:
//   kLeakyRelu        x >= 0 ? x : alpha x
//   kElu              x >= 0 ? x : alpha (exp(x) - 1)
//   kSelu             gamma (x > 0 ? x : alpha (exp(x) - 1))
//   kCelu             max(0, x) + min(0, alpha (exp(x / alpha) - 1))
//   kHardSigmoid      max(0, min(1, alpha x + beta))
//   kHardSwish        x max(0, min(1, x / 6 + 1 / 2))
//   kThresholdedRelu  x > alpha ? x : 0
enum class ActivationOp { kLeakyRelu, kElu, kSelu, kCelu, kHardSigmoid, kHardSwish, kThresholdedRelu };
struct ActivationParams {
  ActivationOp op = ActivationOp::kLeakyRelu;
  double alpha = 0, beta = 0, gamma = 0;
};
bool ActivationSupports(DataType t);
// y = op(x); y has x's dims and dtype; y may alias x.
void ApplyActivation(const ActivationParams& p, const TensorView& x, const TensorView& y, ThreadPool* pool);

enum class BinaryOp {
  kAdd, kSub, kMul, kDiv,  // integer Div truncates toward zero, as C does; x / 0 gives 0
  kMax, kMin,              // NaN in either operand gives NaN, as numpy's maximum does
  kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual,  // write bool
  kAnd, kOr, kXor,         // bool only
  kMod,                    // the remainder with the divisor's sign (Python's %; ONNX Mod, fmod 0)
  kFmod,                   // the remainder with the dividend's sign (C's fmod; ONNX Mod, fmod 1)
  kPRelu,                  // a < 0 ? a * b : a (ONNX PRelu, b the slope)
  kBitAnd, kBitOr, kBitXor,  // integers only
  kShiftLeft, kShiftRight,   // integers only; a shift by the width or more gives 0
};                           // an integer remainder by 0 gives 0
bool BinarySupports(BinaryOp op, DataType t);
bool IsComparison(BinaryOp op);
// out = op(a, b) with a and b broadcast to out's dims (each input dim is 1 or out's).
// a and b share a dtype; out has it too, or bool for comparisons. out may alias an input
// of the same dims.
void Binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out,
            ThreadPool* pool);

// out = a ^ b with broadcasting; out has a's dtype. Bases f32/f64/i32/i64, exponents any
// float or integer type. An integer base with an integer exponent is raised exactly (with
// two's complement wrap-around); a negative exponent gives the truncated real result.
bool PowSupports(DataType base, DataType exponent);
void Pow(const TensorView& a, const TensorView& b, const TensorView& out, ThreadPool* pool);

// out = cond ? x : y with broadcasting; any dtype of 1, 2, 4 or 8 bytes.
bool WhereSupports(DataType t);
void Where(const TensorView& cond, const TensorView& x, const TensorView& y,
           const TensorView& out, ThreadPool* pool);

// out = min(max(x, *lo), *hi); lo and hi point at one element of x's dtype, or are null
// for no bound. When lo > hi every element becomes hi (numpy.clip). NaN stays NaN.
bool ClipSupports(DataType t);
void Clip(const TensorView& x, const void* lo, const void* hi, const TensorView& out,
          ThreadPool* pool);

// y = x converted to y's dtype, following the ONNX Cast rules: floats round to nearest
// even (f64 -> f16/bf16 rounds once, not through f32); float -> integer truncates toward
// zero and saturates (NaN -> 0); integer -> narrower integer wraps; bool is 0/1.
bool CastSupports(DataType from, DataType to);
void Cast(const TensorView& x, const TensorView& y, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
