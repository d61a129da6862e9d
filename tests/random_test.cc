// The random ops (tests/): RandomNormal, RandomUniform, their Like forms, Bernoulli and
// Multinomial draw from the distributions they name (moments and frequencies over many draws,
// seeded so that each check sees the same draws every time),
// in the types asked for; a seeded node replays one sequence of draws session after session
// while each run of a session draws anew; and a variational autoencoder's reparameterisation
// (RandomNormalLike on the gradient path) trains. The ONNX backend tests of Bernoulli compare
// with numpy's draws, which no other generator reproduces, so they are excluded
// (tests/conformance_exclusions.txt).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

std::unique_ptr<InferenceSession> Session(const std::string& text) {
  auto g = graph::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

std::vector<double> AsDoubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.DoubleAt(i);
  return v;
}

void ExpectMoments(const std::vector<double>& v, double mean, double sd, double tol) {
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  for (double x : v) s += (x - m) * (x - m);
  s = std::sqrt(s / static_cast<double>(v.size()));
  EXPECT_NEAR(m, mean, tol);
  EXPECT_NEAR(s, sd, tol);
}

TEST(RandomOps, NormalAndUniformDrawTheirDistributionsInTheTypeAsked) {
  auto s = Session(R"(
    opset 22
    input like: float32[300,400]
    n = RandomNormal() {shape = [200000], mean = 2.0, scale = 3.0, seed = 1.0}
    u = RandomUniform() {shape = [400, 500], low = -1.0, high = 3.0, dtype = 11, seed = 4.0}
    nl = RandomNormalLike(like) {dtype = 16, seed = 2.0}
    ul = RandomUniformLike(like) {seed = 3.0}
    output n
    output u
    output nl
    output ul
  )");
  ASSERT_TRUE(s);
  auto out = s->Run({{"like", Tensor(DataType::kFloat32, {300, 400})}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].dtype(), DataType::kFloat32);
  EXPECT_EQ((*out)[1].dtype(), DataType::kFloat64);
  EXPECT_EQ((*out)[2].dtype(), DataType::kBFloat16);
  EXPECT_EQ((*out)[3].dtype(), DataType::kFloat32);
  EXPECT_EQ((*out)[2].dims(), (std::vector<int64_t>{300, 400}));
  ExpectMoments(AsDoubles((*out)[0]), 2.0, 3.0, 0.03);
  const std::vector<double> u = AsDoubles((*out)[1]);
  ExpectMoments(u, 1.0, 4.0 / std::sqrt(12.0), 0.01);
  for (double x : u) ASSERT_TRUE(x >= -1.0 && x < 3.0) << x;
  ExpectMoments(AsDoubles((*out)[2]), 0.0, 1.0, 0.01);
  ExpectMoments(AsDoubles((*out)[3]), 0.5, 1.0 / std::sqrt(12.0), 0.01);
  // A normal's tails: about 0.27% of draws lie beyond 3 standard deviations.
  int64_t far = 0;
  for (double x : AsDoubles((*out)[2])) far += std::fabs(x) > 3;
  EXPECT_NEAR(static_cast<double>(far) / 120000.0, 0.0027, 0.0008);
}

TEST(RandomOps, ASeededNodeReplaysItsSequenceAndEachRunDrawsAnew) {
  const std::string seeded = "opset 22\nx = RandomUniform() {shape = [64], seed = 7.0}\noutput x\n";
  auto a = Session(seeded), b = Session(seeded);
  auto c = Session("opset 22\nx = RandomUniform() {shape = [64]}\noutput x\n");
  auto d = Session("opset 22\nx = RandomUniform() {shape = [64]}\noutput x\n");
  ASSERT_TRUE(a && b && c && d);
  auto a1 = a->Run({}), a2 = a->Run({}), b1 = b->Run({}), b2 = b->Run({}), c1 = c->Run({}), d1 = d->Run({});
  for (auto* r : {&a1, &a2, &b1, &b2, &c1, &d1}) ASSERT_TRUE(r->ok()) << r->status();
  EXPECT_EQ(AsDoubles((*a1)[0]), AsDoubles((*b1)[0]));
  EXPECT_EQ(AsDoubles((*a2)[0]), AsDoubles((*b2)[0]));
  EXPECT_NE(AsDoubles((*a1)[0]), AsDoubles((*a2)[0]));
  EXPECT_NE(AsDoubles((*c1)[0]), AsDoubles((*d1)[0]));
}

TEST(RandomOps, BernoulliDrawsEachElementWithItsProbability) {
  auto s = Session(R"(
    opset 22
    input p: float64[3,100000]
    b = Bernoulli(p) {seed = 3.0}
    i = Bernoulli(p) {dtype = 6, seed = 4.0}
    k = Bernoulli(p) {dtype = 9, seed = 5.0}
    output b
    output i
    output k
  )");
  ASSERT_TRUE(s);
  Tensor p(DataType::kFloat64, {3, 100000});
  for (int64_t j = 0; j < 100000; ++j) {
    p.data<double>()[j] = 0.0;
    p.data<double>()[100000 + j] = 0.3;
    p.data<double>()[200000 + j] = 1.0;
  }
  auto out = s->Run({{"p", p}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].dtype(), DataType::kFloat64);
  EXPECT_EQ((*out)[1].dtype(), DataType::kInt32);
  EXPECT_EQ((*out)[2].dtype(), DataType::kBool);
  for (const Tensor& t : *out) {
    const std::vector<double> v = AsDoubles(t);
    double row[3] = {0, 0, 0};
    for (size_t j = 0; j < v.size(); ++j) {
      ASSERT_TRUE(v[j] == 0 || v[j] == 1) << v[j];
      row[j / 100000] += v[j];
    }
    EXPECT_EQ(row[0], 0);
    EXPECT_NEAR(row[1] / 100000, 0.3, 0.005);
    EXPECT_EQ(row[2], 100000);
  }
}

TEST(RandomOps, MultinomialSamplesEachRowsSoftmax) {
  auto s = Session(R"(
    opset 22
    input x: float32[2,3]
    y = Multinomial(x) {sample_size = 30000, dtype = 7, seed = 2.0}
    output y
  )");
  ASSERT_TRUE(s);
  const std::vector<double> probs[2] = {{0.2, 0.3, 0.5}, {0.7, 0.0, 0.3}};
  Tensor x(DataType::kFloat32, {2, 3});
  for (int b = 0; b < 2; ++b)
    for (int c = 0; c < 3; ++c)
      x.data<float>()[b * 3 + c] = probs[b][c] > 0 ? std::log(static_cast<float>(probs[b][c])) + 4.f : -INFINITY;
  auto out = s->Run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0].dtype(), DataType::kInt64);
  ASSERT_EQ((*out)[0].dims(), (std::vector<int64_t>{2, 30000}));
  for (int b = 0; b < 2; ++b) {
    double count[3] = {0, 0, 0};
    for (int64_t j = 0; j < 30000; ++j) {
      const int64_t c = (*out)[0].data<int64_t>()[b * 30000 + j];
      ASSERT_TRUE(c >= 0 && c < 3) << c;
      count[c] += 1;
    }
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(count[c] / 30000, probs[b][c], 0.01) << "row " << b << " class " << c;
  }
}

TEST(RandomOps, BadAttributesNameTheNode) {
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"opset 22\nx = RandomNormal()\noutput x\n", "has no 'shape' attribute"},
           {"opset 22\nx = RandomUniform() {shape = [2], dtype = 7}\noutput x\n", "is not an output type it produces"},
           {"opset 22\ninput p: float32[3,4]\nx = Multinomial(p) {dtype = 1}\noutput x\n",
            "is not an output type it produces"},
           {"opset 22\ninput p: float32[3,4]\nx = Multinomial(p) {sample_size = 0}\noutput x\n",
            "sample_size is 0; expected >= 1"}}) {
    auto g = graph::ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status();
    auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.status().message().find("'x'"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status();
  }
}

// A variational autoencoder's reparameterisation, z = mu + exp(logvar / 2) * eps with eps =
// RandomNormalLike(mu): the noise is on the gradient path but passes no gradient, every
// parameter gets one, and the reconstruction loss falls (the encoder learns to quiet the noise).
TEST(RandomOps, ReparameterisedLatentTrains) {
  std::string w1, w2;
  for (int i = 0; i < 8 * 8; ++i) absl::StrAppend(&w1, " ", 0.3 * std::sin(0.7 * i + 0.1));
  for (int i = 0; i < 4 * 8; ++i) absl::StrAppend(&w2, " ", 0.3 * std::cos(0.9 * i + 0.2));
  const std::string text = absl::StrCat(
      "opset 22\ninput x: float32[16,8]\ninit we: float32[8,8] =", w1, "\ninit wd: float32[4,8] =", w2,
      "\ninit half: float32[] = 0.5\ninit split: int64[2] = 4 4\n"
      "h = MatMul(x, we)\nmu, lv = Split(h, split) {axis = 1}\n"
      "eps = RandomNormalLike(mu)\nsd = Mul(lv, half)\nsd2 = Exp(sd)\nnoise = Mul(sd2, eps)\nz = Add(mu, noise)\n"
      "y = MatMul(z, wd)\noutput y\n");
  auto model = graph::ParseGraph(text);
  ASSERT_TRUE(model.ok()) << model.status();
  trainer::TrainingSpec spec;
  spec.loss.kind = trainer::LossKind::kMse;
  auto a = trainer::BuildTrainingArtifacts(**model, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->params, (std::vector<std::string>{"wd", "we"}));
  auto s = trainer::TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
  ASSERT_TRUE(s.ok()) << s.status();
  (*s)->SetLearningRate(0.02);
  Tensor x(DataType::kFloat32, {16, 8});
  for (int i = 0; i < 128; ++i) x.data<float>()[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor labels = x.Clone();
  float first = 0, last = 0;
  for (int step = 0; step < 80; ++step) {
    (*s)->LazyResetGrad();
    auto loss = (*s)->TrainStep({{"x", x}, {"labels", labels}});
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (step == 0) {
      first = *loss;
      for (const std::string& p : (*s)->parameter_names()) {
        auto grad = (*s)->GetGradient(p);
        ASSERT_TRUE(grad.ok()) << p;
        double norm = 0;
        for (int64_t i = 0; i < grad->numel(); ++i) norm += std::fabs(grad->data<float>()[i]);
        EXPECT_GT(norm, 0) << p;
      }
    }
    last = *loss;
    ASSERT_TRUE((*s)->OptimizerStep().ok());
  }
  EXPECT_LT(last, 0.5f * first) << "first " << first << ", last " << last;
}

}  // namespace
}  // namespace cleave
