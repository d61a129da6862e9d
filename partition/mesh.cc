// Device meshes and shardings (partition/): see mesh.h.
#include "partition/mesh.h"

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"

namespace cleave::partition {

namespace {
const char* const kAxisNames[] = {"dp", "pp", "tp", "cp"};
}

absl::StatusOr<Mesh> Mesh::Parse(const std::string& spec) {
  std::vector<Axis> axes;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(part, '=');
    int size = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[1], &size))
      return InvalidArgument("mesh '", spec, "': expected AXIS=SIZE entries like dp=2,pp=2,tp=2, got '",
                             std::string(part), "'");
    axes.push_back({std::string(absl::StripAsciiWhitespace(kv[0])), size});
  }
  if (axes.empty()) return InvalidArgument("mesh '", spec, "' names no axis (expected e.g. dp=2,tp=2)");
  auto m = Create(std::move(axes));
  if (!m.ok()) return InvalidArgument("mesh '", spec, "': ", m.status().message());
  return m;
}

absl::StatusOr<Mesh> Mesh::Create(std::vector<Axis> axes) {
  Mesh m;
  std::set<std::string> seen;
  for (const Axis& a : axes) {
    bool known = false;
    for (const char* n : kAxisNames) known |= a.name == n;
    if (!known) return InvalidArgument("unknown mesh axis '", a.name, "' (expected dp, pp, tp or cp)");
    if (!seen.insert(a.name).second) return InvalidArgument("mesh axis '", a.name, "' appears twice");
    if (a.size < 1) return InvalidArgument("mesh axis ", a.name, " has size ", a.size, ", expected >= 1");
    if (m.world_ > (1 << 20) / a.size) return InvalidArgument("mesh has more than 2^20 ranks");
    m.world_ *= a.size;
  }
  m.axes_ = std::move(axes);
  return m;
}

int Mesh::index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == axis) return static_cast<int>(i);
  return -1;
}

int Mesh::size(const std::string& axis) const {
  const int i = index(axis);
  return i < 0 ? 1 : axes_[i].size;
}

std::vector<int> Mesh::Coords(int rank) const {
  std::vector<int> c(axes_.size());
  for (int i = static_cast<int>(axes_.size()) - 1; i >= 0; --i) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::Rank(const std::vector<int>& coords) const {
  int r = 0;
  for (size_t i = 0; i < axes_.size(); ++i) r = r * axes_[i].size + coords[i];
  return r;
}

int Mesh::Coord(int rank, const std::string& axis) const {
  const int i = index(axis);
  return i < 0 ? 0 : Coords(rank)[i];
}

std::vector<int> Mesh::Group(int rank, const std::string& axis) const {
  return Group(rank, std::vector<std::string>{axis});
}

std::vector<int> Mesh::Group(int rank, const std::vector<std::string>& axes) const {
  std::vector<int> free;  // mesh indices of the group's axes, in mesh order
  for (size_t i = 0; i < axes_.size(); ++i)
    for (const std::string& a : axes)
      if (axes_[i].name == a) free.push_back(static_cast<int>(i));
  std::vector<int> base = Coords(rank);
  std::vector<int> out;
  int count = 1;
  for (int i : free) count *= axes_[i].size;
  for (int k = 0; k < count; ++k) {
    std::vector<int> c = base;
    int rest = k;
    for (int j = static_cast<int>(free.size()) - 1; j >= 0; --j) {
      c[free[j]] = rest % axes_[free[j]].size;
      rest /= axes_[free[j]].size;
    }
    out.push_back(Rank(c));
  }
  return out;
}

std::string Mesh::ToString() const {
  std::vector<std::string> parts;
  for (const Axis& a : axes_) parts.push_back(absl::StrCat(a.name, "=", a.size));
  return absl::StrJoin(parts, ",");
}

bool Sharding::IsReplicated() const {
  if (IsPartial()) return false;
  for (const auto& d : dims)
    if (!d.empty()) return false;
  return true;
}

std::set<std::string> Sharding::Axes() const {
  std::set<std::string> out = partial;
  out.insert(partial_avg.begin(), partial_avg.end());
  for (const auto& d : dims) out.insert(d.begin(), d.end());
  return out;
}

absl::StatusOr<Sharding> Sharding::Parse(const std::string& text) {
  const std::string t(absl::StripAsciiWhitespace(text));
  if (t.size() < 2 || t.front() != '[' || t.back() != ']')
    return InvalidArgument("sharding '", text, "': expected dims in brackets, such as [tp,-] or [dp*tp,-]");
  Sharding s;
  const std::string inner = t.substr(1, t.size() - 2);
  if (absl::StripAsciiWhitespace(inner).empty()) return s;
  for (absl::string_view d : absl::StrSplit(inner, ',')) {
    std::vector<std::string> axes;
    const std::string dim(absl::StripAsciiWhitespace(d));
    if (dim.empty()) return InvalidArgument("sharding '", text, "': an empty dim (write - for a whole one)");
    if (dim != "-")
      for (absl::string_view a : absl::StrSplit(dim, '*')) {
        const std::string axis(absl::StripAsciiWhitespace(a));
        if (axis.empty()) return InvalidArgument("sharding '", text, "': an empty axis name in '", dim, "'");
        axes.push_back(axis);
      }
    s.dims.push_back(std::move(axes));
  }
  return s;
}

std::string Sharding::ToString() const {
  std::vector<std::string> parts;
  for (const auto& d : dims) parts.push_back(d.empty() ? "-" : absl::StrJoin(d, "*"));
  std::string s = absl::StrCat("[", absl::StrJoin(parts, ","), "]");
  if (!partial.empty()) absl::StrAppend(&s, "+partial(", absl::StrJoin(partial, ","), ")");
  if (!partial_avg.empty()) absl::StrAppend(&s, "+avg(", absl::StrJoin(partial_avg, ","), ")");
  return s;
}

absl::Status ValidateSharding(const Mesh& mesh, const std::string& tensor, const Shape& shape,
                              const Sharding& s) {
  if (!shape.has_rank()) return InvalidArgument("tensor '", tensor, "' has unknown rank; cannot shard it");
  if (static_cast<int>(s.dims.size()) != shape.rank())
    return InvalidArgument("sharding ", s.ToString(), " of tensor '", tensor, "' has ", s.dims.size(),
                           " dims, the tensor ", shape.ToString(), " has ", shape.rank());
  std::set<std::string> used;
  auto use = [&](const std::string& a) -> absl::Status {
    if (!mesh.has(a))
      return InvalidArgument("sharding ", s.ToString(), " of tensor '", tensor, "' uses axis '", a,
                             "', which the mesh ", mesh.ToString(), " does not have");
    if (!used.insert(a).second)
      return InvalidArgument("sharding ", s.ToString(), " of tensor '", tensor, "' uses axis '", a, "' twice");
    return absl::OkStatus();
  };
  for (const std::string& a : s.partial) RETURN_IF_ERROR(use(a));
  for (const std::string& a : s.partial_avg) RETURN_IF_ERROR(use(a));
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t parts = 1;
    for (const std::string& a : s.dims[d]) {
      RETURN_IF_ERROR(use(a));
      parts *= mesh.size(a);
    }
    if (parts == 1) continue;
    if (!shape[d].is_static())
      return InvalidArgument("tensor '", tensor, "' dim ", d, " (", shape.ToString(),
                             ") is not static; it cannot be split over ", absl::StrJoin(s.dims[d], "*"));
    if (shape[d].value % parts != 0)
      return InvalidArgument("tensor '", tensor, "' dim ", d, " of size ", shape[d].value, " (shape ",
                             shape.ToString(), ") does not divide by ", absl::StrJoin(s.dims[d], "*"), " = ",
                             parts);
  }
  return absl::OkStatus();
}

absl::StatusOr<Shape> LocalShape(const Mesh& mesh, const std::string& tensor, const Shape& shape,
                                 const Sharding& s) {
  RETURN_IF_ERROR(ValidateSharding(mesh, tensor, shape, s));
  std::vector<Dim> dims = shape.dims();
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t parts = 1;
    for (const std::string& a : s.dims[d]) parts *= mesh.size(a);
    if (parts > 1) dims[d] = Dim(dims[d].value / parts);
  }
  return Shape(std::move(dims));
}

int64_t ShardOffset(const Mesh& mesh, int rank, const Sharding& s, int dim, int64_t global) {
  int64_t parts = 1, index = 0;
  for (const std::string& a : s.dims[dim]) {  // outermost first
    index = index * mesh.size(a) + mesh.Coord(rank, a);
    parts *= mesh.size(a);
  }
  return global / parts * index;
}

}  // namespace cleave::partition
