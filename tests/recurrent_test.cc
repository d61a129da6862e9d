// RNN, GRU and LSTM (tests/), which every session unrolls over the sequence
// (graph/passes/rnn_decomposition.cc), against a reference written here from the ONNX
// equations one row at a time: each row of the batch runs its own length, a reversed row starts
// at its last real element, and Y is zero past a row's length. The cases cover what the ONNX
// backend suite does not: both directions with sequence_lens, layout 1, clip, peepholes,
// input_forget, GRU with and without linear_before_reset, and activations with alpha and beta.
// gradient_check_test.cc checks their gradients by finite differences.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

// n values in [-1, 1), fixed by the seed.
std::vector<float> Random(int64_t n, unsigned seed) { return Cast<float>(Values(n, seed)); }

double Act(const std::string& f, float alpha, float beta, double x) {
  if (f == "Sigmoid") return 1 / (1 + std::exp(-x));
  if (f == "Tanh") return std::tanh(x);
  if (f == "Relu") return x > 0 ? x : 0;
  if (f == "LeakyRelu") return x >= 0 ? x : alpha * x;
  if (f == "ThresholdedRelu") return x > alpha ? x : 0;
  if (f == "HardSigmoid") return std::min(1.0, std::max(0.0, alpha * x + beta));
  if (f == "Elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
  if (f == "Softsign") return x / (1 + std::fabs(x));
  if (f == "Softplus") return std::log1p(std::exp(x));
  if (f == "Affine") return alpha * x + beta;
  if (f == "ScaledTanh") return alpha * std::tanh(beta * x);
  ADD_FAILURE() << "no reference for " << f;
  return 0;
}

struct Case {
  explicit Case(std::string o) : op(std::move(o)) {}
  std::string op;  // RNN, GRU, LSTM
  std::string direction = "forward";
  int64_t seq = 4, batch = 3, input = 2, hidden = 3;
  int64_t layout = 0;
  std::optional<float> clip;
  std::vector<std::string> acts;  // every direction's, forward first; empty: the defaults
  std::vector<float> alphas, betas;
  bool linear_before_reset = false, input_forget = false;
  bool bias = true, initial = true, peepholes = false;
  std::vector<int32_t> lens;  // empty: no sequence_lens
  bool want_y = true, want_h = true, want_c = true;
  int opset = 14;
};

struct Expected {
  std::vector<float> y, h, c;
};

// The ONNX equations, row by row and step by step, in double.
Expected Reference(const Case& c, const std::vector<float>& x, const std::vector<float>& w,
                   const std::vector<float>& r, const std::vector<float>& b, const std::vector<float>& h0,
                   const std::vector<float>& c0, const std::vector<float>& p) {
  const int64_t G = c.op == "LSTM" ? 4 : c.op == "GRU" ? 3 : 1;
  const int64_t D = c.direction == "bidirectional" ? 2 : 1;
  const int64_t T = c.seq, B = c.batch, I = c.input, H = c.hidden;
  std::vector<std::string> acts = c.acts;
  const std::vector<std::string> defaults = c.op == "LSTM"  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                            : c.op == "GRU" ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                            : std::vector<std::string>{"Tanh"};
  if (acts.empty())
    for (int64_t d = 0; d < D; ++d) acts.insert(acts.end(), defaults.begin(), defaults.end());
  // alpha and beta go in order to the activations that take them.
  std::vector<float> alpha(acts.size(), 0), beta(acts.size(), 0);
  size_t na = 0, nb = 0;
  for (size_t k = 0; k < acts.size(); ++k) {
    const std::string& f = acts[k];
    const bool ta = f == "LeakyRelu" || f == "ThresholdedRelu" || f == "Elu" || f == "HardSigmoid" ||
                    f == "Affine" || f == "ScaledTanh";
    const bool tb = f == "HardSigmoid" || f == "Affine" || f == "ScaledTanh";
    alpha[k] = f == "LeakyRelu" ? 0.01f : f == "HardSigmoid" ? 0.2f : 1.f;
    beta[k] = f == "HardSigmoid" ? 0.5f : f == "Affine" ? 0.f : 1.f;
    if (ta && na < c.alphas.size()) alpha[k] = c.alphas[na++];
    if (tb && nb < c.betas.size()) beta[k] = c.betas[nb++];
  }
  const size_t per = defaults.size();
  auto clip = [&](double v) { return c.clip ? std::min<double>(*c.clip, std::max<double>(-*c.clip, v)) : v; };
  auto X = [&](int64_t t, int64_t n, int64_t i) {
    return c.layout ? x[((n * T + t) * I + i)] : x[((t * B + n) * I + i)];
  };
  auto state_at = [&](int64_t d, int64_t n, int64_t j) { return c.layout ? (n * D + d) * H + j : (d * B + n) * H + j; };
  Expected e;
  e.y.assign(static_cast<size_t>(T * D * B * H), 0.f);
  e.h.assign(static_cast<size_t>(D * B * H), 0.f);
  e.c.assign(static_cast<size_t>(D * B * H), 0.f);
  for (int64_t d = 0; d < D; ++d) {
    const bool reverse = c.direction == "reverse" || d == 1;
    auto f = [&](size_t k, double v) { return Act(acts[d * per + k], alpha[d * per + k], beta[d * per + k], v); };
    for (int64_t n = 0; n < B; ++n) {
      const int64_t len = c.lens.empty() ? T : c.lens[n];
      std::vector<double> h(H, 0), cell(H, 0);
      if (c.initial)
        for (int64_t j = 0; j < H; ++j) {
          h[j] = h0[state_at(d, n, j)];
          if (c.op == "LSTM") cell[j] = c0[state_at(d, n, j)];
        }
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = reverse ? len - 1 - s : s;
        // Gate g's row j: X·W plus Wb, and H·R plus Rb.
        auto xw = [&](int64_t g, int64_t j) {
          double v = c.bias ? b[d * 2 * G * H + g * H + j] : 0;
          for (int64_t i = 0; i < I; ++i) v += X(t, n, i) * w[(d * G * H + g * H + j) * I + i];
          return v;
        };
        auto rb = [&](int64_t g, int64_t j) { return c.bias ? b[d * 2 * G * H + G * H + g * H + j] : 0.0; };
        auto hr = [&](int64_t g, int64_t j, const std::vector<double>& state) {
          double v = 0;
          for (int64_t k = 0; k < H; ++k) v += state[k] * r[(d * G * H + g * H + j) * H + k];
          return v;
        };
        std::vector<double> hn(H), cn(H);
        if (G == 1) {
          for (int64_t j = 0; j < H; ++j) hn[j] = f(0, clip(xw(0, j) + hr(0, j, h) + rb(0, j)));
        } else if (G == 3) {
          std::vector<double> z(H), rs(H), rh(H);
          for (int64_t j = 0; j < H; ++j) {
            z[j] = f(0, clip(xw(0, j) + hr(0, j, h) + rb(0, j)));
            rs[j] = f(0, clip(xw(1, j) + hr(1, j, h) + rb(1, j)));
          }
          for (int64_t k = 0; k < H; ++k) rh[k] = rs[k] * h[k];
          for (int64_t j = 0; j < H; ++j) {
            const double rec = c.linear_before_reset ? rs[j] * (hr(2, j, h) + rb(2, j)) : hr(2, j, rh) + rb(2, j);
            const double cand = f(1, clip(xw(2, j) + rec));
            hn[j] = (1 - z[j]) * cand + z[j] * h[j];
          }
        } else {
          auto peep = [&](int64_t k, int64_t j) { return c.peepholes ? p[d * 3 * H + k * H + j] : 0.0; };
          for (int64_t j = 0; j < H; ++j) {
            const double i = f(0, clip(xw(0, j) + hr(0, j, h) + rb(0, j) + peep(0, j) * cell[j]));
            const double fg =
                c.input_forget ? 1 - i : f(0, clip(xw(2, j) + hr(2, j, h) + rb(2, j) + peep(2, j) * cell[j]));
            const double cc = f(1, clip(xw(3, j) + hr(3, j, h) + rb(3, j)));
            cn[j] = fg * cell[j] + i * cc;
            const double o = f(0, clip(xw(1, j) + hr(1, j, h) + rb(1, j) + peep(1, j) * cn[j]));
            hn[j] = o * f(2, cn[j]);
          }
        }
        h = hn;
        if (G == 4) cell = cn;
        for (int64_t j = 0; j < H; ++j) {
          const int64_t at = c.layout ? ((n * T + t) * D + d) * H + j : ((t * D + d) * B + n) * H + j;
          e.y[at] = static_cast<float>(h[j]);
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        e.h[state_at(d, n, j)] = static_cast<float>(h[j]);
        e.c[state_at(d, n, j)] = static_cast<float>(cell[j]);
      }
    }
  }
  return e;
}

void Check(const Case& c) {
  const int64_t G = c.op == "LSTM" ? 4 : c.op == "GRU" ? 3 : 1;
  const int64_t D = c.direction == "bidirectional" ? 2 : 1;
  const int64_t T = c.seq, B = c.batch, I = c.input, H = c.hidden;
  const auto x = Random(T * B * I, 1), w = Random(D * G * H * I, 2), r = Random(D * G * H * H, 3),
             b = Random(D * 2 * G * H, 4), h0 = Random(D * B * H, 5), c0 = Random(D * B * H, 6),
             p = Random(D * 3 * H, 7);
  const Expected e = Reference(c, x, w, r, b, h0, c0, p);
  const std::vector<int64_t> state = c.layout ? std::vector<int64_t>{B, D, H} : std::vector<int64_t>{D, B, H};
  OpTester t(c.op, c.opset);
  t.Attr("hidden_size", H).Attr("direction", c.direction);
  if (c.opset >= 14) t.Attr("layout", c.layout);
  if (c.clip) t.Attr("clip", *c.clip);
  if (!c.acts.empty()) t.Attr("activations", graph::Attribute::Strings(c.acts));
  if (!c.alphas.empty()) t.Attr("activation_alpha", graph::Attribute::Floats(c.alphas));
  if (!c.betas.empty()) t.Attr("activation_beta", graph::Attribute::Floats(c.betas));
  if (c.op == "GRU") t.Attr("linear_before_reset", int64_t{c.linear_before_reset});
  if (c.op == "LSTM") t.Attr("input_forget", int64_t{c.input_forget});
  t.Input<float>("X", c.layout ? std::vector<int64_t>{B, T, I} : std::vector<int64_t>{T, B, I}, x)
      .Input<float>("W", {D, G * H, I}, w)
      .Input<float>("R", {D, G * H, H}, r);
  if (c.bias) t.Input<float>("B", {D, 2 * G * H}, b); else t.OmittedInput();
  if (!c.lens.empty()) t.Input<int32_t>("sequence_lens", {B}, c.lens); else t.OmittedInput();
  if (c.initial) t.Input<float>("initial_h", state, h0); else t.OmittedInput();
  if (c.op == "LSTM") {
    if (c.initial) t.Input<float>("initial_c", state, c0); else t.OmittedInput();
    if (c.peepholes) t.Input<float>("P", {D, 3 * H}, p);
  }
  const std::vector<int64_t> ydims =
      c.layout ? std::vector<int64_t>{B, T, D, H} : std::vector<int64_t>{T, D, B, H};
  if (c.want_y) t.Output<float>("Y", ydims, e.y); else t.OmittedOutput();
  if (c.want_h) t.Output<float>("Y_h", state, e.h); else t.OmittedOutput();
  if (c.op == "LSTM" && c.want_c) t.Output<float>("Y_c", state, e.c);
  t.Tolerance(1e-5, 1e-4).Run();
}

TEST(LstmTest, BidirectionalWithLengthsPeepholesAndClip) {
  Case c{"LSTM"};
  c.direction = "bidirectional";
  c.lens = {4, 1, 3};
  c.peepholes = true;
  c.clip = 0.8f;  // the random pre-activations reach about ±3
  Check(c);
}

TEST(LstmTest, ReverseBatchFirstInputForgetAndOtherActivationsStatesOnly) {
  Case c{"LSTM"};
  c.direction = "reverse";
  c.layout = 1;
  c.input_forget = true;
  c.acts = {"HardSigmoid", "LeakyRelu", "Softsign"};
  c.alphas = {0.3f, 0.2f};
  c.betas = {0.4f};
  c.want_y = false;
  Check(c);
}

TEST(LstmTest, NoBiasNoInitialStateOpset7) {
  Case c{"LSTM"};
  c.bias = false;
  c.initial = false;
  c.opset = 7;
  c.seq = 2;
  c.want_h = c.want_c = false;
  Check(c);
}

TEST(GruTest, BidirectionalLinearBeforeResetWithLengths) {
  Case c{"GRU"};
  c.direction = "bidirectional";
  c.linear_before_reset = true;
  c.lens = {2, 4, 1};
  Check(c);
}

TEST(GruTest, ReverseResetBeforeTheProductClippedWithElu) {
  Case c{"GRU"};
  c.direction = "reverse";
  c.clip = 1.f;
  c.acts = {"Sigmoid", "Elu"};
  c.alphas = {0.5f};
  c.lens = {3, 3, 4};
  Check(c);
}

TEST(GruTest, BatchFirstWithoutInitialState) {
  Case c{"GRU"};
  c.layout = 1;
  c.initial = false;
  c.batch = 1;
  Check(c);
}

TEST(RnnTest, BidirectionalBatchFirstWithLengthsAndAffineBackward) {
  Case c{"RNN"};
  c.direction = "bidirectional";
  c.layout = 1;
  c.lens = {1, 4, 2};
  c.acts = {"Relu", "Affine"};
  c.alphas = {0.5f};
  c.betas = {-0.25f};
  Check(c);
}

TEST(RnnTest, ScaledTanhOneStepNoBias) {
  Case c{"RNN"};
  c.seq = 1;
  c.bias = false;
  c.acts = {"ScaledTanh"};
  c.alphas = {1.5f};
  c.betas = {0.5f};
  Check(c);
}

TEST(RecurrentDecomposition, LeavesOneInputProjectionPerDirection) {
  auto g = graph::ParseGraph(
      "opset 14\ninput x: float32[5,2,3]\ninit w: float32[2,16,3] = fill 0.1\ninit r: float32[2,16,4] = fill 0.1\n"
      "y, yh, yc = LSTM(x, w, r) {hidden_size = 4, direction = \"bidirectional\"}\noutput y\noutput yh\noutput yc");
  ASSERT_TRUE(g.ok()) << g.status();
  SessionOptions o;
  o.optimize = false;
  auto s = InferenceSession::FromGraph(std::move(*g), o);
  ASSERT_TRUE(s.ok()) << s.status();
  int matmuls = 0;
  for (const auto& n : (*s)->graph().nodes()) {
    EXPECT_NE(n->op_type(), "LSTM");
    matmuls += n->op_type() == "MatMul";
  }
  // Per direction: X·Wᵀ over the whole sequence once, then H·Rᵀ per step.
  EXPECT_EQ(matmuls, 2 * (1 + 5));
  auto out = (*s)->Run({{"x", Tensor::FromVector<float>(Random(30, 9), {5, 2, 3})}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{5, 2, 2, 4}));
  EXPECT_EQ((*out)[1].dims(), (std::vector<int64_t>{2, 2, 4}));
  EXPECT_EQ((*out)[2].dims(), (std::vector<int64_t>{2, 2, 4}));
}

TEST(RecurrentDecomposition, BadModelsNameTheNodeAndWhatWasExpected) {
  // A symbolic sequence length cannot be unrolled.
  auto g = graph::ParseGraph(
      "opset 14\ninput x: float32[seq,2,3]\ninit w: float32[1,12,3] = fill 0.1\ninit r: float32[1,12,4] = fill 0.1\n"
      "y, yh = GRU(x, w, r) {hidden_size = 4}\noutput y");
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g), SessionOptions());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("GRU 'y'"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("'seq') is symbolic"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("free_dimension_overrides"), std::string::npos) << s.status();
  // W for the wrong number of gates.
  OpTester("LSTM", 14)
      .Attr("hidden_size", int64_t{2})
      .Input<float>("X", {2, 1, 3}, Random(6, 1))
      .Input<float>("W", {1, 6, 3}, Random(18, 2))
      .Input<float>("R", {1, 8, 2}, Random(16, 3))
      .Output<float>("Y", {2, 1, 1, 2}, Random(4, 1))
      .ExpectFailure("input W 'W' is [1,6,3]; expected [1,8,3] (1 direction, 4 gates, hidden 2)")
      .Run();
  OpTester("RNN", 14)
      .Attr("hidden_size", int64_t{2})
      .Attr("activations", graph::Attribute::Strings({"Swish"}))
      .Input<float>("X", {2, 1, 3}, Random(6, 1))
      .Input<float>("W", {1, 2, 3}, Random(6, 2))
      .Input<float>("R", {1, 2, 2}, Random(4, 3))
      .Output<float>("Y", {2, 1, 1, 2}, Random(4, 1))
      .ExpectFailure("activation 'Swish' is not one of")
      .Run();
  OpTester("RNN", 14)
      .Attr("hidden_size", int64_t{2})
      .Attr("direction", std::string("sideways"))
      .Input<float>("X", {2, 1, 3}, Random(6, 1))
      .Input<float>("W", {1, 2, 3}, Random(6, 2))
      .Input<float>("R", {1, 2, 2}, Random(4, 3))
      .Output<float>("Y", {2, 1, 1, 2}, Random(4, 1))
      .ExpectFailure("direction 'sideways' is none of forward, reverse, bidirectional")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
