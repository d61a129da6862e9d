// Pooling windows (kernels/): the taps of MaxPool's and AveragePool's windows over one [N, C]
// plane, and the adjoint walk their gradients take (each input element's gradient gathered from
// the windows that read it, in a fixed order, with no atomics). The CPU kernels and the CUDA
// kernels (kernels/cuda/pool.cu) share these definitions.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

inline constexpr int kPoolMaxSpatial = 6;

// One plane's geometry: the spatial dims of the input and output, and each dim's window. Tap j
// of output coordinate o reads input coordinate o * stride - pad_begin + j * dilation, j < kernel.
struct PoolLayout {
  int spatial = 0;
  int64_t in[kPoolMaxSpatial] = {}, out[kPoolMaxSpatial] = {}, kernel[kPoolMaxSpatial] = {};
  int64_t stride[kPoolMaxSpatial] = {}, dilation[kPoolMaxSpatial] = {};
  int64_t pad_begin[kPoolMaxSpatial] = {}, pad_end[kPoolMaxSpatial] = {};
  int64_t in_size = 1, out_size = 1;  // the products of in and out
  bool count_include_pad = false;     // AveragePool's divisor counts the taps in the explicit padding
};

// The taps of dim d's window at output coordinate o that fall in [lo, hi).
CLEAVE_HOST_DEVICE inline int64_t PoolTapsIn(const PoolLayout& l, int d, int64_t o, int64_t lo, int64_t hi) {
  const int64_t start = o * l.stride[d] - l.pad_begin[d], dil = l.dilation[d];
  // The first j with start + j * dil >= lo and the last with start + j * dil < hi.
  const int64_t first = start >= lo ? 0 : (lo - start + dil - 1) / dil;
  if (hi - 1 < start) return 0;
  int64_t last = (hi - 1 - start) / dil;
  if (last > l.kernel[d] - 1) last = l.kernel[d] - 1;
  return last >= first ? last - first + 1 : 0;
}

// AveragePool's divisor for the output at plane offset `o`: the window's taps inside the input,
// or with count_include_pad inside the input and its explicit padding (never the taps a
// ceil_mode window adds past it).
CLEAVE_HOST_DEVICE inline int64_t PoolDivisor(const PoolLayout& l, int64_t o) {
  int64_t count = 1;
  for (int d = l.spatial - 1; d >= 0; --d) {
    const int64_t od = o % l.out[d];
    o /= l.out[d];
    count *= l.count_include_pad ? PoolTapsIn(l, d, od, -l.pad_begin[d], l.in[d] + l.pad_end[d])
                                 : PoolTapsIn(l, d, od, 0, l.in[d]);
  }
  return count;
}

// Calls visit(i) for each input element (plane offset, row-major) the window of the output at
// plane offset `o` reads, in row-major tap order.
template <typename Visit>
CLEAVE_HOST_DEVICE inline void PoolVisitWindow(const PoolLayout& l, int64_t o, Visit visit) {
  int64_t start[kPoolMaxSpatial], j[kPoolMaxSpatial];
  for (int d = l.spatial - 1; d >= 0; --d) {
    start[d] = o % l.out[d] * l.stride[d] - l.pad_begin[d];
    o /= l.out[d];
    j[d] = 0;
  }
  for (;;) {
    int64_t i = 0;
    bool inside = true;
    for (int d = 0; d < l.spatial; ++d) {
      const int64_t c = start[d] + j[d] * l.dilation[d];
      inside = inside && c >= 0 && c < l.in[d];
      i = i * l.in[d] + c;
    }
    if (inside) visit(i);
    int d = l.spatial - 1;
    while (d >= 0 && ++j[d] == l.kernel[d]) j[d] = 0, --d;
    if (d < 0) return;
  }
}

// Calls visit(o) for each output (plane offset) whose window reads input element `i` (plane
// offset), in decreasing row-major order of the taps (so increasing order of the outputs).
template <typename Visit>
CLEAVE_HOST_DEVICE inline void PoolVisitReaders(const PoolLayout& l, int64_t i, Visit visit) {
  int64_t c[kPoolMaxSpatial], j[kPoolMaxSpatial];
  for (int d = l.spatial - 1; d >= 0; --d) {
    c[d] = i % l.in[d] + l.pad_begin[d];
    i /= l.in[d];
    j[d] = l.kernel[d] - 1;
  }
  for (;;) {
    int64_t o = 0;
    bool reads = true;
    for (int d = 0; d < l.spatial && reads; ++d) {
      const int64_t t = c[d] - j[d] * l.dilation[d];
      reads = t >= 0 && t % l.stride[d] == 0 && t / l.stride[d] < l.out[d];
      o = o * l.out[d] + t / l.stride[d];
    }
    if (reads) visit(o);
    int d = l.spatial - 1;
    while (d >= 0 && j[d]-- == 0) j[d] = l.kernel[d] - 1, --d;
    if (d < 0) return;
  }
}

// MaxPool's choice in a window: the plane offset of the first largest tap, or of the first NaN
// (which beats every number); -1 when every tap lies in the padding. `load` gives a tap's value
// in a type `less` and `is_nan` take.
template <typename Load, typename Less, typename IsNan>
CLEAVE_HOST_DEVICE inline int64_t PoolArgMax(const PoolLayout& l, int64_t o, Load load, Less less, IsNan is_nan) {
  int64_t best = -1;
  decltype(load(int64_t{0})) best_value{};
  bool best_nan = false;
  PoolVisitWindow(l, o, [&](int64_t i) {
    if (best_nan) return;
    const auto v = load(i);
    if (best < 0 || is_nan(v) || less(best_value, v)) {
      best = i;
      best_value = v;
      best_nan = is_nan(v);
    }
  });
  return best;
}

// Plane offset i (row-major) as the offset in the plane laid out column-major, the first spatial
// dim fastest (MaxPool's Indices with storage_order 1).
CLEAVE_HOST_DEVICE inline int64_t PoolColumnMajor(const PoolLayout& l, int64_t i) {
  int64_t coord[kPoolMaxSpatial];
  for (int d = l.spatial - 1; d >= 0; --d) {
    coord[d] = i % l.in[d];
    i /= l.in[d];
  }
  int64_t index = 0;
  for (int d = l.spatial - 1; d >= 0; --d) index = index * l.in[d] + coord[d];
  return index;
}

}  // namespace cleave::kernels
