// Shared pieces of the CPU shape and data-movement kernels (providers/cpu/). The kernels
// are split by concept over shape_ops.cc (same bytes, new dims), data_movement_ops.cc
// (bytes rearranged) and constant_ops.cc (values made from attributes or shapes);
// RegisterShapeKernels in shape_ops.cc registers all three families.
#pragma once

#include <cstdint>
#include <vector>

#include "base/tensor.h"
#include "providers/kernel.h"

namespace cleave::providers {

// Every dtype with a fixed element size: these ops move bytes, so they take them all.
const std::vector<DataType>& FixedSizeTypes();

// The values of a 0-D or 1-D int32/int64 tensor (a runtime shape, axes or indices input).
std::vector<int64_t> ViewInts(const TensorView& v);

void RegisterDataMovementKernels(KernelRegistry& r);  // data_movement_ops.cc
void RegisterConstantKernels(KernelRegistry& r);      // constant_ops.cc

}  // namespace cleave::providers
