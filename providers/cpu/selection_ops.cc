// NonZero, Compress, NonMaxSuppression and Unique on the CPU (providers/cpu/): ops whose output
// size depends on the data. NonZero and Compress make one pass to count and one to write, in order;
// the CUDA provider leaves them all to this one (the count would need the device to wait).
#include <algorithm>
#include <cmath>
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

// One box's corners, lower first, whatever order the input gives them in.
struct Box {
  double y0, x0, y1, x1;
};

// NonMaxSuppression(boxes [batch, boxes, 4], scores [batch, classes, boxes][,
// max_output_boxes_per_class][, iou_threshold][, score_threshold]) {center_point_box} ->
// selected [n, 3] (batch, class, box): per batch and class, the boxes by descending score (the
// lower index first on a tie), above score_threshold when given, each kept unless its IoU with
// a box kept before exceeds iou_threshold, at most max_output_boxes_per_class (0 when absent).
class NonMaxSuppressionKernel : public OpKernel {
 public:
  NonMaxSuppressionKernel(const graph::Node& n, int) : centre_(n.AttrInt("center_point_box", 0) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& boxes = *ctx.input(0);
    const TensorView& scores = *ctx.input(1);
    if (boxes.rank != 3 || boxes.dims[2] != 4)
      return InvalidArgument("expected boxes [batch, boxes, 4], got ", DimsToString(boxes.dim_span()));
    if (scores.rank != 3 || scores.dims[0] != boxes.dims[0] || scores.dims[2] != boxes.dims[1])
      return InvalidArgument("expected scores [", boxes.dims[0], ", classes, ", boxes.dims[1], "] for boxes ",
                             DimsToString(boxes.dim_span()), ", got ", DimsToString(scores.dim_span()));
    auto input = [&](int i) -> const TensorView* {
      const TensorView* t = ctx.num_inputs() > i ? ctx.input(i) : nullptr;
      return t && t->numel() > 0 ? t : nullptr;
    };
    const int64_t most = input(2) ? std::max<int64_t>(IntAt(*input(2), 0), 0) : 0;
    const double iou = input(3) ? ElementAsDouble(*input(3), 0) : 0.0;
    const bool thresholded = input(4) != nullptr;
    const double floor = thresholded ? ElementAsDouble(*input(4), 0) : 0.0;
    const int64_t batches = boxes.dims[0], count = boxes.dims[1], classes = scores.dims[1];
    std::vector<int64_t> selected;  // (batch, class, box) triples
    std::vector<Box> corner(static_cast<size_t>(count));
    std::vector<int64_t> order, kept;
    for (int64_t b = 0; b < batches; ++b) {
      for (int64_t k = 0; k < count; ++k) {
        const int64_t at = (b * count + k) * 4;
        const double v[4] = {ElementAsDouble(boxes, at), ElementAsDouble(boxes, at + 1), ElementAsDouble(boxes, at + 2), ElementAsDouble(boxes, at + 3)};
        Box& c = corner[static_cast<size_t>(k)];
        if (centre_) {  // [x_centre, y_centre, width, height]
          c = {v[1] - v[3] / 2, v[0] - v[2] / 2, v[1] + v[3] / 2, v[0] + v[2] / 2};
        } else {  // [y1, x1, y2, x2], either diagonal
          c = {std::min(v[0], v[2]), std::min(v[1], v[3]), std::max(v[0], v[2]), std::max(v[1], v[3])};
        }
      }
      for (int64_t cls = 0; cls < classes; ++cls) {
        const int64_t base = (b * classes + cls) * count;
        order.clear();
        for (int64_t k = 0; k < count; ++k) {
          const double v = ElementAsDouble(scores, base + k);
          if (!std::isnan(v) && (!thresholded || v > floor)) order.push_back(k);  // a NaN score never ranks
        }
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t l, int64_t r) { return ElementAsDouble(scores, base + l) > ElementAsDouble(scores, base + r); });
        kept.clear();
        for (int64_t k : order) {
          if (static_cast<int64_t>(kept.size()) >= most) break;
          bool keep = true;
          for (int64_t j : kept)
            if (Overlap(corner[static_cast<size_t>(k)], corner[static_cast<size_t>(j)]) > iou) {
              keep = false;
              break;
            }
          if (!keep) continue;
          kept.push_back(k);
          selected.insert(selected.end(), {b, cls, k});
        }
      }
    }
    TensorView* y = ctx.Output(0, {static_cast<int64_t>(selected.size() / 3), 3});
    if (y && !selected.empty()) std::memcpy(y->data, selected.data(), selected.size() * sizeof(int64_t));
    return absl::OkStatus();
  }

 private:
  // Intersection over union; 0 for boxes that do not overlap or have no area.
  static double Overlap(const Box& a, const Box& b) {
    const double w = std::min(a.x1, b.x1) - std::max(a.x0, b.x0), h = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
    if (w <= 0 || h <= 0) return 0;
    const double inter = w * h, area_a = (a.x1 - a.x0) * (a.y1 - a.y0), area_b = (b.x1 - b.x0) * (b.y1 - b.y0);
    const double uni = area_a + area_b - inter;
    return area_a <= 0 || area_b <= 0 || uni <= 0 ? 0 : inter / uni;
  }
  bool centre_;
};

// -1, 0 or 1 as element i of x is below, equal to or above element j (NaN above every number).
int CompareElements(const TensorView& x, int64_t i, int64_t j) {
  if (x.dtype == DataType::kInt64) {
    const int64_t a = x.as<int64_t>()[i], b = x.as<int64_t>()[j];
    return a < b ? -1 : a > b;
  }
  if (x.dtype == DataType::kUInt64) {
    const uint64_t a = x.as<uint64_t>()[i], b = x.as<uint64_t>()[j];
    return a < b ? -1 : a > b;
  }
  const double a = ElementAsDouble(x, i), b = ElementAsDouble(x, j);
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) - std::isnan(b);  // NaN last, NaNs alike
  return a < b ? -1 : a > b;
}

// Unique(X) {axis, sorted} -> Y, indices, inverse_indices, counts: the distinct slices of X
// along `axis` (its elements, flattened, without one), in ascending order (lexicographic for
// slices) or, with sorted = 0, in the order they first occur; each one's first index in X, each
// slice's place in Y, and each one's count.
class UniqueKernel : public OpKernel {
 public:
  UniqueKernel(const graph::Node& n, int)
      : has_axis_(n.HasAttr("axis")), axis_(n.AttrInt("axis", 0)), sorted_(n.AttrInt("sorted", 1) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    int64_t outer = 1, len = x.numel(), inner = 1;
    int axis = 0;
    if (has_axis_) {
      if (axis_ < -x.rank || axis_ >= x.rank)
        return InvalidArgument("axis ", axis_, " is out of range for X ", DimsToString(x.dim_span()));
      axis = static_cast<int>(axis_ < 0 ? axis_ + x.rank : axis_);
      len = x.dims[axis];
      for (int d = 0; d < axis; ++d) outer *= x.dims[d];
      for (int d = axis + 1; d < x.rank; ++d) inner *= x.dims[d];
    }
    // Slice s holds the elements (o * len + s) * inner + e.
    auto compare = [&](int64_t a, int64_t b) {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t e = 0; e < inner; ++e)
          if (const int c = CompareElements(x, (o * len + a) * inner + e, (o * len + b) * inner + e)) return c;
      return 0;
    };
    std::vector<int64_t> order(static_cast<size_t>(len));
    for (int64_t s = 0; s < len; ++s) order[static_cast<size_t>(s)] = s;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return compare(a, b) < 0; });
    // Groups of equal slices, in ascending order: each one's first slice and count.
    std::vector<int64_t> first, count, group(static_cast<size_t>(len));
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || compare(order[k - 1], order[k]) != 0) {
        first.push_back(order[k]);
        count.push_back(0);
      }
      group[static_cast<size_t>(order[k])] = static_cast<int64_t>(first.size()) - 1;
      ++count.back();
    }
    const int64_t unique = static_cast<int64_t>(first.size());
    std::vector<int64_t> rank(static_cast<size_t>(unique));  // group -> its place in Y
    std::vector<int64_t> by_place(static_cast<size_t>(unique));
    for (int64_t g = 0; g < unique; ++g) by_place[static_cast<size_t>(g)] = g;
    if (!sorted_)
      std::sort(by_place.begin(), by_place.end(),
                [&](int64_t a, int64_t b) { return first[static_cast<size_t>(a)] < first[static_cast<size_t>(b)]; });
    for (int64_t p = 0; p < unique; ++p) rank[static_cast<size_t>(by_place[static_cast<size_t>(p)])] = p;
    std::vector<int64_t> ydims = {unique};
    if (has_axis_) {
      ydims.assign(x.dims, x.dims + x.rank);
      ydims[static_cast<size_t>(axis)] = unique;
    }
    const size_t es = ElementSize(x.dtype);
    if (TensorView* y = ctx.Output(0, ydims)) {
      const char* src = static_cast<const char*>(x.data);
      char* dst = static_cast<char*>(y->data);
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t p = 0; p < unique; ++p)
          std::memcpy(dst + (o * unique + p) * inner * es,
                      src + (o * len + first[static_cast<size_t>(by_place[static_cast<size_t>(p)])]) * inner * es,
                      static_cast<size_t>(inner) * es);
    }
    if (TensorView* t = ctx.num_outputs() > 1 ? ctx.Output(1, {unique}) : nullptr)
      for (int64_t p = 0; p < unique; ++p) t->as<int64_t>()[p] = first[static_cast<size_t>(by_place[static_cast<size_t>(p)])];
    if (TensorView* t = ctx.num_outputs() > 2 ? ctx.Output(2, {len}) : nullptr)
      for (int64_t s = 0; s < len; ++s) t->as<int64_t>()[s] = rank[static_cast<size_t>(group[static_cast<size_t>(s)])];
    if (TensorView* t = ctx.num_outputs() > 3 ? ctx.Output(3, {unique}) : nullptr)
      for (int64_t p = 0; p < unique; ++p) t->as<int64_t>()[p] = count[static_cast<size_t>(by_place[static_cast<size_t>(p)])];
    return absl::OkStatus();
  }

 private:
  bool has_axis_;
  int64_t axis_;
  bool sorted_;
};

}  // namespace

void RegisterSelectionKernels(KernelRegistry& r) {
  r.Register({"", "Unique", 11, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeFactory<UniqueKernel>()});
  r.Register({"", "NonMaxSuppression", 10, 1 << 30,
              AllOf({InputTypeIn(0, {DataType::kFloat32, DataType::kFloat64}),
                     InputTypeIn(1, {DataType::kFloat32, DataType::kFloat64})}),
              MakeFactory<NonMaxSuppressionKernel>()});
  r.Register({"", "NonZero", 9, 1 << 30, InputTypeIn(0, FixedSizeTypes()), MakeFactory<NonZeroKernel>()});
  r.Register({"", "Compress", 9, 1 << 30,
              AllOf({InputTypeIn(0, FixedSizeTypes()), InputTypeIn(1, {DataType::kBool})}),
              MakeFactory<CompressKernel>()});
}

}  // namespace cleave::providers
