// Tensor storage and element access (base/).
#include "base/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/status.h"

namespace cleave {

TensorView::TensorView(void* p, DataType t, std::span<const int64_t> d) : data(p), dtype(t) {
  CLEAVE_CHECK(d.size() <= kMaxRank);
  rank = static_cast<int>(d.size());
  for (int i = 0; i < rank; ++i) dims[i] = d[i];
}

int64_t DenseBytes(DataType dtype, std::span<const int64_t> dims) {
  int64_t n = static_cast<int64_t>(ElementSize(dtype));
  for (int64_t d : dims) {
    if (d < 0) return -1;
    if (d > 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

std::shared_ptr<void> TryAllocateAligned(size_t bytes, bool zero) {
  if (bytes > std::numeric_limits<size_t>::max() - 63) return nullptr;
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) return nullptr;
  if (zero) std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

namespace {
std::shared_ptr<void> AllocateAligned(size_t bytes, bool zero = true) {
  std::shared_ptr<void> p = TryAllocateAligned(bytes, zero);
  CLEAVE_CHECK(p != nullptr);
  return p;
}
}  // namespace

Tensor::Tensor(DataType dtype, std::vector<int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
  storage_ = AllocateAligned(nbytes());
  data_ = storage_.get();
}

Tensor::Tensor(DataType dtype, std::vector<int64_t> dims, std::shared_ptr<void> storage, void* data)
    : dtype_(dtype), dims_(std::move(dims)), storage_(std::move(storage)), data_(data) {}

Tensor Tensor::TryAllocate(DataType dtype, std::vector<int64_t> dims, bool zero) {
  const int64_t bytes = DenseBytes(dtype, dims);
  if (bytes < 0) return Tensor();
  std::shared_ptr<void> storage = TryAllocateAligned(static_cast<size_t>(bytes), zero);
  if (!storage) return Tensor();
  void* data = storage.get();
  return Tensor(dtype, std::move(dims), std::move(storage), data);
}

Tensor Tensor::Uninitialized(DataType dtype, std::vector<int64_t> dims) {
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.storage_ = AllocateAligned(t.nbytes(), /*zero=*/false);
  t.data_ = t.storage_.get();
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

Tensor Tensor::Clone() const {
  Tensor t(dtype_, dims_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

int64_t ElementAsInt(DataType t, const void* data, int64_t i) {
  switch (t) {
    case DataType::kInt64: return static_cast<const int64_t*>(data)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DataType::kInt16: return static_cast<const int16_t*>(data)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(data)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(data)[i];
    case DataType::kUInt16: return static_cast<const uint16_t*>(data)[i];
    case DataType::kUInt32: return static_cast<const uint32_t*>(data)[i];
    case DataType::kUInt64: return static_cast<int64_t>(static_cast<const uint64_t*>(data)[i]);
    case DataType::kBool: return static_cast<const bool*>(data)[i] ? 1 : 0;
    default: return static_cast<int64_t>(ElementAsDouble(t, data, i));
  }
}

double ElementAsDouble(DataType t, const void* data, int64_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(data)[i];
    case DataType::kFloat64: return static_cast<const double*>(data)[i];
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default: return static_cast<double>(ElementAsInt(t, data, i));
  }
}

int64_t Tensor::IntAt(int64_t i) const { return ElementAsInt(dtype_, data_, i); }

double Tensor::DoubleAt(int64_t i) const { return ElementAsDouble(dtype_, data_, i); }

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> v(numel());
  for (int64_t i = 0; i < numel(); ++i) v[i] = IntAt(i);
  return v;
}

Tensor CopyToTensor(const TensorView& v) {
  Tensor t(v.dtype, v.shape());
  if (v.nbytes()) std::memcpy(t.raw(), v.data, v.nbytes());
  return t;
}

}  // namespace cleave
