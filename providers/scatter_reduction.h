// ScatterElements' and ScatterND's `reduction` attribute (providers/), read one way for every
// provider, and the CPU's combination of an update into its element.
#pragma once

#include <algorithm>
#include <string>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "graph/graph.h"
#include "kernels/cpu/type_dispatch.h"

namespace cleave::providers {

enum class ScatterReduction : int { kNone, kAdd, kMul, kMax, kMin };

inline absl::StatusOr<ScatterReduction> ScatterReductionOf(const graph::Node& n) {
  const std::string r = n.AttrString("reduction", "none");
  if (r == "none") return ScatterReduction::kNone;
  if (r == "add") return ScatterReduction::kAdd;
  if (r == "mul") return ScatterReduction::kMul;
  if (r == "max") return ScatterReduction::kMax;
  if (r == "min") return ScatterReduction::kMin;
  return InvalidArgument(n.Describe(), ": expected reduction none, add, mul, max or min, got '", r, "'");
}

// o combined with u by `r` (not kNone); integers wrap, as numpy's do.
template <typename T>
void CombineInto(ScatterReduction r, T& o, T u) {
  switch (r) {
    case ScatterReduction::kAdd: o = kernels::cpu::WrapAdd(o, u); break;
    case ScatterReduction::kMul: o = kernels::cpu::WrapMul(o, u); break;
    case ScatterReduction::kMax: o = std::max(o, u); break;
    default: o = std::min(o, u); break;
  }
}

}  // namespace cleave::providers
