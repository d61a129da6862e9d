// TopK's order of a line's elements (kernels/), one definition for the CPU and CUDA kernels:
// the larger value first (largest) or the smaller (smallest); NaN ranks above every number, as
// PyTorch's topk ranks it (first when largest, last when smallest); equal values, and NaNs, by
// the lower index first, as ONNX asks.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

// Whether element a (at index ia) comes before b (at ib); a_nan / b_nan say whether each is NaN,
// less(p, q) whether number p < q.
template <typename T, typename Less>
CLEAVE_HOST_DEVICE inline bool TopKBefore(T a, bool a_nan, int64_t ia, T b, bool b_nan, int64_t ib, bool largest,
                                          Less less) {
  if (a_nan != b_nan) return largest ? a_nan : b_nan;
  if (!a_nan) {
    if (less(a, b)) return !largest;
    if (less(b, a)) return largest;
  }
  return ia < ib;
}

}  // namespace cleave::kernels
