// The geometry of ONNX Resize (graph/): each dim's output size and the input coordinate each
// output coordinate samples, from the node's attributes and its roi, scales or sizes. Shape
// inference and the kernels (Resize and its gradient ai.cleave.ResizeGrad) read it from here,
// so that the output a graph declares is the one its kernels write.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"

namespace cleave::graph {

enum class ResizeMode { kNearest, kLinear, kCubic };

struct ResizeAttrs {
  ResizeMode mode = ResizeMode::kNearest;
  std::string coordinates = "half_pixel";        // coordinate_transformation_mode
  std::string nearest_mode = "round_prefer_floor";
  float extrapolation_value = 0.f;               // tf_crop_and_resize's outside value
  std::vector<int64_t> axes;                     // version 18: the dims scales / sizes name
  std::string keep_aspect_ratio_policy = "stretch";
  float cubic_coeff_a = -0.75f;                  // Keys' a
  bool exclude_outside = false;                  // taps outside the input dropped, the rest renormalised
  bool antialias = false;                        // downsampling stretches the filter by 1 / scale
};

// The attributes of a Resize (version 11 onwards) or ai.cleave.ResizeGrad node; InvalidArgument
// naming the node for a value ONNX does not define.
absl::StatusOr<ResizeAttrs> ResizeAttrsOf(const Node& n);

// One dim: its input and output sizes, the scale its coordinates use, the resized length they
// take (in * scale: not rounded to the output's size where scales were given, as ONNX's
// align_corners, pytorch_half_pixel and tf_crop_and_resize formulas read it) and
// (tf_crop_and_resize) the roi's start and end as fractions of the input.
struct ResizeDim {
  int64_t in = 1, out = 1;
  double scale = 1.0, length = 1.0;
  double roi_start = 0.0, roi_end = 1.0;
};

// The dims of a Resize of an input of dims `in`, from roi (2 x the dims named, or empty), scales
// or sizes (one of them non-empty, over `axes` or every dim): out = floor(in * scale) (times the
// roi's extent under tf_crop_and_resize) for scales, or the sizes (scaled to keep the aspect
// ratio under not_larger / not_smaller). InvalidArgument saying what disagrees.
absl::StatusOr<std::vector<ResizeDim>> PlanResize(std::span<const int64_t> in, const ResizeAttrs& a,
                                                  std::span<const float> roi, std::span<const float> scales,
                                                  std::span<const int64_t> sizes);

// Along one dim, each output coordinate's taps, as ONNX's reference samples: output o blends the
// input indices index[e] with weights weight[e], e in [offsets[o], offsets[o + 1]). An
// extrapolated coordinate of tf_crop_and_resize has one entry of index -1: it takes
// extrapolation_value. Nearest reads one index (clamped into the input); linear the two around
// the source coordinate, cubic the four (Keys' kernel with cubic_coeff_a); with antialias a
// downsampling filter is stretched by 1 / scale over as many taps as it covers, its weights
// normalised to sum 1. An index outside the input reads its edge, or with exclude_outside is
// dropped and the other weights renormalised. Taps of weight 0 are left out; every output has at
// least one.
struct ResizeTaps {
  std::vector<int64_t> offsets;  // [out + 1]
  std::vector<int64_t> index;    // [entries]
  std::vector<float> weight;     // [entries]
};
ResizeTaps ResizeTapsOf(const ResizeAttrs& a, const ResizeDim& d);

// Whether the dim maps every output coordinate to the same input coordinate (no resampling).
bool ResizeIsIdentity(const ResizeAttrs& a, const ResizeDim& d);

// Every mode is separable: a Resize is a resampling along each dim that is not the identity,
// in dim order, each viewing the tensor as [outer, in, inner] -> [outer, out, inner].
struct ResizePass {
  int64_t outer = 1, in = 1, out = 1, inner = 1;
  ResizeTaps taps;
};
std::vector<ResizePass> ResizePasses(const ResizeAttrs& a, const std::vector<ResizeDim>& dims);

// A pass's adjoint as gathers: input index i reads the output indices outputs[offsets[i] ..
// offsets[i + 1]) with their weights, in output order (extrapolated outputs read nothing).
struct ResizeReaders {
  std::vector<int64_t> offsets, outputs;  // [in + 1], [entries]
  std::vector<float> weights;             // [entries]
};
ResizeReaders ResizeReadersOf(const ResizePass& p);

}  // namespace cleave::graph
