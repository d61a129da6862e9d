// RoiAlign (10, 16) on the CPU (providers/cpu/): each region of interest pooled to
// [output_height, output_width] bins, each bin the average (or, in max mode, the largest of the
// weighted corner values, as the ONNX definition has it) of a grid of bilinear samples, the
// grid sampling_ratio on a side or, with 0, ceil(region / bins) of them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/status.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

// One sample's four corners in a [height, width] plane and their weights (all 0 outside).
struct Sample {
  int64_t at[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

Sample BilinearAt(double y, double x, int64_t height, int64_t width) {
  Sample s;
  if (y < -1.0 || y > static_cast<double>(height) || x < -1.0 || x > static_cast<double>(width)) return s;
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= height - 1) {
    y0 = y1 = height - 1;
    y = static_cast<double>(y0);
  }
  if (x0 >= width - 1) {
    x0 = x1 = width - 1;
    x = static_cast<double>(x0);
  }
  const double ly = y - static_cast<double>(y0), lx = x - static_cast<double>(x0), hy = 1 - ly, hx = 1 - lx;
  s.at[0] = y0 * width + x0;
  s.at[1] = y0 * width + x1;
  s.at[2] = y1 * width + x0;
  s.at[3] = y1 * width + x1;
  s.w[0] = hy * hx;
  s.w[1] = hy * lx;
  s.w[2] = ly * hx;
  s.w[3] = ly * lx;
  return s;
}

class RoiAlignKernel : public OpKernel {
 public:
  RoiAlignKernel(const graph::Node& n, int version)
      : max_(n.AttrString("mode", "avg") == "max"),
        half_pixel_(version >= 16 && n.AttrString("coordinate_transformation_mode", "half_pixel") == "half_pixel"),
        out_h_(n.AttrInt("output_height", 1)), out_w_(n.AttrInt("output_width", 1)),
        ratio_(n.AttrInt("sampling_ratio", 0)), scale_(n.AttrFloat("spatial_scale", 1.f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& rois = *ctx.input(1);
    const TensorView& batch = *ctx.input(2);
    if (x.rank != 4) return InvalidArgument("expected X [N, C, H, W], got ", DimsToString(x.dim_span()));
    if (rois.rank != 2 || rois.dims[1] != 4)
      return InvalidArgument("expected rois [num_rois, 4], got ", DimsToString(rois.dim_span()));
    const int64_t count = rois.dims[0];
    if (batch.rank != 1 || batch.dims[0] != count)
      return InvalidArgument("expected batch_indices [", count, "] (one per roi), got ", DimsToString(batch.dim_span()));
    if (out_h_ < 1 || out_w_ < 1 || ratio_ < 0)
      return InvalidArgument("output_height ", out_h_, ", output_width ", out_w_, " and sampling_ratio ", ratio_,
                             "; expected them >= 1, >= 1 and >= 0");
    const int64_t channels = x.dims[1], height = x.dims[2], width = x.dims[3];
    TensorView* y = ctx.Output(0, {count, channels, out_h_, out_w_});
    if (!y || y->numel() == 0) return absl::OkStatus();
    for (int64_t r = 0; r < count; ++r) {
      const int64_t b = batch.dtype == DataType::kInt32 ? batch.as<int32_t>()[r] : batch.as<int64_t>()[r];
      if (b < 0 || b >= x.dims[0])
        return InvalidArgument("batch_indices[", r, "] is ", b, "; X holds ", x.dims[0], " images");
    }
    ParallelFor(ctx.thread_pool(), count, 1, [&](int64_t r0, int64_t r1) {
      std::vector<Sample> samples;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = batch.dtype == DataType::kInt32 ? batch.as<int32_t>()[r] : batch.as<int64_t>()[r];
        const double offset = half_pixel_ ? 0.5 : 0.0;
        const double x0 = ElementAsDouble(rois, r * 4) * scale_ - offset, y0 = ElementAsDouble(rois, r * 4 + 1) * scale_ - offset;
        double w = ElementAsDouble(rois, r * 4 + 2) * scale_ - offset - x0, h = ElementAsDouble(rois, r * 4 + 3) * scale_ - offset - y0;
        if (!half_pixel_) {
          w = std::max(w, 1.0);
          h = std::max(h, 1.0);
        }
        const double bin_h = h / static_cast<double>(out_h_), bin_w = w / static_cast<double>(out_w_);
        const int64_t grid_h = ratio_ > 0 ? ratio_ : static_cast<int64_t>(std::ceil(h / static_cast<double>(out_h_)));
        const int64_t grid_w = ratio_ > 0 ? ratio_ : static_cast<int64_t>(std::ceil(w / static_cast<double>(out_w_)));
        const double per_bin = static_cast<double>(std::max<int64_t>(grid_h * grid_w, 1));
        samples.clear();
        for (int64_t ph = 0; ph < out_h_; ++ph)
          for (int64_t pw = 0; pw < out_w_; ++pw)
            for (int64_t iy = 0; iy < grid_h; ++iy)
              for (int64_t ix = 0; ix < grid_w; ++ix)
                samples.push_back(BilinearAt(y0 + static_cast<double>(ph) * bin_h +
                                                 (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(grid_h),
                                             x0 + static_cast<double>(pw) * bin_w +
                                                 (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(grid_w),
                                             height, width));
        for (int64_t c = 0; c < channels; ++c) {
          const int64_t plane = (b * channels + c) * height * width;
          size_t k = 0;
          for (int64_t bin = 0; bin < out_h_ * out_w_; ++bin) {
            double acc = 0;
            for (int64_t g = 0; g < grid_h * grid_w; ++g, ++k) {
              const Sample& s = samples[k];
              double v = 0;
              if (max_) {
                v = s.w[0] * ElementAsDouble(x, plane + s.at[0]);
                for (int j = 1; j < 4; ++j) v = std::max(v, s.w[j] * ElementAsDouble(x, plane + s.at[j]));
                acc = g == 0 ? v : std::max(acc, v);
              } else {
                for (int j = 0; j < 4; ++j) v += s.w[j] * ElementAsDouble(x, plane + s.at[j]);
                acc += v;
              }
            }
            const int64_t at = ((r * channels + c) * out_h_ * out_w_) + bin;
            const double out = max_ ? acc : acc / per_bin;
            if (y->dtype == DataType::kFloat64) y->as<double>()[at] = out;
            else y->as<float>()[at] = static_cast<float>(out);
          }
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  bool max_, half_pixel_;
  int64_t out_h_, out_w_, ratio_;
  double scale_;
};

}  // namespace

void RegisterRoiAlignKernels(KernelRegistry& r) {
  r.Register({"", "RoiAlign", 10, 1 << 30,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                     InputTypeIn(2, {DataType::kInt64, DataType::kInt32})}),
              MakeFactory<RoiAlignKernel>()});
}

}  // namespace cleave::providers
