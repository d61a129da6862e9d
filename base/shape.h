// Shapes of graph values (base/): static dims, named symbolic dims ("batch", "seq")
// and unknown dims. A Shape may also have unknown rank. Concrete run-time shapes are
// plain int64 vectors; Shape is what inference reasons about before inputs are bound.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cleave {

struct Dim {
  int64_t value = -1;  // >= 0 when static
  std::string symbol;  // non-empty for a named symbolic dim

  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT: a number is a static dim
  static Dim Symbol(std::string s) {
    Dim d;
    d.symbol = std::move(s);
    return d;
  }
  bool is_static() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
};

class Shape {
 public:
  Shape() = default;  // unknown rank
  explicit Shape(std::vector<Dim> dims) : has_rank_(true), dims_(std::move(dims)) {}
  static Shape FromDims(const std::vector<int64_t>& dims);
  static Shape Scalar() { return Shape(std::vector<Dim>{}); }

  bool has_rank() const { return has_rank_; }
  int rank() const { return static_cast<int>(dims_.size()); }
  const std::vector<Dim>& dims() const { return dims_; }
  std::vector<Dim>& mutable_dims() { return dims_; }
  const Dim& operator[](int i) const { return dims_[i]; }
  bool is_static() const;                 // known rank and every dim static
  std::vector<int64_t> StaticDims() const;  // requires is_static()
  int64_t NumElements() const;            // -1 unless static
  std::string ToString() const;           // "[batch,64,?]" or "?"
  bool operator==(const Shape& o) const { return has_rank_ == o.has_rank_ && dims_ == o.dims_; }

 private:
  bool has_rank_ = false;
  std::vector<Dim> dims_;
};

std::string DimsToString(const int64_t* dims, int rank);
inline std::string DimsToString(const std::vector<int64_t>& d) {
  return DimsToString(d.data(), static_cast<int>(d.size()));
}
inline std::string DimsToString(std::span<const int64_t> d) {
  return DimsToString(d.data(), static_cast<int>(d.size()));
}
int64_t Product(const std::vector<int64_t>& dims);

}  // namespace cleave
