// The decomposed ops (tests/): Einsum, GroupNormalization, DepthToSpace, SpaceToDepth, OneHot,
// Hardmax, EyeLike, LRN, LpPool, GlobalLpPool, MeanVarianceNormalization, LpNormalization, Col2Im
// and the quantization ops run through sessions, which rewrite them (graph/passes/decomposition.cc),
// against references computed here by their definitions: einsum as a sum over every assignment
// of the labels, group norm over each group's elements, the block moves by the ONNX index
// formulas, LRN's sum over its channel window, each Lp pool window's norm (the ONNX backend
// suites cover Shrink and more cases). Then what the rewrite leaves, symbolic dims carried
// through, and the errors that name the node.
// gradient_check_test.cc checks their gradients by finite differences.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

std::vector<float> Random(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

int64_t Numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Einsum by its definition, for letter-only equations with an explicit output: the sum over
// every assignment of the labels of the product of the operands' elements (a label repeated
// in a term reads its diagonal), an axis of size 1 broadcasting (read at 0).
std::vector<float> NaiveEinsum(const std::string& eq, const std::vector<std::vector<int64_t>>& shapes,
                               const std::vector<std::vector<float>>& data, std::vector<int64_t>* out_dims) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  std::string lhs = eq.substr(0, arrow), out = eq.substr(arrow + 2);
  for (size_t p = 0;;) {
    size_t c = lhs.find(',', p);
    terms.push_back(lhs.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t a = 0; a < terms[i].size(); ++a) size[terms[i][a]] = std::max(size[terms[i][a]], shapes[i][a]);
  out_dims->clear();
  for (char c : out) out_dims->push_back(size[c]);
  std::vector<float> result(static_cast<size_t>(Numel(*out_dims)), 0.f);
  std::vector<char> labels;
  for (const auto& [c, n] : size) labels.push_back(c);
  std::map<char, int64_t> at;
  for (char c : labels) at[c] = 0;
  while (true) {
    double prod = 1;
    for (size_t i = 0; i < terms.size(); ++i) {
      int64_t flat = 0;
      for (size_t a = 0; a < terms[i].size(); ++a)
        flat = flat * shapes[i][a] + (shapes[i][a] == 1 ? 0 : at[terms[i][a]]);
      prod *= data[i][static_cast<size_t>(flat)];
    }
    int64_t o = 0;
    for (size_t a = 0; a < out.size(); ++a) o = o * (*out_dims)[a] + at[out[a]];
    result[static_cast<size_t>(o)] += static_cast<float>(prod);
    size_t k = labels.size();
    while (k > 0 && ++at[labels[k - 1]] == size[labels[k - 1]]) at[labels[--k]] = 0;
    if (k == 0) break;
  }
  return result;
}

struct EinsumCase {
  const char* equation;   // what the node carries
  const char* reference;  // the same in letters, for NaiveEinsum
  std::vector<std::vector<int64_t>> shapes;
};

class EinsumTest : public ::testing::TestWithParam<EinsumCase> {};

// Integer operands: products in int64, a diagonal through an int64 identity.
TEST(EinsumDecomposition, IntegerOperandsAndTheirDiagonal) {
  OpTester("Einsum", 13).Attr("equation", std::string("ii,ij->j"))
      .Input<int64_t>("a", {2, 2}, {2, 9, 9, 3}).Input<int64_t>("b", {2, 3}, {1, 2, 3, 4, 5, 6})
      .Output<int64_t>("y", {3}, {14, 19, 24}).Run();
}

TEST_P(EinsumTest, MatchesTheSumOverEveryLabelAssignment) {
  const EinsumCase& c = GetParam();
  std::vector<std::vector<float>> data;
  OpTester t("Einsum", 13);
  t.Attr("equation", std::string(c.equation));
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    data.push_back(Random(Numel(c.shapes[i]), 7 + static_cast<unsigned>(i)));
    t.Input<float>("in" + std::to_string(i), c.shapes[i], data.back());
  }
  std::vector<int64_t> dims;
  std::vector<float> want = NaiveEinsum(c.reference, c.shapes, data, &dims);
  t.Output<float>("out", dims, want).Run();
}

INSTANTIATE_TEST_SUITE_P(
    Equations, EinsumTest,
    ::testing::Values(EinsumCase{"ij,jk->ik", "ij,jk->ik", {{3, 4}, {4, 5}}},
                      EinsumCase{"ij,jk", "ij,jk->ik", {{3, 4}, {4, 5}}},  // implicit output
                      EinsumCase{"bqhd,bkhd->bhqk", "bqhd,bkhd->bhqk", {{2, 3, 2, 4}, {2, 5, 2, 4}}},
                      EinsumCase{"bhqk,bkhd->bqhd", "bhqk,bkhd->bqhd", {{2, 2, 3, 5}, {2, 5, 2, 4}}},
                      EinsumCase{"i,i->", "i,i->", {{6}, {6}}},
                      EinsumCase{"i,j->ij", "i,j->ij", {{3}, {4}}},
                      EinsumCase{"ij->ji", "ij->ji", {{3, 4}}},
                      EinsumCase{"ijk->", "ijk->", {{2, 3, 4}}},
                      EinsumCase{"ijk,kl,lm->im", "ijk,kl,lm->im", {{2, 3, 4}, {4, 5}, {5, 2}}},
                      EinsumCase{"bn,anm,bm->ba", "bn,anm,bm->ba", {{2, 3}, {4, 3, 5}, {2, 5}}},
                      EinsumCase{"ab,cd->", "ab,cd->", {{2, 3}, {4, 5}}},
                      EinsumCase{"...ij,...jk->...ik", "xyij,yjk->xyik", {{2, 1, 3, 4}, {3, 4, 2}}},
                      EinsumCase{"...ij,...jk", "xyij,yjk->xyik", {{2, 3, 3, 4}, {3, 4, 2}}},
                      EinsumCase{"B i, B i -> B", "Bi,Bi->B", {{3, 5}, {3, 5}}},
                      EinsumCase{"ii->i", "ii->i", {{3, 3}}},  // diagonals
                      EinsumCase{"...ii->...i", "bii->bi", {{2, 3, 3}}},
                      EinsumCase{"ii", "ii->", {{4, 4}}},  // the trace
                      EinsumCase{"iji,jk->ik", "iji,jk->ik", {{3, 4, 3}, {4, 2}}}),
    [](const auto& info) { return "case" + std::to_string(info.index); });

// What the session runs instead: no Einsum, the output keeps its name, one MatMul per product.
TEST(EinsumDecomposition, BecomesOneMatMulPerOperandAfterTheFirst) {
  auto g = graph::ParseGraph(
      "opset 13\ninput a: float32[2,3,4]\ninput b: float32[4,5]\ninput c: float32[5,6]\n"
      "y = Einsum(a, b, c) {equation = \"ijk,kl,lm->im\"}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  graph::OpDecomposition pass;
  auto changed = graph::RunPass(pass, g->get());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  std::map<std::string, int> ops;
  for (const auto& n : (*g)->nodes()) ++ops[n->op_type()];
  EXPECT_EQ(ops.count("Einsum"), 0u);
  EXPECT_EQ(ops["MatMul"], 2);
  EXPECT_EQ(ops["ReduceSum"], 1);  // j, summed before the first product
  ASSERT_EQ((*g)->outputs().size(), 1u);
  EXPECT_EQ((*g)->outputs()[0]->name(), "y");
  EXPECT_EQ((*g)->outputs()[0]->shape().ToString(), "[2,6]");
  EXPECT_FALSE(*graph::RunPass(pass, g->get()));  // nothing left to rewrite
}

// A symbolic batch and sequence are carried through (Reshape copies them, MatMul broadcasts).
TEST(EinsumDecomposition, SymbolicBatchAndSequenceRun) {
  auto g = graph::ParseGraph(
      "opset 13\ninput x: float32[batch,seq,4]\ninit w: float32[4,2] = 1 0 0 1 1 1 -1 2\n"
      "y = Einsum(x, w) {equation = \"btd,dh->bth\"}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<float> x = Random(2 * 3 * 4, 3);
  auto out = (*s)->Run({{"x", Tensor::FromVector<float>(x, {2, 3, 4})}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0].dims(), (std::vector<int64_t>{2, 3, 2}));
  for (int r = 0; r < 6; ++r) {
    const float* xr = &x[static_cast<size_t>(r) * 4];
    EXPECT_NEAR((*out)[0].data<float>()[r * 2], xr[0] + xr[2] - xr[3], 1e-5f);
    EXPECT_NEAR((*out)[0].data<float>()[r * 2 + 1], xr[1] + xr[2] + 2 * xr[3], 1e-5f);
  }
}

TEST(EinsumDecomposition, BadEquationsNameTheNode) {
  OpTester("Einsum", 13)
      .Attr("equation", std::string("ii->i"))
      .Input<float>("a", {2, 3}, Random(6, 1))
      .Output<float>("y", {2}, {1, 4})
      .ExpectFailure("label 'i' has sizes 2 and 3 (input 0's axis 1)")
      .Run();
  OpTester("Einsum", 13)
      .Attr("equation", std::string("ij->ii"))
      .Input<float>("a", {2, 2}, Random(4, 1))
      .Output<float>("y", {2, 2}, Random(4, 1))
      .ExpectFailure("the output term 'ii' repeats 'i'")
      .Run();
  OpTester("Einsum", 13)
      .Attr("equation", std::string("ij,jk->ik"))
      .Input<float>("a", {2, 3}, Random(6, 1))
      .Input<float>("b", {4, 2}, Random(8, 2))
      .Output<float>("y", {2, 2}, {0, 0, 0, 0})
      .ExpectFailure("label 'j' has sizes 3 and 4 (input 1's axis 0)")
      .Run();
  OpTester("Einsum", 13)
      .Attr("equation", std::string("ijk->i"))
      .Input<float>("a", {2, 3}, Random(6, 1))
      .Output<float>("y", {2}, {0, 0})
      .ExpectFailure("names 3 axes; the input has rank 2")
      .Run();
  OpTester("Einsum", 13)
      .Attr("equation", std::string("ij->ik"))
      .Input<float>("a", {2, 3}, Random(6, 1))
      .Output<float>("y", {2, 3}, Random(6, 1))
      .ExpectFailure("names 'k', which no input term has")
      .Run();
  // Two symbolic sizes merged into one axis of a product.
  auto g = graph::ParseGraph(
      "opset 13\ninput a: float32[p,q]\ninput b: float32[p,q,r,s]\n"
      "y = Einsum(a, b) {equation = \"ab,abcd->cd\"}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("Einsum 'y'"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("2 symbolic sizes"), std::string::npos) << s.status();
}

// Group norm by its definition: each group's channels and positions normalised together.
std::vector<float> NaiveGroupNorm(const std::vector<float>& x, int64_t n, int64_t c, int64_t hw, int64_t groups,
                                  const std::vector<float>& scale, const std::vector<float>& bias, bool per_channel,
                                  float eps) {
  std::vector<float> y(x.size());
  const int64_t per = c / groups * hw;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int64_t base = (b * c + gi * (c / groups)) * hw;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < per; ++i) mean += x[static_cast<size_t>(base + i)];
      mean /= static_cast<double>(per);
      for (int64_t i = 0; i < per; ++i) var += std::pow(x[static_cast<size_t>(base + i)] - mean, 2);
      var /= static_cast<double>(per);
      for (int64_t i = 0; i < per; ++i) {
        const int64_t ch = gi * (c / groups) + i / hw;
        const size_t k = per_channel ? static_cast<size_t>(ch) : static_cast<size_t>(gi);
        y[static_cast<size_t>(base + i)] =
            static_cast<float>((x[static_cast<size_t>(base + i)] - mean) / std::sqrt(var + eps) * scale[k] + bias[k]);
      }
    }
  return y;
}

TEST(GroupNormalizationTest, Version18ScalesEachGroup) {
  const std::vector<float> x = Random(2 * 6 * 4, 5), s = {0.5f, 2.f, -1.f}, b = {0.f, 1.f, -0.5f};
  OpTester("GroupNormalization", 18)
      .Attr("num_groups", int64_t{3})
      .Attr("epsilon", 1e-3f)
      .Input<float>("x", {2, 6, 2, 2}, x)
      .Input<float>("scale", {3}, s)
      .Input<float>("bias", {3}, b)
      .Output<float>("y", {2, 6, 2, 2}, NaiveGroupNorm(x, 2, 6, 4, 3, s, b, false, 1e-3f))
      .Run();
}

TEST(GroupNormalizationTest, Version21ScalesEachChannel) {
  const std::vector<float> x = Random(3 * 4 * 5, 6), s = {0.5f, 2.f, -1.f, 1.5f}, b = {0.f, 1.f, -0.5f, 3.f};
  OpTester("GroupNormalization", 21)
      .Attr("num_groups", int64_t{2})
      .Input<float>("x", {3, 4, 5}, x)
      .Input<float>("scale", {4}, s)
      .Input<float>("bias", {4}, b)
      .Output<float>("y", {3, 4, 5}, NaiveGroupNorm(x, 3, 4, 5, 2, s, b, true, 1e-5f))
      .Run();
}

TEST(GroupNormalizationTest, GroupsThatDoNotDivideTheChannelsAreRefused) {
  OpTester("GroupNormalization", 21)
      .Attr("num_groups", int64_t{3})
      .Input<float>("x", {1, 4, 2}, Random(8, 1))
      .Input<float>("scale", {4}, {1, 1, 1, 1})
      .Input<float>("bias", {4}, {0, 0, 0, 0})
      .Output<float>("y", {1, 4, 2}, Random(8, 1))
      .ExpectFailure("X's 4 channels do not divide into num_groups = 3 groups")
      .Run();
  OpTester("GroupNormalization", 18)
      .Attr("num_groups", int64_t{2})
      .Input<float>("x", {1, 4, 2}, Random(8, 1))
      .Input<float>("scale", {4}, {1, 1, 1, 1})
      .Input<float>("bias", {4}, {0, 0, 0, 0})
      .Output<float>("y", {1, 4, 2}, Random(8, 1))
      .ExpectFailure("expected [2] (num_groups)")
      .Run();
}

// DepthToSpace by the ONNX formula: y[n, c, h b + i, w b + j] reads channel
// (i b + j) C' + c (DCR) or c b² + i b + j (CRD), C' = C / b².
std::vector<float> NaiveDepthToSpace(const std::vector<float>& x, int64_t n, int64_t c, int64_t h, int64_t w,
                                     int64_t b, bool crd) {
  const int64_t co = c / (b * b);
  std::vector<float> y(x.size());
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t ci = 0; ci < co; ++ci)
      for (int64_t hi = 0; hi < h * b; ++hi)
        for (int64_t wi = 0; wi < w * b; ++wi) {
          const int64_t i = hi % b, j = wi % b;
          const int64_t src = crd ? ci * b * b + i * b + j : (i * b + j) * co + ci;
          y[static_cast<size_t>(((ni * co + ci) * h * b + hi) * w * b + wi)] =
              x[static_cast<size_t>(((ni * c + src) * h + hi / b) * w + wi / b)];
        }
  return y;
}

TEST(DepthSpaceTest, DepthToSpaceInBothModes) {
  const std::vector<float> x = Random(2 * 8 * 2 * 3, 9);
  for (const char* mode : {"DCR", "CRD"}) {
    OpTester("DepthToSpace", 13)
        .Attr("blocksize", int64_t{2})
        .Attr("mode", std::string(mode))
        .Input<float>("x", {2, 8, 2, 3}, x)
        .Output<float>("y", {2, 2, 4, 6}, NaiveDepthToSpace(x, 2, 8, 2, 3, 2, std::string(mode) == "CRD"))
        .Run();
  }
}

// SpaceToDepth undoes DepthToSpace's DCR mode.
TEST(DepthSpaceTest, SpaceToDepthInvertsDepthToSpace) {
  const std::vector<float> x = Random(1 * 18 * 2 * 2, 4);
  OpTester("SpaceToDepth", 13)
      .Attr("blocksize", int64_t{3})
      .Input<float>("y", {1, 2, 6, 6}, NaiveDepthToSpace(x, 1, 18, 2, 2, 3, false))
      .Output<float>("x", {1, 18, 2, 2}, x)
      .Run();
}

TEST(DepthSpaceTest, IndivisibleDimsAreRefused) {
  OpTester("DepthToSpace", 13)
      .Attr("blocksize", int64_t{2})
      .Input<float>("x", {1, 6, 1, 1}, Random(6, 1))
      .Output<float>("y", {1, 1, 2, 2}, Random(4, 1))
      .ExpectFailure("X's 6 channels are not a multiple of blocksize² = 4")
      .Run();
  OpTester("SpaceToDepth", 13)
      .Attr("blocksize", int64_t{2})
      .Input<float>("x", {1, 1, 3, 4}, Random(12, 1))
      .Output<float>("y", {1, 4, 1, 2}, Random(8, 1))
      .ExpectFailure("X's dim 2 (3) is not a multiple of blocksize 2")
      .Run();
}

// OneHot: a negative index counts from the end, one outside [-depth, depth) gives a row of
// off values; the new axis in the middle; depth a constant or known only at run time.
TEST(OneHotTest, NegativeAndOutOfRangeIndicesAlongAMiddleAxis) {
  // Depth 4: 5 and -5 match nothing. y[i, d, j] = on where idx[i, j] wraps to d.
  const std::vector<float> want = {3, 0, 0,   0, 0, 0,   0, 0, 0,   0, 3, 0,
                                   0, 0, 0,   0, 0, 0,   3, 0, 0,   0, 0, 3};
  for (bool constant : {true, false}) {
    OpTester t("OneHot", 11);
    t.Attr("axis", int64_t{1}).Input<int64_t>("indices", {2, 3}, {0, -1, 5, 2, -5, 3}).Input<float>("depth", {}, {4});
    if (constant) t.AsInitializer();
    t.Input<float>("values", {2}, {0, 3}).Output<float>("y", {2, 4, 3}, want).Run();
  }
}

// Hardmax: version 13 along one axis; before 13 over the dims from the axis on, flattened. Ties
// go to the first.
TEST(HardmaxTest, OneAxisFrom13AndFlattenedBefore) {
  const std::vector<float> x = {1, 4, 4, 2, 0, 5, 5, 1};  // [2, 2, 2]
  OpTester("Hardmax", 13).Attr("axis", int64_t{1}).Input<float>("x", {2, 2, 2}, x)
      .Output<float>("y", {2, 2, 2}, {0, 1, 1, 0, 0, 1, 1, 0}).Run();
  OpTester("Hardmax", 11).Attr("axis", int64_t{1}).Input<float>("x", {2, 2, 2}, x)
      .Output<float>("y", {2, 2, 2}, {0, 1, 0, 0, 0, 1, 0, 0}).Run();
}

TEST(EyeLikeTest, OffDiagonalIntegersAndASymbolicShapeRefused) {
  OpTester("EyeLike", 22).Attr("k", int64_t{-1}).Attr("dtype", int64_t{7}).Input<float>("x", {3, 2}, Random(6, 1))
      .Output<int64_t>("y", {3, 2}, {0, 0, 1, 0, 0, 1}).Run();
  auto g = graph::ParseGraph("opset 22\ninput x: float32[n,3]\ny = EyeLike(x)\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("EyeLike 'y': X's shape [n,3] is not static"), std::string::npos) << s.status();
}

// LRN by its definition: each element over (bias + alpha / size * the sum of squares of the
// `size` channels around it, cut at the ends)^beta.
TEST(LrnTest, MatchesTheDefinitionAtTheChannelEnds) {
  const int64_t n = 2, c = 5, hw = 3, size = 4;
  const float alpha = 0.02f, beta = 0.6f, bias = 1.5f;
  const std::vector<float> x = Random(n * c * hw, 8);
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) {
        double sum = 0;
        for (int64_t q = ch - (size - 1) / 2; q <= ch + size / 2; ++q)
          if (q >= 0 && q < c) sum += std::pow(x[static_cast<size_t>((b * c + q) * hw + p)], 2);
        const size_t i = static_cast<size_t>((b * c + ch) * hw + p);
        y[i] = static_cast<float>(x[i] / std::pow(bias + alpha / size * sum, beta));
      }
  OpTester("LRN", 13).Attr("size", size).Attr("alpha", alpha).Attr("beta", beta).Attr("bias", bias)
      .Input<float>("x", {n, c, hw}, x).Output<float>("y", {n, c, hw}, y).Run();
}

// LpPool over [N, C, H, W] by its definition: each window's (sum of |x|^p)^(1/p), taps in the
// padding or past the input adding nothing; the output sizes as ceil_mode computes them (a last
// window starting in the end padding dropped).
std::vector<float> NaiveLpPool2d(const std::vector<float>& x, int64_t nc, const int64_t in[2], const int64_t k[2],
                                 const int64_t s[2], const int64_t dil[2], const int64_t pb[2], const int64_t pe[2],
                                 double p, int64_t out[2]) {
  for (int d = 0; d < 2; ++d) {
    const int64_t span = in[d] + pb[d] + pe[d] - dil[d] * (k[d] - 1) - 1;
    out[d] = (span + s[d] - 1) / s[d] + 1;
    if ((out[d] - 1) * s[d] >= in[d] + pb[d]) --out[d];
  }
  std::vector<float> y;
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t oh = 0; oh < out[0]; ++oh)
      for (int64_t ow = 0; ow < out[1]; ++ow) {
        double sum = 0;
        for (int64_t i = 0; i < k[0]; ++i)
          for (int64_t j = 0; j < k[1]; ++j) {
            const int64_t h = oh * s[0] - pb[0] + i * dil[0], w = ow * s[1] - pb[1] + j * dil[1];
            if (h >= 0 && h < in[0] && w >= 0 && w < in[1])
              sum += std::pow(std::fabs(x[static_cast<size_t>((c * in[0] + h) * in[1] + w)]), p);
          }
        y.push_back(static_cast<float>(std::pow(sum, 1 / p)));
      }
  return y;
}

TEST(LpPoolTest, CeilModeDilationsPadsAndStrides) {
  const int64_t in[2] = {6, 7}, k[2] = {2, 3}, s[2] = {2, 2}, dil[2] = {1, 2}, pb[2] = {1, 0}, pe[2] = {0, 1};
  const std::vector<float> x = Random(2 * 6 * 7, 9);
  for (const double p : {1.0, 2.0, 3.0}) {
    int64_t out[2];
    const std::vector<float> y = NaiveLpPool2d(x, 2, in, k, s, dil, pb, pe, p, out);
    ASSERT_EQ(out[0], 4);  // ceil_mode adds a row and a column
    ASSERT_EQ(out[1], 3);
    OpTester("LpPool", 18)
        .Attr("kernel_shape", std::vector<int64_t>{2, 3})
        .Attr("strides", std::vector<int64_t>{2, 2})
        .Attr("dilations", std::vector<int64_t>{1, 2})
        .Attr("pads", std::vector<int64_t>{1, 0, 0, 1})
        .Attr("ceil_mode", int64_t{1})
        .Attr("p", static_cast<int64_t>(p))
        .Input<float>("x", {1, 2, 6, 7}, x)
        .Output<float>("y", {1, 2, 4, 3}, y)
        .Run();
  }
}

TEST(LpPoolTest, GlobalLpPoolOverEverySpatialDim) {
  const std::vector<float> x = Random(2 * 3 * 4 * 2, 10);
  for (const int64_t p : {1, 3}) {
    std::vector<float> y;
    for (int64_t c = 0; c < 6; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < 8; ++i) sum += std::pow(std::fabs(x[static_cast<size_t>(c * 8 + i)]), p);
      y.push_back(static_cast<float>(std::pow(sum, 1.0 / p)));
    }
    OpTester("GlobalLpPool", 13).Attr("p", p).Input<float>("x", {2, 3, 4, 2}, x).Output<float>("y", {2, 3, 1, 1}, y).Run();
  }
}

TEST(LpPoolTest, SymbolicSpatialDimsRunAndBadPIsRefused) {
  auto g = graph::ParseGraph(
      "opset 18\ninput x: float32[n,2,h,w]\n"
      "y = LpPool(x) {kernel_shape = [3, 3], auto_pad = \"SAME_UPPER\", p = 2}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<float> x = Random(2 * 3 * 4, 11);
  auto out = (*s)->Run({{"x", Tensor::FromVector<float>(x, {1, 2, 3, 4})}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0].dims(), (std::vector<int64_t>{1, 2, 3, 4}));
  // SAME_UPPER with a 3x3 window: the window centred on each element; the corner's 2x2.
  double corner = 0;
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j) corner += std::pow(x[static_cast<size_t>(i * 4 + j)], 2);
  EXPECT_NEAR((*out)[0].data<float>()[0], std::sqrt(corner), 1e-5);
  OpTester("LpPool", 18)
      .Attr("kernel_shape", std::vector<int64_t>{2})
      .Attr("p", int64_t{0})
      .Input<float>("x", {1, 1, 4}, Random(4, 1))
      .Output<float>("y", {1, 1, 3}, Random(3, 1))
      .ExpectFailure("p is 0; expected p >= 1")
      .Run();
}

TEST(NormalizationTest, MeanVarianceNormalizationOverGivenAxes) {
  // X [2, 3, 4] normalised over axes 0 and 2: each of the 3 channels over its 8 elements.
  const std::vector<float> x = Random(24, 12);
  std::vector<float> y(24);
  for (int64_t c = 0; c < 3; ++c) {
    double mean = 0, var = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t k = 0; k < 4; ++k) mean += x[static_cast<size_t>((b * 3 + c) * 4 + k)] / 8.0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t k = 0; k < 4; ++k) var += std::pow(x[static_cast<size_t>((b * 3 + c) * 4 + k)] - mean, 2) / 8.0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t k = 0; k < 4; ++k) {
        const size_t i = static_cast<size_t>((b * 3 + c) * 4 + k);
        y[i] = static_cast<float>((x[i] - mean) / (std::sqrt(var) + 1e-9));
      }
  }
  OpTester("MeanVarianceNormalization", 13)
      .Attr("axes", std::vector<int64_t>{0, -1})
      .Input<float>("x", {2, 3, 4}, x)
      .Output<float>("y", {2, 3, 4}, y)
      .Run();
}

TEST(NormalizationTest, LpNormalizationL1L2AndAZeroLine) {
  // Rows of [3, 2, 2] along axis 1; the second line along axis 1 of batch 1 is all zeros.
  std::vector<float> x = Random(12, 13);
  x[5] = x[7] = 0;  // batch 1, column 1
  for (const int64_t p : {1, 2}) {
    std::vector<float> y(12);
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t k = 0; k < 2; ++k) {
        double norm = 0;
        for (int64_t j = 0; j < 2; ++j) {
          const double v = x[static_cast<size_t>((b * 2 + j) * 2 + k)];
          norm += p == 1 ? std::fabs(v) : v * v;
        }
        if (p == 2) norm = std::sqrt(norm);
        for (int64_t j = 0; j < 2; ++j) {
          const size_t i = static_cast<size_t>((b * 2 + j) * 2 + k);
          y[i] = norm == 0 ? 0.f : static_cast<float>(x[i] / norm);
        }
      }
    OpTester("LpNormalization", 13)
        .Attr("axis", int64_t{1})
        .Attr("p", p)
        .Input<float>("x", {3, 2, 2}, x)
        .Output<float>("y", {3, 2, 2}, y)
        .Run();
  }
  OpTester("LpNormalization", 13)
      .Attr("p", int64_t{3})
      .Input<float>("x", {2, 2}, Random(4, 1))
      .Output<float>("y", {2, 2}, Random(4, 1))
      .ExpectFailure("p is 3; expected 1 or 2")
      .Run();
}

// ReverseSequence batch-major over a symbolic time dim with trailing dims: each row's first len
// steps reversed, the rest kept.
TEST(LayoutOpsTest, ReverseSequenceBatchMajorSymbolicTime) {
  auto g = graph::ParseGraph(
      "opset 13\ninput x: float32[3,t,2]\ninput l: int64[3]\n"
      "y = ReverseSequence(x, l) {batch_axis = 0, time_axis = 1}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<float> x = Random(3 * 4 * 2, 14);
  const std::vector<int64_t> lens = {4, 1, 3};
  auto out = (*s)->Run({{"x", Tensor::FromVector<float>(x, {3, 4, 2})}, {"l", Tensor::FromVector<int64_t>(lens, {3})}});
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t k = 0; k < 2; ++k) {
        const int64_t src = t < lens[b] ? lens[b] - 1 - t : t;
        EXPECT_EQ((*out)[0].data<float>()[(b * 4 + t) * 2 + k], x[static_cast<size_t>((b * 4 + src) * 2 + k)])
            << b << "," << t << "," << k;
      }
}

// MaxUnpool inverts a strided, padded MaxPool over several images and channels (its indices
// address the flattened tensor), zeros elsewhere; a larger output_shape pads zeros after.
TEST(LayoutOpsTest, MaxUnpoolPlacesEachMaximumWhereMaxPoolFoundIt) {
  auto g = graph::ParseGraph(R"(
    opset 13
    input x: float32[2,2,5,5]
    init big: int64[4] = 2 2 7 6
    m, i = MaxPool(x) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]}
    u = MaxUnpool(m, i) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]}
    v = MaxUnpool(m, i, big) {kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]}
    output m
    output i
    output u
    output v
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<float> x = Random(100, 15);
  auto out = (*s)->Run({{"x", Tensor::FromVector<float>(x, {2, 2, 5, 5})}});
  ASSERT_TRUE(out.ok()) << out.status();
  const Tensor &m = (*out)[0], &idx = (*out)[1], &u = (*out)[2], &v = (*out)[3];
  ASSERT_EQ(u.dims(), (std::vector<int64_t>{2, 2, 5, 5}));  // (3 - 1) * 2 - 2 + 3
  ASSERT_EQ(v.dims(), (std::vector<int64_t>{2, 2, 7, 6}));
  std::vector<float> want(100, 0.f);
  for (int64_t k = 0; k < m.numel(); ++k) want[static_cast<size_t>(idx.data<int64_t>()[k])] = m.data<float>()[k];
  int placed = 0;
  for (int64_t k = 0; k < 100; ++k) {
    EXPECT_EQ(u.data<float>()[k], want[static_cast<size_t>(k)]) << k;
    placed += want[static_cast<size_t>(k)] != 0.f;
  }
  EXPECT_GT(placed, 8);  // several images' and channels' maxima, not only the first plane's
  for (int64_t k = 0; k < v.numel(); ++k) {
    const int64_t w = k % 6, h = k / 6 % 7, plane = k / 42;
    const float expect = h < 5 && w < 5 ? want[static_cast<size_t>(plane * 25 + h * 5 + w)] : 0.f;
    EXPECT_EQ(v.data<float>()[k], expect) << k;
  }
}

TEST(LayoutOpsTest, WindowsOfAConstantSizeInFloat64) {
  std::vector<double> hann(5), blackman(5);
  for (int n = 0; n < 5; ++n) {
    hann[static_cast<size_t>(n)] = 0.5 - 0.5 * std::cos(2 * M_PI * n / 4);  // symmetric: N = size - 1
    blackman[static_cast<size_t>(n)] = 0.42 - 0.5 * std::cos(2 * M_PI * n / 5) + 0.08 * std::cos(4 * M_PI * n / 5);
  }
  OpTester("HannWindow", 17).Attr("periodic", int64_t{0}).Attr("output_datatype", int64_t{11})
      .Input<int64_t>("size", {}, {5}).AsInitializer().Output<double>("y", {5}, hann).Tolerance(1e-12, 1e-12).Run();
  OpTester("BlackmanWindow", 17).Attr("output_datatype", int64_t{11})
      .Input<int32_t>("size", {}, {5}).Output<double>("y", {5}, blackman).Tolerance(1e-12, 1e-12).Run();
}

// Ties round to even, the zero point shifts, and the type's range saturates.
// Col2Im against its definition: each column element (c, kernel offset k, block position l)
// added at l * stride + k * dilation - pad_begin where that falls inside the image; 1-D to 3-D,
// with strides, dilations and pads together, and a column count that disagrees refused.
TEST(LayoutOpsTest, Col2ImAddsEachColumnAtItsBlockPosition) {
  struct Case {
    std::vector<int64_t> image, block, strides, dilations, pads;
    int64_t n, c;
  };
  const Case cases[] = {{{9}, {3}, {2}, {2}, {1, 2}, 2, 3},
                        {{5, 6}, {2, 3}, {1, 2}, {2, 1}, {0, 1, 2, 0}, 1, 2},
                        {{3, 4, 3}, {2, 2, 2}, {1, 1, 2}, {1, 2, 1}, {1, 0, 0, 0, 1, 1}, 2, 1}};
  for (const Case& t : cases) {
    const size_t r = t.image.size();
    std::vector<int64_t> positions;
    int64_t k = 1, l = 1;
    for (size_t d = 0; d < r; ++d) {
      positions.push_back((t.image[d] + t.pads[d] + t.pads[r + d] - t.dilations[d] * (t.block[d] - 1) - 1) /
                              t.strides[d] + 1);
      k *= t.block[d];
      l *= positions.back();
    }
    const std::vector<float> cols = Random(t.n * t.c * k * l, 17);
    std::vector<int64_t> ydims = {t.n, t.c};
    ydims.insert(ydims.end(), t.image.begin(), t.image.end());
    std::vector<float> want(static_cast<size_t>(Numel(ydims)), 0.f);
    for (int64_t b = 0; b < t.n * t.c; ++b) {
      for (int64_t kk = 0; kk < k; ++kk) {
        for (int64_t ll = 0; ll < l; ++ll) {
          int64_t at = 0, krest = kk, lrest = ll;
          bool inside = true;
          std::vector<int64_t> coord(r);
          for (size_t d = r; d-- > 0;) {
            coord[d] = (lrest % positions[d]) * t.strides[d] + (krest % t.block[d]) * t.dilations[d] - t.pads[d];
            lrest /= positions[d];
            krest /= t.block[d];
            inside = inside && coord[d] >= 0 && coord[d] < t.image[d];
          }
          if (!inside) continue;
          for (size_t d = 0; d < r; ++d) at = at * t.image[d] + coord[d];
          want[static_cast<size_t>(b * Numel(t.image) + at)] += cols[static_cast<size_t>((b * k + kk) * l + ll)];
        }
      }
    }
    SCOPED_TRACE(::testing::PrintToString(t.image));
    OpTester("Col2Im", 18)
        .Attr("strides", t.strides)
        .Attr("dilations", t.dilations)
        .Attr("pads", t.pads)
        .Input<float>("input", {t.n, t.c * k, l}, cols)
        .Input<int64_t>("image_shape", {static_cast<int64_t>(r)}, t.image)
        .Input<int64_t>("block_shape", {static_cast<int64_t>(r)}, t.block)
        .Output<float>("output", ydims, want)
        .Run();
  }
  auto g = graph::ParseGraph(
      "opset 18\ninput x: float32[1,4,5]\ninit i: int64[2] = 4 4\ninit b: int64[2] = 2 2\ny = Col2Im(x, i, b)\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("expected 9 block positions in dim 2"), std::string::npos) << s.status();
}

TEST(QuantizeTest, QuantizeLinearRoundsHalvesToEvenAndSaturates) {
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 100.f, -100.f, 0.74f};
  // x / 0.5 = 1, 3, 5, -1, -5, 200, -200, 1.48; + 10.
  OpTester("QuantizeLinear", 13)
      .Input<float>("x", {8}, x)
      .Input<float>("scale", {}, {0.5f})
      .Input<int8_t>("zp", {}, {10})
      .Output<int8_t>("y", {8}, {11, 13, 15, 9, 5, 127, -128, 11})
      .Run();
  // x / 1: ties 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0, -2.5 -> -2; uint8 saturates at 0.
  OpTester("QuantizeLinear", 13)
      .Input<float>("x", {8}, x)
      .Input<float>("scale", {}, {1.f})
      .Output<uint8_t>("y", {8}, {0, 2, 2, 0, 0, 100, 0, 1})
      .Run();
}

TEST(QuantizeTest, PerAxisHalfInputAndBFloat16Dequantization) {
  // Per channel along axis 1 of [2, 2, 2], from float16.
  std::vector<uint16_t> xh;
  for (float v : {1.f, 2.f, 3.f, 4.f, -1.f, -2.f, -3.f, -4.f}) xh.push_back(FloatToHalf(v));
  Tensor x(DataType::kFloat16, {2, 2, 2});
  std::copy(xh.begin(), xh.end(), x.data<uint16_t>());
  Tensor scale(DataType::kFloat16, {2});
  scale.data<uint16_t>()[0] = FloatToHalf(1.f);
  scale.data<uint16_t>()[1] = FloatToHalf(0.5f);
  OpTester("QuantizeLinear", 19)
      .InputTensor("x", x)
      .InputTensor("scale", scale)
      .Input<uint8_t>("zp", {2}, {100, 200})
      // channel 0 (scale 1, zp 100): 1 2 | -1 -2; channel 1 (scale 0.5, zp 200): 6 8 | -6 -8.
      .Output<uint8_t>("y", {2, 2, 2}, {101, 102, 206, 208, 99, 98, 194, 192})
      .Run();
  // int32 accumulators (a bias) dequantized by a bfloat16 scale give bfloat16.
  Tensor s(DataType::kBFloat16, {});
  s.data<uint16_t>()[0] = FloatToBFloat16(0.25f);
  Tensor want(DataType::kBFloat16, {3});
  for (int i = 0; i < 3; ++i) want.data<uint16_t>()[i] = FloatToBFloat16(std::vector<float>{-25.f, 0.f, 1024.f}[i]);
  OpTester("DequantizeLinear", 21)
      .Input<int32_t>("x", {3}, {-100, 0, 4096})
      .InputTensor("scale", s)
      .OutputTensor("y", want)
      .Run();
}

TEST(QuantizeTest, DynamicQuantizeLinearWidensTheRangeToZero) {
  // All positive: the range is [0, 5.1], scale 0.02, zero point 0.
  OpTester("DynamicQuantizeLinear", 11)
      .Input<float>("x", {4}, {1.f, 2.6f, 5.1f, 0.1f})
      .Output<uint8_t>("y", {4}, {50, 130, 255, 5})
      .Output<float>("scale", {}, {0.02f})
      .Output<uint8_t>("zp", {}, {0})
      .Run();
}

TEST(QuantizeTest, MismatchedScalesAndUnsupportedTypesAreRefused) {
  OpTester("QuantizeLinear", 13)
      .Attr("axis", int64_t{0})
      .Input<float>("x", {2, 3}, Random(6, 1))
      .Input<float>("scale", {3}, {1, 1, 1})
      .Output<uint8_t>("y", {2, 3}, {0, 0, 0, 0, 0, 0})
      .ExpectFailure("input 1 'scale' is [3]; expected a scalar, [1], or [2] (X's dim 0)")
      .Run();
  OpTester("DequantizeLinear", 13)
      .Input<uint8_t>("x", {2}, {1, 2})
      .Input<float>("scale", {}, {1})
      .Input<int8_t>("zp", {}, {0})
      .Output<float>("y", {2}, {1, 2})
      .ExpectFailure("x_zero_point has dtype int8, expected x's uint8")
      .Run();
  OpTester("QuantizeLinear", 21)
      .Attr("output_dtype", int64_t{1})
      .Input<float>("x", {2}, {1, 2})
      .Input<float>("scale", {}, {1})
      .Output<float>("y", {2}, {1, 2})
      .ExpectFailure("quantized type float32 is not one cleave supports")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
