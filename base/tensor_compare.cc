// Tolerance comparison of tensors (base/).
#include "base/tensor_compare.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/shape.h"

namespace cleave {

TensorDiff DiffTensors(const Tensor& got, const Tensor& want, double atol, double rtol) {
  TensorDiff d;
  if (got.dtype() != want.dtype()) {
    d.mismatch = absl::StrCat("dtype ", DataTypeName(got.dtype()), ", expected ", DataTypeName(want.dtype()));
    return d;
  }
  if (got.dims() != want.dims()) {
    d.mismatch = absl::StrCat("shape ", DimsToString(got.dims()), ", expected ", DimsToString(want.dims()));
    return d;
  }
  const bool is_float = IsFloat(want.dtype());
  double worst_err = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.DoubleAt(i), w = want.DoubleAt(i);
    if (!is_float) {
      if (got.IntAt(i) == want.IntAt(i)) continue;
      g = static_cast<double>(got.IntAt(i)), w = static_cast<double>(want.IntAt(i));
    } else if ((std::isnan(g) && std::isnan(w)) || (std::isinf(w) && g == w)) {
      continue;
    }
    double err = std::fabs(g - w);
    if (std::isnan(err)) err = INFINITY;
    d.max_abs = std::max(d.max_abs, err);
    if (w != 0) d.max_rel = std::max(d.max_rel, err / std::fabs(w));
    if (is_float && err <= atol + rtol * std::fabs(w)) continue;
    ++d.bad;
    if (err > worst_err) worst_err = err, d.worst = i;
  }
  return d;
}

std::string TensorDiff::Describe(const Tensor& got, const Tensor& want) const {
  if (!mismatch.empty()) return mismatch;
  if (bad == 0) return "";
  return absl::StrCat(bad, " of ", want.numel(), " elements differ, max abs error ", max_abs,
                      ", max rel error ", max_rel, "; worst at element ", worst, ": got ",
                      got.DoubleAt(worst), ", expected ", want.DoubleAt(worst));
}

}  // namespace cleave
