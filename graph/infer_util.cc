// Broadcasting and axis helpers for shape inference (graph/).
#include "graph/infer_util.h"

#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/infer_shape_util.h"

namespace cleave::graph {

void InferContext::SetOutput(int i, DataType t, Shape s) const {
  Value* v = node_.output(i);
  if (!v) return;
  v->set_dtype(t);
  v->set_shape(std::move(s));
}

absl::StatusOr<Shape> BroadcastShapes(const InferContext& ctx, const std::vector<Shape>& shapes) {
  int rank = 0;
  for (const Shape& s : shapes) {
    if (!s.has_rank()) return Shape();
    rank = std::max(rank, s.rank());
  }
  std::vector<Dim> out(rank, Dim(1));
  for (int k = 0; k < rank; ++k) {
    std::vector<Dim> seen;
    for (const Shape& s : shapes) {
      int j = k - (rank - s.rank());
      if (j < 0) continue;
      seen.push_back(s[j]);
    }
    Dim r(1);
    bool unknown = false;
    for (const Dim& d : seen) {
      if (d.is_static() && d.value == 1) continue;
      if (r.is_static() && r.value == 1) {
        r = d;
      } else if (d.is_static() && r.is_static()) {
        if (d.value != r.value)
          return ctx.Error("cannot broadcast dim ", d.value, " with ", r.value, " at axis ", k,
                           " (output rank ", rank, ")");
      } else if (!(d == r)) {
        // A symbol against a different symbol or a static value > 1: the static value
        // wins when one side is static (the symbol must equal it or be 1). A symbol s
        // against min(s, c) gives s: they are equal whenever the run can broadcast them
        // (s > c leaves c against s, neither 1).
        if (d.is_static()) r = d;
        else if (!r.is_static() && !d.symbol.empty() && ClippedOf(r) == d.symbol) r = d;
        else if (!r.is_static() && !(!r.symbol.empty() && ClippedOf(d) == r.symbol)) unknown = true;
      }
    }
    out[k] = unknown ? Dim() : r;
  }
  return Shape(std::move(out));
}

std::optional<std::vector<int64_t>> BroadcastDims(const std::vector<int64_t>& a,
                                                  const std::vector<int64_t>& b) {
  size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t k = 0; k < rank; ++k) {
    int64_t da = k + a.size() >= rank ? a[k + a.size() - rank] : 1;
    int64_t db = k + b.size() >= rank ? b[k + b.size() - rank] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[k] = da == 1 ? db : da;
  }
  return out;
}

absl::StatusOr<int> NormalizeAxis(const InferContext& ctx, int64_t axis, int rank) {
  if (axis < -rank || axis >= std::max(rank, 1))
    return ctx.Error("axis ", axis, " is out of range for rank ", rank);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

std::optional<std::vector<int64_t>> ConstantInts(const InferContext& ctx, int i) {
  const Tensor* t = ctx.input_constant(i);
  if (!t) return std::nullopt;
  return t->ToInt64Vector();
}

absl::Status ExpectDtype(const InferContext& ctx, int i, std::initializer_list<DataType> allowed) {
  DataType t = ctx.input_dtype(i);
  if (t == DataType::kUndefined) return absl::OkStatus();
  for (DataType a : allowed)
    if (a == t) return absl::OkStatus();
  std::vector<std::string> names;
  for (DataType a : allowed) names.emplace_back(DataTypeName(a));
  return ctx.Error("input ", i, " '", ctx.node().input(i)->name(), "' has dtype ", DataTypeName(t),
                   ", expected one of ", absl::StrJoin(names, ", "));
}

absl::Status InferSameAsInput0(InferContext& ctx) {
  ctx.SetOutput(0, ctx.input_dtype(0), ctx.input_shape(0));
  return absl::OkStatus();
}

}  // namespace cleave::graph
