// The decompositions' emitter and constants (graph/passes/emitter.h).
#include "graph/passes/emitter.h"

namespace cleave::graph::decompose {

void SetElement(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DataType::kFloat32: t.data<float>()[i] = static_cast<float>(v); break;
    case DataType::kFloat64: t.data<double>()[i] = v; break;
    case DataType::kFloat16: t.data<uint16_t>()[i] = FloatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: t.data<uint16_t>()[i] = FloatToBFloat16(static_cast<float>(v)); break;
    case DataType::kInt64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt64: t.data<uint64_t>()[i] = static_cast<uint64_t>(v); break;
    case DataType::kInt32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DataType::kUInt32: t.data<uint32_t>()[i] = static_cast<uint32_t>(v); break;
    case DataType::kInt16: t.data<int16_t>()[i] = static_cast<int16_t>(v); break;
    case DataType::kUInt16: t.data<uint16_t>()[i] = static_cast<uint16_t>(v); break;
    case DataType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(v); break;
    default: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;  // uint8, bool
  }
}

absl::StatusOr<std::vector<Value*>> Emitter::AddN(const std::string& op, const std::vector<Value*>& inputs,
                                                   int outputs, const std::map<std::string, Attribute>& attrs) {
  std::vector<Value*> outs;
  for (int i = 0; i < outputs; ++i) outs.push_back(g_->CreateUniqueValue(absl::StrCat(base_, "/", op)));
  Node* m = g_->AddNode(op, inputs, outs, g_->UniqueName(absl::StrCat(base_, "/", op)));
  for (const auto& [k, a] : attrs) m->SetAttr(k, a);
  RETURN_IF_ERROR(InferNode(*g_, *m));
  made_.insert(outs.begin(), outs.end());
  return outs;
}

absl::StatusOr<std::vector<Value*>> Emitter::Split(Value* x, int64_t axis, const std::vector<int64_t>& sizes) {
  if (sizes.size() == 1) return std::vector<Value*>{x};
  const int n = static_cast<int>(sizes.size());
  if (opset_ >= 13) return AddN("Split", {x, Ints(sizes)}, n, {{"axis", Attribute::Int(axis)}});
  return AddN("Split", {x}, n, {{"axis", Attribute::Int(axis)}, {"split", Attribute::Ints(sizes)}});
}

absl::StatusOr<Value*> Emitter::ClipSymmetric(Value* x, float bound) {
  if (opset_ >= 11) return Add("Clip", {x, Scalar(x->dtype(), -bound), Scalar(x->dtype(), bound)});
  return Add("Clip", {x}, {{"min", Attribute::Float(-bound)}, {"max", Attribute::Float(bound)}});
}

absl::Status Emitter::Finish(Value* v, Value* out) {
  const Shape known = out->shape();
  Node* p;
  if (made_.count(v) && v->consumers().empty()) {
    p = v->producer();
    g_->SetNodeOutput(p, v->producer_output(), out);
  } else {
    p = g_->AddNode("Identity", {v}, {out}, g_->UniqueName(base_ + "/Identity"));
  }
  RETURN_IF_ERROR(InferNode(*g_, *p));
  const Shape& now = out->shape();
  if (!known.has_rank() || (now.has_rank() && now.rank() != known.rank())) return absl::OkStatus();
  std::vector<Dim> dims = known.dims();
  if (now.has_rank())
    for (int a = 0; a < now.rank(); ++a)
      if (now[a].is_static() || !dims[a].is_static()) dims[a] = now[a];
  out->set_shape(Shape(std::move(dims)));
  return absl::OkStatus();
}

Value* Emitter::Filled(DataType t, int64_t n, float value) {
  Tensor tensor(t, {n});
  for (int64_t i = 0; i < n; ++i) SetElement(tensor, i, value);
  return g_->AddInitializer(g_->UniqueName(base_ + (value == 0.f ? "/zeros" : "/ones")), std::move(tensor));
}

Value* Emitter::Scalar(DataType t, double v) {
  Tensor tensor(t, {});
  SetElement(tensor, 0, v);
  return g_->AddInitializer(g_->UniqueName(base_ + "/scalar"), std::move(tensor));
}

Value* Emitter::Eye(DataType t, int rank, int p, int q, int64_t n) {
  std::vector<int64_t> dims(rank, 1);
  dims[p] = dims[q] = n;
  Tensor tensor(t, dims);  // zeros
  // Element (i, i) of the [n, n] plane sits at i * (stride of p + stride of q).
  int64_t sp = 1, sq = 1;
  for (int a = rank - 1; a > p; --a) sp *= dims[a];
  for (int a = rank - 1; a > q; --a) sq *= dims[a];
  for (int64_t i = 0; i < n; ++i) SetElement(tensor, i * (sp + sq), 1.f);
  return g_->AddInitializer(g_->UniqueName(base_ + "/eye"), std::move(tensor));
}

absl::StatusOr<std::vector<int64_t>> Target(const std::string& node, const std::vector<std::optional<int64_t>>& sizes,
                                            const std::string& what) {
  std::vector<int64_t> t;
  int unknown = 0;
  for (const auto& s : sizes) {
    t.push_back(s ? *s : -1);
    unknown += !s;
  }
  if (unknown > 1)
    return Unimplemented(node, ": ", what, " has ", unknown,
                         " symbolic sizes, and cleave decomposes the op over a shape with at most one; fix the "
                         "model's dims (free_dimension_overrides, or --dim when training)");
  return t;
}

std::optional<int64_t> StaticDim(const Value* v, int axis) {
  const Dim& d = v->shape()[axis];
  return d.is_static() ? std::optional<int64_t>(d.value) : std::nullopt;
}

}  // namespace cleave::graph::decompose
