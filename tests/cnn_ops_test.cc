// The convolutional networks' ops besides Conv on the CPU (tests/): MaxPool, AveragePool and the
// global pools (values worked by hand, PyTorch's ceil_mode divisor, MaxPool's Indices in both
// storage orders, NaN) and BatchNormalization in both modes, and their errors. The ONNX backend
// suites cover the rest of the forward; gradient_check_test.cc the gradients.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

std::vector<float> Iota(int n, float from = 1.f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + static_cast<float>(i);
  return v;
}

// Two planes of 1..16 and 17..32 [4, 4], 2x2 windows with stride 2: each window's largest is its
// bottom-right tap; the indices count from the tensor's start (the second plane adds 16).
TEST(PoolOpsTest, MaxPoolGivesValuesAndFlatIndicesOfEveryPlane) {
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2, 2})
      .Attr("strides", std::vector<int64_t>{2, 2})
      .Input<float>("x", {1, 2, 4, 4}, Iota(32))
      .Output<float>("y", {1, 2, 2, 2}, {6, 8, 14, 16, 22, 24, 30, 32})
      .Output<int64_t>("indices", {1, 2, 2, 2}, {5, 7, 13, 15, 21, 23, 29, 31})
      .Run();
}

// storage_order 1: the index of (h, w) is w * H + h within its plane.
TEST(PoolOpsTest, MaxPoolIndicesInColumnMajorOrder) {
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2, 2})
      .Attr("strides", std::vector<int64_t>{2, 2})
      .Attr("storage_order", int64_t{1})
      .Input<float>("x", {1, 2, 4, 4}, Iota(32))
      .Output<float>("y", {1, 2, 2, 2}, {6, 8, 14, 16, 22, 24, 30, 32})
      // (1,1) -> 1*4+1 = 5, (1,3) -> 13, (3,1) -> 7, (3,3) -> 15; plane 1 adds 16.
      .Output<int64_t>("indices", {1, 2, 2, 2}, {5, 13, 7, 15, 21, 29, 23, 31})
      .Run();
}

// A NaN beats every number (PyTorch's choice), ties go to the first tap, and the padding never
// wins: a window over [-5, -5] and the padding gives -5.
TEST(PoolOpsTest, MaxPoolTakesNaNFirstOfEqualsAndNeverThePadding) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{3})
      .Attr("strides", std::vector<int64_t>{3})
      .Attr("pads", std::vector<int64_t>{1, 1})
      .Input<float>("x", {1, 1, 7}, {-5, -5, 2, nan, 2, 7, 7})
      .Output<float>("y", {1, 1, 3}, {-5, nan, 7})
      .Output<int64_t>("indices", {1, 1, 3}, {0, 3, 5})
      .Run();
}

// PyTorch's avg_pool2d(arange(1..16) [4, 4], kernel 3, stride 2, padding 1, ceil_mode=True,
// count_include_pad=True): the last window of each dim starts in the input and runs one tap past
// the padding, which the divisor leaves out.
TEST(PoolOpsTest, AveragePoolCeilModeDividesAsPyTorch) {
  OpTester("AveragePool", 19)
      .Attr("kernel_shape", std::vector<int64_t>{3, 3})
      .Attr("strides", std::vector<int64_t>{2, 2})
      .Attr("pads", std::vector<int64_t>{1, 1, 1, 1})
      .Attr("ceil_mode", int64_t{1})
      .Attr("count_include_pad", int64_t{1})
      .Input<float>("x", {1, 1, 4, 4}, Iota(16))
      .Output<float>("y", {1, 1, 3, 3}, {1.5555556f, 3.3333333f, 2.f, 6.3333335f, 11.f, 6.f, 4.5f, 7.5f, 4.f})
      .Tolerance(1e-6, 1e-6)
      .Run();
  // Without count_include_pad each window divides by its taps in the input: the corner window
  // (0, 0) reads 1, 2, 5, 6.
  OpTester("AveragePool", 19)
      .Attr("kernel_shape", std::vector<int64_t>{3, 3})
      .Attr("strides", std::vector<int64_t>{2, 2})
      .Attr("pads", std::vector<int64_t>{1, 1, 1, 1})
      .Attr("ceil_mode", int64_t{1})
      .Input<float>("x", {1, 1, 4, 4}, Iota(16))
      .Output<float>("y", {1, 1, 3, 3}, {3.5f, 5.f, 6.f, 9.5f, 11.f, 12.f, 13.5f, 15.f, 16.f})
      .Tolerance(1e-6, 1e-6)
      .Run();
}

// ceil_mode drops a last window that would start in the end padding: [1, 1, 5] with kernel 2,
// stride 2 and pads [1, 1] rounds (7 - 2) / 2 + 1 up to 4 windows, but the fourth would start at
// position 5, past the input, so there are 3.
TEST(PoolOpsTest, CeilModeDropsAWindowStartingInTheEndPadding) {
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2})
      .Attr("strides", std::vector<int64_t>{2})
      .Attr("pads", std::vector<int64_t>{1, 1})
      .Attr("ceil_mode", int64_t{1})
      .Input<float>("x", {1, 1, 5}, {1, 2, 3, 4, 5})
      .Output<float>("y", {1, 1, 3}, {1, 3, 5})
      .Run();
}

TEST(PoolOpsTest, GlobalPoolsReduceEverySpatialDim) {
  OpTester("GlobalAveragePool", 1)
      .Input<float>("x", {2, 1, 2, 3}, Iota(12))
      .Output<float>("y", {2, 1, 1, 1}, {3.5f, 9.5f})
      .Run();
  OpTester("GlobalMaxPool", 1)
      .Input<double>("x", {1, 2, 3}, {4, -1, 9, -7, -2, -3})
      .Output<double>("y", {1, 2, 1}, {9, -2})
      .Run();
}

TEST(PoolOpsTest, MaxPoolOfUint8) {
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2})
      .Input<uint8_t>("x", {1, 1, 4}, {3, 250, 7, 1})
      .Output<uint8_t>("y", {1, 1, 3}, {250, 250, 7})
      .Run();
}

TEST(PoolOpsTest, BadWindowsFailNamingWhatDisagrees) {
  OpTester("MaxPool", 12)
      .Input<float>("x", {1, 1, 4, 4}, Iota(16))
      .UncheckedOutput("y")
      .ExpectFailure("expected kernel_shape of 2 values")
      .Run();
  OpTester("AveragePool", 19)
      .Attr("kernel_shape", std::vector<int64_t>{5, 1})
      .Input<float>("x", {1, 1, 4, 4}, Iota(16))
      .UncheckedOutput("y")
      .ExpectFailure("spatial dim 0 of 4 (padded to 4) is smaller than the 5 the dilated kernel spans")
      .Run();
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2, 2})
      .Attr("strides", std::vector<int64_t>{0, 1})
      .Input<float>("x", {1, 1, 4, 4}, Iota(16))
      .UncheckedOutput("y")
      .ExpectFailure("strides must be 1 to 2^31 - 1, got 0")
      .Run();
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2})
      .Input<float>("x", {4, 4}, Iota(16))
      .UncheckedOutput("y")
      .ExpectFailure("expected X [N, C, spatial...] of rank 3")
      .Run();
  OpTester("MaxPool", 12)
      .Attr("kernel_shape", std::vector<int64_t>{2})
      .Attr("pads", std::vector<int64_t>{1})
      .Input<float>("x", {1, 1, 4}, Iota(4))
      .UncheckedOutput("y")
      .ExpectFailure("expected 2 pads")
      .Run();
}

// Inference mode: (x - mean) / sqrt(var + eps) * scale + B per channel, here with var + eps = 4
// and 0.25 so that the results are exact.
TEST(BatchNormTest, InferenceModeUsesTheGivenStatistics) {
  OpTester("BatchNormalization", 15)
      .Attr("epsilon", 0.f)
      .Input<float>("x", {2, 2, 2}, {1, 3, 5, 7, -1, 9, 0.5f, 1})
      .Input<float>("scale", {2}, {2, 1})
      .Input<float>("b", {2}, {0, -1})
      .Input<float>("mean", {2}, {1, 5})
      .Input<float>("var", {2}, {4, 0.25f})
      // Channel 0 reads x 1, 3 (image 0) and -1, 9 (image 1): (x - 1) / 2 * 2. Channel 1 reads
      // 5, 7 and 0.5, 1: (x - 5) / 0.5 - 1.
      .Output<float>("y", {2, 2, 2}, {0, 2, -1, 3, -2, 8, -10, -9})
      .Run();
}

// Training mode: channel 0 holds 1, 3, -1, 9 (mean 3, biased variance 14), channel 1 holds 5,
// 7, 0.5, 1 (mean 3.375, variance 7.421875); the running statistics are
// input * 0.75 + batch * 0.25.
TEST(BatchNormTest, TrainingModeUsesTheBatchAndUpdatesTheRunningStatistics) {
  const double s0 = std::sqrt(14.0), s1 = std::sqrt(7.421875);
  auto y = [](double x, double m, double s) { return static_cast<float>((x - m) / s); };
  OpTester("BatchNormalization", 15)
      .Attr("epsilon", 0.f)
      .Attr("momentum", 0.75f)
      .Attr("training_mode", int64_t{1})
      .Input<float>("x", {2, 2, 2}, {1, 3, 5, 7, -1, 9, 0.5f, 1})
      .Input<float>("scale", {2}, {1, 1})
      .Input<float>("b", {2}, {0, 0})
      .Input<float>("mean", {2}, {1, 5})
      .Input<float>("var", {2}, {4, 0.25f})
      .Output<float>("y", {2, 2, 2},
                     {y(1, 3, s0), y(3, 3, s0), y(5, 3.375, s1), y(7, 3.375, s1), y(-1, 3, s0), y(9, 3, s0),
                      y(0.5, 3.375, s1), y(1, 3.375, s1)})
      .Output<float>("running_mean", {2}, {1 * 0.75f + 3 * 0.25f, 5 * 0.75f + 3.375f * 0.25f})
      .Output<float>("running_var", {2}, {4 * 0.75f + 14 * 0.25f, 0.25f * 0.75f + 7.421875f * 0.25f})
      .Tolerance(1e-6, 1e-6)
      .Run();
}

TEST(BatchNormTest, BadOperandsAndUnsupportedFormsFail) {
  OpTester("BatchNormalization", 15)
      .Input<float>("x", {2, 3, 2}, std::vector<float>(12, 1.f))
      .Input<float>("scale", {2}, {1, 1})
      .Input<float>("b", {3}, {0, 0, 0})
      .Input<float>("mean", {3}, {0, 0, 0})
      .Input<float>("var", {3}, {1, 1, 1})
      .UncheckedOutput("y")
      .ExpectFailure("[3] (X's channels)")
      .Run();
  // Version 9's training outputs (saved mean and variance) are not implemented.
  OpTester("BatchNormalization", 9)
      .Input<float>("x", {2, 1}, {1, 2})
      .Input<float>("scale", {1}, {1})
      .Input<float>("b", {1}, {0})
      .Input<float>("mean", {1}, {0})
      .Input<float>("var", {1}, {1})
      .UncheckedOutput("y")
      .UncheckedOutput("mean_out")
      .ExpectFailure("training mode as version 14 has it")
      .Run();
  OpTester("BatchNormalization", 15)
      .Input<float>("x", {2, 1}, {1, 2})
      .Input<float>("scale", {1}, {1})
      .Input<float>("b", {1}, {0})
      .Input<double>("mean", {1}, {0})
      .Input<float>("var", {1}, {1})
      .UncheckedOutput("y")
      .ExpectFailure("float64")
      .Run();
}

// Nearest (asymmetric, floor) doubles each element; linear (align_corners) blends exactly here.
TEST(ResizeTest, NearestAndLinearUpsample) {
  OpTester("Resize", 13)
      .Attr("mode", std::string("nearest"))
      .Attr("coordinate_transformation_mode", std::string("asymmetric"))
      .Attr("nearest_mode", std::string("floor"))
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {4}, {1, 1, 2, 2})
      .Output<float>("y", {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4})
      .Run();
  OpTester("Resize", 13)
      .Attr("mode", std::string("linear"))
      .Attr("coordinate_transformation_mode", std::string("align_corners"))
      .Input<float>("x", {1, 1, 1, 2}, {0, 4})
      .OmittedInput()
      .OmittedInput()
      .Input<int64_t>("sizes", {4}, {1, 1, 1, 5})
      .Output<float>("y", {1, 1, 1, 5}, {0, 1, 2, 3, 4})
      .Run();
}

TEST(ResizeTest, BadInputsFailNamingWhatDisagrees) {
  OpTester("Resize", 13)
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {4}, {1, 1, 1e30f, 1})
      .UncheckedOutput("y")
      .ExpectFailure("dim 2 would resize to")
      .Run();
  OpTester("Resize", 13)
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {4}, {1, 1, 2, 2})
      .Input<int64_t>("sizes", {4}, {1, 1, 4, 4})
      .UncheckedOutput("y")
      .ExpectFailure("expected exactly one of scales and sizes")
      .Run();
  OpTester("Resize", 13)
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {2}, {2, 2})
      .UncheckedOutput("y")
      .ExpectFailure("expected 4 scales, got 2")
      .Run();
  OpTester("Resize", 13)
      .Attr("mode", std::string("bicubic"))
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {4}, {1, 1, 2, 2})
      .UncheckedOutput("y")
      .ExpectFailure("expected mode nearest, linear or cubic, got 'bicubic'")
      .Run();
  OpTester("Resize", 19)
      .Attr("coordinate_transformation_mode", std::string("half_pixel_symetric"))
      .Input<float>("x", {1, 1, 2, 2}, {1, 2, 3, 4})
      .OmittedInput()
      .Input<float>("scales", {4}, {1, 1, 2, 2})
      .UncheckedOutput("y")
      .ExpectFailure("unknown coordinate_transformation_mode 'half_pixel_symetric'")
      .Run();
}

// RoiAlign samples bilinearly, exact on a linear image: over the whole 4 x 4 plane of image 1
// (values 4y + x + 16), any grid of samples symmetric about the centre averages to 23.5, and a
// 2 x 2 output of each quarter to its own centre; a batch index past X is refused.
TEST(CnnOps, RoiAlignAveragesBilinearSamples) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
  for (int64_t ratio : {int64_t{0}, int64_t{2}}) {
    OpTester("RoiAlign", 16)
        .Attr("coordinate_transformation_mode", std::string("output_half_pixel"))
        .Attr("sampling_ratio", ratio)
        .Input<float>("X", {2, 1, 4, 4}, x)
        .Input<float>("rois", {1, 4}, {0, 0, 3, 3})
        .Input<int64_t>("batch_indices", {1}, {1})
        .Output<float>("Y", {1, 1, 1, 1}, {23.5f})
        .Run();
  }
  // Half-pixel coordinates, a spatial scale of 0.5: the roi [0, 0, 8, 8] covers [-0.5, 3.5],
  // each quarter's samples centred on (0.5 or 2.5, 0.5 or 2.5).
  OpTester("RoiAlign", 16)
      .Attr("output_height", int64_t{2})
      .Attr("output_width", int64_t{2})
      .Attr("sampling_ratio", int64_t{2})
      .Attr("spatial_scale", 0.5f)
      .Input<float>("X", {2, 1, 4, 4}, x)
      .Input<float>("rois", {1, 4}, {0, 0, 8, 8})
      .Input<int64_t>("batch_indices", {1}, {0})
      .Output<float>("Y", {1, 1, 2, 2}, {2.5f, 4.5f, 10.5f, 12.5f})
      .Run();
  OpTester("RoiAlign", 16)
      .Input<float>("X", {2, 1, 4, 4}, x)
      .Input<float>("rois", {1, 4}, {0, 0, 3, 3})
      .Input<int64_t>("batch_indices", {1}, {2})
      .UncheckedOutput("Y")
      .ExpectFailure("batch_indices[0] is 2; X holds 2 images")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
