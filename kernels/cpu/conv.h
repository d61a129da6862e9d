// Convolution on the CPU (kernels/): ONNX Conv over 1 to 3 spatial dims (any number up to
// kMaxRank - 2), with strides, dilations, explicit or automatic padding and groups, forward and
// backward. Each image and group is lowered to one product: the input's patches laid out as
// columns (im2col, zeros where a patch reaches into the padding) times the group's filters, and
// back (col2im sums the columns' gradients into the input's).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

struct ConvParams {
  int spatial = 0;                             // the spatial dims
  int64_t N = 0, C = 0, M = 0, group = 1;      // images, input and output channels, groups
  int64_t in[kMaxRank] = {}, kernel[kMaxRank] = {}, out[kMaxRank] = {};
  int64_t stride[kMaxRank] = {}, dilation[kMaxRank] = {}, pad_begin[kMaxRank] = {};

  int64_t InSize() const;      // the product of in
  int64_t KernelSize() const;  // ... of kernel
  int64_t OutSize() const;     // ... of out
  // The elements of one group's columns: (C / group) * KernelSize() rows of OutSize(); -1 when
  // that overflows int64.
  int64_t ColumnElements() const;
};

struct ConvAttrs {
  std::string auto_pad = "NOTSET";  // NOTSET, SAME_UPPER, SAME_LOWER, VALID
  std::vector<int64_t> strides, dilations, pads, kernel_shape;  // empty: the defaults
  int64_t group = 1;
};

// X [N, C, in...] and W [M, C / group, kernel...] (kernel_shape, when given, must match);
// InvalidArgument naming what disagrees.
absl::StatusOr<ConvParams> PlanConv(std::span<const int64_t> x, std::span<const int64_t> w, const ConvAttrs& a);

struct ConvTransposeAttrs : ConvAttrs {
  std::vector<int64_t> output_padding, output_shape;  // empty: none, and Y's shape from the pads
};

// ConvTranspose of X [N, C, in...] with W [C, M / group, kernel...] is the input gradient of
// the Conv whose input is Y [N, M, out...] and whose output is X: returns that Conv's
// parameters (its C is M, its M is C, its `in` Y's spatial dims and its `out` X's), from which
// Y = ConvBackward's dX of X, and the transposed convolution's gradients are that Conv's
// forward (dX) and weight gradient (dW). Y's dims follow the ONNX formulas:
// stride * (in - 1) + output_padding + dilation * (kernel - 1) + 1 - pads, or output_shape
// (then, and with SAME_UPPER / SAME_LOWER, the pads are derived from it; an output_shape
// beyond the formula's extent adds positions at the end, which no tap reaches).
absl::StatusOr<ConvParams> PlanConvTranspose(std::span<const int64_t> x, std::span<const int64_t> w,
                                             const ConvTransposeAttrs& a);

// Y [N, M, out...] = conv(X, W) + B (B [M] or null). `col` is scratch of ColumnElements().
template <typename T>
void ConvForward(const ConvParams& p, const T* x, const T* w, const T* b, T* y, T* col, ThreadPool* pool);

// The gradients of Conv from dY: dX (X's shape), dW (W's), dB ([M]); each may be null when
// not wanted. `col` is scratch of ColumnElements().
template <typename T>
void ConvBackward(const ConvParams& p, const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, T* col,
                  ThreadPool* pool);

}  // namespace cleave::kernels::cpu
