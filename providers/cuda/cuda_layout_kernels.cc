// The CUDA provider's data-movement kernels (providers/cuda/): Concat and Split, Gather and its
// gradient along any axis, Transpose, Slice and SliceGrad, Expand, and the views (Reshape,
// Flatten, Squeeze, Unsqueeze, Identity), and the value makers ConstantOfShape, Range and Trilu.
// Shapes, starts, axes and scalars are read on the host; the copies run on the provider's stream
// (kernels/cuda/data.cu).
#include <algorithm>
#include <cuda_runtime_api.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/shape.h"
#include "kernels/cuda/kernels.h"
#include "providers/axis.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_provider.h"

namespace cleave::providers {
namespace {

// Concat and Split along an axis: one pitched device copy per part.
class ConcatSplitKernel : public CudaKernel {
 public:
  ConcatSplitKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), concat_(n.op_type() == "Concat"), axis_(n.AttrInt("axis", 0)),
        split_attr_(n.AttrInts("split")), num_outputs_(n.num_outputs()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& first = *ctx.input(0);
    const int rank = first.rank;
    const int64_t axis = axis_ < 0 ? axis_ + rank : axis_;
    if (axis < 0 || axis >= rank) return InvalidArgument(name_, ": axis ", axis_, " is out of range for rank ", rank);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= first.dims[d];
    for (int d = axis + 1; d < rank; ++d) inner *= first.dims[d];
    const size_t es = ElementSize(first.dtype);
    auto stream_ = static_cast<cudaStream_t>(stream());
    // `rows` blocks of w bytes; one row is a plain copy (as a 2-D copy its pitch, the whole
    // tensor, could pass the device's pitch limit).
    auto copy = [&](void* dst, size_t dpitch, const void* src, size_t spitch, size_t w, int64_t rows) {
      if (rows == 1) return Check(cudaMemcpyAsync(dst, src, w, cudaMemcpyDeviceToDevice, stream_));
      return Check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, w, rows, cudaMemcpyDeviceToDevice, stream_));
    };
    if (concat_) {
      int64_t total = 0;
      for (int i = 0; i < ctx.num_inputs(); ++i) total += ctx.input(i)->dims[axis];
      std::vector<int64_t> out(first.dims, first.dims + rank);
      out[axis] = total;
      TensorView* y = ctx.Output(0, out);
      if (!y) return absl::OkStatus();
      int64_t at = 0;
      for (int i = 0; i < ctx.num_inputs(); ++i) {
        const TensorView& x = *ctx.input(i);
        const size_t w = static_cast<size_t>(x.dims[axis] * inner) * es;
        if (w && outer)
          RETURN_IF_ERROR(copy(static_cast<char*>(y->data) + at * inner * es, total * inner * es, x.data, w, w, outer));
        at += x.dims[axis];
      }
      return absl::OkStatus();
    }
    std::vector<int64_t> parts = split_attr_;
    const TensorView* sp = ctx.num_inputs() > 1 ? ctx.input(1) : nullptr;
    if (sp) parts.assign(sp->as<int64_t>(), sp->as<int64_t>() + sp->numel());
    if (parts.empty()) {
      const int64_t n = first.dims[axis], k = num_outputs_;
      for (int i = 0; i < k; ++i) parts.push_back((n + k - 1) / k - (i == k - 1 ? (n + k - 1) / k * k - n : 0));
    }
    int64_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      std::vector<int64_t> out(first.dims, first.dims + rank);
      out[axis] = parts[i];
      TensorView* y = ctx.Output(static_cast<int>(i), out);
      const size_t w = static_cast<size_t>(parts[i] * inner) * es;
      if (y && w && outer)
        RETURN_IF_ERROR(copy(y->data, w, static_cast<const char*>(first.data) + at * inner * es,
                             first.dims[axis] * inner * es, w, outer));
      at += parts[i];
    }
    if (at != first.dims[axis])
      return InvalidArgument(name_, ": the parts add up to ", at, ", the axis has ", first.dims[axis]);
    return absl::OkStatus();
  }

 private:
  bool concat_;
  int64_t axis_;
  std::vector<int64_t> split_attr_;
  int num_outputs_;
};

// ---- lookups and layout ----------------------------------------------------------------

// The elements before and after `axis` of dims: the [outer, dims[axis], inner] view.
void AroundAxis(std::span<const int64_t> dims, int axis, int64_t* outer, int64_t* inner) {
  *outer = *inner = 1;
  for (int d = 0; d < axis; ++d) *outer *= dims[d];
  for (size_t d = axis + 1; d < dims.size(); ++d) *inner *= dims[d];
}

// Gather(data, indices) {axis}: data [outer, rows, inner] around the axis, int64 or int32
// indices, out data.dims[:axis] + indices.dims + data.dims[axis+1:].
class GatherKernel : public CudaKernel {
 public:
  GatherKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), axis_(n.AttrInt("axis", 0)),
        tag_(p->IndexCheckTag(absl::StrCat(name_, " (axis ", axis_, ")"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& table = *ctx.input(0);
    const TensorView& ids = *ctx.input(1);
    ASSIGN_OR_RETURN(const int axis, ResolveAxis(axis_, table.rank));
    if (table.rank - 1 + ids.rank > kc::kMaxRank)
      return Unimplemented(name_, ": output rank ", table.rank - 1 + ids.rank, " over ", kc::kMaxRank);
    std::vector<int64_t> out(table.dims, table.dims + axis);
    out.insert(out.end(), ids.dims, ids.dims + ids.rank);
    out.insert(out.end(), table.dims + axis + 1, table.dims + table.rank);
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    int64_t outer, inner;
    AroundAxis(table.dim_span(), axis, &outer, &inner);
    return Check(kc::Gather(static_cast<int>(ElementSize(table.dtype)), table.data, ids.data,
                            ids.dtype == DataType::kInt32, y->data, outer, ids.numel(), table.dims[axis], inner,
                            stream(), {p_->bad_index_words(), tag_}));
  }

 private:
  int64_t axis_, tag_;
};

// GatherGrad(shape [host], indices, dY[, base, reset [host]]) {axis} -> dX of `shape`: dY
// (shape[:axis] + indices.dims + shape[axis+1:]) scatter-added along the axis.
class GatherGradKernel : public CudaKernel {
 public:
  GatherGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), axis_(n.AttrInt("axis", 0)),
        tag_(p->IndexCheckTag(absl::StrCat(name_, " (axis ", axis_, ")"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& shape = *ctx.input(0);
    const TensorView& ids = *ctx.input(1);
    const TensorView& dy = *ctx.input(2);
    std::vector<int64_t> dims(shape.as<int64_t>(), shape.as<int64_t>() + shape.numel());
    ASSIGN_OR_RETURN(const int axis, ResolveAxis(axis_, static_cast<int>(dims.size())));
    int64_t outer, inner;
    AroundAxis(dims, axis, &outer, &inner);
    if (dy.numel() != outer * ids.numel() * inner)
      return InvalidArgument(name_, ": dY ", DimsToString(dy.shape()), " has ", dy.numel(), " elements, expected ",
                             outer, " x ", ids.numel(), " x ", inner, " for indices ", DimsToString(ids.shape()),
                             " along axis ", axis, " of ", DimsToString(dims));
    // A base (input 3) that dX starts from, unless reset (input 4, host) is set.
    const TensorView* base = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    const TensorView* reset = ctx.num_inputs() > 4 ? ctx.input(4) : nullptr;
    if (base && (base->dtype != DataType::kFloat32 || base->shape() != dims))
      return InvalidArgument(name_, ": expected a base of the table's shape ", DimsToString(dims), " and float32, got ",
                             DimsToString(base->shape()), " ", DataTypeName(base->dtype));
    if (reset && *reset->as<bool>()) base = nullptr;
    TensorView* dx = ctx.Output(0, dims);
    if (!dx) return absl::OkStatus();
    return Check(kc::GatherGrad(dy.as<float>(), ids.data, ids.dtype == DataType::kInt32, dx->as<float>(), outer,
                                ids.numel(), dims[axis], inner, stream(), base ? base->as<float>() : nullptr,
                                {p_->bad_index_words(), tag_}));
  }

 private:
  int64_t axis_, tag_;
};

class TransposeKernel : public CudaKernel {
 public:
  TransposeKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), perm_(n.AttrInts("perm")) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    std::vector<int64_t> perm = perm_;
    if (perm.empty())
      for (int d = x.rank - 1; d >= 0; --d) perm.push_back(d);
    if (static_cast<int>(perm.size()) != x.rank) return InvalidArgument(name_, ": perm does not match the rank");
    std::vector<int64_t> out;
    for (int64_t p : perm) out.push_back(x.dims[p]);
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    return Check(kc::Transpose(static_cast<int>(ElementSize(x.dtype)), x.data, y->data, x.rank, x.dims, perm.data(),
                               stream()));
  }

 private:
  std::vector<int64_t> perm_;
};

// Input i (a host tensor of int64 or int32 values) as int64s; empty when the input is absent.
std::vector<int64_t> HostInts(KernelContext& ctx, int i) {
  const TensorView* t = ctx.num_inputs() > i ? ctx.input(i) : nullptr;
  std::vector<int64_t> v;
  if (!t) return v;
  for (int64_t k = 0; k < t->numel(); ++k)
    v.push_back(t->dtype == DataType::kInt32 ? t->as<int32_t>()[k] : t->as<int64_t>()[k]);
  return v;
}

// The slice of `dims` that inputs first.. (starts, ends[, axes, steps], on the host) ask for, or
// the error naming the node.
absl::StatusOr<kernels::cpu::SliceParams> ResolveSliceInputs(const std::string& name, std::span<const int64_t> dims,
                                                              KernelContext& ctx, int first) {
  const std::vector<int64_t> starts = HostInts(ctx, first), ends = HostInts(ctx, first + 1),
                             axes = HostInts(ctx, first + 2), steps = HostInts(ctx, first + 3);
  auto p = kernels::cpu::ResolveSlice(dims, starts, ends, axes, steps);
  if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(name, ": ", p.status().message()));
  return p;
}

// Where a resolved slice of `dims` starts (elements from the first) and each of its dims' step
// in elements, for a strided walk of a contiguous tensor of `dims`.
int64_t SliceWalk(const std::vector<int64_t>& dims, const kernels::cpu::SliceParams& p,
                  std::vector<int64_t>* strides) {
  const int rank = static_cast<int>(dims.size());
  int64_t stride = 1, first = 0;
  strides->assign(rank, 0);
  for (int d = rank - 1; d >= 0; --d) {
    first += p.starts[d] * stride;
    (*strides)[d] = p.steps[d] * stride;
    stride *= dims[d];
  }
  return first;
}

// Slice (opset 10 on: starts, ends, axes and steps are inputs, read on the host): a strided
// copy from the first selected element.
class SliceKernel : public CudaKernel {
 public:
  SliceKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(const kernels::cpu::SliceParams p, ResolveSliceInputs(name_, x.dim_span(), ctx, 1));
    std::vector<int64_t> out(p.out_dims.begin(), p.out_dims.end());
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    std::vector<int64_t> strides;
    const int64_t first = SliceWalk(x.shape(), p, &strides);
    const size_t es = ElementSize(x.dtype);
    return Check(kc::StridedCopy(static_cast<int>(es), static_cast<const char*>(x.data) + first * es, y->data, x.rank,
                                 out.data(), strides.data(), stream()));
  }
};

// SliceGrad(dY, shape, starts, ends[, axes, steps]) (all but dY on the host): zeros of `shape`
// with dY written into the slice, a strided scatter from its first element.
class SliceGradKernel : public CudaKernel {
 public:
  SliceGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const std::vector<int64_t> dims = HostInts(ctx, 1);
    if (dims.size() > static_cast<size_t>(kc::kMaxRank))
      return Unimplemented(name_, ": rank ", dims.size(), " over ", kc::kMaxRank);
    ASSIGN_OR_RETURN(const kernels::cpu::SliceParams p, ResolveSliceInputs(name_, dims, ctx, 2));
    const std::vector<int64_t> slice(p.out_dims.begin(), p.out_dims.end());
    if (dy.shape() != slice)
      return InvalidArgument(name_, ": dY ", DimsToString(dy.shape()), " does not match the slice ",
                             DimsToString(slice), " of shape ", DimsToString(dims));
    TensorView* dx = ctx.Output(0, dims);
    if (!dx) return absl::OkStatus();
    RETURN_IF_ERROR(Check(cudaMemsetAsync(dx->data, 0, dx->nbytes(), static_cast<cudaStream_t>(stream()))));
    if (dy.numel() == 0) return absl::OkStatus();
    std::vector<int64_t> strides;
    const int64_t first = SliceWalk(dims, p, &strides);
    const size_t es = ElementSize(dy.dtype);
    return Check(kc::StridedScatter(static_cast<int>(es), dy.data, static_cast<char*>(dx->data) + first * es,
                                    static_cast<int>(dims.size()), slice.data(), strides.data(), stream()));
  }
};

// Expand(x, shape [host]): x broadcast with `shape` (either may have the larger dims), a strided
// copy that steps 0 along the dims x has as 1.
class ExpandKernel : public CudaKernel {
 public:
  ExpandKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const std::vector<int64_t> shape = HostInts(ctx, 1);
    const int rank = std::max<int>(x.rank, static_cast<int>(shape.size()));
    if (rank > kc::kMaxRank) return Unimplemented(name_, ": rank ", rank, " over ", kc::kMaxRank);
    std::vector<int64_t> out(rank), strides(rank);
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      const int ix = d - (rank - x.rank), is = d - (rank - static_cast<int>(shape.size()));
      const int64_t dx = ix >= 0 ? x.dims[ix] : 1, ds = is >= 0 ? shape[is] : 1;
      if (dx != ds && dx != 1 && ds != 1)
        return InvalidArgument(name_, ": input ", DimsToString(x.shape()), " does not broadcast to shape ",
                               DimsToString(shape), " (dim ", d, ": ", dx, " against ", ds, ")");
      out[d] = dx == 1 ? ds : dx;
      strides[d] = dx == 1 ? 0 : stride;
      stride *= dx;
    }
    TensorView* y = ctx.Output(0, out);
    if (!y || y->numel() == 0) return absl::OkStatus();
    return Check(kc::StridedCopy(static_cast<int>(ElementSize(x.dtype)), x.data, y->data, rank, out.data(),
                                 strides.data(), stream()));
  }
};

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: a device copy into the output's dims
// (shape and axes inputs are read on the host), or nothing when the executor made the output
// a view of the input.
class ViewKernel : public CudaKernel {
 public:
  ViewKernel(const CudaExecutionProvider* p, const graph::Node& n, int version)
      : CudaKernel(p, n), op_(n.op_type()), allowzero_(n.AttrInt("allowzero", 0) != 0),
        axis_(n.AttrInt("axis", 1)), axes_attr_(n.AttrInts("axes")) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* arg = ctx.num_inputs() > 1 ? ctx.input(1) : nullptr;
    std::vector<int64_t> out;
    if (op_ == "Reshape") {
      int64_t known = 1, infer = -1;
      for (int64_t i = 0; i < arg->numel(); ++i) {
        int64_t d = arg->as<int64_t>()[i];
        if (d == 0 && !allowzero_) d = i < x.rank ? x.dims[i] : 0;
        if (d == -1) infer = i;
        else known *= d;
        out.push_back(d);
      }
      if (infer >= 0) out[infer] = known ? x.numel() / known : 0;
    } else if (op_ == "Flatten") {
      const int64_t axis = axis_ < 0 ? axis_ + x.rank : axis_;
      int64_t outer = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= x.dims[d];
      out = {outer, outer ? x.numel() / outer : 0};
    } else if (op_ == "Squeeze" || op_ == "Unsqueeze") {
      std::vector<int64_t> axes = axes_attr_;
      if (arg)
        axes.assign(arg->as<int64_t>(), arg->as<int64_t>() + arg->numel());
      const int out_rank = op_ == "Unsqueeze" ? x.rank + static_cast<int>(axes.size()) : x.rank;
      for (int64_t& a : axes)
        if (a < 0) a += out_rank;
      if (op_ == "Unsqueeze") {
        for (int d = 0, k = 0; d < out_rank; ++d)
          out.push_back(std::count(axes.begin(), axes.end(), d) ? 1 : x.dims[k++]);
      } else {
        for (int d = 0; d < x.rank; ++d)
          if (axes.empty() ? x.dims[d] != 1 : !std::count(axes.begin(), axes.end(), d)) out.push_back(x.dims[d]);
      }
    } else {
      out.assign(x.dims, x.dims + x.rank);
    }
    int64_t n = 1;
    for (int64_t d : out) n *= d;
    if (n != x.numel())
      return InvalidArgument(name_, ": cannot view ", DimsToString(x.shape()), " as ", DimsToString(out));
    TensorView* y = ctx.Output(0, out);
    // The executor may hand out the input's own bytes as the output (a view): nothing to copy.
    if (!y || y->data == x.data) return absl::OkStatus();
    return Copy(y->data, x.data, x.nbytes());
  }

 private:
  std::string op_;
  bool allowzero_;
  int64_t axis_;
  std::vector<int64_t> axes_attr_;
};

}  // namespace

// ConstantOfShape(shape [host]) {value}: the value's bytes, decoded once.
class ConstantOfShapeKernel : public CudaKernel {
 public:
  ConstantOfShapeKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {
    const graph::Attribute* a = n.FindAttr("value");
    const Tensor value = a ? a->t : Tensor::Scalar<float>(0.f);  // the spec's default: float32 zero
    elem_bytes_ = static_cast<int>(ElementSize(value.dtype()));
    std::memcpy(&bits_, value.raw(), std::min<size_t>(value.nbytes(), sizeof bits_));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const std::vector<int64_t> dims = HostInts(ctx, 0);
    for (int64_t d : dims)
      if (d < 0) return InvalidArgument(name_, ": shape ", DimsToString(dims), " has a negative dim");
    TensorView* y = ctx.Output(0, dims);
    return y ? Check(kc::Fill(elem_bytes_, bits_, y->data, y->numel(), stream())) : absl::OkStatus();
  }

 private:
  int elem_bytes_ = 4;
  uint64_t bits_ = 0;
};

std::string OneElementValue(const graph::Node& n, int) {
  const graph::Attribute* a = n.FindAttr("value");
  if (!a) return "";
  const size_t bytes = ElementSize(a->t.dtype());
  if (a->t.numel() != 1 || (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8))
    return absl::StrCat("a value of dtype ", DataTypeName(a->t.dtype()), " and ", a->t.numel(),
                        " elements is not supported on CUDA");
  return "";
}

// Range(start, limit, delta [host scalars]): start + i * delta, as the CPU counts and computes.
class RangeKernel : public CudaKernel {
 public:
  RangeKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    for (int i = 0; i < 3; ++i)
      if (ctx.input(i)->numel() != 1)
        return InvalidArgument(name_, ": input ", i, " has shape ", DimsToString(ctx.input(i)->shape()),
                               ", expected a scalar");
    const DataType t = ctx.input(0)->dtype;
    if (t == DataType::kFloat32) {
      const float start = *ctx.input(0)->as<float>(), limit = *ctx.input(1)->as<float>();
      const float delta = *ctx.input(2)->as<float>();
      if (delta == 0.f) return InvalidArgument(name_, ": delta is 0, expected non-zero");
      const int64_t n = kernels::cpu::RangeCount(start, limit, delta);
      TensorView* y = ctx.Output(0, {n});
      return y ? Check(kc::Range(kc::Elem::kF32, 0, 0, start, delta, y->data, n, stream())) : absl::OkStatus();
    }
    const int64_t start = HostInts(ctx, 0)[0], limit = HostInts(ctx, 1)[0], delta = HostInts(ctx, 2)[0];
    if (delta == 0) return InvalidArgument(name_, ": delta is 0, expected non-zero");
    const int64_t n = kernels::cpu::RangeCount(start, limit, delta);
    TensorView* y = ctx.Output(0, {n});
    const kc::Elem e = t == DataType::kInt32 ? kc::Elem::kI32 : kc::Elem::kI64;
    return y ? Check(kc::Range(e, start, delta, 0, 0, y->data, n, stream())) : absl::OkStatus();
  }
};

// Trilu(x[, k [host]]) {upper}: over the last two dims.
class TriluKernel : public CudaKernel {
 public:
  TriluKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), upper_(n.AttrInt("upper", 1) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank < 2) return InvalidArgument(name_, ": expected an input of rank >= 2, got ", DimsToString(x.shape()));
    const std::vector<int64_t> k = HostInts(ctx, 1);
    if (ctx.num_inputs() > 1 && ctx.input(1) && k.size() != 1)
      return InvalidArgument(name_, ": expected a scalar k, got shape ", DimsToString(ctx.input(1)->shape()));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    const int64_t rows = x.dims[x.rank - 2], cols = x.dims[x.rank - 1];
    const int64_t batch = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
    return Check(kc::Trilu(static_cast<int>(ElementSize(x.dtype)), x.data, y->data, batch, rows, cols,
                           k.empty() ? 0 : k[0], upper_, stream()));
  }

 private:
  bool upper_;
};

void RegisterCudaLayoutKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  const std::vector<DataType> ints = {DataType::kInt64, DataType::kInt32};
  const auto f32 = InputTypeIn(0, {DataType::kFloat32});
  auto any = [](const graph::Node&, int) { return std::string(); };
  Add<SliceKernel>(r, p, "", "Slice", 10, 1 << 30, any, {1, 2, 3, 4});
  Add<SliceGradKernel>(r, p, C, "SliceGrad", 1, 1, f32, {1, 2, 3, 4, 5});
  Add<ExpandKernel>(r, p, "", "Expand", 8, 1 << 30, InputTypeIn(1, {DataType::kInt64}), {1});
  const auto int_ids = [&ints](int i) { return InputTypeIn(i, ints); };
  Add<GatherKernel>(r, p, "", "Gather", 1, 1 << 30, int_ids(1));
  Add<GatherGradKernel>(r, p, C, "GatherGrad", 1, 1, AllOf({InputTypeIn(2, {DataType::kFloat32}), int_ids(1)}),
                        {0, 4});
  Add<TransposeKernel>(r, p, "", "Transpose", 1, 1 << 30, any);
  Add<ViewKernel>(r, p, "", "Reshape", 5, 1 << 30, any, {1});
  Add<ViewKernel>(r, p, "", "Flatten", 1, 1 << 30, any);
  Add<ViewKernel>(r, p, "", "Squeeze", 1, 1 << 30, any, {1});
  Add<ViewKernel>(r, p, "", "Unsqueeze", 1, 1 << 30, any, {1});
  Add<ViewKernel>(r, p, "", "Identity", 1, 1 << 30, any);
  Add<ConcatSplitKernel>(r, p, "", "Concat", 4, 1 << 30, any);
  Add<ConcatSplitKernel>(r, p, "", "Split", 2, 1 << 30, any, {1});
  Add<ConstantOfShapeKernel>(r, p, "", "ConstantOfShape", 9, 1 << 30,
                             AllOf({InputTypeIn(0, {DataType::kInt64}), OneElementValue}), {0});
  Add<RangeKernel>(r, p, "", "Range", 11, 1 << 30, InputTypeIn(0, {DataType::kFloat32, DataType::kInt64,
                                                                   DataType::kInt32}), {0, 1, 2});
  const auto word_sized = [](const graph::Node& n, int) -> std::string {
    const size_t b = ElementSize(n.input(0)->dtype());
    return b == 1 || b == 2 || b == 4 || b == 8 ? "" : "elements of this size are not supported on CUDA";
  };
  Add<TriluKernel>(r, p, "", "Trilu", 14, 1 << 30, word_sized, {1});
}

}  // namespace cleave::providers
