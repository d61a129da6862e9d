// CPU kernels for the ops that keep the bytes and change only the dims (providers/cpu/):
// Reshape, Squeeze, Unsqueeze, Flatten, Identity; and RegisterShapeKernels for the whole
// shape family. Output dims are computed from runtime values here; inference has already
// checked what was knowable at load, so these checks catch only runtime inconsistencies.
// Compute allocates nothing: dims live in fixed DimVectors (at most kMaxRank entries).
#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "kernels/cpu/shape.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

const std::vector<DataType>& FixedSizeTypes() {
  static const std::vector<DataType>* types = new std::vector<DataType>{
      DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
      DataType::kInt8,    DataType::kInt16,   DataType::kInt32,   DataType::kInt64,
      DataType::kUInt8,   DataType::kUInt16,  DataType::kUInt32,  DataType::kUInt64,
      DataType::kBool};
  return *types;
}

absl::Status ReadDimValues(const TensorView& v, const char* what, DimVector* out) {
  const int64_t n = v.numel();
  if (n > kMaxRank)
    return InvalidArgument(what, " input has ", n, " values, expected at most ", kMaxRank,
                           " (the maximum rank)");
  out->resize(static_cast<int>(n));
  for (int64_t i = 0; i < n; ++i) (*out)[static_cast<int>(i)] = IntAt(v, i);
  return absl::OkStatus();
}

namespace {

int64_t ProductOf(const DimVector& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Output = input bytes under new dims. Subclasses say what the dims are.
class SameBytesKernel : public OpKernel {
 public:
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(DimVector dims, OutputDims(ctx, x));
    TensorView* y = ctx.Output(0, dims);
    // The executor may hand out the input's own bytes as the output (a view): nothing to copy.
    if (y && y->data != x.data) kernels::cpu::CopyBytes(y->data, x.data, x.nbytes(), ctx.thread_pool());
    return absl::OkStatus();
  }

 protected:
  virtual absl::StatusOr<DimVector> OutputDims(const KernelContext& ctx,
                                               const TensorView& x) const = 0;
};

class ReshapeKernel : public SameBytesKernel {
 public:
  ReshapeKernel(const graph::Node& n, int version)
      : allow_zero_(version >= 14 && n.AttrInt("allowzero", 0) != 0) {}

 protected:
  absl::StatusOr<DimVector> OutputDims(const KernelContext& ctx,
                                       const TensorView& x) const override {
    DimVector shape;
    RETURN_IF_ERROR(ReadDimValues(*ctx.input(1), "shape", &shape));
    DimVector out = shape;
    int minus_one = -1;
    int64_t known = 1;  // product of the entries other than -1
    for (int k = 0; k < shape.size(); ++k) {
      if (shape[k] == -1) {
        if (minus_one >= 0) return InvalidArgument("shape ", DimsToString(shape), " has two -1");
        minus_one = k;
        continue;
      }
      if (shape[k] == 0 && !allow_zero_) {
        if (k >= x.rank)
          return InvalidArgument("shape entry ", k, " is 0 (copy the input dim) but the input ",
                                 DimsToString(x.dim_span()), " has rank ", x.rank);
        out[k] = x.dims[k];
      } else if (shape[k] < 0) {
        return InvalidArgument("shape entry ", k, " is ", shape[k], ", expected >= -1");
      }
      known *= out[k];
    }
    const int64_t n = x.numel();
    if (minus_one >= 0) {
      if (known == 0 || n % known != 0)
        return InvalidArgument("cannot reshape ", DimsToString(x.dim_span()), " (", n,
                               " elements) to shape ", DimsToString(shape),
                               ": the other dims (", known, " elements) do not divide ", n);
      out[minus_one] = n / known;
    }
    if (ProductOf(out) != n)
      return InvalidArgument("cannot reshape ", DimsToString(x.dim_span()), " (", n,
                             " elements) to ", DimsToString(out), " (", ProductOf(out),
                             " elements)");
    return out;
  }

 private:
  bool allow_zero_;
};

// Squeeze and Unsqueeze take axes as an attribute before version 13 and an input after.
class AxesKernel : public SameBytesKernel {
 public:
  AxesKernel(const graph::Node& n, int version)
      : from_input_(version >= 13), attr_(n.AttrInts("axes")) {}

 protected:
  // The axes, empty when omitted. Values of the axes input are read into *buf, which the
  // returned span then views.
  absl::StatusOr<std::span<const int64_t>> Axes(const KernelContext& ctx, DimVector* buf) const {
    if (!from_input_) return std::span<const int64_t>(attr_);
    if (const TensorView* a = ctx.input(1)) RETURN_IF_ERROR(ReadDimValues(*a, "axes", buf));
    return buf->span();
  }

 private:
  bool from_input_;
  std::vector<int64_t> attr_;
};

class SqueezeKernel : public AxesKernel {
 public:
  using AxesKernel::AxesKernel;

 protected:
  absl::StatusOr<DimVector> OutputDims(const KernelContext& ctx,
                                       const TensorView& x) const override {
    DimVector buf;
    ASSIGN_OR_RETURN(std::span<const int64_t> axes, Axes(ctx, &buf));
    bool drop[kMaxRank] = {};
    if (axes.empty())  // no axes: squeeze every size-1 dim
      for (int k = 0; k < x.rank; ++k) drop[k] = x.dims[k] == 1;
    for (int64_t a : axes) {
      if (a < -x.rank || a >= x.rank)
        return InvalidArgument("axis ", a, " is out of range for rank ", x.rank);
      int k = static_cast<int>(a < 0 ? a + x.rank : a);
      if (x.dims[k] != 1)
        return InvalidArgument("cannot squeeze axis ", a, " of ", DimsToString(x.dim_span()),
                               ": its size is ", x.dims[k], ", expected 1");
      drop[k] = true;
    }
    DimVector out;
    for (int k = 0; k < x.rank; ++k)
      if (!drop[k]) out.push_back(x.dims[k]);
    return out;
  }
};

class UnsqueezeKernel : public AxesKernel {
 public:
  using AxesKernel::AxesKernel;

 protected:
  absl::StatusOr<DimVector> OutputDims(const KernelContext& ctx,
                                       const TensorView& x) const override {
    DimVector buf;
    ASSIGN_OR_RETURN(std::span<const int64_t> axes, Axes(ctx, &buf));
    // Axes index the output, so negative ones count back from the output rank.
    const int out_rank = x.rank + static_cast<int>(axes.size());
    if (out_rank > kMaxRank)
      return InvalidArgument("unsqueezing ", axes.size(), " axes into rank ", x.rank,
                             " gives rank ", out_rank, ", expected at most ", kMaxRank);
    bool inserted[kMaxRank] = {};
    for (int64_t a : axes) {
      if (a < -out_rank || a >= out_rank)
        return InvalidArgument("axis ", a, " is out of range for output rank ", out_rank);
      int k = static_cast<int>(a < 0 ? a + out_rank : a);
      if (inserted[k]) return InvalidArgument("axis ", a, " is repeated in axes");
      inserted[k] = true;
    }
    DimVector out;
    int j = 0;
    for (int k = 0; k < out_rank; ++k) out.push_back(inserted[k] ? 1 : x.dims[j++]);
    return out;
  }
};

class FlattenKernel : public SameBytesKernel {
 public:
  FlattenKernel(const graph::Node& n, int) : axis_(n.AttrInt("axis", 1)) {}

 protected:
  absl::StatusOr<DimVector> OutputDims(const KernelContext&,
                                       const TensorView& x) const override {
    if (axis_ < -x.rank || axis_ > x.rank)
      return InvalidArgument("axis ", axis_, " is out of range for rank ", x.rank);
    const int a = static_cast<int>(axis_ < 0 ? axis_ + x.rank : axis_);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < x.rank; ++k) (k < a ? outer : inner) *= x.dims[k];
    return DimVector{outer, inner};
  }

 private:
  int64_t axis_;
};

class IdentityKernel : public SameBytesKernel {
 public:
  IdentityKernel(const graph::Node&, int) {}

 protected:
  absl::StatusOr<DimVector> OutputDims(const KernelContext&,
                                       const TensorView& x) const override {
    return DimVector(x.dim_span());
  }
};

}  // namespace

void RegisterShapeKernels(KernelRegistry& r) {
  const SupportsFn data_types = InputTypeIn(0, FixedSizeTypes());
  const SupportsFn int64_arg = InputTypeIn(1, {DataType::kInt64});
  r.Register({"", "Reshape", 5, 1 << 30, AllOf({data_types, int64_arg}),
              MakeFactory<ReshapeKernel>()});
  r.Register({"", "Squeeze", 1, 1 << 30, AllOf({data_types, int64_arg}),
              MakeFactory<SqueezeKernel>()});
  r.Register({"", "Unsqueeze", 1, 1 << 30, AllOf({data_types, int64_arg}),
              MakeFactory<UnsqueezeKernel>()});
  r.Register({"", "Flatten", 1, 1 << 30, data_types, MakeFactory<FlattenKernel>()});
  r.Register({"", "Identity", 1, 1 << 30, data_types, MakeFactory<IdentityKernel>()});
  RegisterDataMovementKernels(r);
  RegisterConstantKernels(r);
}

}  // namespace cleave::providers
