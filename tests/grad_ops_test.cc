// Op tests for the ai.cleave gradient ops (tests/): GatherGrad, SliceGrad and
// SoftmaxCrossEntropyLossGrad on the CPU provider, with expected values worked out by hand in
// the comments next to each case.
#include <cmath>

#include "gtest/gtest.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

constexpr const char* kDomain = "ai.cleave";

OpTester Op(const char* name) { return OpTester(name, 1, kDomain); }

TEST(GradOps, GatherGradAxis0RepeatedAndNegativeIndices) {
  // indices 0, -1 (= 2), 0: row 0 gets dY rows 0 and 2, row 2 gets dY row 1, row 1 nothing.
  Op("GatherGrad").Input<int64_t>("shape", {2}, {3, 2}).Input<int64_t>("indices", {3}, {0, -1, 0})
      .Input<float>("dY", {3, 2}, {1, 2, 3, 4, 5, 6})
      .Output<float>("dX", {3, 2}, {6, 8, 0, 0, 3, 4}).Run();
}

TEST(GradOps, GatherGradAxis1Int32Float64) {
  // Both dY columns land on column 2: row 0 = 1 + 2, row 1 = 3 + 4.
  Op("GatherGrad").Attr("axis", int64_t{-1}).Input<int64_t>("shape", {2}, {2, 3})
      .Input<int32_t>("indices", {2}, {2, 2}).Input<double>("dY", {2, 2}, {1, 2, 3, 4})
      .Output<double>("dX", {2, 3}, {0, 0, 3, 0, 0, 7}).Run();
}

TEST(GradOps, GatherGradMatrixIndices) {
  // indices [[1, 3], [1, 0]]: dX[1] = 1 + 3, dX[3] = 2, dX[0] = 4.
  Op("GatherGrad").Input<int64_t>("shape", {1}, {4}).Input<int64_t>("indices", {2, 2}, {1, 3, 1, 0})
      .Input<float>("dY", {2, 2}, {1, 2, 3, 4})
      .Output<float>("dX", {4}, {4, 4, 0, 2}).Run();
}

TEST(GradOps, GatherGradErrors) {
  Op("GatherGrad").Input<int64_t>("shape", {1}, {3}).Input<int64_t>("indices", {1}, {3})
      .Input<float>("dY", {1}, {1}).Output<float>("dX", {3}, {0, 0, 0})
      .ExpectFailure("out of range").Run();
  Op("GatherGrad").Input<int64_t>("shape", {2}, {3, 2}).Input<int64_t>("indices", {2}, {0, 1})
      .Input<float>("dY", {3, 2}, {1, 2, 3, 4, 5, 6}).Output<float>("dX", {3, 2}, {0, 0, 0, 0, 0, 0})
      .ExpectFailure("does not match").Run();
}

TEST(GradOps, SliceGradStep2) {
  // Slice [1:4:2] of 5 reads positions 1 and 3.
  Op("SliceGrad").Input<float>("dY", {2}, {1, 2}).Input<int64_t>("shape", {1}, {5})
      .Input<int64_t>("starts", {1}, {1}).Input<int64_t>("ends", {1}, {4})
      .Input<int64_t>("axes", {1}, {0}).Input<int64_t>("steps", {1}, {2})
      .Output<float>("dX", {5}, {0, 1, 0, 2, 0}).Run();
}

TEST(GradOps, SliceGradNegativeStep) {
  // Axis 1 of 4 from -1 (= 3) down to 0 exclusive by -2 reads columns 3 and 1.
  Op("SliceGrad").Input<double>("dY", {2, 2}, {1, 2, 3, 4}).Input<int64_t>("shape", {2}, {2, 4})
      .Input<int64_t>("starts", {1}, {-1}).Input<int64_t>("ends", {1}, {0})
      .Input<int64_t>("axes", {1}, {-1}).Input<int64_t>("steps", {1}, {-2})
      .Output<double>("dX", {2, 4}, {0, 2, 0, 1, 0, 4, 0, 3}).Run();
}

TEST(GradOps, SliceGradOmittedAxesClampsEnds) {
  // starts (1, 0), ends (100 -> 3, 1): rows 1..2 of column 0.
  Op("SliceGrad").Input<float>("dY", {2, 1}, {5, 6}).Input<int64_t>("shape", {2}, {3, 2})
      .Input<int32_t>("starts", {2}, {1, 0}).Input<int32_t>("ends", {2}, {100, 1})
      .Output<float>("dX", {3, 2}, {0, 0, 5, 0, 6, 0}).Run();
}

TEST(GradOps, SliceGradShapeMismatch) {
  Op("SliceGrad").Input<float>("dY", {3}, {1, 2, 3}).Input<int64_t>("shape", {1}, {5})
      .Input<int64_t>("starts", {1}, {0}).Input<int64_t>("ends", {1}, {2})
      .Output<float>("dX", {5}, {0, 0, 0, 0, 0}).ExpectFailure("does not match the slice").Run();
}

// Two rows of two classes with softmax (0.25, 0.75) and (0.5, 0.5); labels 1 and 0, so
// softmax - onehot is (0.25, -0.25) and (-0.5, 0.5).
std::vector<double> LogProbs() { return {std::log(0.25), std::log(0.75), std::log(0.5), std::log(0.5)}; }

TEST(GradOps, SceGradMean) {  // divided by N = 2
  Op("SoftmaxCrossEntropyLossGrad").Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {1, 0})
      .Output<double>("d", {2, 2}, {0.125, -0.125, -0.25, 0.25}).Run();
}

TEST(GradOps, SceGradMeanWeighted) {
  // w = (2, 1): row 0 has weight w[1] = 1, row 1 w[0] = 2, W = 3; dY = 3 cancels W.
  Op("SoftmaxCrossEntropyLossGrad").Input<double>("dY", {}, {3}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int32_t>("label", {2}, {1, 0}).Input<double>("weight", {2}, {2, 1})
      .Output<double>("d", {2, 2}, {0.25, -0.25, -1, 1}).Run();
}

TEST(GradOps, SceGradNonePerPosition) {  // dY per row: 2 and -1
  Op("SoftmaxCrossEntropyLossGrad").Attr("reduction", std::string("none"))
      .Input<double>("dY", {2}, {2, -1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {1, 0})
      .Output<double>("d", {2, 2}, {0.5, -0.5, 0.5, -0.5}).Run();
}

TEST(GradOps, SceGradIgnoreIndex) {  // row 0 ignored: 0; the mean divides by 1 row
  Op("SoftmaxCrossEntropyLossGrad").Attr("ignore_index", int64_t{1})
      .Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {1, 0})
      .Output<double>("d", {2, 2}, {0, 0, -0.5, 0.5}).Run();
}

TEST(GradOps, SceGradSumWithTrailingDims) {
  // [N=1, C=2, D=2]: position 0 has softmax (0.25, 0.75) and label 0, position 1 has
  // (0.5, 0.5) and label 1. Layout [c][d]: (0.25 - 1, 0.5, 0.75, 0.5 - 1).
  Op("SoftmaxCrossEntropyLossGrad").Attr("reduction", std::string("sum"))
      .Input<float>("dY", {}, {1})
      .Input<float>("log_prob", {1, 2, 2},
                    {std::log(0.25f), std::log(0.5f), std::log(0.75f), std::log(0.5f)})
      .Input<int64_t>("label", {1, 2}, {0, 1})
      .Output<float>("d", {1, 2, 2}, {-0.75f, 0.5f, 0.75f, -0.5f}).Run();
}

TEST(GradOps, SceGradLabelOutOfRange) {
  Op("SoftmaxCrossEntropyLossGrad").Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {2, 0}).Output<double>("d", {2, 2}, {0, 0, 0, 0})
      .ExpectFailure("outside [0, 2)").Run();
}

}  // namespace
}  // namespace cleave::testing
