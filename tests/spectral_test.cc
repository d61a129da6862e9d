// DFT and STFT (tests/) against transforms written here with std::complex from the definition
// X[k] = sum_t x[t] e^(-2 pi i k t / n) (the inverse with +, divided by n): a signal axis in the
// middle of the dims, complex input, a dft_length that pads or truncates, onesided and inverse
// transforms, float64, and STFT frames with a window; then the errors that name the node. The
// ONNX backend suite checks MelWeightMatrix and the default cases.
#include <cmath>
#include <complex>
#include <numbers>
#include <vector>

#include "gtest/gtest.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

using Complex = std::complex<double>;

std::vector<Complex> Transform(const std::vector<Complex>& x, int64_t n, bool inverse, int64_t bins) {
  std::vector<Complex> y(static_cast<size_t>(bins));
  for (int64_t k = 0; k < bins; ++k) {
    for (int64_t t = 0; t < std::min<int64_t>(n, static_cast<int64_t>(x.size())); ++t) {
      const double a = (inverse ? 2 : -2) * std::numbers::pi * static_cast<double>(k * t) / static_cast<double>(n);
      y[static_cast<size_t>(k)] += x[static_cast<size_t>(t)] * Complex(std::cos(a), std::sin(a));
    }
    if (inverse) y[static_cast<size_t>(k)] /= static_cast<double>(n);
  }
  return y;
}

// x [outer, len, inner, parts] transformed along len into [outer, bins, inner, 2].
std::vector<double> Reference(const std::vector<double>& x, int64_t outer, int64_t len, int64_t inner, int64_t parts,
                              int64_t n, bool inverse, bool onesided) {
  const int64_t bins = onesided ? n / 2 + 1 : n;
  std::vector<double> y(static_cast<size_t>(outer * bins * inner * 2));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      std::vector<Complex> line(static_cast<size_t>(len));
      for (int64_t t = 0; t < len; ++t) {
        const size_t at = static_cast<size_t>(((o * len + t) * inner + i) * parts);
        line[static_cast<size_t>(t)] = Complex(x[at], parts == 2 ? x[at + 1] : 0.0);
      }
      const std::vector<Complex> f = Transform(line, n, inverse, bins);
      for (int64_t k = 0; k < bins; ++k) {
        const size_t at = static_cast<size_t>(((o * bins + k) * inner + i) * 2);
        y[at] = f[static_cast<size_t>(k)].real();
        y[at + 1] = f[static_cast<size_t>(k)].imag();
      }
    }
  }
  return y;
}

TEST(Spectral, DftAlongAnyAxisPaddedTruncatedOnesidedAndInverse) {
  struct Case {
    int64_t outer, len, inner, parts, n;
    bool inverse, onesided;
  };
  for (const Case& c : {Case{2, 7, 3, 1, 7, false, false}, Case{2, 6, 3, 2, 9, false, true},
                        Case{1, 8, 2, 2, 5, true, false}, Case{3, 5, 1, 1, 12, false, true}}) {
    SCOPED_TRACE(::testing::Message() << "len " << c.len << " n " << c.n << " parts " << c.parts);
    const std::vector<double> x = Values(c.outer * c.len * c.inner * c.parts, 21);
    const int64_t bins = c.onesided ? c.n / 2 + 1 : c.n;
    // Version 20 (axis an input, here the middle dim) in float32, and version 17 (the attribute)
    // in float64.
    OpTester("DFT", 20)
        .Attr("inverse", int64_t{c.inverse})
        .Attr("onesided", int64_t{c.onesided})
        .Input<float>("x", {c.outer, c.len, c.inner, c.parts}, Cast<float>(x))
        .Input<int64_t>("dft_length", {}, {c.n})
        .Input<int64_t>("axis", {}, {1})
        .Output<float>("y", {c.outer, bins, c.inner, 2},
                       Cast<float>(Reference(x, c.outer, c.len, c.inner, c.parts, c.n, c.inverse, c.onesided)))
        .Run();
    OpTester("DFT", 17)
        .Attr("axis", int64_t{1})
        .Attr("inverse", int64_t{c.inverse})
        .Attr("onesided", int64_t{c.onesided})
        .Input<double>("x", {c.outer, c.len, c.inner, c.parts}, x)
        .Input<int64_t>("dft_length", {}, {c.n})
        .Output<double>("y", {c.outer, bins, c.inner, 2},
                        Reference(x, c.outer, c.len, c.inner, c.parts, c.n, c.inverse, c.onesided))
        .Run();
  }
}

TEST(Spectral, StftFramesAWindowedComplexSignal) {
  const int64_t batch = 2, len = 23, frame = 8, step = 5, frames = (len - frame) / step + 1, bins = frame / 2 + 1;
  const std::vector<double> x = Values(batch * len * 2, 31), w = Values(frame, 32);
  std::vector<double> want;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t f = 0; f < frames; ++f) {
      std::vector<double> seg;
      for (int64_t t = 0; t < frame; ++t)
        for (int p = 0; p < 2; ++p) seg.push_back(x[static_cast<size_t>((b * len + f * step + t) * 2 + p)] * w[static_cast<size_t>(t)]);
      const std::vector<double> y = Reference(seg, 1, frame, 1, 2, frame, false, true);
      want.insert(want.end(), y.begin(), y.end());
    }
  }
  OpTester("STFT", 17)
      .Input<float>("signal", {batch, len, 2}, Cast<float>(x))
      .Input<int64_t>("frame_step", {}, {step})
      .Input<float>("window", {frame}, Cast<float>(w))
      .Output<float>("output", {batch, frames, bins, 2}, Cast<float>(want))
      .Run();
}

TEST(Spectral, BadAxesAndFramesAreRefused) {
  OpTester("DFT", 20)
      .Input<float>("x", {2, 4, 1}, std::vector<float>(8, 1.f))
      .OmittedInput()
      .Input<int64_t>("axis", {}, {-1})
      .UncheckedOutput("y")
      .ExpectFailure("axis -1 is not a signal dim of input [2,4,1]")
      .Run();
  OpTester("STFT", 17)
      .Input<float>("signal", {1, 6, 1}, std::vector<float>(6, 1.f))
      .Input<int64_t>("frame_step", {}, {2})
      .OmittedInput()
      .Input<int64_t>("frame_length", {}, {9})
      .UncheckedOutput("output")
      .ExpectFailure("frame_length is 9; expected 1 to the signal's 6 samples")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
