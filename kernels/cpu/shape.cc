// Block-copy kernels on the CPU (kernels/cpu/): Concat, Split, Gather, fill, and the
// resolution of Slice arguments. Each works on contiguous blocks of bytes (a row of the
// inner dims), so one memcpy moves a whole block whatever the element type.
#include <algorithm>
#include <cstring>

#include "base/status.h"
#include "kernels/cpu/shape.h"

namespace cleave::kernels::cpu {

namespace {

// Below this many bytes per thread, waking the pool costs more than the copy.
constexpr int64_t kParallelBytes = 32 * 1024;

int64_t Grain(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kParallelBytes / std::max<int64_t>(1, bytes_per_item));
}

int64_t ProductOf(const int64_t* dims, int begin, int end) {
  int64_t n = 1;
  for (int k = begin; k < end; ++k) n *= dims[k];
  return n;
}

// One axis of Slice, per the ONNX clamping rules (see shape.h).
void ResolveAxis(int64_t d, int64_t start, int64_t end, int64_t step, int64_t* out_start,
                 int64_t* out_len) {
  if (d == 0) {
    *out_start = 0;
    *out_len = 0;
    return;
  }
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    *out_len = end > start ? (end - start + step - 1) / step : 0;
  } else {
    // A negative step walks down from start to just above end; end = -1 means "through
    // index 0", which is why its clamp range starts at -1.
    start = std::clamp<int64_t>(start, 0, d - 1);
    end = std::clamp<int64_t>(end, -1, d - 1);
    *out_len = start > end ? (start - end - step - 1) / -step : 0;
  }
  *out_start = start;
}

}  // namespace

absl::StatusOr<SliceParams> ResolveSlice(std::span<const int64_t> dims,
                                         std::span<const int64_t> starts,
                                         std::span<const int64_t> ends,
                                         std::span<const int64_t> axes,
                                         std::span<const int64_t> steps) {
  const int rank = static_cast<int>(dims.size());
  const size_t n = starts.size();
  if (ends.size() != n || (!axes.empty() && axes.size() != n) ||
      (!steps.empty() && steps.size() != n))
    return InvalidArgument("expected starts, ends, axes and steps of equal length, got ",
                           n, ", ", ends.size(), ", ", axes.size(), ", ", steps.size());
  if (rank > kMaxRank) return InvalidArgument("rank ", rank, " exceeds the maximum ", kMaxRank);
  SliceParams p;
  p.starts.resize(rank, 0);
  p.steps.resize(rank, 1);
  p.out_dims = DimVector(dims);
  bool seen[kMaxRank] = {};
  for (size_t i = 0; i < n; ++i) {
    int64_t axis = axes.empty() ? static_cast<int64_t>(i) : axes[i];
    if (axis < -rank || axis >= rank)
      return InvalidArgument("slice axis ", axis, " is out of range for rank ", rank);
    if (axis < 0) axis += rank;
    if (seen[axis]) return InvalidArgument("slice axis ", axis, " is repeated");
    seen[axis] = true;
    int64_t step = steps.empty() ? 1 : steps[i];
    if (step == 0)
      return InvalidArgument("slice step for axis ", axis, " is 0, expected non-zero");
    p.steps[axis] = step;
    ResolveAxis(dims[axis], starts[i], ends[i], step, &p.starts[axis], &p.out_dims[axis]);
  }
  return p;
}

void Concat(std::span<const TensorView* const> xs, int axis, TensorView& y, ThreadPool* pool) {
  const size_t esize = ElementSize(y.dtype);
  const int64_t outer = ProductOf(y.dims, 0, axis);
  // Bytes of one step along the axis: input i's block in a row is dims[axis] of these.
  const int64_t inner = ProductOf(y.dims, axis + 1, y.rank) * esize;
  const int64_t y_row = y.dims[axis] * inner;
  char* out = static_cast<char*>(y.data);
  if (outer == 1) {  // each input is one contiguous block of the output
    int64_t offset = 0;
    for (const TensorView* x : xs) {
      const int64_t block = x->dims[axis] * inner;
      CopyBytes(out + offset, x->data, block, pool);
      offset += block;
    }
    return;
  }
  ParallelFor(pool, outer, Grain(y_row), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      int64_t offset = 0;
      for (const TensorView* x : xs) {
        const int64_t block = x->dims[axis] * inner;
        if (block)
          std::memcpy(out + o * y_row + offset, static_cast<const char*>(x->data) + o * block,
                      block);
        offset += block;
      }
    }
  });
}

void Split(const TensorView& x, int axis, std::span<const int64_t> sizes,
           std::span<TensorView* const> ys, ThreadPool* pool) {
  const size_t esize = ElementSize(x.dtype);
  const int64_t outer = ProductOf(x.dims, 0, axis);
  const int64_t x_row = ProductOf(x.dims, axis, x.rank) * esize;
  const int64_t inner = ProductOf(x.dims, axis + 1, x.rank) * esize;
  const char* in = static_cast<const char*>(x.data);
  if (outer == 1) {  // each output is one contiguous block of the input
    int64_t offset = 0;
    for (size_t i = 0; i < ys.size(); ++i) {
      const int64_t block = sizes[i] * inner;
      if (ys[i]) CopyBytes(ys[i]->data, in + offset, block, pool);
      offset += block;  // a skipped output still takes its share of the axis
    }
    return;
  }
  ParallelFor(pool, outer, Grain(x_row), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      int64_t offset = 0;
      for (size_t i = 0; i < ys.size(); ++i) {
        const int64_t block = sizes[i] * inner;
        if (ys[i] && block)
          std::memcpy(static_cast<char*>(ys[i]->data) + o * block, in + o * x_row + offset,
                      block);
        offset += block;
      }
    }
  });
}

namespace {

int64_t IndexAt(const TensorView& indices, int64_t j) {
  return indices.dtype == DataType::kInt32 ? indices.as<const int32_t>()[j]
                                           : indices.as<const int64_t>()[j];
}

// Gather of single elements (axis is the last one): a typed loop, since a memcpy call per
// element would cost more than the element.
template <typename T>
void GatherElements(const T* data, const TensorView& indices, int64_t outer, int64_t d, T* y,
                    ThreadPool* pool) {
  const int64_t n = indices.numel();
  ParallelFor(pool, outer, Grain(n * sizeof(T)), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      for (int64_t j = 0; j < n; ++j) {
        int64_t idx = IndexAt(indices, j);
        y[o * n + j] = data[o * d + (idx < 0 ? idx + d : idx)];
      }
  });
}

}  // namespace

absl::Status Gather(const TensorView& data, const TensorView& indices, int axis, TensorView& y,
                    ThreadPool* pool) {
  if (indices.dtype != DataType::kInt32 && indices.dtype != DataType::kInt64)
    return InvalidArgument("Gather indices have dtype ", DataTypeName(indices.dtype),
                           ", expected int32 or int64");
  const int64_t d = data.dims[axis], n = indices.numel();
  for (int64_t j = 0; j < n; ++j) {
    int64_t idx = IndexAt(indices, j);
    if (idx < -d || idx >= d)
      return InvalidArgument("index ", idx, " (element ", j, " of indices) is out of ",
                             "range for axis ", axis, " of size ", d, ": expected [", -d, ", ",
                             d - 1, "]");
  }
  if (y.numel() == 0) return absl::OkStatus();
  const size_t esize = ElementSize(data.dtype);
  const int64_t outer = ProductOf(data.dims, 0, axis);
  const int64_t inner = ProductOf(data.dims, axis + 1, data.rank);
  if (inner == 1) {
    ForElementSize(esize, [&](auto u) {
      using U = decltype(u);
      GatherElements(data.as<const U>(), indices, outer, d, y.as<U>(), pool);
    });
    return absl::OkStatus();
  }
  // Rows of `inner` elements. With axis 0 this is the embedding lookup: outer is 1 and
  // every index copies one contiguous table row, in parallel over the indices.
  const size_t row = static_cast<size_t>(inner) * esize;
  const char* in = static_cast<const char*>(data.data);
  char* out = static_cast<char*>(y.data);
  ParallelFor(pool, outer * n, Grain(row), [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      int64_t o = w / n, idx = IndexAt(indices, w % n);
      if (idx < 0) idx += d;
      std::memcpy(out + w * row, in + (o * d + idx) * row, row);
    }
  });
  return absl::OkStatus();
}

void FillBytes(void* dst, int64_t n, const void* value, size_t elem_size) {
  ForElementSize(elem_size, [&](auto u) {
    using U = decltype(u);
    std::fill_n(static_cast<U*>(dst), n, *static_cast<const U*>(value));
  });
}

}  // namespace cleave::kernels::cpu
