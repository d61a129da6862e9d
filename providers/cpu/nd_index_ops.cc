// GatherND and ScatterND on the CPU (providers/cpu/): slices of the data addressed by tuples of
// coordinates (kernels/nd_index.h). Every tuple is checked before anything is written, and an
// out-of-range coordinate is an error naming it, its tuple and the dim; ScatterND's reductions
// combine duplicate tuples in their order, on one thread, so the result is deterministic.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "kernels/cpu/type_dispatch.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/shape_ops.h"
#include "providers/nd_index_plan.h"
#include "providers/scatter_reduction.h"

namespace cleave::providers {

namespace {

// The slice each tuple addresses, as an element offset into the data, into the context's
// scratch (planned with the run).
absl::StatusOr<std::span<int64_t>> SliceOffsets(KernelContext& ctx, const kernels::NdIndexLayout& l,
                                                const TensorView& idx) {
  const int64_t n = l.batches * l.tuples;
  int64_t* buffer = ctx.ScratchOf<int64_t>(std::max<int64_t>(n, 1));
  if (!buffer) return NoScratch();
  const int64_t* ids = idx.as<int64_t>();
  for (int64_t t = 0; t < n; ++t) {
    int bad = 0;
    const int64_t at = kernels::NdSlice(l, ids + t * l.k, &bad);
    if (at < 0)
      return InvalidArgument("index ", ids[t * l.k + bad], " (coordinate ", bad, " of tuple ", t,
                             ") is outside [", -l.dims[bad], ", ", l.dims[bad], ")");
    buffer[t] = (t / l.tuples * l.block + at) * l.slice;
  }
  return std::span<int64_t>(buffer, static_cast<size_t>(n));
}

class GatherNdKernel : public OpKernel {
 public:
  GatherNdKernel(const graph::Node& n, int) : batch_dims_(n.AttrInt("batch_dims", 0)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    ASSIGN_OR_RETURN(const kernels::NdIndexLayout l, PlanNdIndex(x, idx, batch_dims_));
    ASSIGN_OR_RETURN(const std::span<int64_t> offsets, SliceOffsets(ctx, l, idx));
    TensorView* y = ctx.Output(0, NdGatheredDims(x, idx, batch_dims_));
    if (!y) return absl::OkStatus();
    const size_t bytes = static_cast<size_t>(l.slice) * ElementSize(x.dtype);
    const char* src = static_cast<const char*>(x.data);
    char* dst = static_cast<char*>(y->data);
    ParallelFor(ctx.thread_pool(), static_cast<int64_t>(offsets.size()), std::max<int64_t>(1, 16384 / std::max<size_t>(bytes, 1)),
                [&](int64_t t0, int64_t t1) {
                  for (int64_t t = t0; t < t1; ++t)
                    std::memcpy(dst + t * bytes, src + offsets[t] * ElementSize(x.dtype), bytes);
                });
    return absl::OkStatus();
  }

 private:
  int64_t batch_dims_;
};

// ScatterND(data, indices, updates): the data with each update slice written at its tuple's
// slice, or combined there by `reduction` (add, mul, max, min).
class ScatterNdKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const ScatterReduction red, ScatterReductionOf(n));
    return std::unique_ptr<OpKernel>(new ScatterNdKernel(red));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& idx = *ctx.input(1);
    const TensorView& upd = *ctx.input(2);
    ASSIGN_OR_RETURN(const kernels::NdIndexLayout l, PlanNdIndex(x, idx, 0));
    if (upd.dtype != x.dtype)
      return InvalidArgument("expected updates of the data's dtype ", DataTypeName(x.dtype), ", got ",
                             DataTypeName(upd.dtype));
    const DimVector want = NdGatheredDims(x, idx, 0);
    if (DimVector(upd.dim_span()) != want)
      return InvalidArgument("expected updates ", DimsToString(want.span()), " (the indices' dims less the last, then "
                             "the data's after the indexed ones), got ", DimsToString(upd.dim_span()));
    ASSIGN_OR_RETURN(const std::span<int64_t> offsets, SliceOffsets(ctx, l, idx));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (y->data != x.data && x.nbytes()) std::memcpy(y->data, x.data, x.nbytes());
    if (reduction_ == ScatterReduction::kNone) {
      const size_t es = ElementSize(x.dtype), bytes = static_cast<size_t>(l.slice) * es;
      for (size_t t = 0; t < offsets.size(); ++t)
        std::memcpy(static_cast<char*>(y->data) + offsets[t] * es, static_cast<const char*>(upd.data) + t * bytes, bytes);
      return absl::OkStatus();
    }
    const bool known = kernels::cpu::VisitNumeric(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      Combine<T>(offsets, l.slice, upd.as<T>(), y->as<T>());
    });
    return known ? absl::OkStatus() : InvalidArgument("a reduction over ", DataTypeName(x.dtype), " data");
  }

 private:
  explicit ScatterNdKernel(ScatterReduction r) : reduction_(r) {}

  template <typename T>
  void Combine(std::span<const int64_t> offsets, int64_t slice, const T* u, T* out) const {
    for (size_t t = 0; t < offsets.size(); ++t)
      for (int64_t s = 0; s < slice; ++s) CombineInto(reduction_, out[offsets[t] + s], u[static_cast<int64_t>(t) * slice + s]);
  }

  ScatterReduction reduction_;
};

}  // namespace

void RegisterNdIndexKernels(KernelRegistry& r) {
  r.Register({"", "GatherND", 11, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeFactory<GatherNdKernel>()});
  r.Register({"", "ScatterND", 11, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeCheckedFactory<ScatterNdKernel>()});
}

}  // namespace cleave::providers
