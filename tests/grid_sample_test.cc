// GridSample and AffineGrid (tests/) against a reference written here from the ONNX definitions
// in double: coordinates denormalised per align_corners, rounded half to even in nearest mode,
// an outside coordinate clamped (border) or mirrored step by step about the borders until
// inside (reflection), then the taps of each axis combined as a tensor product, an index
// outside the axis reading 0, the nearest edge, or its mirror. The cases cover what the ONNX
// backend suite does not: 1-D and 3-D inputs in every mode (cubic included), every padding with
// coordinates well outside [-1, 1], and several images and channels. gradient_check_test.cc
// checks the gradients by finite differences.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

struct Sampling {
  std::string mode, padding;
  bool align = false;
};

// x mirrored about lo and hi, one reflection at a time, until inside.
double Mirror(double x, double lo, double hi) {
  if (hi <= lo) return lo;
  while (x < lo || x > hi) x = x < lo ? 2 * lo - x : 2 * hi - x;
  return x;
}

// The index an integer tap i of an axis of `size` reads, or -1 for 0.
int64_t TapIndex(int64_t i, int64_t size, const Sampling& s) {
  if (i >= 0 && i < size) return i;
  if (s.padding == "zeros") return -1;
  if (s.padding == "border") return i < 0 ? 0 : size - 1;
  const double lo = s.align ? 0.0 : -0.5, hi = s.align ? size - 1.0 : size - 0.5;
  return static_cast<int64_t>(Mirror(static_cast<double>(i), lo, hi));
}

double Keys(double s) {
  const double a = -0.75;
  s = std::fabs(s);
  if (s <= 1) return (a + 2) * s * s * s - (a + 3) * s * s + 1;
  if (s < 2) return a * s * s * s - 5 * a * s * s + 8 * a * s - 4 * a;
  return 0;
}

// Y [N, C, out...] of X [N, C, in...] at grid [N, out..., r].
std::vector<double> Reference(const std::vector<double>& x, const I64& xd, const std::vector<double>& grid,
                              const I64& gd, const Sampling& s) {
  const int r = static_cast<int>(xd.size()) - 2;
  int64_t plane = 1, points = 1;
  for (int d = 0; d < r; ++d) {
    plane *= xd[d + 2];
    points *= gd[d + 1];
  }
  std::vector<double> y(static_cast<size_t>(xd[0] * xd[1] * points));
  for (int64_t b = 0; b < xd[0]; ++b) {
    for (int64_t p = 0; p < points; ++p) {
      // Per axis (X's order): the taps' indices and weights.
      std::vector<std::vector<std::pair<int64_t, double>>> taps(static_cast<size_t>(r));
      for (int d = 0; d < r; ++d) {
        const double g = grid[static_cast<size_t>((b * points + p) * r + (r - 1 - d))];
        const double size = static_cast<double>(xd[d + 2]);
        double c = s.align ? (g + 1) / 2 * (size - 1) : ((g + 1) * size - 1) / 2;
        if (s.mode == "nearest") c = std::nearbyint(c);
        const double lo = s.align ? 0 : -0.5, hi = s.align ? size - 1 : size - 0.5;
        if ((c < lo || c > hi) && s.padding == "border") c = std::min(std::max(c, 0.0), size - 1);
        if ((c < lo || c > hi) && s.padding == "reflection") c = Mirror(c, lo, hi);
        const int64_t f = static_cast<int64_t>(std::floor(c));
        auto& t = taps[static_cast<size_t>(d)];
        if (s.mode == "nearest") t.push_back({TapIndex(static_cast<int64_t>(c), xd[d + 2], s), 1.0});
        else if (s.mode == "linear") for (int64_t k = f; k <= f + 1; ++k) t.push_back({TapIndex(k, xd[d + 2], s), 1 - std::fabs(c - k)});
        else for (int64_t k = f - 1; k <= f + 2; ++k) t.push_back({TapIndex(k, xd[d + 2], s), Keys(c - k)});
      }
      for (int64_t ch = 0; ch < xd[1]; ++ch) {
        const double* xc = x.data() + (b * xd[1] + ch) * plane;
        double acc = 0;
        std::vector<size_t> j(static_cast<size_t>(r), 0);
        for (bool more = true; more;) {
          double w = 1;
          int64_t at = 0;
          bool inside = true;
          for (int d = 0; d < r; ++d) {
            const auto& [index, weight] = taps[static_cast<size_t>(d)][j[static_cast<size_t>(d)]];
            inside = inside && index >= 0;
            at = at * xd[d + 2] + index;
            w *= weight;
          }
          if (inside) acc += w * xc[at];
          more = false;
          for (int d = r - 1; d >= 0 && !more; --d) {
            size_t& k = j[static_cast<size_t>(d)];
            more = ++k < taps[static_cast<size_t>(d)].size();
            if (!more) k = 0;
          }
        }
        y[static_cast<size_t>((b * xd[1] + ch) * points + p)] = acc;
      }
    }
  }
  return y;
}

void Check(const Sampling& s, const I64& xd, const I64& out, int opset = 20) {
  SCOPED_TRACE(::testing::Message() << s.mode << " " << s.padding << " align " << s.align << " X " << ::testing::PrintToString(xd));
  const int r = static_cast<int>(xd.size()) - 2;
  I64 gd = {xd[0]};
  for (int64_t o : out) gd.push_back(o);
  gd.push_back(r);
  std::vector<double> grid = Values(Numel(gd), 7);
  for (double& g : grid) g *= 1.7;  // well past [-1, 1] on both sides
  const std::vector<double> x = Values(Numel(xd), 3);
  I64 yd = {xd[0], xd[1]};
  for (int64_t o : out) yd.push_back(o);
  std::string mode = s.mode;
  if (opset < 20 && mode != "nearest") mode = mode == "linear" ? "bilinear" : "bicubic";
  OpTester("GridSample", opset)
      .Attr("mode", mode)
      .Attr("padding_mode", s.padding)
      .Attr("align_corners", int64_t{s.align})
      .Input<float>("X", xd, Cast<float>(x))
      .Input<float>("grid", gd, Cast<float>(grid))
      .Output<float>("Y", yd, Cast<float>(Reference(x, xd, grid, gd, s)))
      .Run();
}

TEST(GridSample, EveryModePaddingAndRankMatchesTheDefinition) {
  for (const char* mode : {"linear", "nearest", "cubic"}) {
    for (const char* padding : {"zeros", "border", "reflection"}) {
      for (bool align : {false, true}) {
        const Sampling s{mode, padding, align};
        Check(s, {2, 3, 5}, {7});
        Check(s, {2, 2, 4, 3}, {3, 5});
        Check(s, {1, 2, 3, 4, 2}, {2, 3, 2});
      }
    }
  }
}

TEST(GridSample, Version16SpellsTheModesBilinearAndBicubic) {
  Check({"linear", "zeros", false}, {1, 2, 4, 4}, {3, 3}, 16);
  Check({"cubic", "reflection", true}, {1, 1, 4, 5}, {2, 3}, 16);
}

TEST(GridSample, AxesOfOneElement) {
  // align_corners maps every coordinate of a one-element axis to 0, whose borders coincide.
  for (const char* padding : {"zeros", "border", "reflection"})
    for (bool align : {false, true}) Check({"linear", padding, align}, {1, 2, 1, 3}, {2, 2});
}

TEST(GridSample, BadInputsNameTheNodeAndWhatWasExpected) {
  OpTester("GridSample", 20)
      .Input<float>("X", {1, 1, 3, 3}, std::vector<float>(9, 1.f))
      .Input<float>("grid", {1, 2, 2, 3}, std::vector<float>(12, 0.f))
      .Output<float>("Y", {1, 1, 2, 2}, std::vector<float>(4, 0.f))
      .ExpectFailure("expected its last dim 2 (a coordinate per spatial axis of X [1,1,3,3])")
      .Run();
  OpTester("GridSample", 20)
      .Input<float>("X", {2, 1, 3, 3}, std::vector<float>(18, 1.f))
      .Input<float>("grid", {3, 2, 2, 2}, std::vector<float>(24, 0.f))
      .Output<float>("Y", {2, 1, 2, 2}, std::vector<float>(8, 0.f))
      .ExpectFailure("differ in the batch")
      .Run();
  OpTester("GridSample", 20)
      .Attr("mode", std::string("area"))
      .Input<float>("X", {1, 1, 3, 3}, std::vector<float>(9, 1.f))
      .Input<float>("grid", {1, 2, 2, 2}, std::vector<float>(8, 0.f))
      .Output<float>("Y", {1, 1, 2, 2}, std::vector<float>(4, 0.f))
      .ExpectFailure("mode \"area\"; expected linear, nearest or cubic")
      .Run();
}

// AffineGrid's base grid per the ONNX function: -1 + 2k / (S - 1) with align_corners (-1 for an
// axis of one), else (2k + 1) / S - 1; then theta times (x, y[, z], 1).
TEST(AffineGrid, MatchesTheDefinitionIncludingAxesOfOne) {
  for (bool align : {false, true}) {
    for (const I64& size : {I64{2, 3, 1, 4}, I64{1, 1, 2, 1, 3}}) {
      SCOPED_TRACE(::testing::Message() << "align " << align << " size " << ::testing::PrintToString(size));
      const int r = static_cast<int>(size.size()) - 2;
      const I64 td = {size[0], r, r + 1};
      const std::vector<double> theta = Values(Numel(td), 5);
      I64 gd = {size[0]};
      int64_t points = 1;
      for (int d = 0; d < r; ++d) {
        gd.push_back(size[d + 2]);
        points *= size[d + 2];
      }
      gd.push_back(r);
      auto coord = [&](int64_t k, int64_t s) {
        if (align) return s == 1 ? -1.0 : -1.0 + 2.0 * k / (s - 1);
        return (2.0 * k + 1) / s - 1;
      };
      std::vector<double> want;
      for (int64_t b = 0; b < size[0]; ++b) {
        for (int64_t p = 0; p < points; ++p) {
          std::vector<double> homo(static_cast<size_t>(r) + 1, 1.0);  // innermost axis first, then 1
          int64_t rest = p;
          for (int d = r - 1; d >= 0; --d) {
            homo[static_cast<size_t>(r - 1 - d)] = coord(rest % size[d + 2], size[d + 2]);
            rest /= size[d + 2];
          }
          for (int i = 0; i < r; ++i) {
            double v = 0;
            for (int j = 0; j <= r; ++j) v += theta[static_cast<size_t>((b * r + i) * (r + 1) + j)] * homo[j];
            want.push_back(v);
          }
        }
      }
      OpTester("AffineGrid", 20)
          .Attr("align_corners", int64_t{align})
          .Input<float>("theta", td, Cast<float>(theta))
          .Input<int64_t>("size", {static_cast<int64_t>(size.size())}, size)
          .Output<float>("grid", gd, Cast<float>(want))
          .Run();
    }
  }
}

TEST(AffineGrid, ThetaAndSizeThatDisagreeAreRefused) {
  OpTester("AffineGrid", 20)
      .Input<float>("theta", {1, 2, 3}, std::vector<float>(6, 0.f))
      .Input<int64_t>("size", {5}, {1, 1, 2, 2, 2})
      .Output<float>("grid", {1, 2, 2, 2, 3}, std::vector<float>(24, 0.f))
      .ExpectFailure("expected theta [N, 2, 3] with size [4], or [N, 3, 4] with size [5]")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
