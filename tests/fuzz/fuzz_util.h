// What the session and training fuzz targets share (tests/fuzz/): the size budget a model must
// fit to be worth running, and the deterministic inputs they feed.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/tensor.h"
#include "graph/graph.h"
#include "graph/op_table.h"

namespace cleave::fuzz {

// A model this large is legitimate, but its folding and runs measure memory bandwidth, not
// robustness: models with a known value or initializer past these are skipped.
inline constexpr int64_t kMaxElements = int64_t{1} << 16;
inline constexpr int64_t kMaxTotalElements = int64_t{1} << 20;
// Symbolic dims of the inputs are fixed to this.
inline constexpr int64_t kFreeDim = 2;

// The symbolic dims of g's inputs, each fixed to kFreeDim.
inline std::map<std::string, int64_t> FreeDims(const graph::Graph& g) {
  std::map<std::string, int64_t> dims;
  for (const graph::Value* in : g.inputs())
    for (const Dim& d : in->shape().dims())
      if (!d.symbol.empty()) dims[d.symbol] = kFreeDim;
  return dims;
}

// `shape` with its symbolic dims fixed to kFreeDim.
inline Shape Fixed(const Shape& shape) {
  if (!shape.has_rank()) return shape;
  std::vector<Dim> dims = shape.dims();
  for (Dim& d : dims)
    if (!d.is_static()) d = Dim(kFreeDim);
  return Shape(std::move(dims));
}

// Whether g's shapes infer and every value and initializer fits the budget.
inline bool WithinBudget(graph::Graph& g) {
  if (!graph::InferShapes(g).ok()) return false;
  int64_t total = 0;
  for (const graph::Value* v : g.AllValues()) {
    const int64_t n = v->is_initializer() ? v->initializer()->numel() : v->shape().NumElements();
    if (n > kMaxElements) return false;
    if (n > 0) total += n;
  }
  return total <= kMaxTotalElements;
}

// A tensor of `dtype` and `shape` holding small values of both signs (index-like inputs stay
// mostly in range), or nothing when the shape is not static and small.
inline bool MakeInput(DataType dtype, const Shape& shape, Tensor* out) {
  if (!shape.has_rank() || ElementSize(dtype) == 0) return false;
  std::vector<int64_t> dims;
  for (const Dim& d : shape.dims()) {
    if (!d.is_static() || d.value > 64) return false;
    dims.push_back(d.value);
  }
  const int64_t bytes = DenseBytes(dtype, dims);
  if (bytes < 0 || bytes / static_cast<int64_t>(ElementSize(dtype)) > kMaxElements) return false;
  Tensor t(dtype, dims);
  const int64_t n = t.numel();
  switch (dtype) {
    case DataType::kFloat32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
      break;
    case DataType::kInt64:
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i % 3;
      break;
    case DataType::kInt32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
      break;
    case DataType::kBool:
      for (int64_t i = 0; i < n; ++i) t.data<bool>()[i] = i % 2 == 0;
      break;
    default:
      if (t.nbytes() > 0) std::memset(t.raw(), 0, t.nbytes());
      break;
  }
  *out = std::move(t);
  return true;
}

}  // namespace cleave::fuzz
