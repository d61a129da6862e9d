// Tensors (base/). TensorView is the non-owning view kernels see: a pointer, an element
// type and up to kMaxRank dims stored inline, so building one never allocates.
// Tensor owns (or shares) its bytes and hands out views. Layout is always dense row-major.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace cleave {

constexpr int kMaxRank = 8;

struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kUndefined;
  int rank = 0;
  int64_t dims[kMaxRank] = {};

  TensorView() = default;
  TensorView(void* p, DataType t, std::span<const int64_t> d);

  int64_t dim(int i) const { return dims[i < 0 ? i + rank : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * ElementSize(dtype); }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(dims, dims + rank); }
  std::span<const int64_t> dim_span() const { return {dims, static_cast<size_t>(rank)}; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

// Bytes of a dense tensor of `dims`, or -1 when a dim is negative or the size overflows int64.
int64_t DenseBytes(DataType dtype, std::span<const int64_t> dims);

// Element i of `data` (of type t): an integer or bool as int64 (a float truncated), or any of
// them as a double (uint64 through int64, as the integer form).
int64_t ElementAsInt(DataType t, const void* data, int64_t i);
double ElementAsDouble(DataType t, const void* data, int64_t i);
inline int64_t ElementAsInt(const TensorView& v, int64_t i) { return ElementAsInt(v.dtype, v.data, i); }
inline double ElementAsDouble(const TensorView& v, int64_t i) { return ElementAsDouble(v.dtype, v.data, i); }

// 64-byte aligned memory for `bytes` (at least one line), freed with the last owner; null when
// it cannot be had.
std::shared_ptr<void> TryAllocateAligned(size_t bytes, bool zero);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage.
  Tensor(DataType dtype, std::vector<int64_t> dims);
  // Allocates without filling, for tensors about to be overwritten whole.
  static Tensor Uninitialized(DataType dtype, std::vector<int64_t> dims);
  // As the constructor (zero) or Uninitialized, but an undefined Tensor, not an abort, when a
  // dim is negative, the size overflows, or the memory cannot be had.
  static Tensor TryAllocate(DataType dtype, std::vector<int64_t> dims, bool zero = true);
  // Shares storage owned elsewhere (e.g. an mmap'ed external-data file).
  Tensor(DataType dtype, std::vector<int64_t> dims, std::shared_ptr<void> storage, void* data);

  template <typename T>
  static Tensor FromVector(const std::vector<T>& v, std::vector<int64_t> dims) {
    Tensor t(DataTypeOf<T>::value, std::move(dims));
    for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = v[i];
    return t;
  }
  template <typename T>
  static Tensor Scalar(T v) { return FromVector<T>({v}, {}); }

  bool defined() const { return dtype_ != DataType::kUndefined; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * ElementSize(dtype_); }
  void* raw() const { return data_; }
  template <typename T>
  T* data() const { return static_cast<T*>(data_); }
  TensorView view() const { return TensorView(data_, dtype_, dims_); }
  Tensor Clone() const;
  // Reads element i of an integer or float tensor as int64 (shape arithmetic).
  int64_t IntAt(int64_t i) const;
  double DoubleAt(int64_t i) const;
  std::vector<int64_t> ToInt64Vector() const;

 private:
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> dims_;
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
};

// Copies a view into a new owning tensor.
Tensor CopyToTensor(const TensorView& v);

}  // namespace cleave
