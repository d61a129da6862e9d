// Where GridSample reads (kernels/): for one output point, the taps of each spatial axis of X
// (index, weight, and the weight's derivative by the grid coordinate), one definition for the
// CPU kernels and the CUDA kernels alike, forward and backward.
//
// The definition is ONNX's (GridSample 16, 20, 22; PyTorch's grid_sample where the two agree):
// - a normalised coordinate g in [-1, 1] maps to x = (g + 1) / 2 * (size - 1) with
//   align_corners, else ((g + 1) * size - 1) / 2;
// - nearest mode rounds x half to even;
// - a coordinate outside [lo, hi] (0 and size - 1 with align_corners, else -0.5 and size - 0.5)
//   is clamped to [0, size - 1] (border padding) or reflected about lo and hi until inside
//   (reflection padding); zeros padding leaves it;
// - linear mode reads floor(x) and the next index, weighted 1 - f and f (f = x - floor(x));
//   cubic mode the four from floor(x) - 1, by Keys' kernel with a = -0.75;
// - an index outside [0, size) reads 0 (zeros padding), the nearest inside (border), or the
//   index reflected about lo and hi (reflection).
// The taps of several axes combine as a tensor product.
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

enum class GridMode : int { kLinear, kNearest, kCubic };
enum class GridPadding : int { kZeros, kBorder, kReflection };

inline constexpr int kMaxGridAxes = 3;

// X [batch, channels, in...] sampled at grid [batch, out..., axes] into Y [batch, channels,
// out...]; grid's last dim lists the coordinates innermost axis first (x, then y, then z).
struct GridSampleLayout {
  int axes = 0;  // spatial rank, 1 to kMaxGridAxes
  int64_t batch = 0, channels = 0;
  int64_t in[kMaxGridAxes] = {1, 1, 1};
  int64_t out_points = 0;  // the product of grid's dims between the batch and the last
  GridMode mode = GridMode::kLinear;
  GridPadding padding = GridPadding::kZeros;
  bool align_corners = false;
};

CLEAVE_HOST_DEVICE inline int64_t GridInPoints(const GridSampleLayout& l) {
  int64_t n = 1;
  for (int d = 0; d < l.axes; ++d) n *= l.in[d];
  return n;
}

// The taps of one axis: count of them (1, 2 or 4), each an index into the axis (-1: reads 0),
// its weight, and the weight's derivative by the grid coordinate.
template <typename A>
struct GridAxisTaps {
  int count = 0;
  int64_t index[4];
  A w[4];
  A dw[4];
};

CLEAVE_HOST_DEVICE inline float GridFloor(float v) { return floorf(v); }
CLEAVE_HOST_DEVICE inline double GridFloor(double v) { return floor(v); }
CLEAVE_HOST_DEVICE inline float GridRint(float v) { return rintf(v); }
CLEAVE_HOST_DEVICE inline double GridRint(double v) { return rint(v); }
CLEAVE_HOST_DEVICE inline float GridFmod(float a, float b) { return fmodf(a, b); }
CLEAVE_HOST_DEVICE inline double GridFmod(double a, double b) { return fmod(a, b); }

// x reflected about lo and hi until inside; *sign the derivative (+1 or -1; 0 when lo == hi).
template <typename A>
CLEAVE_HOST_DEVICE inline A GridReflect(A x, A lo, A hi, A* sign) {
  const A range = hi - lo;
  if (range <= A(0)) {
    *sign = A(0);
    return lo;
  }
  const bool below = x < lo;
  const A dx = below ? lo - x : x - hi;
  const A flips = GridFloor(dx / range);
  const A r = dx - flips * range;
  const bool even = GridFmod(flips, A(2)) == A(0);
  *sign = even ? A(-1) : A(1);
  if (below) return even ? lo + r : hi - r;
  return even ? hi - r : lo + r;
}

// Keys' cubic kernel (a = -0.75) at s in [0, 2], and its derivative.
template <typename A>
CLEAVE_HOST_DEVICE inline A GridCubic(A s) {
  const A a = A(-0.75);
  return s <= A(1) ? ((a + A(2)) * s - (a + A(3))) * s * s + A(1) : ((a * s - A(5) * a) * s + A(8) * a) * s - A(4) * a;
}
template <typename A>
CLEAVE_HOST_DEVICE inline A GridCubicSlope(A s) {
  const A a = A(-0.75);
  return s <= A(1) ? (A(3) * (a + A(2)) * s - A(2) * (a + A(3))) * s : (A(3) * a * s - A(10) * a) * s + A(8) * a;
}

// The index tap i of an axis of `size` reads under the padding, or -1 for zero.
CLEAVE_HOST_DEVICE inline int64_t GridTapIndex(int64_t i, int64_t size, GridPadding padding, bool align) {
  if (i >= 0 && i < size) return i;
  if (padding == GridPadding::kZeros) return -1;
  if (padding == GridPadding::kBorder || size == 1) return i < 0 ? 0 : size - 1;
  double sign;
  const double lo = align ? 0.0 : -0.5, hi = align ? static_cast<double>(size - 1) : static_cast<double>(size) - 0.5;
  const int64_t r = static_cast<int64_t>(GridReflect(static_cast<double>(i), lo, hi, &sign));
  return r < 0 ? 0 : r >= size ? size - 1 : r;
}

// The taps of axis d (X's order) for normalised coordinate g.
template <typename A>
CLEAVE_HOST_DEVICE inline void GridAxis(const GridSampleLayout& l, int d, A g, GridAxisTaps<A>* t) {
  const int64_t size = l.in[d];
  const A n = static_cast<A>(size);
  A x = l.align_corners ? (g + A(1)) / A(2) * (n - A(1)) : ((g + A(1)) * n - A(1)) / A(2);
  A slope = l.align_corners ? (n - A(1)) / A(2) : n / A(2);  // dx / dg
  if (!(x == x)) {  // NaN: every tap reads 0 (zeros) or the first element
    t->count = 1;
    t->index[0] = l.padding == GridPadding::kZeros ? -1 : 0;
    t->w[0] = A(1);
    t->dw[0] = A(0);
    return;
  }
  if (l.mode == GridMode::kNearest) x = GridRint(x);
  const A lo = l.align_corners ? A(0) : A(-0.5), hi = l.align_corners ? n - A(1) : n - A(0.5);
  if (x < lo || x > hi) {
    if (l.padding == GridPadding::kBorder) {
      x = x < A(0) ? A(0) : x > n - A(1) ? n - A(1) : x;
      slope = A(0);
    } else if (l.padding == GridPadding::kReflection) {
      A sign;
      x = GridReflect(x, lo, hi, &sign);
      slope *= sign;
    } else {
      // Zeros: far outside, every tap reads 0; the bound keeps floor(x) an exact int64.
      const A far = n + A(4);
      x = x < -far ? -far : x > far ? far : x;
    }
  }
  if (l.mode == GridMode::kNearest) {
    t->count = 1;
    t->index[0] = GridTapIndex(static_cast<int64_t>(x), size, l.padding, l.align_corners);
    t->w[0] = A(1);
    t->dw[0] = A(0);
    return;
  }
  const A x0 = GridFloor(x), f = x - x0;
  const int64_t i0 = static_cast<int64_t>(x0);
  if (l.mode == GridMode::kLinear) {
    t->count = 2;
    t->w[0] = A(1) - f;
    t->w[1] = f;
    t->dw[0] = -slope;
    t->dw[1] = slope;
  } else {
    t->count = 4;
    t->w[0] = GridCubic(f + A(1));
    t->w[1] = GridCubic(f);
    t->w[2] = GridCubic(A(1) - f);
    t->w[3] = GridCubic(A(2) - f);
    t->dw[0] = GridCubicSlope(f + A(1)) * slope;
    t->dw[1] = GridCubicSlope(f) * slope;
    t->dw[2] = -GridCubicSlope(A(1) - f) * slope;
    t->dw[3] = -GridCubicSlope(A(2) - f) * slope;
  }
  const int64_t first = l.mode == GridMode::kLinear ? i0 : i0 - 1;
  for (int k = 0; k < t->count; ++k) t->index[k] = GridTapIndex(first + k, size, l.padding, l.align_corners);
}

// The taps of every axis for one output point, whose grid coordinates are g[0 .. axes), the
// innermost axis first.
template <typename A>
CLEAVE_HOST_DEVICE inline void GridPointTaps(const GridSampleLayout& l, const A* g, GridAxisTaps<A>* taps) {
  for (int d = 0; d < l.axes; ++d) GridAxis(l, d, g[l.axes - 1 - d], &taps[d]);
}

// Calls fn(offset, weight, dweight) for every combination of the axes' taps that reads X (none
// reading 0): offset into one [in...] plane, the product of the weights, and per axis d the
// product's derivative by that axis's grid coordinate.
template <typename A, typename Fn>
CLEAVE_HOST_DEVICE inline void ForEachGridTap(const GridSampleLayout& l, const GridAxisTaps<A>* taps, Fn&& fn) {
  int j[kMaxGridAxes] = {0, 0, 0};
  for (;;) {
    bool inside = true;
    int64_t offset = 0;
    for (int d = 0; d < l.axes; ++d) {
      const int64_t i = taps[d].index[j[d]];
      inside = inside && i >= 0;
      offset = offset * l.in[d] + i;
    }
    if (inside) {
      A weight = A(1), dweight[kMaxGridAxes];
      for (int d = 0; d < l.axes; ++d) {
        weight *= taps[d].w[j[d]];
        dweight[d] = taps[d].dw[j[d]];
        for (int e = 0; e < l.axes; ++e)
          if (e != d) dweight[d] *= taps[e].w[j[e]];
      }
      fn(offset, weight, dweight);
    }
    int d = l.axes - 1;
    while (d >= 0 && ++j[d] == taps[d].count) j[d--] = 0;
    if (d < 0) return;
  }
}

}  // namespace cleave::kernels
