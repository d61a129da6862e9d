// How a rotary embedding's x rows meet its cos / sin tables (kernels/), shared by the CPU and
// CUDA kernels: plain data, no CUDA or abseil header.
#pragma once

#include <cstdint>

namespace cleave::kernels {

// x viewed as `rows` rows of its last axis (`dim` elements, even); cos and sin (one layout)
// broadcast over x's leading dims lead_dims[0..lead_rank) with table_strides (0 where they
// broadcast) and along the row with table_col (1, or 0 for a table of one column).
struct RotaryLayout {
  static constexpr int kMaxLeadRank = 8;
  int64_t rows = 0, dim = 0;
  int lead_rank = 0;
  int64_t lead_dims[kMaxLeadRank] = {};
  int64_t table_strides[kMaxLeadRank] = {};
  int64_t table_col = 1;
};

}  // namespace cleave::kernels
