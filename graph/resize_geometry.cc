// Resize's geometry (graph/): see resize_geometry.h.
#include "graph/resize_geometry.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::graph {

absl::StatusOr<ResizeAttrs> ResizeAttrsOf(const Node& n) {
  ResizeAttrs a;
  const std::string mode = n.AttrString("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return InvalidArgument(n.Describe(), ": expected mode nearest, linear or cubic, got '", mode, "'");
  a.mode = mode == "linear" ? ResizeMode::kLinear : mode == "cubic" ? ResizeMode::kCubic : ResizeMode::kNearest;
  a.cubic_coeff_a = n.AttrFloat("cubic_coeff_a", -0.75f);
  a.exclude_outside = n.AttrInt("exclude_outside", 0) != 0;
  a.antialias = n.AttrInt("antialias", 0) != 0;
  a.coordinates = n.AttrString("coordinate_transformation_mode", "half_pixel");
  const std::vector<std::string> known = {"half_pixel",         "pytorch_half_pixel", "align_corners",
                                          "asymmetric",         "tf_crop_and_resize", "tf_half_pixel_for_nn",
                                          "half_pixel_symmetric"};
  if (std::find(known.begin(), known.end(), a.coordinates) == known.end())
    return InvalidArgument(n.Describe(), ": unknown coordinate_transformation_mode '", a.coordinates, "'");
  a.nearest_mode = n.AttrString("nearest_mode", "round_prefer_floor");
  if (a.nearest_mode != "round_prefer_floor" && a.nearest_mode != "round_prefer_ceil" && a.nearest_mode != "floor" &&
      a.nearest_mode != "ceil")
    return InvalidArgument(n.Describe(), ": unknown nearest_mode '", a.nearest_mode, "'");
  a.extrapolation_value = n.AttrFloat("extrapolation_value", 0.f);
  a.axes = n.AttrInts("axes");
  a.keep_aspect_ratio_policy = n.AttrString("keep_aspect_ratio_policy", "stretch");
  if (a.keep_aspect_ratio_policy != "stretch" && a.keep_aspect_ratio_policy != "not_larger" &&
      a.keep_aspect_ratio_policy != "not_smaller")
    return InvalidArgument(n.Describe(), ": unknown keep_aspect_ratio_policy '", a.keep_aspect_ratio_policy, "'");
  return a;
}

absl::StatusOr<std::vector<ResizeDim>> PlanResize(std::span<const int64_t> in, const ResizeAttrs& a,
                                                  std::span<const float> roi, std::span<const float> scales,
                                                  std::span<const int64_t> sizes) {
  const int r = static_cast<int>(in.size());
  std::vector<int> axes;
  for (int64_t v : a.axes) {
    const int64_t axis = v < 0 ? v + r : v;
    if (axis < 0 || axis >= r || std::count(axes.begin(), axes.end(), static_cast<int>(axis)))
      return InvalidArgument("axes [", absl::StrJoin(a.axes, ","), "] are not distinct dims of a rank-", r, " input");
    axes.push_back(static_cast<int>(axis));
  }
  if (axes.empty())
    for (int d = 0; d < r; ++d) axes.push_back(d);
  const size_t k = axes.size();
  if (scales.empty() == sizes.empty())
    return InvalidArgument("expected exactly one of scales and sizes, got ", scales.size(), " scales and ",
                           sizes.size(), " sizes");
  if (!scales.empty() && scales.size() != k) return InvalidArgument("expected ", k, " scales, got ", scales.size());
  if (!sizes.empty() && sizes.size() != k) return InvalidArgument("expected ", k, " sizes, got ", sizes.size());
  const bool crop = a.coordinates == "tf_crop_and_resize";
  if (crop && roi.size() != 2 * k)
    return InvalidArgument("tf_crop_and_resize needs a roi of ", 2 * k, " values, got ", roi.size());
  std::vector<ResizeDim> dims(static_cast<size_t>(r));
  for (int d = 0; d < r; ++d) {
    if (in[d] < 0) return InvalidArgument("dim ", d, " of the input is ", in[d]);
    dims[d].in = dims[d].out = in[d];
    dims[d].length = static_cast<double>(in[d]);
  }
  // not_larger / not_smaller: one scale for every named dim, the smallest or largest asked for.
  double keep = 0;
  if (!sizes.empty() && a.keep_aspect_ratio_policy != "stretch") {
    const bool larger = a.keep_aspect_ratio_policy == "not_smaller";
    keep = larger ? 0.0 : 1e300;
    for (size_t j = 0; j < k; ++j) {
      const double s = static_cast<double>(sizes[j]) / static_cast<double>(std::max<int64_t>(in[axes[j]], 1));
      keep = larger ? std::max(keep, s) : std::min(keep, s);
    }
  }
  for (size_t j = 0; j < k; ++j) {
    ResizeDim& d = dims[axes[j]];
    if (crop) {
      d.roi_start = roi[j];
      d.roi_end = roi[k + j];
    }
    // Sizes are bounded before they become integers (a scale of 1e30 must not overflow int64).
    constexpr double kMaxSize = static_cast<double>(int64_t{1} << 40);
    double size = 0;
    if (!scales.empty()) {
      if (!(scales[j] > 0.f)) return InvalidArgument("scales must be positive, got ", scales[j], " for dim ", axes[j]);
      d.scale = scales[j];
      const double extent = crop ? d.roi_end - d.roi_start : 1.0;
      size = std::floor(static_cast<double>(d.in) * extent * d.scale);
      if (!(size >= 0)) return InvalidArgument("the roi of dim ", axes[j], " gives ", size, " elements");
    } else {
      size = keep > 0 ? std::round(keep * static_cast<double>(d.in)) : static_cast<double>(sizes[j]);
      if (size < 0) return InvalidArgument("sizes must be >= 0, got ", sizes[j], " for dim ", axes[j]);
    }
    if (size >= kMaxSize) return InvalidArgument("dim ", axes[j], " would resize to ", size, " elements");
    d.out = static_cast<int64_t>(size);
    if (scales.empty()) d.scale = keep > 0 ? keep : d.in > 0 ? static_cast<double>(d.out) / static_cast<double>(d.in) : 1.0;
    d.length = static_cast<double>(d.in) * d.scale;
  }
  return dims;
}

namespace {

// The input coordinate output coordinate o samples.
double Source(const ResizeAttrs& a, const ResizeDim& d, int64_t o) {
  const double x = static_cast<double>(o), in = static_cast<double>(d.in), len = d.length;
  const std::string& m = a.coordinates;
  if (m == "asymmetric") return x / d.scale;
  if (m == "align_corners") return len == 1.0 ? 0.0 : x * (in - 1) / (len - 1);
  if (m == "pytorch_half_pixel") return len > 1.0 ? (x + 0.5) / d.scale - 0.5 : -0.5;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / d.scale;  // Resize-11 only
  if (m == "tf_crop_and_resize")
    return len > 1.0 ? d.roi_start * (in - 1) + x * (d.roi_end - d.roi_start) * (in - 1) / (len - 1)
                     : 0.5 * (d.roi_start + d.roi_end) * (in - 1);
  if (m == "half_pixel_symmetric") {  // centred: the output's rounding split between both ends
    const double adjustment = len > 0 ? static_cast<double>(d.out) / len : 1.0;
    return in / 2 * (1 - adjustment) + (x + 0.5) / d.scale - 0.5;
  }
  return (x + 0.5) / d.scale - 0.5;  // half_pixel
}

int64_t Nearest(const std::string& mode, double x) {
  const double f = std::floor(x);
  if (mode == "floor") return static_cast<int64_t>(f);
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (x - f == 0.5) return static_cast<int64_t>(mode == "round_prefer_ceil" ? f + 1 : f);
  return static_cast<int64_t>(std::round(x));
}

// Keys' cubic kernel with coefficient A at |s|.
double Cubic(double s, double A) {
  s = std::fabs(s);
  if (s <= 1) return ((A + 2) * s - (A + 3)) * s * s + 1;
  if (s < 2) return ((A * s - 5 * A) * s + 8 * A) * s - 4 * A;
  return 0;
}

}  // namespace

ResizeTaps ResizeTapsOf(const ResizeAttrs& a, const ResizeDim& d) {
  ResizeTaps t;
  t.offsets.reserve(static_cast<size_t>(d.out) + 1);
  t.offsets.push_back(0);
  const bool crop = a.coordinates == "tf_crop_and_resize";
  const int64_t last = std::max<int64_t>(d.in - 1, 0);
  // The filter's stretch: 1, or the downsampling scale with antialias.
  const double s = a.antialias ? std::min(d.scale, 1.0) : 1.0;
  std::vector<double> w;
  for (int64_t o = 0; o < d.out; ++o) {
    const double x = Source(a, d, o);
    if (crop && (x < 0 || x > static_cast<double>(last))) {
      t.index.push_back(-1);
      t.weight.push_back(0.f);
    } else if (a.mode == ResizeMode::kNearest) {
      t.index.push_back(std::clamp<int64_t>(Nearest(a.nearest_mode, x), 0, last));
      t.weight.push_back(1.f);
    } else {
      // Taps base + i for i in [start, start + n), ratio = x - base in (0, 1] (an integer x takes
      // base x - 1, as ONNX's reference picks its neighbours).
      const double fl = std::floor(x);
      const double base = x == fl ? fl - 1 : fl, ratio = x - base;
      const double reach = a.mode == ResizeMode::kLinear ? 1.0 : 2.0;
      const int64_t start = static_cast<int64_t>(std::floor(-reach / s)) + 1, n = 2 - 2 * start;
      w.assign(static_cast<size_t>(n), 0.0);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double u = (static_cast<double>(start + i) - ratio) * s;
        const double v = a.mode == ResizeMode::kLinear ? std::max(0.0, 1 - std::fabs(u)) : Cubic(u, a.cubic_coeff_a);
        const int64_t at = static_cast<int64_t>(base) + start + i;
        w[static_cast<size_t>(i)] = a.exclude_outside && (at < 0 || at > last) ? 0.0 : v;
        sum += w[static_cast<size_t>(i)];
      }
      // Antialias and exclude_outside normalise the weights; plain linear and cubic sum to 1.
      const double norm = (a.antialias || a.exclude_outside) && sum != 0 ? sum : 1.0;
      for (int64_t i = 0; i < n; ++i) {
        if (w[static_cast<size_t>(i)] == 0) continue;
        t.index.push_back(std::clamp<int64_t>(static_cast<int64_t>(base) + start + i, 0, last));
        t.weight.push_back(static_cast<float>(w[static_cast<size_t>(i)] / norm));
      }
      if (static_cast<int64_t>(t.index.size()) == t.offsets.back()) {  // every weight 0: one tap of 0
        t.index.push_back(std::clamp<int64_t>(static_cast<int64_t>(base), 0, last));
        t.weight.push_back(0.f);
      }
    }
    t.offsets.push_back(static_cast<int64_t>(t.index.size()));
  }
  return t;
}

bool ResizeIsIdentity(const ResizeAttrs& a, const ResizeDim& d) {
  if (d.in != d.out) return false;
  const ResizeTaps t = ResizeTapsOf(a, d);
  for (int64_t o = 0; o < d.out; ++o) {
    const int64_t e = t.offsets[static_cast<size_t>(o)];
    if (t.offsets[static_cast<size_t>(o) + 1] != e + 1 || t.index[static_cast<size_t>(e)] != o ||
        t.weight[static_cast<size_t>(e)] != 1.f)
      return false;
  }
  return true;
}

std::vector<ResizePass> ResizePasses(const ResizeAttrs& a, const std::vector<ResizeDim>& dims) {
  std::vector<ResizePass> passes;
  std::vector<int64_t> cur;
  for (const ResizeDim& d : dims) cur.push_back(d.in);
  for (size_t d = 0; d < dims.size(); ++d) {
    if (ResizeIsIdentity(a, dims[d])) continue;
    ResizePass p;
    for (size_t i = 0; i < d; ++i) p.outer *= cur[i];
    for (size_t i = d + 1; i < cur.size(); ++i) p.inner *= cur[i];
    p.in = dims[d].in;
    p.out = dims[d].out;
    p.taps = ResizeTapsOf(a, dims[d]);
    cur[d] = dims[d].out;
    passes.push_back(std::move(p));
  }
  return passes;
}

ResizeReaders ResizeReadersOf(const ResizePass& p) {
  std::vector<std::vector<std::pair<int64_t, float>>> by_input(static_cast<size_t>(p.in));
  for (int64_t o = 0; o < p.out; ++o)
    for (int64_t e = p.taps.offsets[static_cast<size_t>(o)]; e < p.taps.offsets[static_cast<size_t>(o) + 1]; ++e)
      if (const int64_t i = p.taps.index[static_cast<size_t>(e)]; i >= 0)
        by_input[static_cast<size_t>(i)].emplace_back(o, p.taps.weight[static_cast<size_t>(e)]);
  ResizeReaders r;
  r.offsets.push_back(0);
  for (const auto& list : by_input) {
    for (const auto& [o, w] : list) {
      r.outputs.push_back(o);
      r.weights.push_back(w);
    }
    r.offsets.push_back(static_cast<int64_t>(r.outputs.size()));
  }
  return r;
}

}  // namespace cleave::graph
