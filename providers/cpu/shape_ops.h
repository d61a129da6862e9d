// Shared pieces of the CPU shape and data-movement kernels (providers/cpu/). The kernels
// are split by concept over shape_ops.cc (same bytes, new dims), data_movement_ops.cc
// (bytes rearranged) and constant_ops.cc (values made from attributes or shapes);
// RegisterShapeKernels in shape_ops.cc registers all three families.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "base/fixed_vector.h"
#include "base/tensor.h"
#include "providers/kernel.h"

namespace cleave::providers {

// Every dtype with a fixed element size: these ops move bytes, so they take them all.
const std::vector<DataType>& FixedSizeTypes();

// Element i of an int32 or int64 tensor, as int64.
inline int64_t IntAt(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kInt32 ? v.as<const int32_t>()[i] : v.as<const int64_t>()[i];
}

// Reads the values of a 0-D or 1-D int32/int64 runtime input (a shape, axes, starts...)
// into *out without allocating. More than kMaxRank values is InvalidArgument naming `what`:
// no valid shape or list of distinct axes is that long.
absl::Status ReadDimValues(const TensorView& v, const char* what, DimVector* out);

// n uninitialised elements of T from the context's scratch memory, for per-run arrays
// whose length depends on the node (Concat inputs, Split outputs): scratch is planned with
// the run, so this does not allocate once the session has warmed up. Its data() is null when
// the scratch cannot be had (see KernelContext::Scratch).
template <typename T>
std::span<T> ScratchArray(KernelContext& ctx, int n) {
  static_assert(std::is_trivially_copyable_v<T>);
  T* data = ctx.ScratchOf<T>(n);
  return {data, data ? static_cast<size_t>(n) : size_t{0}};
}

void RegisterDataMovementKernels(KernelRegistry& r);  // data_movement_ops.cc
void RegisterConstantKernels(KernelRegistry& r);      // constant_ops.cc

}  // namespace cleave::providers
