// Models of ops that every session decomposes train (tests/): the training graph holds what the
// ops became, every parameter gets a gradient through them, and AdamW lowers the loss.
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "trainer/training_session.h"

namespace cleave::trainer {
namespace {

// Trains `steps` AdamW steps on `feeds`: every parameter gets a nonzero gradient in the first,
// and the last loss is below `fraction` of the first.
void ExpectTrains(TrainingSession& s, const Feeds& feeds, int steps, float fraction) {
  float first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    s.LazyResetGrad();
    auto loss = s.TrainStep(feeds);
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (step == 0) {
      first = *loss;
      for (const std::string& p : s.parameter_names()) {
        auto grad = s.GetGradient(p);
        ASSERT_TRUE(grad.ok()) << p;
        double norm = 0;
        for (int64_t i = 0; i < grad->numel(); ++i) norm += std::fabs(grad->data<float>()[i]);
        EXPECT_GT(norm, 0) << p;
      }
    }
    last = *loss;
    ASSERT_TRUE(s.OptimizerStep().ok());
  }
  EXPECT_LT(last, fraction * first) << "first " << first << ", last " << last;
}

// The MSE training session of `text`, whose parameters must be `params` and whose training graph
// holds none of `decomposed` (the rewrite replaced them); null, with a test failure, otherwise.
std::unique_ptr<TrainingSession> MseSession(const std::string& text, const std::vector<std::string>& params,
                                            const std::set<std::string>& decomposed) {
  auto model = graph::ParseGraph(text);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  TrainingSpec spec;
  spec.loss.kind = LossKind::kMse;
  auto a = BuildTrainingArtifacts(**model, spec);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return nullptr;
  EXPECT_EQ(a->params, params);
  for (const auto& n : a->training->nodes()) EXPECT_FALSE(decomposed.count(n->op_type())) << n->Describe();
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// A model of decomposed ops trains: Einsum mixing the channels, GroupNormalization 21 with its
// per-channel scale and bias, DepthToSpace. The training graph holds what they became (no
// Einsum, no GroupNormalization), every parameter gets a gradient, and AdamW lowers the loss.
TEST(TrainingSession, DecomposedOpsTrain) {
  std::string w;
  for (int i = 0; i < 64; ++i) absl::StrAppend(&w, " ", (i * 37 % 17) / 17.0 - 0.5);
  const std::string text = absl::StrCat(
      "opset 21\ninput x: float32[4,8,2,2]\ninit w: float32[8,8] =", w,
      "\ninit s: float32[8] = fill 1\ninit b: float32[8] = fill 0\n"
      "h = Einsum(x, w) {equation = \"nchw,cd->ndhw\"}\n"
      "g = GroupNormalization(h, s, b) {num_groups = 4}\n"
      "y = DepthToSpace(g) {blocksize = 2}\noutput y\n");
  auto s = MseSession(text, {"b", "s", "w"}, {"Einsum", "GroupNormalization", "DepthToSpace"});
  ASSERT_TRUE(s);
  s->SetLearningRate(0.05);
  Tensor x(DataType::kFloat32, {4, 8, 2, 2}), labels(DataType::kFloat32, {4, 2, 4, 4});
  for (int i = 0; i < 128; ++i) {
    x.data<float>()[i] = std::sin(0.7f * static_cast<float>(i));
    labels.data<float>()[i] = std::cos(0.3f * static_cast<float>(i));
  }
  ExpectTrains(*s, {{"x", x}, {"labels", labels}}, 30, 0.8f);
}

// An LSTM feeding a GRU, each unrolled over the sequence, trains: every weight gets a gradient
// through the steps and the loss falls.
TEST(TrainingSession, RecurrentOpsTrain) {
  auto values = [](int n, float phase) {
    std::string v;
    for (int i = 0; i < n; ++i) absl::StrAppend(&v, " ", 0.4 * std::sin(1.3 * i + phase));
    return v;
  };
  const std::string text = absl::StrCat(
      "opset 14\ninput x: float32[6,4,3]\ninit w1: float32[1,32,3] =", values(96, 0.1f),
      "\ninit r1: float32[1,32,8] =", values(256, 0.7f), "\ninit b1: float32[1,64] = fill 0\n",
      "init w2: float32[2,6,8] =", values(96, 1.9f), "\ninit r2: float32[2,6,2] =", values(24, 2.3f),
      "\ninit ax: int64[1] = 1\n"
      "y1, h1, c1 = LSTM(x, w1, r1, b1) {hidden_size = 8}\n"
      "s1 = Squeeze(y1, ax)\n"
      "y2, h2 = GRU(s1, w2, r2) {hidden_size = 2, direction = \"bidirectional\", linear_before_reset = 1}\n"
      "output y2\n");
  auto s = MseSession(text, {"b1", "r1", "r2", "w1", "w2"}, {"LSTM", "GRU"});
  ASSERT_TRUE(s);
  s->SetLearningRate(0.02);
  Tensor x(DataType::kFloat32, {6, 4, 3}), labels(DataType::kFloat32, {6, 2, 4, 2});
  for (int i = 0; i < 72; ++i) x.data<float>()[i] = std::sin(0.7f * static_cast<float>(i));
  for (int i = 0; i < 96; ++i) labels.data<float>()[i] = 0.5f * std::cos(0.3f * static_cast<float>(i));
  ExpectTrains(*s, {{"x", x}, {"labels", labels}}, 40, 0.7f);
}

// A spatial transformer trains: AffineGrid of a learned theta (decomposed into a MatMul) feeding
// GridSample of the scaled image, so theta learns through the grid's gradient and the scale
// through X's. The target is the image itself, halved: theta must undo its rotation and shift.
TEST(TrainingSession, SpatialTransformerTrains) {
  const std::string text =
      "opset 20\ninput x: float32[2,2,6,6]\ninit k: float32[1,2,1,1] = 1 1\n"
      "init t: float32[2,2,3] = 0.95 -0.3 0.2 0.3 0.95 -0.1 0.95 -0.3 0.2 0.3 0.95 -0.1\n"
      "init size: int64[4] = 2 2 6 6\n"
      "g = AffineGrid(t, size) {align_corners = 1}\n"
      "xs = Mul(x, k)\n"
      "y = GridSample(xs, g) {align_corners = 1, padding_mode = \"border\"}\noutput y\n";
  auto s = MseSession(text, {"k", "t"}, {"AffineGrid"});
  ASSERT_TRUE(s);
  s->SetLearningRate(0.02);
  Tensor x(DataType::kFloat32, {2, 2, 6, 6}), labels(DataType::kFloat32, {2, 2, 6, 6});
  for (int i = 0; i < 144; ++i) {
    const int h = i / 6 % 6, w = i % 6;
    x.data<float>()[i] = std::sin(0.9f * static_cast<float>(h) + 0.4f * static_cast<float>(i / 36)) *
                         std::cos(0.6f * static_cast<float>(w));
    labels.data<float>()[i] = 0.5f * x.data<float>()[i];
  }
  ExpectTrains(*s, {{"x", x}, {"labels", labels}}, 60, 0.3f);
}

}  // namespace
}  // namespace cleave::trainer
