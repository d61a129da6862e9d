// CPU kernels that make values rather than move them (providers/cpu/): Shape,
// ConstantOfShape, Range, Constant. Attribute values are decoded once when the kernel is
// created, so Compute only sizes the output and writes it.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/shape.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

bool IsFixedSize(DataType t) {
  const auto& types = FixedSizeTypes();
  return std::find(types.begin(), types.end(), t) != types.end();
}

class ShapeKernel : public OpKernel {
 public:
  ShapeKernel(const graph::Node& n, int version)
      : start_(version >= 15 ? n.AttrInt("start", 0) : 0),
        end_(version >= 15 && n.HasAttr("end") ? std::optional<int64_t>(n.AttrInt("end", 0))
                                               : std::nullopt) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    // start/end count back from the rank when negative, then clamp into [0, rank].
    const int64_t r = x.rank;
    int64_t start = start_ < 0 ? start_ + r : start_;
    int64_t end = end_ ? (*end_ < 0 ? *end_ + r : *end_) : r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, 0, r);
    const int64_t n = std::max<int64_t>(end - start, 0);
    TensorView* y = ctx.Output(0, {n});
    if (y) std::copy(x.dims + start, x.dims + start + n, y->as<int64_t>());
    return absl::OkStatus();
  }

 private:
  int64_t start_;
  std::optional<int64_t> end_;
};

// Size: the number of elements of input 0 (read for its dims only), as an int64 scalar.
class SizeKernel : public OpKernel {
 public:
  SizeKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (TensorView* y = ctx.Output(0, std::span<const int64_t>())) *y->as<int64_t>() = x.numel();
    return absl::OkStatus();
  }
};

class ConstantOfShapeKernel : public OpKernel {
 public:
  ConstantOfShapeKernel(const graph::Node& n, int) {
    const graph::Attribute* a = n.FindAttr("value");
    value_ = a ? a->t : Tensor::Scalar<float>(0.f);  // the spec's default: float32 zero
  }

  absl::Status Compute(KernelContext& ctx) const override {
    DimVector dims;
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(0), "shape", &dims));
    for (int64_t d : dims)
      if (d < 0) return InvalidArgument("shape ", DimsToString(dims), " has a negative dim");
    TensorView* y = ctx.Output(0, dims);
    if (y) kernels::cpu::FillBytes(y->data, y->numel(), value_.raw(), ElementSize(value_.dtype()));
    return absl::OkStatus();
  }

 private:
  Tensor value_;
};

std::string ConstantOfShapeSupports(const graph::Node& n, int) {
  const graph::Attribute* a = n.FindAttr("value");
  if (a && !IsFixedSize(a->t.dtype()))
    return absl::StrCat("value of dtype ", DataTypeName(a->t.dtype()), " is not supported");
  return "";
}

class RangeKernel : public OpKernel {
 public:
  RangeKernel(const graph::Node&, int) {}

  absl::Status Compute(KernelContext& ctx) const override {
    absl::Status status;
    bool known = VisitRangeType(ctx.input(0)->dtype, [&](auto tag) {
      using T = decltype(tag);
      status = Run<T>(ctx);
    });
    if (!known)
      return InvalidArgument("Range of dtype ", DataTypeName(ctx.input(0)->dtype),
                             " is not supported");
    return status;
  }

  // Calls fn(T{}) for the types Range is defined for.
  template <typename Fn>
  static bool VisitRangeType(DataType t, Fn&& fn) {
    switch (t) {
      case DataType::kFloat32: fn(float{}); return true;
      case DataType::kFloat64: fn(double{}); return true;
      case DataType::kInt16: fn(int16_t{}); return true;
      case DataType::kInt32: fn(int32_t{}); return true;
      case DataType::kInt64: fn(int64_t{}); return true;
      default: return false;
    }
  }

 private:
  template <typename T>
  static absl::Status Run(KernelContext& ctx) {
    for (int i = 0; i < 3; ++i)
      if (ctx.input(i)->numel() != 1)
        return InvalidArgument("input ", i, " has shape ", DimsToString(ctx.input(i)->dim_span()),
                               ", expected a scalar");
    const T start = *ctx.input(0)->as<const T>();
    const T limit = *ctx.input(1)->as<const T>();
    const T delta = *ctx.input(2)->as<const T>();
    if (delta == T(0)) return InvalidArgument("delta is 0, expected non-zero");
    const int64_t n = kernels::cpu::RangeCount(start, limit, delta);
    TensorView* y = ctx.Output(0, {n});
    if (y) kernels::cpu::Range(start, delta, n, y->as<T>());
    return absl::OkStatus();
  }
};

// The Constant's value as a tensor, from whichever attribute form it uses; an error for
// the forms cleave does not run (strings, sparse tensors).
absl::StatusOr<Tensor> ConstantValue(const graph::Node& n) {
  if (const graph::Attribute* a = n.FindAttr("value")) {
    if (a->type != graph::AttrType::kTensor || !IsFixedSize(a->t.dtype()))
      return Unimplemented("value of dtype ", DataTypeName(a->t.dtype()), " is not supported");
    return a->t;
  }
  if (n.HasAttr("value_float")) return Tensor::Scalar<float>(n.AttrFloat("value_float", 0));
  if (n.HasAttr("value_int")) return Tensor::Scalar<int64_t>(n.AttrInt("value_int", 0));
  if (n.HasAttr("value_floats")) {
    std::vector<float> v = n.AttrFloats("value_floats");
    return Tensor::FromVector<float>(v, {static_cast<int64_t>(v.size())});
  }
  if (n.HasAttr("value_ints")) {
    std::vector<int64_t> v = n.AttrInts("value_ints");
    return Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size())});
  }
  if (n.HasAttr("sparse_value")) return Unimplemented("sparse_value Constants are not supported");
  if (n.HasAttr("value_string") || n.HasAttr("value_strings"))
    return Unimplemented("string Constants are not supported");
  return InvalidArgument("expected one of value, value_float(s), value_int(s), got none");
}

class ConstantKernel : public OpKernel {
 public:
  explicit ConstantKernel(Tensor value) : value_(std::move(value)) {}

  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(Tensor value, ConstantValue(n));
    return std::unique_ptr<OpKernel>(new ConstantKernel(std::move(value)));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    TensorView* y = ctx.Output(0, value_.dims());
    if (y && value_.nbytes()) std::memcpy(y->data, value_.raw(), value_.nbytes());
    return absl::OkStatus();
  }

 private:
  Tensor value_;
};

std::string ConstantSupports(const graph::Node& n, int) {
  absl::StatusOr<Tensor> v = ConstantValue(n);
  return v.ok() ? "" : std::string(v.status().message());
}

}  // namespace

void RegisterConstantKernels(KernelRegistry& r) {
  r.Register({"", "Shape", 1, 1 << 30, InputTypeIn(0, FixedSizeTypes()),
              MakeFactory<ShapeKernel>(), {}, {0}});
  r.Register({"", "Size", 1, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeFactory<SizeKernel>(), {}, {0}});
  r.Register({"", "ConstantOfShape", 9, 1 << 30,
              AllOf({InputTypeIn(0, {DataType::kInt64}), ConstantOfShapeSupports}),
              MakeFactory<ConstantOfShapeKernel>()});
  r.Register({"", "Range", 11, 1 << 30,
              InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64, DataType::kInt16,
                              DataType::kInt32, DataType::kInt64}),
              MakeFactory<RangeKernel>()});
  r.Register({"", "Constant", 1, 1 << 30, ConstantSupports,
              MakeCheckedFactory<ConstantKernel>()});
}

}  // namespace cleave::providers
