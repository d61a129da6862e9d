// Op tests for the ai.cleave gradient ops (tests/): GatherGrad, SliceGrad,
// SoftmaxCrossEntropyLossGrad, SoftmaxGrad, LogSoftmaxGrad, GeluGrad and
// LayerNormalizationGrad on the CPU provider. Expected values are worked out by hand in the
// comments next to each case or computed by naive double-precision references written here
// (LayerNorm's from its explicit Jacobian), and the kernels' column sums are checked to be
// bitwise the same for every thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "base/thread_pool.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/grad.h"
#include "kernels/cpu/nn.h"
#include "tests/nn_test_util.h"
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

TEST(GradOps, GatherGradOntoABase) {
  // The same scatter as GatherGradAxis0RepeatedAndNegativeIndices onto a base: dX = base +
  // {6, 8, 0, 0, 3, 4}; with reset the base is ignored.
  for (bool reset : {false, true}) {
    Op("GatherGrad").Input<int64_t>("shape", {2}, {3, 2}).Input<int64_t>("indices", {3}, {0, -1, 0})
        .Input<float>("dY", {3, 2}, {1, 2, 3, 4, 5, 6}).Input<float>("base", {3, 2}, {10, 20, 30, 40, 50, 60})
        .Input<bool>("reset", {}, {reset})
        .Output<float>("dX", {3, 2}, reset ? std::vector<float>{6, 8, 0, 0, 3, 4}
                                           : std::vector<float>{16, 28, 30, 40, 53, 64})
        .Run();
  }
  Op("GatherGrad").Input<int64_t>("shape", {1}, {4}).Input<int64_t>("indices", {2}, {3, 3})
      .Input<double>("dY", {2}, {1, 2}).Input<double>("base", {4}, {1, 1, 1, 1})
      .Output<double>("dX", {4}, {1, 1, 1, 4}).Run();
  // A base of another shape is an error naming both.
  Op("GatherGrad").Input<int64_t>("shape", {2}, {3, 2}).Input<int64_t>("indices", {1}, {0})
      .Input<float>("dY", {1, 2}, {1, 2}).Input<float>("base", {2, 3}, {0, 0, 0, 0, 0, 0})
      .Output<float>("dX", {3, 2}, {0, 0, 0, 0, 0, 0}).ExpectFailure("expected a base of the table's shape [3,2]")
      .Run();
}

// In place (the base is dX itself, as a training session's accumulation buffer is): only the
// rows at the indices change.
TEST(GradOps, GatherGradInPlaceTouchesOnlyTheIndexedRows) {
  Tensor table = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  Tensor dy = Tensor::FromVector<float>({1, 1, 2, 2, 4, 4}, {3, 2});
  Tensor ids = Tensor::FromVector<int64_t>({2, 0, 2}, {3});
  TensorView dx = table.view();
  ASSERT_TRUE(kernels::cpu::GatherGrad(dy.view(), ids.view(), 0, dx, nullptr, table.raw()).ok());
  const std::vector<float> want = {3, 4, 3, 4, 10, 11, 7, 8};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(table.data<float>()[i], want[i]) << i;
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

TEST(GradOps, SceGradOverASliceOfTheClasses) {
  // Columns [2, 4) of 4 classes (one rank's half of a vocabulary-parallel loss). Row 0's label
  // 3 is column 1 here; row 1's label 0 lives on the other rank: only the softmax term.
  // Mean over N = 2 rows: 0.5 * (p - onehot).
  Op("SoftmaxCrossEntropyLossGrad").Attr("class_offset", int64_t{2}).Attr("num_classes", int64_t{4})
      .Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {3, 0})
      .Output<double>("d", {2, 2}, {0.125, -0.125, 0.25, 0.25}).Run();
  // The range check is against all classes.
  Op("SoftmaxCrossEntropyLossGrad").Attr("class_offset", int64_t{2}).Attr("num_classes", int64_t{4})
      .Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {4, 0}).Output<double>("d", {2, 2}, {0, 0, 0, 0})
      .ExpectFailure("outside [0, 4)").Run();
  Op("SoftmaxCrossEntropyLossGrad").Attr("class_offset", int64_t{3}).Attr("num_classes", int64_t{4})
      .Input<double>("dY", {}, {1}).Input<double>("log_prob", {2, 2}, LogProbs())
      .Input<int64_t>("label", {2}, {3, 0}).Output<double>("d", {2, 2}, {0, 0, 0, 0})
      .ExpectFailure("holds classes [3, 5) of num_classes 4").Run();
}

// ---- The one-pass cross-entropy from the scores -----------------------------------------

Tensor Bf16(std::vector<int64_t> dims, const std::vector<float>& v) {
  Tensor t(DataType::kBFloat16, std::move(dims));
  for (size_t i = 0; i < v.size(); ++i) t.data<uint16_t>()[i] = FloatToBFloat16(v[i]);
  return t;
}

TEST(GradOps, SceGradFromScoresWithTheLossHandValues) {
  // The scores are the log-probabilities above (their log-softmax is themselves): the mean loss
  // is (-log 0.75 - log 0.5) / 2 and the gradient that of SceGradMean.
  Op("SoftmaxCrossEntropyLossGrad").Attr("from_scores", int64_t{1})
      .Input<float>("dY", {}, {1}).Input<float>("scores", {2, 2}, Cast<float>(LogProbs()))
      .Input<int64_t>("label", {2}, {1, 0})
      .Output<float>("d", {2, 2}, {0.125f, -0.125f, -0.25f, 0.25f})
      .Output<float>("loss", {}, {static_cast<float>(-(std::log(0.75) + std::log(0.5)) / 2)}).Run();
  // bf16 scores and a bf16 gradient (to = bfloat16); "none" with a loss per row, row 0 ignored.
  Op("SoftmaxCrossEntropyLossGrad").Attr("from_scores", int64_t{1}).Attr("reduction", std::string("none"))
      .Attr("ignore_index", int64_t{1}).Attr("to", int64_t{16})
      .Input<float>("dY", {2}, {2, 2}).InputTensor("scores", Bf16({2, 2}, {0, 0, 1, 1}))
      .Input<int32_t>("label", {2}, {1, 0})
      .OutputTensor("d", Bf16({2, 2}, {0, 0, -1, 1}))
      .Output<float>("loss", {2}, {0, static_cast<float>(std::log(2.0))}).Run();
}

// The kernel against the two it replaces (kernels/cpu: SoftmaxCrossEntropy for the loss, a
// double log-softmax and SoftmaxCrossEntropyGrad for the gradient), for each reduction, with
// and without ignored rows, both label types, row lengths below and above a vector's and the
// low-precision scores and gradients; the loss is the same for every thread count.
template <typename L>
void CheckOnePassCrossEntropy(int64_t N, int64_t C, kernels::cpu::LossReduction reduction, bool ignore) {
  SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C << " reduction " << static_cast<int>(reduction)
                                    << (ignore ? " ignore_index" : ""));
  kernels::cpu::SceParams p;
  p.N = N;
  p.C = C;
  p.reduction = reduction;
  if (ignore) p.ignore_index = -100;
  std::vector<double> x = Values(N * C, static_cast<uint32_t>(N * C));
  for (double& v : x) v *= 6;  // logits of a few units
  std::vector<L> labels(N);
  for (int64_t i = 0; i < N; ++i) labels[i] = static_cast<L>(ignore && i % 4 == 1 ? -100 : (i * 7919) % C);
  const bool none = reduction == kernels::cpu::LossReduction::kNone;
  std::vector<double> dy = none ? Values(N, 5) : std::vector<double>{0.75};
  // The reference in double.
  std::vector<double> lp(x.size()), want_dx(x.size()), want_loss(none ? N : 1), scratch(2 * N + 1);
  kernels::cpu::SoftmaxParams sp;
  sp.log = true;
  sp.outer = N;
  sp.axis = C;
  kernels::cpu::Softmax(sp, x.data(), lp.data(), nullptr);
  const absl::Status grad = kernels::cpu::SoftmaxCrossEntropyGrad<double, L>(p, dy.data(), lp.data(), labels.data(),
                                                                             nullptr, want_dx.data(), nullptr);
  ASSERT_TRUE(grad.ok()) << grad;
  const absl::Status fwd = kernels::cpu::SoftmaxCrossEntropy<double, L>(p, x.data(), labels.data(), nullptr,
                                                                        want_loss.data(), nullptr, scratch.data(), nullptr);
  ASSERT_TRUE(fwd.ok()) << fwd;
  const std::vector<float> dyf = Cast<float>(dy);
  const int64_t dims[2] = {N, C};
  ThreadPool pool(2);
  for (const auto& [in_t, out_t] : {std::pair{DataType::kFloat32, DataType::kFloat32},
                                    std::pair{DataType::kBFloat16, DataType::kBFloat16},
                                    std::pair{DataType::kFloat32, DataType::kFloat16}}) {
    SCOPED_TRACE(::testing::Message() << DataTypeName(in_t) << " scores, " << DataTypeName(out_t) << " gradient");
    Tensor scores(in_t, {N, C}), dx(out_t, {N, C});
    const std::vector<float> xf = Cast<float>(x);
    kernels::cpu::Cast(TensorView(const_cast<float*>(xf.data()), DataType::kFloat32, dims), scores.view(), nullptr);
    std::vector<float> loss(none ? N : 1), loss1(loss.size());
    std::vector<double> work(N + 1);
    TensorView sv = scores.view(), dv = dx.view();
    ASSERT_TRUE(kernels::cpu::SoftmaxCrossEntropyFromScores<L>(p, dyf.data(), sv, labels.data(), dv, loss.data(),
                                                               work.data(), &pool).ok());
    ASSERT_TRUE(kernels::cpu::SoftmaxCrossEntropyFromScores<L>(p, dyf.data(), sv, labels.data(), dv, loss1.data(),
                                                               work.data(), nullptr).ok());
    EXPECT_EQ(loss, loss1) << "the loss depends on the thread count";
    // Low-precision scores move the loss by their rounding (bf16: 2^-9 of a few units).
    const double loss_tol = in_t == DataType::kFloat32 ? 2e-6 : 0.05;
    for (size_t i = 0; i < loss.size(); ++i) EXPECT_NEAR(loss[i], want_loss[i], loss_tol * std::max(1.0, std::abs(want_loss[i]))) << i;
    Tensor wide(DataType::kFloat32, {N, C});
    kernels::cpu::Cast(dx.view(), wide.view(), nullptr);
    const float* got = wide.data<float>();
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < N * C; ++i) {
      worst = std::max(worst, std::abs(got[i] - want_dx[i]));
      scale = std::max(scale, std::abs(want_dx[i]));
    }
    const double dx_tol = in_t == DataType::kFloat32 && out_t == DataType::kFloat32 ? 1e-6 : 2e-2;
    EXPECT_LT(worst, dx_tol * scale) << "largest gradient difference";
    for (int64_t i = 0; i < N; ++i) {
      if (!ignore || labels[i] != -100) continue;
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(got[i * C + c], 0.f) << "ignored row " << i;
    }
  }
}

TEST(GradOps, SceOnePassMatchesTheLossAndTheGradientKernels) {
  using kernels::cpu::LossReduction;
  for (LossReduction r : {LossReduction::kMean, LossReduction::kSum, LossReduction::kNone})
    for (bool ignore : {false, true}) {
      CheckOnePassCrossEntropy<int64_t>(37, 5, r, ignore);
      CheckOnePassCrossEntropy<int32_t>(9, 1000, r, ignore);
    }
}

TEST(GradOps, SceOnePassBadLabelWritesNothingAndAllIgnoredIsNan) {
  kernels::cpu::SceParams p;
  p.N = 2;
  p.C = 3;
  p.ignore_index = -1;
  const int64_t dims[2] = {2, 3};
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, dx(6, 7.f), loss = {7.f};
  std::vector<double> work(3);
  const float dy = 1;
  TensorView sv(x.data(), DataType::kFloat32, dims), dv(dx.data(), DataType::kFloat32, dims);
  const int64_t bad[2] = {0, 3};
  absl::Status s = kernels::cpu::SoftmaxCrossEntropyFromScores<int64_t>(p, &dy, sv, bad, dv, loss.data(), work.data(),
                                                                        nullptr);
  EXPECT_NE(s.message().find("label 3 at position 1 is outside [0, 3) and is not ignore_index -1"), std::string::npos)
      << s;
  for (float v : dx) EXPECT_EQ(v, 7.f);
  EXPECT_EQ(loss[0], 7.f);
  // Every row ignored: the mean divides 0 by 0, as the forward does, and the gradient is 0.
  const int64_t ignored[2] = {-1, -1};
  ASSERT_TRUE(kernels::cpu::SoftmaxCrossEntropyFromScores<int64_t>(p, &dy, sv, ignored, dv, loss.data(), work.data(),
                                                                   nullptr).ok());
  EXPECT_TRUE(std::isnan(loss[0]));
  for (float v : dx) EXPECT_EQ(v, 0.f);
}

// ---- SoftmaxGrad / LogSoftmaxGrad -------------------------------------------------------

TEST(GradOps, SoftmaxGradHandValues) {
  // Row 0: y (0.25, 0.75), dy (1, 0): sum(dy y) = 0.25, dx = (0.25 * 0.75, 0.75 * -0.25).
  // Row 1: y (0.5, 0.5), dy (2, 4): sum = 3, dx = (0.5 * -1, 0.5 * 1).
  Op("SoftmaxGrad").Input<float>("dY", {2, 2}, {1, 0, 2, 4}).Input<float>("Y", {2, 2}, {0.25f, 0.75f, 0.5f, 0.5f})
      .Output<float>("dX", {2, 2}, {0.1875f, -0.1875f, -0.5f, 0.5f}).Run();
}

TEST(GradOps, LogSoftmaxGradHandValues) {
  // y = log(0.25, 0.75), dy (1, 2): sum(dy) = 3, dx = dy - softmax * 3 = (0.25, -0.25).
  Op("LogSoftmaxGrad").Input<double>("dY", {1, 2}, {1, 2})
      .Input<double>("Y", {1, 2}, {std::log(0.25), std::log(0.75)})
      .Output<double>("dX", {1, 2}, {0.25, -0.25}).Run();
}

// Softmax (or log-softmax) of x along `axis` of dims, and the gradient of each from dy,
// by index arithmetic over every (outer, inner) pair.
struct SoftmaxCase {
  std::vector<double> y, dx;
};
SoftmaxCase NaiveSoftmaxGrad(const I64& dims, int axis, const std::vector<double>& x,
                             const std::vector<double>& dy, bool log) {
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < axis; ++k) outer *= dims[k];
  for (size_t k = axis + 1; k < dims.size(); ++k) inner *= dims[k];
  const int64_t n = dims[axis];
  SoftmaxCase c{std::vector<double>(x.size()), std::vector<double>(x.size())};
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t a) { return (o * n + a) * inner + i; };
      double z = 0, s = 0;
      for (int64_t a = 0; a < n; ++a) z += std::exp(x[at(a)]);
      for (int64_t a = 0; a < n; ++a) {
        const double p = std::exp(x[at(a)]) / z;
        c.y[at(a)] = log ? std::log(p) : p;
        s += log ? dy[at(a)] : dy[at(a)] * p;
      }
      for (int64_t a = 0; a < n; ++a) {
        const double p = std::exp(x[at(a)]) / z;
        c.dx[at(a)] = log ? dy[at(a)] - p * s : p * (dy[at(a)] - s);
      }
    }
  return c;
}

TEST(GradOps, SoftmaxGradsAlongAxisNotLastMatchNaive) {
  const I64 dims = {2, 3, 4};
  const std::vector<double> x = Values(24, 7), dy = Values(24, 8);
  for (bool log : {false, true})
    for (int64_t axis : {0, 1, -1}) {
      const int a = axis < 0 ? axis + 3 : static_cast<int>(axis);
      SoftmaxCase c = NaiveSoftmaxGrad(dims, a, x, dy, log);
      SCOPED_TRACE(::testing::Message() << (log ? "LogSoftmaxGrad" : "SoftmaxGrad") << " axis " << axis);
      Op(log ? "LogSoftmaxGrad" : "SoftmaxGrad").Attr("axis", axis).Input<double>("dY", dims, dy)
          .Input<double>("Y", dims, c.y).Output<double>("dX", dims, c.dx).Tolerance(1e-12, 1e-10).Run();
      Op(log ? "LogSoftmaxGrad" : "SoftmaxGrad").Attr("axis", axis).Input<float>("dY", dims, Cast<float>(dy))
          .Input<float>("Y", dims, Cast<float>(c.y)).Output<float>("dX", dims, Cast<float>(c.dx)).Run();
    }
}

TEST(GradOps, SoftmaxGradShapeMismatch) {
  Op("SoftmaxGrad").Input<float>("dY", {2, 2}, {1, 2, 3, 4}).Input<float>("Y", {4}, {1, 2, 3, 4})
      .Output<float>("dX", {4}, {0, 0, 0, 0}).ExpectFailure("expected dY of the shape").Run();
}

// ---- GeluGrad ---------------------------------------------------------------------------

// d/dx of 0.5 x (1 + erf(x / sqrt 2)) and of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + c x^3).
double GeluPrime(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
  const double s = std::sqrt(2 / M_PI), c = 0.044715, t = std::tanh(s * (x + c * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
}

TEST(GradOps, GeluGradBothFormsMatchTheDerivative) {
  std::vector<double> x, dy;
  for (int i = -60; i <= 60; ++i) {  // -6 .. 6 in steps of 0.1, through the minimum near -0.75
    x.push_back(i / 10.0);
    dy.push_back(1.0 + 0.01 * i);
  }
  const I64 dims = {static_cast<int64_t>(x.size())};
  for (bool tanh_form : {false, true}) {
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = dy[i] * GeluPrime(x[i], tanh_form);
    const std::string approx = tanh_form ? "tanh" : "none";
    Op("GeluGrad").Attr("approximate", approx).Input<double>("dY", dims, dy).Input<double>("X", dims, x)
        .Output<double>("dX", dims, want).Tolerance(1e-14, 1e-12).Run();
    // The vectorised float path: a few 1e-7 relative from erfc / exp.
    Op("GeluGrad").Attr("approximate", approx).Input<float>("dY", dims, Cast<float>(dy))
        .Input<float>("X", dims, Cast<float>(x)).Output<float>("dX", dims, Cast<float>(want))
        .Tolerance(1e-6, 1e-5).Run();
  }
}

TEST(GradOps, GeluGradTailsAndNonFinite) {
  // gelu' is 0 far left and 1 far right in both forms; inf follows, NaN propagates.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  for (const char* approx : {"none", "tanh"}) {
    Op("GeluGrad").Attr("approximate", std::string(approx))
        .Input<float>("dY", {6}, {2, 2, 2, 2, 2, 2}).Input<float>("X", {6}, {-30, 30, -inf, inf, nan, 12})
        .Output<float>("dX", {6}, {0, 2, 0, 2, nan, 2}).Run();
  }
  Op("GeluGrad").Attr("approximate", std::string("exact")).Input<float>("dY", {1}, {1})
      .Input<float>("X", {1}, {0}).Output<float>("dX", {1}, {0.5f}).ExpectFailure("approximate").Run();
}

// ---- LayerNormalizationGrad -----------------------------------------------------------------

// Reference gradients of y = xhat * scale + bias over rows of `cols`, with scale broadcast as
// scale_at(c) gives. dx from the explicit Jacobian
// d xhat_i / d x_j = inv_std (delta_ij - 1/n - xhat_i xhat_j / n).
struct LnGrads {
  std::vector<double> mean, inv_std, dx, dscale_cols, dbias_cols;
};
LnGrads NaiveLayerNormGrad(const std::vector<double>& x, const std::vector<double>& dy,
                           int64_t rows, int64_t cols, const std::vector<double>& scale_cols,
                           double eps) {
  LnGrads r{{}, {}, std::vector<double>(x.size()), std::vector<double>(cols), std::vector<double>(cols)};
  const double n = static_cast<double>(cols);
  for (int64_t row = 0; row < rows; ++row) {
    const double* xr = x.data() + row * cols;
    const double* dyr = dy.data() + row * cols;
    double m = 0, v = 0;
    for (int64_t c = 0; c < cols; ++c) m += xr[c] / n;
    for (int64_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m) / n;
    const double s = 1 / std::sqrt(v + eps);
    r.mean.push_back(m);
    r.inv_std.push_back(s);
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < cols; ++i) {
        const double xi = (xr[i] - m) * s, xj = (xr[j] - m) * s;
        sum += dyr[i] * scale_cols[i] * s * ((i == j ? 1 : 0) - 1 / n - xi * xj / n);
      }
      r.dx[row * cols + j] = sum;
      r.dscale_cols[j] += dyr[j] * (xr[j] - m) * s;
      r.dbias_cols[j] += dyr[j];
    }
  }
  return r;
}

TEST(GradOps, LayerNormGradTwoNormalisedAxesFloat64) {
  // X [2, 3, 4] normalised over [3, 4] (axis 1): 2 rows of 12.
  const I64 xd = {2, 3, 4}, sd = {3, 4}, stat = {2, 1, 1};
  const std::vector<double> x = Values(24, 21), dy = Values(24, 22), scale = Values(12, 23);
  LnGrads r = NaiveLayerNormGrad(x, dy, 2, 12, scale, 1e-5);
  Op("LayerNormalizationGrad").Attr("axis", int64_t{1}).Input<double>("dY", xd, dy).Input<double>("X", xd, x)
      .Input<double>("scale", sd, scale).Input<double>("mean", stat, r.mean).Input<double>("inv_std_dev", stat, r.inv_std)
      .Output<double>("dX", xd, r.dx).Output<double>("dScale", sd, r.dscale_cols)
      .Output<double>("dBias", sd, r.dbias_cols).Tolerance(1e-12, 1e-10).Run();
}

TEST(GradOps, LayerNormGradFloat32WithoutBiasOutput) {
  const I64 xd = {3, 5}, sd = {5}, stat = {3, 1};
  const std::vector<double> x = Values(15, 31), dy = Values(15, 32), scale = Values(5, 33);
  LnGrads r = NaiveLayerNormGrad(x, dy, 3, 5, scale, 1e-5);
  Op("LayerNormalizationGrad").Input<float>("dY", xd, Cast<float>(dy)).Input<float>("X", xd, Cast<float>(x))
      .Input<float>("scale", sd, Cast<float>(scale)).Input<float>("mean", stat, Cast<float>(r.mean))
      .Input<float>("inv_std_dev", stat, Cast<float>(r.inv_std))
      .Output<float>("dX", xd, Cast<float>(r.dx)).Output<float>("dScale", sd, Cast<float>(r.dscale_cols)).Run();
}

TEST(GradOps, LayerNormGradBroadcastScaleSumsOverItsBroadcastAxes) {
  // Scale [4] over the normalised [3, 4]: dScale[k] sums the [3, 4] column sums over the 3.
  // Statistics in float32 (the default stash type) with a float64 X.
  const I64 xd = {2, 3, 4}, stat = {2, 1, 1};
  const std::vector<double> x = Values(24, 41), dy = Values(24, 42), s4 = Values(4, 43);
  std::vector<double> scale(12);
  for (int c = 0; c < 12; ++c) scale[c] = s4[c % 4];
  LnGrads r = NaiveLayerNormGrad(x, dy, 2, 12, scale, 1e-5);
  // The kernel reads the statistics rounded to float32, hence the float-level tolerance.
  std::vector<float> mean = Cast<float>(r.mean), inv = Cast<float>(r.inv_std);
  std::vector<double> dscale(4, 0), dbias(4, 0);
  for (int c = 0; c < 12; ++c) {
    dscale[c % 4] += r.dscale_cols[c];
    dbias[c % 4] += r.dbias_cols[c];
  }
  Op("LayerNormalizationGrad").Attr("axis", int64_t{-2}).Input<double>("dY", xd, dy).Input<double>("X", xd, x)
      .Input<double>("scale", {4}, s4).Input<float>("mean", stat, mean).Input<float>("inv_std_dev", stat, inv)
      .Output<double>("dX", xd, r.dx).Output<double>("dScale", {4}, dscale).Output<double>("dBias", {4}, dbias)
      .Tolerance(1e-6, 1e-5).Run();
}

TEST(GradOps, LayerNormGradStatisticsOfTheWrongShape) {
  Op("LayerNormalizationGrad").Input<float>("dY", {2, 2}, {1, 2, 3, 4}).Input<float>("X", {2, 2}, {1, 2, 3, 4})
      .Input<float>("scale", {2}, {1, 1}).Input<float>("mean", {2, 2}, {0, 0, 0, 0})
      .Input<float>("inv_std_dev", {2, 1}, {1, 1}).Output<float>("dX", {2, 2}, {0, 0, 0, 0})
      .ExpectFailure("X's with the normalised axes reduced to 1").Run();
}

// RMSNormalizationGrad against the explicit Jacobian of xhat = x s, s = 1 / sqrt(mean(x^2) + eps):
// d xhat_i / d x_j = s (delta_ij - xhat_i xhat_j / n); dScale = sum dy xhat. With dX_add, dX
// is the gradient plus that input.
TEST(GradOps, RMSNormGradMatchesItsJacobianAndAddsTheResidual) {
  const I64 xd = {2, 3, 5}, sd = {5}, stat = {2, 3, 1};
  const int64_t rows = 6, cols = 5;
  const std::vector<double> x = Values(30, 61), dy = Values(30, 62), scale = Values(5, 63), add = Values(30, 64);
  std::vector<double> inv(rows), dx(30), dx_add(30), dscale(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * cols;
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += xr[c] * xr[c] / cols;
    const double s = 1 / std::sqrt(ms + 1e-5);
    inv[r] = s;
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t i = 0; i < cols; ++i)
        sum += dy[r * cols + i] * scale[i] * s * ((i == j ? 1 : 0) - xr[i] * s * xr[j] * s / cols);
      dx[r * cols + j] = sum;
      dx_add[r * cols + j] = sum + add[r * cols + j];
      dscale[j] += dy[r * cols + j] * xr[j] * s;
    }
  }
  Op("RMSNormalizationGrad").Input<double>("dY", xd, dy).Input<double>("X", xd, x).Input<double>("scale", sd, scale)
      .Input<double>("inv_std_dev", stat, inv).Output<double>("dX", xd, dx).Output<double>("dScale", sd, dscale)
      .Tolerance(1e-12, 1e-10).Run();
  Op("RMSNormalizationGrad").Input<double>("dY", xd, dy).Input<double>("X", xd, x).Input<double>("scale", sd, scale)
      .Input<double>("inv_std_dev", stat, inv).Input<double>("dX_add", xd, add).Output<double>("dX", xd, dx_add)
      .Tolerance(1e-12, 1e-10).Run();
  // The forward saves exactly these statistics and normalises with them.
  std::vector<double> y(30);
  for (int64_t k = 0; k < 30; ++k) y[k] = x[k] * inv[k / cols] * scale[k % cols];
  Op("RMSNormalization").Input<double>("X", xd, x).Input<double>("Scale", sd, scale).Output<double>("Y", xd, y)
      .Output<float>("InvStdDev", stat, Cast<float>(inv)).Tolerance(1e-6, 1e-6).Run();
  Op("RMSNormalizationGrad").Input<double>("dY", xd, dy).Input<double>("X", xd, x).Input<double>("scale", sd, scale)
      .Input<double>("inv_std_dev", {2, 3}, inv).Output<double>("dX", xd, dx)
      .ExpectFailure("X's with the normalised axes reduced to 1").Run();
  // A scale that does not broadcast over the normalised dims is an error naming both shapes.
  Op("RMSNormalization").Input<double>("X", xd, x).Input<double>("Scale", {4}, Values(4, 65))
      .Output<double>("Y", xd, y).ExpectFailure("[4] does not broadcast over the normalised dims of X [2,3,5]").Run();
}

// The column sums (dScale, dBias) use fixed row blocks added in block order, so every thread
// count gives the same bits; so do dX and the softmax gradients, computed row by row.
TEST(GradOps, LayerNormAndSoftmaxGradsDoNotDependOnTheThreadCount) {
  const int64_t rows = 1000, cols = 37;
  const std::vector<float> x = Cast<float>(Values(rows * cols, 51)), dy = Cast<float>(Values(rows * cols, 52));
  const std::vector<float> scale = Cast<float>(Values(cols, 53));
  std::vector<float> mean(rows), inv(rows);
  for (int64_t r = 0; r < rows; ++r) {
    mean[r] = 0.01f * static_cast<float>(r % 7);
    inv[r] = 1.0f + 0.001f * static_cast<float>(r % 13);
  }
  kernels::cpu::LayerNormGradParams p{rows, cols};
  auto run = [&](ThreadPool* pool) {
    std::vector<float> out(rows * cols + 2 * cols);
    std::vector<double> ws(kernels::cpu::LayerNormGradWorkspace(p));
    kernels::cpu::LayerNormGrad<float, float>(p, dy.data(), x.data(), scale.data(), mean.data(), inv.data(),
                                              out.data(), out.data() + rows * cols,
                                              out.data() + rows * cols + cols, ws.data(), pool);
    kernels::cpu::SoftmaxParams sp;
    sp.outer = 10;
    sp.axis = rows / 10;
    sp.inner = cols;
    std::vector<float> sm(rows * cols);
    kernels::cpu::SoftmaxGrad(sp, dy.data(), x.data(), sm.data(), pool);
    out.insert(out.end(), sm.begin(), sm.end());
    return out;
  };
  ThreadPool one(1), three(3), four(4);
  const std::vector<float> a = run(nullptr), b = run(&one), c = run(&three), d = run(&four);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(b.data(), c.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(c.data(), d.data(), a.size() * sizeof(float)), 0);
  // And the sums are right: dBias[c] = sum over rows of dy.
  for (int64_t col = 0; col < cols; ++col) {
    double want = 0;
    for (int64_t r = 0; r < rows; ++r) want += dy[r * cols + col];
    EXPECT_NEAR(c[rows * cols + cols + col], want, 1e-4) << col;
  }
}

}  // namespace
}  // namespace cleave::testing
