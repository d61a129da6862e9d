// Propagation of shape tensors' symbolic values (graph/).
#include "graph/dims_value.h"

#include <algorithm>
#include <string>

#include "graph/infer_shape_util.h"
#include "graph/op_table.h"

namespace cleave::graph {

namespace {

using Dims = std::vector<Dim>;

// Dim's value -1 already means "unknown", so a literal negative element (Reshape's -1) is
// kept as a symbol spelled with its number.
Dim ElementDim(int64_t v) { return v >= 0 ? Dim(v) : Dim::Symbol(std::to_string(v)); }
bool IsLiteral(const Dim& d, int64_t v) {
  return v >= 0 ? d.is_static() && d.value == v : d.symbol == std::to_string(v);
}
bool HasNegative(const Dims& dims) {
  for (const Dim& d : dims)
    if (!d.symbol.empty() && d.symbol[0] == '-') return true;
  return false;
}

constexpr int64_t kMaxElements = 16;  // shape tensors are short; longer ones are data

bool IsIntShapeType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

// A small integer constant as a vector (indices, axes, starts...).
std::optional<std::vector<int64_t>> SmallConstant(const Node& n, int i) {
  const Tensor* t = ConstantInput(n, i);
  if (!t || !IsInteger(t->dtype()) || t->numel() > kMaxElements) return std::nullopt;
  return t->ToInt64Vector();
}

std::optional<Dims> ShapeValue(const Node& n, int version) {
  const Shape& in = n.input(0)->shape();
  if (!in.has_rank()) return std::nullopt;
  const int64_t r = in.rank();
  int64_t start = version >= 15 ? n.AttrInt("start", 0) : 0;
  int64_t end = version >= 15 ? n.AttrInt("end", r) : r;
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, 0, r);
  if (end <= start) return Dims{};
  return Dims(in.dims().begin() + start, in.dims().begin() + end);
}

std::optional<Dims> GatherValue(const Node& n) {
  std::optional<Dims> data = InputDimsValue(n, 0);
  std::optional<std::vector<int64_t>> idx = SmallConstant(n, 1);
  if (!data || !idx || n.AttrInt("axis", 0) != 0 || n.input(0)->shape().rank() != 1) return std::nullopt;
  Dims out;
  const int64_t size = static_cast<int64_t>(data->size());
  for (int64_t i : *idx) {
    if (i < -size || i >= size) return std::nullopt;
    out.push_back((*data)[i < 0 ? i + size : i]);
  }
  return out;
}

std::optional<Dims> ConcatValue(const Node& n) {
  Dims out;
  for (int i = 0; i < n.num_inputs(); ++i) {
    std::optional<Dims> part = InputDimsValue(n, i);
    if (!part || n.input(i)->shape().rank() != 1) return std::nullopt;
    out.insert(out.end(), part->begin(), part->end());
  }
  return out;
}

std::optional<Dims> SliceValue(const Node& n, int version) {
  std::optional<Dims> data = InputDimsValue(n, 0);
  if (!data || version < 10 || n.input(0)->shape().rank() != 1) return std::nullopt;
  auto starts = SmallConstant(n, 1), ends = SmallConstant(n, 2);
  auto axes = n.input(3) ? SmallConstant(n, 3) : std::vector<int64_t>{0};
  auto steps = n.input(4) ? SmallConstant(n, 4) : std::vector<int64_t>{1};
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 ||
      (*axes != std::vector<int64_t>{0} && *axes != std::vector<int64_t>{-1}) ||
      *steps != std::vector<int64_t>{1})
    return std::nullopt;
  const int64_t size = static_cast<int64_t>(data->size());
  auto clamp = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + size : v, 0, size); };
  int64_t b = clamp((*starts)[0]), e = clamp((*ends)[0]);
  return e > b ? Dims(data->begin() + b, data->begin() + e) : Dims{};
}

// The dims value a shape-arithmetic node produces, if any.
std::optional<Dims> OutputValue(const Node& n, int version) {
  const std::string& op = n.op_type();
  if (op == "Shape") return ShapeValue(n, version);
  if (op == "Constant") {  // the value_int(s) forms; a 'value' tensor reads as a constant
    Dims dims;
    if (const Attribute* a = n.FindAttr("value_ints"))
      for (int64_t v : a->ints) dims.push_back(ElementDim(v));
    else if (const Attribute* b = n.FindAttr("value_int"))
      dims.push_back(ElementDim(b->i));
    else
      return std::nullopt;
    return dims;
  }
  if (op == "Gather") return GatherValue(n);
  if (op == "Concat") return ConcatValue(n);
  if (op == "Slice") return SliceValue(n, version);
  if (op == "Identity" || op == "Unsqueeze" || op == "Squeeze" ||
      (op == "Cast" && IsIntShapeType(n.output(0)->dtype())))
    return InputDimsValue(n, 0);  // the elements stay; only rank 0 <-> 1 may change
  return std::nullopt;
}

// Reshape's output from a target whose elements are dims: 0 copies the input dim (unless
// allowzero), -1 is what the rest leaves, and a named dim is itself.
std::optional<Shape> ReshapeFromDims(const Node& n, int version, const Dims& target) {
  const Shape& in = n.input(0)->shape();
  const bool allow_zero = version >= 14 && n.AttrInt("allowzero", 0) != 0;
  Dims out(target.size());
  int minus_one = -1;
  bool all_known = true;
  for (size_t k = 0; k < target.size(); ++k) {
    const Dim& d = target[k];
    if (IsLiteral(d, -1)) {
      minus_one = static_cast<int>(k);
    } else if (IsLiteral(d, 0) && !allow_zero) {
      out[k] = in.has_rank() && static_cast<int>(k) < in.rank() ? in[k] : Dim();
    } else {
      out[k] = d;
    }
    all_known = all_known && (minus_one == static_cast<int>(k) || out[k].is_static() ||
                              !out[k].symbol.empty());
  }
  if (minus_one >= 0) {
    if (!all_known || !in.has_rank()) return Shape(std::move(out));
    DimProduct den;
    for (size_t k = 0; k < out.size(); ++k)
      if (static_cast<int>(k) != minus_one) den.Mul(out[k]);
    out[minus_one] = DimProduct::Of(in.dims(), 0, in.rank()).DivideBy(den);
  }
  return Shape(std::move(out));
}

// Slice(x, 0, ends) with a named dim s among the ends, step 1: the axis keeps min(x's dim, s),
// which is s when x's dim is s, and ClippedSymbol(s, c) when it is a static c (a table of c
// rows cut to the sequence length). Other axes stay as inference left them.
std::optional<Shape> SliceToSymbolicEnd(const Node& n) {
  const Shape& in = n.input(0)->shape();
  std::optional<Dims> ends = InputDimsValue(n, 2);
  auto starts = SmallConstant(n, 1);
  if (!in.has_rank() || !ends || !starts || starts->size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes(ends->size());
  for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
  if (n.input(3)) {
    auto a = SmallConstant(n, 3);
    if (!a || a->size() != axes.size()) return std::nullopt;
    axes = *a;
  }
  if (n.input(4)) {
    auto steps = SmallConstant(n, 4);
    if (!steps || steps->size() != axes.size()) return std::nullopt;
    for (int64_t step : *steps)
      if (step != 1) return std::nullopt;
  }
  Dims out(in.rank(), Dim());
  bool any = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t k = axes[i] < 0 ? axes[i] + in.rank() : axes[i];
    const Dim& end = (*ends)[i];
    if (k < 0 || k >= in.rank() || (*starts)[i] != 0 || end.symbol.empty() || HasNegative({end}))
      continue;
    if (in[k].is_static()) {
      out[k] = in[k].value == 0 ? Dim(0) : ClippedSymbol(end.symbol, in[k].value);
      any = true;
    } else if (in[k] == end) {
      out[k] = end;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  return Shape(std::move(out));
}

// Fills dims that inference left unknown from a refined shape of the same rank.
Shape Merge(const Shape& inferred, const Shape& refined) {
  if (!inferred.has_rank()) return refined;
  if (!refined.has_rank() || refined.rank() != inferred.rank()) return inferred;
  Dims out = inferred.dims();
  for (int k = 0; k < inferred.rank(); ++k)
    if (!out[k].is_static() && out[k].symbol.empty()) out[k] = refined[k];
  return Shape(std::move(out));
}

void Refine(Node& n, int version) {
  const std::string& op = n.op_type();
  Value* out = n.output(0);
  std::optional<Shape> refined;
  if (op == "Reshape" && !SmallConstant(n, 1)) {
    if (auto t = InputDimsValue(n, 1)) refined = ReshapeFromDims(n, version, *t);
  } else if (op == "ConstantOfShape" && !SmallConstant(n, 0)) {
    if (auto t = InputDimsValue(n, 0); t && !HasNegative(*t)) refined = Shape(*t);
  } else if (op == "Range") {
    // Range(0, n, 1) has n elements, whatever n is (torch.arange(seq) exports this way).
    auto start = InputDimsValue(n, 0), delta = InputDimsValue(n, 2);
    auto limit = InputDimsValue(n, 1);
    auto is = [](const std::optional<Dims>& d, int64_t v) {
      return d && d->size() == 1 && IsLiteral((*d)[0], v);
    };
    if (is(start, 0) && is(delta, 1) && limit && limit->size() == 1 && !HasNegative(*limit))
      refined = Shape(*limit);
  } else if (op == "Slice" && version >= 10 && !SmallConstant(n, 2)) {
    refined = SliceToSymbolicEnd(n);
  } else if (op == "Expand" && !SmallConstant(n, 1)) {
    auto t = InputDimsValue(n, 1);
    const Shape& in = n.input(0)->shape();
    if (t && !HasNegative(*t) && in.has_rank() && static_cast<int>(t->size()) >= in.rank()) {
      // Broadcast: a target dim of 1 takes the input's dim; otherwise the target's.
      Dims dims = *t;
      const int lead = static_cast<int>(dims.size()) - in.rank();
      for (int k = 0; k < in.rank(); ++k)
        if (dims[lead + k].is_static() && dims[lead + k].value == 1) dims[lead + k] = in[k];
      refined = Shape(std::move(dims));
    }
  }
  if (refined && out) out->set_shape(Merge(out->shape(), *refined));
}

}  // namespace

std::optional<std::vector<Dim>> InputDimsValue(const Node& n, int i) {
  if (auto c = SmallConstant(n, i)) {
    Dims dims;
    for (int64_t v : *c) dims.push_back(ElementDim(v));
    return dims;
  }
  const Value* v = n.input(i);
  if (!v) return std::nullopt;
  return v->dims_value();
}

void PropagateDimsValues(Node& n, int version) {
  if (!n.domain().empty()) return;
  Refine(n, version);
  Value* out = n.output(0);
  if (!out || !IsIntShapeType(out->dtype())) return;
  const Shape& s = out->shape();
  if (s.has_rank() && s.rank() > 1) return;
  std::optional<Dims> value = OutputValue(n, version);
  if (value && static_cast<int64_t>(value->size()) <= kMaxElements) out->set_dims_value(std::move(value));
}

}  // namespace cleave::graph
