// Comparing tensors against expected values (base/): one rule for tests, `cleave run
// --check` and `cleave conformance`. Floats pass when |got - want| <= atol + rtol * |want|
// (numpy's allclose, as the ONNX backend runner uses); NaN matches NaN and an infinity
// matches itself. Integers and bools must be equal.
#pragma once

#include <cstdint>
#include <string>

#include "base/tensor.h"

namespace cleave {

struct TensorDiff {
  std::string mismatch;  // dtype or shape disagreement, else empty
  int64_t bad = 0;       // elements outside the tolerance
  int64_t worst = -1;    // index of the element with the largest error among them
  double max_abs = 0;    // over all elements
  double max_rel = 0;    // over elements whose expected value is non-zero
  bool ok() const { return mismatch.empty() && bad == 0; }
  // "" when ok, else what differs and by how much.
  std::string Describe(const Tensor& got, const Tensor& want) const;
};

TensorDiff DiffTensors(const Tensor& got, const Tensor& want, double atol, double rtol);

}  // namespace cleave
