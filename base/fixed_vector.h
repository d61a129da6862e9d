// FixedVector (base/): a vector of at most N trivially copyable elements stored inline, for
// the dims, axes and shape values kernels compute on the step path, where no heap
// allocation is allowed. It never spills: growing past N is a bug (CLEAVE_CHECK), so code
// filling one from runtime values checks the count first and returns a user error.
#pragma once

#include <initializer_list>
#include <span>
#include <type_traits>

#include "base/status.h"
#include "base/tensor.h"

namespace cleave {

template <typename T, int N>
class FixedVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "FixedVector holds plain values (dims, axes, pointers)");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  FixedVector() = default;
  FixedVector(int n, T value) { resize(n, value); }
  FixedVector(std::initializer_list<T> v) : FixedVector(std::span<const T>(v.begin(), v.size())) {}
  explicit FixedVector(std::span<const T> v) {
    CLEAVE_CHECK(v.size() <= static_cast<size_t>(N));
    for (const T& x : v) items_[size_++] = x;
  }

  static constexpr int capacity() { return N; }
  int size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return items_; }
  const T* data() const { return items_; }
  T& operator[](int i) { return items_[i]; }
  const T& operator[](int i) const { return items_[i]; }
  T& back() { return items_[size_ - 1]; }
  T* begin() { return items_; }
  T* end() { return items_ + size_; }
  const T* begin() const { return items_; }
  const T* end() const { return items_ + size_; }
  std::span<const T> span() const { return {items_, static_cast<size_t>(size_)}; }
  operator std::span<const T>() const { return span(); }  // NOLINT: a view of the elements

  void push_back(T v) {
    CLEAVE_CHECK(size_ < N);
    items_[size_++] = v;
  }
  void resize(int n, T value = T()) {
    CLEAVE_CHECK(n >= 0 && n <= N);
    for (int i = size_; i < n; ++i) items_[i] = value;
    size_ = n;
  }
  void clear() { size_ = 0; }

  bool operator==(const FixedVector& o) const {
    if (size_ != o.size_) return false;
    for (int i = 0; i < size_; ++i)
      if (!(items_[i] == o.items_[i])) return false;
    return true;
  }

 private:
  int size_ = 0;
  T items_[N] = {};
};

// Concrete dims of one tensor (or axes of one): never more than kMaxRank.
using DimVector = FixedVector<int64_t, kMaxRank>;

}  // namespace cleave
