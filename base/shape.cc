// Shape printing and helpers (base/).
#include "base/shape.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave {

Shape Shape::FromDims(const std::vector<int64_t>& dims) {
  std::vector<Dim> d(dims.begin(), dims.end());
  return Shape(std::move(d));
}

bool Shape::is_static() const {
  if (!has_rank_) return false;
  for (const Dim& d : dims_)
    if (!d.is_static()) return false;
  return true;
}

std::vector<int64_t> Shape::StaticDims() const {
  std::vector<int64_t> out;
  out.reserve(dims_.size());
  for (const Dim& d : dims_) out.push_back(d.value);
  return out;
}

int64_t Shape::NumElements() const {
  if (!is_static()) return -1;
  int64_t n = 1;
  for (const Dim& d : dims_) n *= d.value;
  return n;
}

std::string Shape::ToString() const {
  if (!has_rank_) return "?";
  std::vector<std::string> parts;
  for (const Dim& d : dims_)
    parts.push_back(d.is_static() ? absl::StrCat(d.value) : (d.symbol.empty() ? "?" : d.symbol));
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

std::string DimsToString(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) absl::StrAppend(&s, i ? "," : "", dims[i]);
  return s + "]";
}

int64_t Product(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace cleave
