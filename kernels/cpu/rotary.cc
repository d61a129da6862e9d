// Rotary position embedding on the CPU (kernels/cpu/): y = x cos + rotate_half(x) sin and its
// gradient, one row of x (the last axis, D elements) at a time, rows in parallel. The products
// and the sum are formed as the exported Mul, Neg, Concat and Add form them, so the fused op
// computes the same bits.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/shape.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

namespace {

// The offset of x's row r into the cos / sin tables (broadcast over x's leading dims).
int64_t TableRow(const RotaryLayout& p, int64_t r) {
  int64_t off = 0;
  for (int k = p.lead_rank - 1; k >= 0; --k) {
    const int64_t d = p.lead_dims[k];
    off += (r % d) * p.table_strides[k];
    r /= d;
  }
  return off;
}

}  // namespace

absl::StatusOr<RotaryLayout> PlanRotary(std::span<const int64_t> x, std::span<const int64_t> table) {
  const int xr = static_cast<int>(x.size()), tr = static_cast<int>(table.size());
  auto error = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("rotary embedding: ", why, "; x ", DimsToString(x), ", cos/sin ",
                                                   DimsToString(table)));
  };
  if (xr == 0 || x[xr - 1] % 2 != 0) return error("expected x's last dim to be even (two halves)");
  if (tr > xr) return error("expected cos/sin of at most x's rank");
  RotaryLayout p;
  p.dim = x[xr - 1];
  p.rows = p.dim ? Product(std::vector<int64_t>(x.begin(), x.end())) / p.dim : 0;
  p.lead_rank = xr - 1;
  const int64_t col = tr ? table[tr - 1] : 1;
  if (col != p.dim && col != 1) return error("expected cos/sin's last dim to be x's or 1");
  p.table_col = col == 1 ? 0 : 1;
  int64_t stride = col;
  for (int k = xr - 2; k >= 0; --k) {
    p.lead_dims[k] = x[k];
    const int t = k - (xr - tr);  // the table's dim against x's dim k, if it has one
    const int64_t d = t >= 0 ? table[t] : 1;
    if (d != 1 && d != x[k]) return error("expected cos/sin to broadcast to x");
    p.table_strides[k] = d == 1 ? 0 : stride;
    stride *= d;
  }
  return p;
}

template <typename T>
void Rotary(const RotaryLayout& p, bool backward, const T* x, const T* cos, const T* sin, T* y, ThreadPool* pool) {
  const int64_t D = p.dim, h = D / 2, cs = p.table_col;
  ParallelFor(pool, p.rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(D, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * D;
      const int64_t row = TableRow(p, r);  // cos and sin share a layout
      const T* c = cos + row;
      const T* s = sin + row;
      T* yr = y + r * D;
      if (!backward) {  // x cos + concat(-x2, x1) sin
        for (int64_t i = 0; i < h; ++i) yr[i] = xr[i] * c[i * cs] + (-xr[i + h]) * s[i * cs];
        for (int64_t i = h; i < D; ++i) yr[i] = xr[i] * c[i * cs] + xr[i - h] * s[i * cs];
      } else {  // dy cos + concat((dy sin)2, -(dy sin)1)
        for (int64_t i = 0; i < h; ++i) yr[i] = xr[i] * c[i * cs] + xr[i + h] * s[(i + h) * cs];
        for (int64_t i = h; i < D; ++i) yr[i] = xr[i] * c[i * cs] + (-(xr[i - h] * s[(i - h) * cs]));
      }
    }
  });
}

template void Rotary<float>(const RotaryLayout&, bool, const float*, const float*, const float*, float*,
                            ThreadPool*);
template void Rotary<double>(const RotaryLayout&, bool, const double*, const double*, const double*, double*,
                             ThreadPool*);

}  // namespace cleave::kernels::cpu
