// Data-movement kernels on the CPU (kernels/cpu/): transpose, slice, expand, concat, split,
// gather, fill and range. They move bytes, so all but Range work by element size and take
// every fixed-size dtype. Outputs are dense row-major views the caller has allocated with
// the right dims; nothing here allocates, and every output element is written exactly once.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/fixed_vector.h"
#include "base/status.h"
#include "base/tensor.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

// Calls fn(U{}) with the unsigned integer type U of the element size (1, 2, 4 or 8 bytes),
// so a byte-moving loop is written once and runs for every dtype of that size.
template <typename Fn>
void ForElementSize(size_t elem_size, Fn&& fn) {
  switch (elem_size) {
    case 1: fn(uint8_t{}); break;
    case 2: fn(uint16_t{}); break;
    case 4: fn(uint32_t{}); break;
    case 8: fn(uint64_t{}); break;
    default: CLEAVE_CHECK(false && "element size must be 1, 2, 4 or 8");
  }
}

// dst[i_0, ..., i_{r-1}] = src[offset + sum_k i_k * src_strides[k]] for a dense dst of
// `dims`. Strides are in elements and may be 0 (broadcast) or negative (reverse walk).
// Transpose, Slice and Expand are this one copy with different strides.
struct StridedCopyParams {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t src_strides[kMaxRank] = {};
  int64_t src_offset = 0;
  size_t elem_size = 0;
};
void StridedCopy(const StridedCopyParams& p, const void* src, void* dst, ThreadPool* pool);

// memcpy split into large chunks across the pool (Reshape, Identity, Flatten copies).
void CopyBytes(void* dst, const void* src, size_t bytes, ThreadPool* pool);

// Row-major strides of `dims`, in elements, into strides[0, dims.size()).
void DenseStrides(std::span<const int64_t> dims, int64_t* strides);

// y = x with axes permuted: y.dims[k] == x.dims[perm[k]].
void Transpose(const TensorView& x, std::span<const int> perm, TensorView& y, ThreadPool* pool);

// Per-axis slice of every input axis (axes not sliced: start 0, step 1, full length).
struct SliceParams {
  DimVector starts, steps, out_dims;
};
// Resolves ONNX Slice arguments against concrete dims: negative starts/ends count from the
// end, then starts/ends are clamped to [0, d] for positive steps and [-1, d-1] (ends) /
// [0, d-1] (starts) for negative steps; empty `axes` means 0..n-1, empty `steps` means 1.
// Errors for a zero step, an axis out of range, a repeated axis or mismatched lengths.
absl::StatusOr<SliceParams> ResolveSlice(std::span<const int64_t> dims,
                                         std::span<const int64_t> starts,
                                         std::span<const int64_t> ends,
                                         std::span<const int64_t> axes,
                                         std::span<const int64_t> steps);
void Slice(const TensorView& x, const SliceParams& p, TensorView& y, ThreadPool* pool);

// Broadcasts x (numpy rules, right-aligned) to y.dims, which the caller has computed.
void Expand(const TensorView& x, TensorView& y, ThreadPool* pool);

// Concatenates xs along `axis` (normalised) into y; every x has y's dims except at axis.
// Concat and Split take any number of parts and allocate nothing: block offsets are
// running sums recomputed per row, which costs one multiply per part.
void Concat(std::span<const TensorView* const> xs, int axis, TensorView& y, ThreadPool* pool);
// The inverse: ys[i] takes the next sizes[i] entries along axis. A null ys[i] is an output
// nobody reads; its entries are skipped.
void Split(const TensorView& x, int axis, std::span<const int64_t> sizes,
           std::span<TensorView* const> ys, ThreadPool* pool);

// y = data indexed along `axis` by `indices` (int32 or int64; negative counts from the end).
// y.dims = data.dims[:axis] + indices.dims + data.dims[axis+1:]. Every index is checked
// before anything is written; an index outside [-d, d) is InvalidArgument.
absl::Status Gather(const TensorView& data, const TensorView& indices, int axis, TensorView& y,
                    ThreadPool* pool);

// Writes n copies of the elem_size bytes at `value` (ConstantOfShape).
void FillBytes(void* dst, int64_t n, const void* value, size_t elem_size);

// Number of Range elements: max(ceil((limit - start) / delta), 0). Integers use exact
// integer division so large int64 ranges do not lose precision through double.
template <typename T>
int64_t RangeCount(T start, T limit, T delta) {
  if constexpr (std::is_integral_v<T>) {
    int64_t span = static_cast<int64_t>(limit) - static_cast<int64_t>(start);
    int64_t d = static_cast<int64_t>(delta);
    // ceil(span / d) for either sign of d: C++ division truncates toward zero, so add
    // one when the quotient is positive and there is a remainder.
    int64_t q = span / d;
    if (span % d != 0 && ((span < 0) == (d < 0))) ++q;
    return q > 0 ? q : 0;
  } else {
    double n = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) /
                         static_cast<double>(delta));
    return n > 0 ? static_cast<int64_t>(n) : 0;
  }
}

// out[i] = start + i * delta, as the ONNX spec writes it (not a running sum, so rounding
// error does not accumulate along the range). Floats are computed in double and rounded
// once; integers in int64, which cannot overflow for a range whose ends fit in T.
template <typename T>
void Range(T start, T delta, int64_t n, T* out) {
  using Wide = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(static_cast<Wide>(start) +
                            static_cast<Wide>(i) * static_cast<Wide>(delta));
}

}  // namespace cleave::kernels::cpu
