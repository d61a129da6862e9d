// CPU kernels for GridSample and its gradient ai.cleave.GridSampleGrad (providers/cpu/), over
// the taps of kernels/grid_sample.h. The forward and the grid's gradient run over the output
// points (each point's taps found once, then every channel); X's gradient runs over the
// [N, C] planes, each plane's points in order, so it needs no atomics and gives the same bits
// for any thread count.
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/grid_sample.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/grid_sample_plan.h"

namespace cleave::providers {

namespace {

using kernels::ForEachGridTap;
using kernels::GridAxisTaps;
using kernels::GridPointTaps;
using kernels::GridSampleLayout;
using kernels::kMaxGridAxes;

int64_t Grain(const GridSampleLayout& l) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(l.channels, 1)); }

// y [N, C, points] from x [N, C, in...] at grid [N, points, axes].
template <typename T>
void Sample(const GridSampleLayout& l, const T* x, const T* grid, T* y, ThreadPool* pool) {
  const int64_t plane = kernels::GridInPoints(l);
  ParallelFor(pool, l.batch * l.out_points, Grain(l), [&](int64_t p0, int64_t p1) {
    GridAxisTaps<T> taps[kMaxGridAxes];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / l.out_points, o = p % l.out_points;
      GridPointTaps(l, grid + (b * l.out_points + o) * l.axes, taps);
      for (int64_t c = 0; c < l.channels; ++c) {
        const T* xc = x + (b * l.channels + c) * plane;
        T acc = T(0);
        ForEachGridTap(l, taps, [&](int64_t at, T w, const T*) { acc += w * xc[at]; });
        y[(b * l.channels + c) * l.out_points + o] = acc;
      }
    }
  });
}

// dx [N, C, in...] and dgrid [N, points, axes] from dy [N, C, points]; either may be null (not
// wanted).
template <typename T>
void SampleGrad(const GridSampleLayout& l, const T* dy, const T* x, const T* grid, T* dx, T* dgrid,
                ThreadPool* pool) {
  const int64_t plane = kernels::GridInPoints(l);
  if (dx) ParallelFor(pool, l.batch * l.channels, 1, [&](int64_t q0, int64_t q1) {
    GridAxisTaps<T> taps[kMaxGridAxes];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t b = q / l.channels;
      T* dxc = dx + q * plane;
      std::fill(dxc, dxc + plane, T(0));
      for (int64_t o = 0; o < l.out_points; ++o) {
        const T g = dy[q * l.out_points + o];
        if (g == T(0)) continue;
        GridPointTaps(l, grid + (b * l.out_points + o) * l.axes, taps);
        ForEachGridTap(l, taps, [&](int64_t at, T w, const T*) { dxc[at] += w * g; });
      }
    }
  });
  if (dgrid) ParallelFor(pool, l.batch * l.out_points, Grain(l), [&](int64_t p0, int64_t p1) {
    GridAxisTaps<T> taps[kMaxGridAxes];
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = p / l.out_points, o = p % l.out_points;
      GridPointTaps(l, grid + (b * l.out_points + o) * l.axes, taps);
      T acc[kMaxGridAxes] = {T(0), T(0), T(0)};
      for (int64_t c = 0; c < l.channels; ++c) {
        const T g = dy[(b * l.channels + c) * l.out_points + o];
        const T* xc = x + (b * l.channels + c) * plane;
        ForEachGridTap(l, taps, [&](int64_t at, T, const T* dw) {
          for (int d = 0; d < l.axes; ++d) acc[d] += g * dw[d] * xc[at];
        });
      }
      // The grid lists the innermost axis first.
      for (int d = 0; d < l.axes; ++d) dgrid[p * l.axes + (l.axes - 1 - d)] = acc[d];
    }
  });
}

// GridSample(X, grid) -> Y, and ai.cleave.GridSampleGrad(dY, X, grid) -> dX, dGrid with the
// forward's attributes.
class GridSampleKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(GridSampleLayout a, GridSampleAttrsOf(n));
    return std::unique_ptr<OpKernel>(new GridSampleKernel(a, n.domain() == graph::kCleaveDomain));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const int first = grad_ ? 1 : 0;
    const TensorView& x = *ctx.input(first);
    const TensorView& grid = *ctx.input(first + 1);
    if (grid.dtype != x.dtype)
      return InvalidArgument("grid is ", DataTypeName(grid.dtype), "; expected X's ", DataTypeName(x.dtype));
    ASSIGN_OR_RETURN(const GridSampleLayout l, PlanGridSample(attrs_, x.dim_span(), grid.dim_span()));
    const std::vector<int64_t> y = GridSampleOutputDims(l, grid.dim_span());
    if (!grad_) {
      TensorView* out = ctx.Output(0, y);
      if (!out || out->numel() == 0) return absl::OkStatus();
      if (x.dtype == DataType::kFloat64) Sample(l, x.as<double>(), grid.as<double>(), out->as<double>(), ctx.thread_pool());
      else Sample(l, x.as<float>(), grid.as<float>(), out->as<float>(), ctx.thread_pool());
      return absl::OkStatus();
    }
    const TensorView& dy = *ctx.input(0);
    if (dy.dtype != x.dtype || std::vector<int64_t>(dy.dims, dy.dims + dy.rank) != y)
      return InvalidArgument("expected dY ", DataTypeName(x.dtype), " ", DimsToString(y), " (the forward's Y), got ",
                             DataTypeName(dy.dtype), " ", DimsToString(dy.dim_span()));
    // dGrid may be left off (the grid wants no gradient).
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dgrid = ctx.num_outputs() > 1 ? ctx.Output(1, grid.dim_span()) : nullptr;
    for (TensorView* t : {dx, dgrid})
      if (t && t->numel()) std::memset(t->data, 0, t->nbytes());
    if (dy.numel() == 0) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64)
      SampleGrad(l, dy.as<double>(), x.as<double>(), grid.as<double>(), dx ? dx->as<double>() : nullptr,
                 dgrid ? dgrid->as<double>() : nullptr, ctx.thread_pool());
    else
      SampleGrad(l, dy.as<float>(), x.as<float>(), grid.as<float>(), dx ? dx->as<float>() : nullptr,
                 dgrid ? dgrid->as<float>() : nullptr, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  GridSampleKernel(GridSampleLayout a, bool grad) : attrs_(a), grad_(grad) {}
  GridSampleLayout attrs_;
  bool grad_;
};

}  // namespace

void RegisterGridSampleKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  r.Register({"", "GridSample", 16, 1 << 30, InputTypeIn(0, floats), MakeCheckedFactory<GridSampleKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "GridSampleGrad", 1, 1, InputTypeIn(0, floats),
              MakeCheckedFactory<GridSampleKernel>()});
}

}  // namespace cleave::providers
