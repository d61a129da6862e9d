// GatherND and ScatterND's addressing (kernels/), one definition for the CPU and CUDA kernels:
// data [batch..., indexed (k dims)..., slice...] and indices [batch..., tuples..., k]; the tuple
// of k coordinates addresses one slice of its batch's indexed block, a negative coordinate
// counting from the end.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

inline constexpr int kNdMaxCoordinates = 8;

struct NdIndexLayout {
  int k = 0;                                // coordinates per tuple
  int64_t dims[kNdMaxCoordinates] = {};     // the lengths of the indexed dims
  int64_t batches = 1, tuples = 1;          // tuples per batch
  int64_t block = 1;                        // slices per batch: the product of dims
  int64_t slice = 1;                        // elements per slice
};

// The slice a tuple addresses within its batch's block, or -1 with *bad the position of the
// first coordinate out of [-dims[j], dims[j]).
template <typename Id>
CLEAVE_HOST_DEVICE inline int64_t NdSlice(const NdIndexLayout& l, const Id* tuple, int* bad) {
  int64_t at = 0;
  for (int j = 0; j < l.k; ++j) {
    int64_t c = static_cast<int64_t>(tuple[j]);
    if (c < -l.dims[j] || c >= l.dims[j]) {
      *bad = j;
      return -1;
    }
    if (c < 0) c += l.dims[j];
    at = at * l.dims[j] + c;
  }
  return at;
}

}  // namespace cleave::kernels
