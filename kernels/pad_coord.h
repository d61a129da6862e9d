// Where Pad reads (kernels/): the input coordinate an output coordinate of a padded dim takes,
// for the CPU's Pad and the CUDA provider's Pad and Tile alike (Tile is wrap mode with nothing
// before).
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

}  // namespace cleave::kernels
