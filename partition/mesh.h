// Device meshes and shardings (partition/).
//
// A Mesh names its axes outermost first, as the user writes them ("dp=2,pp=2,tp=2"): the
// last axis varies fastest over ranks, so with tp innermost a tp group is a run of
// consecutive ranks (one node, as in Megatron). A rank's coordinates determine its groups:
// the group of rank r along axis A is every rank that shares r's coordinates on all other
// axes, ordered by the A coordinate.
//
// A Sharding says, per tensor dim, which mesh axes split it (outermost first; empty:
// replicated along that dim), plus the axes over which the local values are partial sums
// that still need adding (DTensor's Partial).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/shape.h"

namespace cleave::partition {

class Mesh {
 public:
  struct Axis {
    std::string name;
    int size;
  };
  // Parses "dp=2,pp=2,tp=2". Axis names: dp, pp, tp, cp (each at most once); sizes >= 1.
  static absl::StatusOr<Mesh> Parse(const std::string& spec);
  static absl::StatusOr<Mesh> Create(std::vector<Axis> axes);

  const std::vector<Axis>& axes() const { return axes_; }
  int world_size() const { return world_; }
  // Size of the named axis; 1 for an axis the mesh does not have.
  int size(const std::string& axis) const;
  bool has(const std::string& axis) const { return index(axis) >= 0; }
  int index(const std::string& axis) const;  // -1 when absent

  std::vector<int> Coords(int rank) const;
  int Rank(const std::vector<int>& coords) const;
  int Coord(int rank, const std::string& axis) const;  // 0 for an absent axis
  // The ranks of `rank`'s group along `axis`, ordered by that coordinate.
  std::vector<int> Group(int rank, const std::string& axis) const;
  // The ranks of `rank`'s group over several axes (row-major over them, in mesh order).
  std::vector<int> Group(int rank, const std::vector<std::string>& axes) const;
  std::string ToString() const;  // "dp=2,pp=2,tp=2"

 private:
  std::vector<Axis> axes_;
  int world_ = 1;
};

struct Sharding {
  std::vector<std::vector<std::string>> dims;  // per tensor dim, the mesh axes splitting it
  std::set<std::string> partial;               // axes over which values are partial sums
  std::set<std::string> partial_avg = {};      // axes over which values are partial means

  static Sharding Replicated(int rank) { return Sharding{std::vector<std::vector<std::string>>(rank), {}, {}}; }
  // Parses the dims part of ToString's form: "[tp,-]", "[dp*tp,-,-]", "[]" (no partial).
  static absl::StatusOr<Sharding> Parse(const std::string& text);
  bool IsPartial() const { return !partial.empty() || !partial_avg.empty(); }
  bool IsReplicated() const;
  // Every mesh axis the sharding uses (on a dim or as partial).
  std::set<std::string> Axes() const;
  // "[dp,-,tp]" with "+partial(tp)" when partial; "[]" for a scalar.
  std::string ToString() const;
  bool operator==(const Sharding& o) const {
    return dims == o.dims && partial == o.partial && partial_avg == o.partial_avg;
  }
};

// Checks the sharding against the tensor: rank, known axes, no axis used twice, and every
// sharded dim static and divisible by the product of its axes. Errors name the tensor, the
// dim and what was expected.
absl::Status ValidateSharding(const Mesh& mesh, const std::string& tensor, const Shape& shape,
                              const Sharding& s);
// The per-rank shape (each sharded dim divided by the product of its axes' sizes).
absl::StatusOr<Shape> LocalShape(const Mesh& mesh, const std::string& tensor, const Shape& shape,
                                 const Sharding& s);
// Rank r's slice along dim d: [offset, offset + local) of the global dim.
int64_t ShardOffset(const Mesh& mesh, int rank, const Sharding& s, int dim, int64_t global);

}  // namespace cleave::partition
