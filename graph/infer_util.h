// Helpers shared by the shape-inference functions (graph/).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "base/shape.h"
#include "graph/op_table.h"

namespace cleave::graph {

// Numpy/ONNX multidirectional broadcasting of symbolic shapes. A symbolic dim meets a
// static 1 as itself, meets an equal symbol as itself, and meets anything else unknown.
absl::StatusOr<Shape> BroadcastShapes(const InferContext& ctx, const std::vector<Shape>& shapes);
// Broadcasting of concrete dims (kernels and the executor share it through base types).
std::optional<std::vector<int64_t>> BroadcastDims(const std::vector<int64_t>& a,
                                                  const std::vector<int64_t>& b);
// Maps axis in [-rank, rank) to [0, rank), or errors naming the node.
absl::StatusOr<int> NormalizeAxis(const InferContext& ctx, int64_t axis, int rank);
// The constant int64 values of input i (from an initializer), if known.
std::optional<std::vector<int64_t>> ConstantInts(const InferContext& ctx, int i);
// Checks input i's dtype is one of `allowed`.
absl::Status ExpectDtype(const InferContext& ctx, int i, std::initializer_list<DataType> allowed);
// Output 0 = input 0's dtype and shape (unary elementwise ops).
absl::Status InferSameAsInput0(InferContext& ctx);

}  // namespace cleave::graph
