// CPU kernels for Resize (nearest, linear and cubic) and its gradient ai.cleave.ResizeGrad
// (providers/cpu/). Every mode is separable: Y is X resampled along one resized dim after
// another (graph/resize_geometry.h gives each dim's taps), the dims that map every coordinate to
// itself skipped. The gradient runs the passes' adjoints in reverse order, each input row
// gathering the output rows that read it in a fixed order (no atomics, the same bits for any
// thread count).
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "base/fixed_vector.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/resize_geometry.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/resize_plan.h"

namespace cleave::providers {

namespace {

using graph::ResizeAttrs;
using graph::ResizeDim;

using Pass = graph::ResizePass;

int64_t Elements(const Pass& p, bool output) { return p.outer * (output ? p.out : p.in) * p.inner; }

template <typename T>
void Forward(const Pass& p, const T* x, T* y, float extrapolation, ThreadPool* pool) {
  const graph::ResizeTaps& t = p.taps;
  ParallelFor(pool, p.outer * p.out, std::max<int64_t>(1, 4096 / std::max<int64_t>(p.inner, 1)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                  const int64_t b = r / p.out, o = r % p.out;
                  const int64_t e0 = t.offsets[static_cast<size_t>(o)], e1 = t.offsets[static_cast<size_t>(o) + 1];
                  T* out = y + r * p.inner;
                  if (t.index[static_cast<size_t>(e0)] < 0) {
                    std::fill(out, out + p.inner, static_cast<T>(extrapolation));
                    continue;
                  }
                  const T* first = x + (b * p.in + t.index[static_cast<size_t>(e0)]) * p.inner;
                  const T w0 = T(t.weight[static_cast<size_t>(e0)]);
                  for (int64_t k = 0; k < p.inner; ++k) out[k] = w0 == T(1) ? first[k] : first[k] * w0;
                  for (int64_t e = e0 + 1; e < e1; ++e) {
                    const T* row = x + (b * p.in + t.index[static_cast<size_t>(e)]) * p.inner;
                    const T w = T(t.weight[static_cast<size_t>(e)]);
                    for (int64_t k = 0; k < p.inner; ++k) out[k] += row[k] * w;
                  }
                }
              });
}

// dx [outer, in, inner] from dy [outer, out, inner]: each input row the weighted sum of the
// output rows that read it, in output order.
template <typename T>
void Backward(const Pass& p, const T* dy, T* dx, ThreadPool* pool) {
  const graph::ResizeReaders readers = graph::ResizeReadersOf(p);
  ParallelFor(pool, p.outer * p.in, std::max<int64_t>(1, 4096 / std::max<int64_t>(p.inner, 1)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                  const int64_t b = r / p.in, i = r % p.in;
                  T* out = dx + r * p.inner;
                  std::fill(out, out + p.inner, T(0));
                  for (int64_t e = readers.offsets[i]; e < readers.offsets[i + 1]; ++e) {
                    const T* g = dy + (b * p.out + readers.outputs[e]) * p.inner;
                    const T w = T(readers.weights[e]);
                    for (int64_t k = 0; k < p.inner; ++k) out[k] += g[k] * w;
                  }
                }
              });
}

// Runs the passes (forward, or their adjoints in reverse) from `src` into `dst`, through
// scratch between them; no passes: a copy.
template <typename T>
absl::Status RunPasses(const std::vector<Pass>& passes, bool backward, const T* src, T* dst, int64_t dst_elements,
                       float extrapolation, KernelContext& ctx) {
  if (passes.empty()) {
    std::memcpy(dst, src, static_cast<size_t>(dst_elements) * sizeof(T));
    return absl::OkStatus();
  }
  const T* cur = src;
  for (size_t j = 0; j < passes.size(); ++j) {
    const Pass& p = passes[backward ? passes.size() - 1 - j : j];
    T* next = dst;
    if (j + 1 < passes.size()) {
      next = ctx.ScratchOf<T>(std::max<int64_t>(Elements(p, !backward), 1));
      if (!next) return NoScratch();
    }
    if (backward) Backward(p, cur, next, ctx.thread_pool());
    else Forward(p, cur, next, extrapolation, ctx.thread_pool());
    cur = next;
  }
  return absl::OkStatus();
}

// Resize(X[, roi, scales, sizes]) -> Y, and ai.cleave.ResizeGrad(dY, X's shape[, roi, scales,
// sizes]) -> dX with the forward's attributes: the same passes, forward or their adjoints.
class ResizeKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(ResizeAttrs a, graph::ResizeAttrsOf(n));
    return std::unique_ptr<OpKernel>(new ResizeKernel(std::move(a), n.domain() == graph::kCleaveDomain));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& src = *ctx.input(0);
    DimVector in(src.dim_span());
    if (grad_) {
      const TensorView& shape = *ctx.input(1);
      if (shape.dtype != DataType::kInt64 || shape.rank != 1)
        return InvalidArgument("expected X's shape as a 1-D int64 tensor, got ", DataTypeName(shape.dtype), " ",
                               DimsToString(shape.dim_span()));
      in = DimVector(std::span<const int64_t>(shape.as<int64_t>(), static_cast<size_t>(shape.numel())));
    }
    ASSIGN_OR_RETURN(const std::vector<ResizeDim> dims, PlanResizeInputs(ctx, grad_ ? 2 : 1, in.span(), a_));
    DimVector out;
    for (const ResizeDim& d : dims) out.push_back(d.out);
    if (grad_ && DimVector(src.dim_span()) != out)
      return InvalidArgument("expected dY ", DimsToString(out.span()), " (the forward's Y), got ",
                             DimsToString(src.dim_span()));
    TensorView* dst = ctx.Output(0, grad_ ? in.span() : out.span());
    if (!dst || dst->numel() == 0) return absl::OkStatus();
    if (src.numel() == 0) {
      if (!grad_) return InvalidArgument("cannot resize an empty input to ", DimsToString(out.span()));
      std::memset(dst->data, 0, dst->nbytes());
      return absl::OkStatus();
    }
    const std::vector<Pass> passes = graph::ResizePasses(a_, dims);
    const float extrapolation = grad_ ? 0.f : a_.extrapolation_value;
    if (src.dtype == DataType::kFloat64)
      return RunPasses(passes, grad_, src.as<double>(), dst->as<double>(), dst->numel(), extrapolation, ctx);
    return RunPasses(passes, grad_, src.as<float>(), dst->as<float>(), dst->numel(), extrapolation, ctx);
  }

 private:
  ResizeKernel(ResizeAttrs a, bool grad) : a_(std::move(a)), grad_(grad) {}
  ResizeAttrs a_;
  bool grad_;
};

}  // namespace

void RegisterResizeKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  r.Register({"", "Resize", 11, 1 << 30, InputTypeIn(0, floats), MakeCheckedFactory<ResizeKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "ResizeGrad", 1, 1, InputTypeIn(0, floats),
              MakeCheckedFactory<ResizeKernel>()});
}

}  // namespace cleave::providers
