// Where Pad reads (kernels/): the input coordinate an output coordinate of a padded dim takes,
// for the CPU's Pad and the CUDA provider's Pad and Tile alike (Tile is wrap mode with nothing
// before); and its adjoint for PadGrad, each input element's gradient gathered from the output
// elements that read it.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

enum class PadMode : int { kConstant, kReflect, kEdge, kWrap };

// The input coordinate that output coordinate o of a dim padded by `before` reads, or -1 for the
// constant (outside the input in constant mode). Reflect mirrors about the edge without repeating
// it; edge repeats the edge; wrap starts over. len > 0.
CLEAVE_HOST_DEVICE inline int64_t PadSourceCoord(int64_t o, int64_t before, int64_t len, PadMode mode) {
  const int64_t i = o - before;
  if (i >= 0 && i < len) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : len - 1;
    case PadMode::kWrap: return ((i % len) + len) % len;
    case PadMode::kReflect: {
      if (len == 1) return 0;
      const int64_t period = 2 * (len - 1);
      const int64_t m = ((i % period) + period) % period;
      return m < len ? m : period - m;
    }
  }
  return -1;
}

// The output coordinates of a padded dim that read each input coordinate, in increasing order:
// input coordinate i's are coords[offsets[i] .. offsets[i + 1]) (offsets has len + 1 entries,
// coords one per output coordinate that reads the input).
struct PadPreimages {
  const int64_t* offsets = nullptr;
  const int64_t* coords = nullptr;
};

// Fills offsets [len + 1] and coords [out] for a dim of len > 0 input coordinates padded to out
// by `before` (host).
inline void BuildPadPreimages(int64_t before, int64_t len, int64_t out, PadMode mode, int64_t* offsets,
                              int64_t* coords) {
  for (int64_t i = 0; i <= len; ++i) offsets[i] = 0;
  for (int64_t o = 0; o < out; ++o)
    if (const int64_t i = PadSourceCoord(o, before, len, mode); i >= 0) ++offsets[i + 1];
  for (int64_t i = 0; i < len; ++i) offsets[i + 1] += offsets[i];
  int64_t* next = offsets;  // offsets[i] advances as i's coordinates are placed, then steps back
  for (int64_t o = 0; o < out; ++o)
    if (const int64_t i = PadSourceCoord(o, before, len, mode); i >= 0) coords[next[i]++] = o;
  for (int64_t i = len; i > 0; --i) offsets[i] = offsets[i - 1];
  offsets[0] = 0;
}

// PadGrad: dX [x_dims] from dY (element strides y_strides per dim) through each dim's preimages.
inline constexpr int kPadGradMaxRank = 8;
struct PadGradLayout {
  int rank = 0;
  int64_t x_dims[kPadGradMaxRank] = {}, y_strides[kPadGradMaxRank] = {};
  PadPreimages pre[kPadGradMaxRank];
};

// dX at element x_index: the sum, in Acc and in a fixed order (the preimages' product,
// lexicographic), of load(offset) over the dY elements that read it.
template <typename Acc, typename Load>
CLEAVE_HOST_DEVICE inline Acc PadGradGather(const PadGradLayout& l, int64_t x_index, Load load) {
  int64_t k[kPadGradMaxRank], begin[kPadGradMaxRank], end[kPadGradMaxRank];
  for (int d = l.rank - 1; d >= 0; --d) {
    const int64_t i = x_index % l.x_dims[d];
    x_index /= l.x_dims[d];
    begin[d] = k[d] = l.pre[d].offsets[i];
    end[d] = l.pre[d].offsets[i + 1];
    if (begin[d] == end[d]) return Acc(0);
  }
  Acc sum(0);
  for (;;) {
    int64_t offset = 0;
    for (int d = 0; d < l.rank; ++d) offset += l.pre[d].coords[k[d]] * l.y_strides[d];
    sum += load(offset);
    int d = l.rank - 1;
    while (d >= 0 && ++k[d] == end[d]) k[d] = begin[d], --d;
    if (d < 0) return sum;
  }
}

}  // namespace cleave::kernels
