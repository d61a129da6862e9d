// NonZero and Compress on the CPU (providers/cpu/): ops whose output size depends on the data.
// Both make one pass to count and one to write, in order; the CUDA provider leaves them to this
// one (the count would need the device to wait).
#include <cstring>
#include <memory>
#include <vector>

#include "base/status.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

// Element i of x (of any fixed-size type) is not zero: some byte of it is set, except for a
// float's negative zero.
bool NonZeroAt(const TensorView& x, int64_t i) {
  switch (x.dtype) {
    case DataType::kFloat32: return x.as<float>()[i] != 0.f;
    case DataType::kFloat64: return x.as<double>()[i] != 0.0;
    case DataType::kFloat16: case DataType::kBFloat16: return (x.as<uint16_t>()[i] & 0x7fff) != 0;
    default: {
      const size_t w = ElementSize(x.dtype);
      const unsigned char* p = static_cast<const unsigned char*>(x.data) + static_cast<size_t>(i) * w;
      for (size_t b = 0; b < w; ++b)
        if (p[b]) return true;
      return false;
    }
  }
}

// NonZero: the coordinates of the nonzero elements, [rank, count] int64, in row-major order. A
// scalar counts as [1] (numpy's nonzero of a 0-d array).
class NonZeroKernel : public OpKernel {
 public:
  NonZeroKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    std::vector<int64_t> dims(x.dim_span().begin(), x.dim_span().end());
    if (dims.empty()) dims.push_back(1);
    const int rank = static_cast<int>(dims.size());
    std::vector<int64_t> hits;
    for (int64_t i = 0; i < x.numel(); ++i)
      if (NonZeroAt(x, i)) hits.push_back(i);
    const int64_t count = static_cast<int64_t>(hits.size());
    TensorView* y = ctx.Output(0, std::vector<int64_t>{rank, count});
    if (!y) return absl::OkStatus();
    int64_t* out = y->as<int64_t>();
    for (int64_t k = 0; k < count; ++k) {
      int64_t rest = hits[static_cast<size_t>(k)];
      for (int a = rank - 1; a >= 0; --a) {
        out[a * count + k] = rest % dims[static_cast<size_t>(a)];
        rest /= dims[static_cast<size_t>(a)];
      }
    }
    return absl::OkStatus();
  }
};

// Compress: the slices along `axis` whose condition is true (X flattened when there is no
// axis). A condition shorter than the axis leaves the rest out, as numpy's compress; a longer
// one must be false past the axis.
class CompressKernel : public OpKernel {
 public:
  CompressKernel(const graph::Node& n, int)
      : has_axis_(n.HasAttr("axis")), axis_(n.AttrInt("axis", 0)), node_(n.Describe()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& cond = *ctx.input(1);
    if (cond.rank != 1) return InvalidArgument(node_, ": condition has rank ", cond.rank, "; expected 1");
    std::vector<int64_t> dims(x.dim_span().begin(), x.dim_span().end());
    int axis = 0;
    if (has_axis_) {
      const int r = static_cast<int>(dims.size());
      if (axis_ < -r || axis_ >= r)
        return InvalidArgument(node_, ": axis ", axis_, " is out of range for an input of rank ", r);
      axis = static_cast<int>(axis_ < 0 ? axis_ + r : axis_);
    } else {
      dims = {x.numel()};
    }
    const int64_t len = dims[static_cast<size_t>(axis)];
    const bool* c = cond.as<bool>();
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < cond.numel(); ++i) {
      if (!c[i]) continue;
      if (i >= len)
        return InvalidArgument(node_, ": condition is true at ", i, ", past the ", len, " slices along axis ", axis);
      keep.push_back(i);
    }
    int64_t outer = 1, inner = 1;
    for (int a = 0; a < axis; ++a) outer *= dims[static_cast<size_t>(a)];
    for (size_t a = static_cast<size_t>(axis) + 1; a < dims.size(); ++a) inner *= dims[a];
    std::vector<int64_t> out_dims = dims;
    out_dims[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
    TensorView* y = ctx.Output(0, out_dims);
    if (!y) return absl::OkStatus();
    const size_t row = static_cast<size_t>(inner) * ElementSize(x.dtype);
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i : keep) {
        std::memcpy(dst, src + (o * len + i) * row, row);
        dst += row;
      }
    return absl::OkStatus();
  }

 private:
  bool has_axis_;
  int64_t axis_;
  std::string node_;
};

}  // namespace

void RegisterSelectionKernels(KernelRegistry& r) {
  r.Register({"", "NonZero", 9, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeFactory<NonZeroKernel>()});
  r.Register({"", "Compress", 9, 1 << 30,
              AllOf({InputTypeIn(0, FixedSizeTypes()), InputTypeIn(1, {DataType::kBool})}),
              MakeFactory<CompressKernel>()});
}

}  // namespace cleave::providers
