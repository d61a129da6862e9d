// Op tests for matrix products and normalisation (tests/): MatMul, Gemm, FusedMatMul,
// Softmax, LogSoftmax and LayerNormalization through OpTester. Expected values are either
// worked out by hand (noted beside them) or computed by the naive loops below, written
// from the op definitions in double precision, independently of the kernels.
#include <cmath>
#include <ostream>
#include <sstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

// ---- MatMul ------------------------------------------------------------------------------

TEST(NnMatMulTest, TwoD) {
  // [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] = [[1+3, 2+3], [4+6, 5+6]]
  OpTester("MatMul", 13)
      .Input<float>("A", {2, 3}, {1, 2, 3, 4, 5, 6})
      .Input<float>("B", {3, 2}, {1, 0, 0, 1, 1, 1})
      .Output<float>("Y", {2, 2}, {4, 5, 10, 11})
      .Run();
}

TEST(NnMatMulTest, OneDOperandsDropTheirDim) {
  const std::vector<float> b = {1, 0, 0, 1, 1, 1};
  // [1,2,3] @ B = [1+3, 2+3]: A's prepended 1 is dropped.
  OpTester("MatMul", 13).Input<float>("A", {3}, {1, 2, 3}).Input<float>("B", {3, 2}, b)
      .Output<float>("Y", {2}, {4, 5}).Run();
  // A @ [1,1,1] = row sums [6, 15]: B's appended 1 is dropped.
  OpTester("MatMul", 13).Input<float>("A", {2, 3}, {1, 2, 3, 4, 5, 6})
      .Input<float>("B", {3}, {1, 1, 1}).Output<float>("Y", {2}, {6, 15}).Run();
  // Dot product 1*4 + 2*5 + 3*6 = 32 as a scalar.
  OpTester("MatMul", 13).Input<float>("A", {3}, {1, 2, 3}).Input<float>("B", {3}, {4, 5, 6})
      .Output<float>("Y", {}, {32}).Run();
  // A 1-D A against a batched B: [K] @ [2, K, N] -> [2, N].
  OpTester("MatMul", 13).Input<float>("A", {2}, {1, 2})
      .Input<float>("B", {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8})
      .Output<float>("Y", {2, 2}, {7, 10, 19, 22}).Run();
}

struct MatMulCase {
  I64 a, b;
};
void PrintTo(const MatMulCase& c, std::ostream* os) { *os << "A" << c.a << " B" << c.b; }

class NnMatMulBroadcastTest : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(NnMatMulBroadcastTest, Float32MatchesNaive) {
  const MatMulCase& c = GetParam();
  std::vector<double> a = Values(Numel(c.a), 1), b = Values(Numel(c.b), 2);
  I64 yd;
  std::vector<double> y = NaiveMatMul(a, c.a, b, c.b, &yd);
  OpTester("MatMul", 13).Input<float>("A", c.a, Cast<float>(a)).Input<float>("B", c.b, Cast<float>(b))
      .Output<float>("Y", yd, Cast<float>(y)).Tolerance(1e-4, 1e-4).Run();
}

TEST_P(NnMatMulBroadcastTest, Float64AndIntegersMatchNaive) {
  const MatMulCase& c = GetParam();
  std::vector<double> a = Values(Numel(c.a), 3), b = Values(Numel(c.b), 4);
  I64 yd;
  std::vector<double> y = NaiveMatMul(a, c.a, b, c.b, &yd);
  OpTester("MatMul", 13).Input<double>("A", c.a, a).Input<double>("B", c.b, b)
      .Output<double>("Y", yd, y).Tolerance(1e-12, 1e-12).Run();
  std::vector<double> ai = Ints(Numel(c.a), 5), bi = Ints(Numel(c.b), 6);
  std::vector<double> yi = NaiveMatMul(ai, c.a, bi, c.b, &yd);
  OpTester("MatMul", 13).Input<int64_t>("A", c.a, Cast<int64_t>(ai))
      .Input<int64_t>("B", c.b, Cast<int64_t>(bi)).Output<int64_t>("Y", yd, Cast<int64_t>(yi)).Run();
  OpTester("MatMul", 13).Input<int32_t>("A", c.a, Cast<int32_t>(ai))
      .Input<int32_t>("B", c.b, Cast<int32_t>(bi)).Output<int32_t>("Y", yd, Cast<int32_t>(yi)).Run();
}

INSTANTIATE_TEST_SUITE_P(
    NnShapes, NnMatMulBroadcastTest,
    ::testing::Values(MatMulCase{{2, 3, 4}, {4, 5}},              // B shared: batch folds into M
                      MatMulCase{{4}, {2, 4, 3}},                 // 1-D A, batched B
                      MatMulCase{{2, 3, 4}, {4}},                 // batched A, 1-D B
                      MatMulCase{{2, 1, 3, 4}, {3, 4, 2}},        // A broadcast over dim 1
                      MatMulCase{{3, 1, 4, 5}, {1, 2, 5, 6}},     // both broadcast
                      MatMulCase{{2, 3, 4, 5}, {2, 3, 5, 4}},     // attention scores
                      MatMulCase{{1, 5}, {3, 5, 2}},              // 2-D A shared by the batch
                      MatMulCase{{2, 3, 0}, {0, 4}},              // K = 0 gives zeros
                      MatMulCase{{2, 40, 70}, {2, 70, 90}}));     // above the small-GEMM split

TEST(NnMatMulTest, LargeBatchesUseTheThreadedPaths) {
  // 2*256*128*256 = 16.8 MFLOP per product: each product goes to threaded sgemm.
  const I64 ad = {2, 256, 128}, bd = {2, 128, 256};
  std::vector<double> a = Values(Numel(ad), 7), b = Values(Numel(bd), 8);
  I64 yd;
  std::vector<double> y = NaiveMatMul(a, ad, b, bd, &yd);
  OpTester("MatMul", 13).Input<float>("A", ad, Cast<float>(a)).Input<float>("B", bd, Cast<float>(b))
      .Output<float>("Y", yd, Cast<float>(y)).Tolerance(1e-4, 1e-4).Run();
}

TEST(NnMatMulTest, MismatchedInnerDimsFail) {
  OpTester("MatMul", 13).Input<float>("A", {2, 3}, Cast<float>(Values(6, 1)))
      .Input<float>("B", {4, 2}, Cast<float>(Values(8, 2))).UncheckedOutput("Y")
      .ExpectFailure("inner dims differ").Run();
  OpTester("MatMul", 13).Input<float>("A", {2, 2, 3}, Cast<float>(Values(12, 1)))
      .Input<float>("B", {3, 3, 2}, Cast<float>(Values(18, 2))).UncheckedOutput("Y")
      .ExpectFailure("cannot broadcast").Run();
}

// ---- Gemm ----------------------------------------------------------------------------------

struct GemmCase {
  bool ta, tb;
  float alpha, beta;
  I64 c;  // empty: no C
};
void PrintTo(const GemmCase& g, std::ostream* os) {
  *os << "transA " << g.ta << " transB " << g.tb << " alpha " << g.alpha << " beta " << g.beta
      << " C" << g.c;
}

class NnGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(NnGemmTest, MatchesNaive) {
  const GemmCase& g = GetParam();
  const int64_t M = 3, N = 4, K = 5;
  const I64 ad = g.ta ? I64{K, M} : I64{M, K}, bd = g.tb ? I64{N, K} : I64{K, N};
  std::vector<double> a = Values(M * K, 11), b = Values(K * N, 12), c = Values(Numel(g.c), 13);
  std::vector<double> y(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += (g.ta ? a[k * M + m] : a[m * K + k]) * (g.tb ? b[n * K + k] : b[k * N + n]);
      double cv = 0;
      if (!g.c.empty()) {  // unidirectional broadcast of C to [M, N]
        const int64_t cr = g.c.size() == 2 ? g.c[0] : 1, cc = g.c.empty() ? 1 : g.c.back();
        cv = c[(cr == 1 ? 0 : m) * cc + (cc == 1 ? 0 : n)];
      }
      y[m * N + n] = g.alpha * s + g.beta * cv;
    }
  for (bool f64 : {false, true}) {
    OpTester t("Gemm", 13);
    t.Attr("transA", int64_t{g.ta}).Attr("transB", int64_t{g.tb}).Attr("alpha", g.alpha)
        .Attr("beta", g.beta);
    if (f64) t.Input<double>("A", ad, a).Input<double>("B", bd, b);
    else t.Input<float>("A", ad, Cast<float>(a)).Input<float>("B", bd, Cast<float>(b));
    if (!g.c.empty()) {
      if (f64) t.Input<double>("C", g.c, c);
      else t.Input<float>("C", g.c, Cast<float>(c));
    }
    if (f64) t.Output<double>("Y", {M, N}, y).Tolerance(1e-12, 1e-12);
    else t.Output<float>("Y", {M, N}, Cast<float>(y));
    t.Run();
  }
}

INSTANTIATE_TEST_SUITE_P(NnAttrs, NnGemmTest,
                         ::testing::Values(GemmCase{false, false, 1.f, 1.f, {}},
                                           GemmCase{true, false, 0.5f, 1.f, {3, 4}},
                                           GemmCase{false, true, 1.f, 2.f, {4}},
                                           GemmCase{true, true, 2.f, -1.f, {3, 1}},
                                           GemmCase{false, false, 1.f, 0.25f, {1}},
                                           GemmCase{false, true, 1.f, 3.f, {}},
                                           GemmCase{true, false, 1.f, 0.f, {3, 4}}));

TEST(NnGemmTest, ScalarCAndBadC) {
  // [[1,2],[3,4]] @ I + 10 * 0.5 = [[6,7],[8,9]] with a 0-D C.
  OpTester("Gemm", 13).Attr("beta", 0.5f).Input<float>("A", {2, 2}, {1, 2, 3, 4})
      .Input<float>("B", {2, 2}, {1, 0, 0, 1}).Input<float>("C", {}, {10})
      .Output<float>("Y", {2, 2}, {6, 7, 8, 9}).Run();
  OpTester("Gemm", 13).Input<float>("A", {2, 2}, {1, 2, 3, 4}).Input<float>("B", {2, 2}, {1, 0, 0, 1})
      .Input<float>("C", {3}, {1, 2, 3}).UncheckedOutput("Y").ExpectFailure("does not broadcast").Run();
}

// ---- FusedMatMul ----------------------------------------------------------------------------

double GeluErf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double GeluTanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST(NnFusedMatMulTest, BiasAndActivationsMatchNaive) {
  const I64 ad = {2, 3, 8}, bd = {8, 6};
  const I64 btd = {6, 8};  // the same B transposed, for transB = 1
  std::vector<double> a = Values(Numel(ad), 21), b = Values(Numel(bd), 22), bias = Values(6, 23);
  for (double& v : a) v *= 3;  // spread the pre-activations over GELU's curved region
  std::vector<double> bt(b.size());
  for (int64_t k = 0; k < 8; ++k)
    for (int64_t n = 0; n < 6; ++n) bt[n * 8 + k] = b[k * 6 + n];
  I64 yd;
  const std::vector<double> mm = NaiveMatMul(a, ad, b, bd, &yd);
  for (const char* act : {"", "gelu", "gelu_tanh"}) {
    for (bool with_bias : {false, true}) {
      for (bool trans_b : {false, true}) {
        std::vector<double> y = mm;
        for (size_t i = 0; i < y.size(); ++i) {
          double v = y[i] + (with_bias ? bias[i % 6] : 0.0);
          y[i] = act == std::string("gelu") ? GeluErf(v) : act == std::string("gelu_tanh") ? GeluTanh(v) : v;
        }
        for (bool f64 : {false, true}) {
          OpTester t("FusedMatMul", 1, "ai.cleave");
          t.Attr("activation", std::string(act)).Attr("transB", int64_t{trans_b});
          const I64& bdims = trans_b ? btd : bd;
          const std::vector<double>& bv = trans_b ? bt : b;
          if (f64) t.Input<double>("A", ad, a).Input<double>("B", bdims, bv);
          else t.Input<float>("A", ad, Cast<float>(a)).Input<float>("B", bdims, Cast<float>(bv));
          if (with_bias) {
            if (f64) t.Input<double>("bias", {6}, bias);
            else t.Input<float>("bias", {6}, Cast<float>(bias));
          }
          if (f64) t.Output<double>("Y", yd, y).Tolerance(1e-12, 1e-12);
          else t.Output<float>("Y", yd, Cast<float>(y)).Tolerance(1e-5, 1e-4);
          SCOPED_TRACE(::testing::Message() << "act '" << act << "' bias " << with_bias << " transB "
                                          << trans_b << " f64 " << f64);
          t.Run();
        }
      }
    }
  }
}

TEST(NnFusedMatMulTest, RejectsUnknownActivationAndBadBias) {
  OpTester("FusedMatMul", 1, "ai.cleave").Attr("activation", std::string("relu"))
      .Input<float>("A", {2, 2}, {1, 2, 3, 4}).Input<float>("B", {2, 2}, {1, 0, 0, 1})
      .UncheckedOutput("Y").ExpectFailure("expected activation").Run();
  OpTester("FusedMatMul", 1, "ai.cleave").Input<float>("A", {2, 2}, {1, 2, 3, 4})
      .Input<float>("B", {2, 2}, {1, 0, 0, 1}).Input<float>("bias", {3}, {1, 2, 3})
      .UncheckedOutput("Y").ExpectFailure("bias").Run();
}

// ---- Softmax and LogSoftmax -------------------------------------------------------------------

TEST(NnSoftmaxTest, HandValues) {
  // softmax([1,2,3]) = [e^-2, e^-1, 1] / (e^-2 + e^-1 + 1); log of it is x - 3 - log(1.5032147).
  OpTester("Softmax", 13).Input<float>("X", {2, 3}, {1, 2, 3, 1001, 1002, 1003})
      .Output<float>("Y", {2, 3}, {0.09003057f, 0.24472847f, 0.66524096f, 0.09003057f, 0.24472847f, 0.66524096f})
      .Run();
  OpTester("LogSoftmax", 13).Input<float>("X", {2, 3}, {1, 2, 3, -1000, -999, -998})
      .Output<float>("Y", {2, 3}, {-2.40760596f, -1.40760596f, -0.40760596f, -2.40760596f, -1.40760596f, -0.40760596f})
      .Run();
}

struct SoftmaxCase {
  int opset;
  I64 dims;
  int64_t axis;  // INT64_MIN: attribute omitted
  int64_t outer, n, inner;  // the view the case means, for the naive reference
};
void PrintTo(const SoftmaxCase& c, std::ostream* os) {
  *os << "opset " << c.opset << " X" << c.dims << " axis "
      << (c.axis == INT64_MIN ? std::string("default") : std::to_string(c.axis));
}

class NnSoftmaxAxisTest : public ::testing::TestWithParam<SoftmaxCase> {};

TEST_P(NnSoftmaxAxisTest, MatchesNaive) {
  const SoftmaxCase& c = GetParam();
  std::vector<double> x = Values(Numel(c.dims), 31);
  for (double& v : x) v *= 8;
  for (bool log : {false, true}) {
    std::vector<double> y = NaiveSoftmax(x, c.outer, c.n, c.inner, log);
    for (bool f64 : {false, true}) {
      OpTester t(log ? "LogSoftmax" : "Softmax", c.opset);
      if (c.axis != INT64_MIN) t.Attr("axis", c.axis);
      if (f64) t.Input<double>("X", c.dims, x).Output<double>("Y", c.dims, y).Tolerance(1e-12, 1e-12);
      else t.Input<float>("X", c.dims, Cast<float>(x)).Output<float>("Y", c.dims, Cast<float>(y));
      SCOPED_TRACE(::testing::Message() << "log " << log << " f64 " << f64);
      t.Run();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    NnAxes, NnSoftmaxAxisTest,
    ::testing::Values(
        SoftmaxCase{13, {2, 3, 4}, INT64_MIN, 6, 4, 1},  // v13 default: last axis
        SoftmaxCase{13, {2, 3, 4}, 1, 2, 3, 4},          // v13: only the middle axis
        SoftmaxCase{13, {2, 3, 4}, -3, 1, 2, 12},        // v13: negative axis 0
        SoftmaxCase{11, {2, 3, 4}, INT64_MIN, 2, 12, 1}, // v11 default 1: flattens [3, 4]
        SoftmaxCase{11, {2, 3, 4}, 2, 6, 4, 1},
        SoftmaxCase{1, {2, 3, 4}, 0, 1, 24, 1},          // v1: all elements as one row
        SoftmaxCase{13, {2, 5, 300}, 1, 2, 5, 300},      // inner > one column block
        SoftmaxCase{13, {3, 1000}, -1, 3, 1000, 1}));    // long rows

TEST(NnSoftmaxTest, AxisOutOfRangeFails) {
  OpTester("Softmax", 13).Attr("axis", int64_t{2}).Input<float>("X", {2, 3}, {1, 2, 3, 4, 5, 6})
      .UncheckedOutput("Y").ExpectFailure("out of range").Run();
}

// ---- LayerNormalization -----------------------------------------------------------------------

TEST(NnLayerNormTest, HandValuesWithStatistics) {
  // Row [1,2,3]: mean 2, var 2/3, inv_std = 1/sqrt(2/3 + 1e-5) = 1.2247357;
  // normalised [-1.2247357, 0, 1.2247357], then * [1, 2, 0.5] + [0, 1, -1].
  // Row [2,2,2]: var 0, inv_std = 1/sqrt(1e-5) = 316.22777; normalised zeros -> bias.
  OpTester("LayerNormalization", 17)
      .Input<float>("X", {2, 3}, {1, 2, 3, 2, 2, 2})
      .Input<float>("Scale", {3}, {1, 2, 0.5f})
      .Input<float>("B", {3}, {0, 1, -1})
      .Output<float>("Y", {2, 3}, {-1.2247357f, 1, -0.38763215f, 0, 1, -1})
      .Output<float>("Mean", {2, 1}, {2, 2})
      .Output<float>("InvStdDev", {2, 1}, {1.2247357f, 316.22777f})
      .Run();
}

TEST(NnLayerNormTest, LargeOffsetKeepsPrecision) {
  // 10001, 10002, 10003 are exact in float; the result must equal that of [1,2,3].
  OpTester("LayerNormalization", 17).Attr("epsilon", 0.f)
      .Input<float>("X", {1, 3}, {10001, 10002, 10003}).Input<float>("Scale", {3}, {1, 1, 1})
      .Output<float>("Y", {1, 3}, {-1.2247449f, 0, 1.2247449f}).Run();
}

TEST(NnLayerNormTest, AxesAndBroadcastScaleMatchNaive) {
  const I64 xd = {2, 3, 4};
  std::vector<double> x = Values(24, 41);
  for (int64_t axis : {0, 1, -1, 2}) {
    const int a = axis < 0 ? axis + 3 : axis;
    const int64_t rows = Numel(I64(xd.begin(), xd.begin() + a)), cols = 24 / rows;
    I64 sd(xd.begin() + a, xd.end()), stat = xd;
    for (int k = a; k < 3; ++k) stat[k] = 1;
    std::vector<double> scale = Values(cols, 42), bias = Values(cols, 43), mean, inv;
    std::vector<double> y = NaiveLayerNorm(x, rows, cols, scale, bias, 1e-5, &mean, &inv);
    for (const char* domain : {"", "ai.cleave"}) {
      OpTester t("LayerNormalization", domain[0] ? 1 : 17, domain);
      t.Attr("axis", axis).Input<double>("X", xd, x).Input<double>("Scale", sd, scale)
          .Input<double>("B", sd, bias).Output<double>("Y", xd, y).Tolerance(1e-9, 1e-7)
          .Output<float>("Mean", stat, Cast<float>(mean)).Output<float>("InvStdDev", stat, Cast<float>(inv));
      t.Run();
    }
  }
  // Scale [4] broadcast over the normalised [3, 4] at axis 1, no bias, Mean omitted.
  std::vector<double> s4 = Values(4, 44), scale(12), mean, inv;
  for (int i = 0; i < 12; ++i) scale[i] = s4[i % 4];
  std::vector<double> y = NaiveLayerNorm(x, 2, 12, scale, {}, 1e-3, &mean, &inv);
  OpTester("LayerNormalization", 17).Attr("axis", int64_t{1}).Attr("epsilon", 1e-3f)
      .Input<float>("X", xd, Cast<float>(x)).Input<float>("Scale", {4}, Cast<float>(s4))
      .Output<float>("Y", xd, Cast<float>(y)).OmittedOutput()
      .Output<float>("InvStdDev", {2, 1, 1}, Cast<float>(inv)).Run();
}

TEST(NnLayerNormTest, BadScaleFails) {
  OpTester("LayerNormalization", 17).Input<float>("X", {2, 3}, {1, 2, 3, 4, 5, 6})
      .Input<float>("Scale", {2}, {1, 1}).UncheckedOutput("Y").ExpectFailure("does not broadcast").Run();
}

// Dropout before version 12 (ratio as an attribute) is the identity at inference, and its
// version-7 mask has the input's type while the version-10 mask is bool.
TEST(NnDropoutTest, LegacyVersionsAreIdentity) {
  std::vector<float> x = {1.f, -2.f, 3.f, 0.5f};
  OpTester("Dropout", 7).Attr("ratio", 0.3f).Input<float>("x", {2, 2}, x)
      .Output<float>("y", {2, 2}, x).Output<float>("mask", {2, 2}, {1.f, 1.f, 1.f, 1.f}).Run();
  OpTester("Dropout", 10).Attr("ratio", 0.3f).Input<float>("x", {4}, x)
      .Output<float>("y", {4}, x).Output<bool>("mask", {4}, {true, true, true, true}).Run();
}

// ---- Conv -----------------------------------------------------------------------------------

// The ONNX definition written out directly (no patches, no products): y[n, m, o] = b[m] + sum over
// the group's channels and the kernel of x at o * stride - pad + k * dilation (0 outside).
std::vector<double> NaiveConv2d(const std::vector<double>& x, const I64& xd, const std::vector<double>& w,
                                const I64& wd, const std::vector<double>& b, int64_t group, I64 stride, I64 pad,
                                I64 dil, I64* out) {
  const int64_t N = xd[0], C = xd[1], H = xd[2], W = xd[3], M = wd[0], Cg = wd[1], KH = wd[2], KW = wd[3];
  const int64_t OH = (H + pad[0] + pad[2] - dil[0] * (KH - 1) - 1) / stride[0] + 1;
  const int64_t OW = (W + pad[1] + pad[3] - dil[1] * (KW - 1) - 1) / stride[1] + 1;
  *out = {N, M, OH, OW};
  std::vector<double> y(N * M * OH * OW);
  const int64_t Mg = M / group;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0 : b[m];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * stride[0] - pad[0] + kh * dil[0], iw = ow * stride[1] - pad[1] + kw * dil[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const int64_t ci = (m / Mg) * Cg + c;
                acc += x[((n * C + ci) * H + ih) * W + iw] * w[((m * Cg + c) * KH + kh) * KW + kw];
              }
          y[((n * M + m) * OH + oh) * OW + ow] = acc;
        }
  (void)C;
  return y;
}

TEST(NnConvTest, Float32AndFloat64MatchTheDefinition) {
  struct Case {
    I64 x, w;
    int64_t group;
    I64 stride, pad, dil;
    bool bias;
  };
  const Case cases[] = {
      {{2, 3, 9, 8}, {5, 3, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},
      {{1, 4, 10, 7}, {6, 2, 3, 2}, 2, {2, 1}, {0, 2, 1, 0}, {1, 2}, false},
      // A ViT's patch embedding: stride = kernel, no padding; 64 rows of 48 go through the GEMM.
      {{2, 3, 32, 32}, {16, 3, 4, 4}, 1, {4, 4}, {0, 0, 0, 0}, {1, 1}, true},
      // Depthwise.
      {{1, 4, 6, 6}, {4, 1, 3, 3}, 4, {1, 1}, {1, 1, 1, 1}, {2, 2}, true},
  };
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const std::vector<double> x = Values(Numel(c.x), ++seed), w = Values(Numel(c.w), ++seed);
    const std::vector<double> b = c.bias ? Values(c.w[0], ++seed) : std::vector<double>();
    I64 out;
    const std::vector<double> y = NaiveConv2d(x, c.x, w, c.w, b, c.group, c.stride, c.pad, c.dil, &out);
    for (bool f64 : {false, true}) {
      std::ostringstream what;
      what << "X " << c.x << " W " << c.w << (f64 ? " float64" : " float32");
      SCOPED_TRACE(what.str());
      OpTester t("Conv", 11);
      t.Attr("group", c.group).Attr("strides", c.stride).Attr("pads", c.pad).Attr("dilations", c.dil);
      if (f64) {
        t.Input<double>("x", c.x, x).Input<double>("w", c.w, w);
        if (c.bias) t.Input<double>("b", {c.w[0]}, b);
        t.Output<double>("y", out, y).Tolerance(1e-12, 1e-12).Run();
      } else {
        t.Input<float>("x", c.x, Cast<float>(x)).Input<float>("w", c.w, Cast<float>(w));
        if (c.bias) t.Input<float>("b", {c.w[0]}, Cast<float>(b));
        t.Output<float>("y", out, Cast<float>(y)).Tolerance(1e-5, 1e-4).Run();
      }
    }
  }
}

TEST(NnConvTest, MismatchedChannelsGroupsAndKernelsFail) {
  OpTester("Conv", 11).Input<float>("x", {1, 3, 4, 4}, std::vector<float>(48, 1.f))
      .Input<float>("w", {2, 2, 3, 3}, std::vector<float>(36, 1.f)).UncheckedOutput("y")
      .ExpectFailure("channels").Run();
  OpTester("Conv", 11).Attr("group", int64_t{2}).Input<float>("x", {1, 3, 4, 4}, std::vector<float>(48, 1.f))
      .Input<float>("w", {2, 1, 3, 3}, std::vector<float>(18, 1.f)).UncheckedOutput("y")
      .ExpectFailure("channels").Run();
  OpTester("Conv", 11).Input<float>("x", {1, 1, 2, 2}, std::vector<float>(4, 1.f))
      .Input<float>("w", {1, 1, 3, 3}, std::vector<float>(9, 1.f)).UncheckedOutput("y")
      .ExpectFailure("smaller than the 3 the dilated kernel spans").Run();
}

}  // namespace
}  // namespace cleave::testing
