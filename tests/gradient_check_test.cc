// Every gradient rule against central finite differences in double precision. Each case is a
// forward graph written as text with float64 inputs; the harness adds loss = sum(y * r) for a
// fixed random r, builds the backward graph, runs it, and compares each input's gradient with
// (f(x + eps e_i) - f(x - eps e_i)) / (2 eps) for every element.
#include <cmath>
#include <random>
#include <set>

#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"
#include "trainer/autodiff.h"
#include "trainer/gradient_rules.h"

namespace cleave::trainer {
namespace {

using graph::Value;

struct GradCase {
  const char* name;
  const char* text;       // forward graph; every graph input is differentiated
  double lo = -2, hi = 2;  // range of the random inputs
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

Tensor RandomTensor(const Shape& s, double lo, double hi, std::mt19937& rng) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t(DataType::kFloat64, s.StaticDims());
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t;
}

// Appends loss = ReduceSum(y * r) (a scalar) and returns it.
Value* AddLoss(graph::Graph& g, std::mt19937& rng) {
  Value* y = g.outputs()[0];
  Value* r = g.AddInitializer(g.UniqueName("r"), RandomTensor(y->shape(), -1, 1, rng));
  Value* yr = g.GetOrCreateValue("yr");
  Value* loss = g.GetOrCreateValue("loss");
  g.AddNode("Mul", {y, r}, {yr}, "loss_mul");
  graph::Node* sum = g.AddNode("ReduceSum", {yr}, {loss}, "loss_sum");
  sum->SetAttr("keepdims", graph::Attribute::Int(0));
  g.SetOutputs({loss});
  EXPECT_TRUE(graph::InferShapes(g).ok());
  return loss;
}

double Loss(InferenceSession& s, const Feeds& feeds) {
  auto out = s.Run(feeds);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0].data<double>()[0] : NAN;
}

class GradientCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradientCheck, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  std::mt19937 rng(11);
  auto parsed = graph::ParseGraph(c.text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto g = std::move(*parsed);
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  // Decomposed ops (Einsum, GroupNormalization, ...) are differentiated through what they become.
  graph::OpDecomposition decompose;
  ASSERT_TRUE(graph::RunPass(decompose, g.get()).ok());
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  Value* loss = AddLoss(*g, rng);
  Feeds feeds;
  for (Value* in : g->inputs()) feeds.emplace_back(in->name(), RandomTensor(in->shape(), c.lo, c.hi, rng));
  SessionOptions plain;
  plain.optimize = false;
  auto forward = InferenceSession::FromGraph(g->Clone(), plain);
  ASSERT_TRUE(forward.ok()) << forward.status();

  std::vector<Value*> wrt(g->inputs().begin(), g->inputs().end());
  auto grads = BuildBackward(*g, loss, wrt);
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<Value*> outs;
  for (Value* w : wrt) outs.push_back(grads->at(w->name()));
  g->SetOutputs(outs);
  auto backward = InferenceSession::FromGraph(std::move(g), plain);
  ASSERT_TRUE(backward.ok()) << backward.status();
  auto analytic = (*backward)->Run(feeds);
  ASSERT_TRUE(analytic.ok()) << analytic.status();

  const double eps = 1e-6;
  for (size_t k = 0; k < feeds.size(); ++k) {
    Tensor& x = feeds[k].second;
    ASSERT_EQ((*analytic)[k].dims(), x.dims()) << "gradient of " << feeds[k].first;
    for (int64_t i = 0; i < x.numel(); ++i) {
      double keep = x.data<double>()[i];
      x.data<double>()[i] = keep + eps;
      double up = Loss(**forward, feeds);
      x.data<double>()[i] = keep - eps;
      double down = Loss(**forward, feeds);
      x.data<double>()[i] = keep;
      double numeric = (up - down) / (2 * eps);
      double got = (*analytic)[k].data<double>()[i];
      EXPECT_NEAR(got, numeric, 1e-6 + 1e-5 * std::fabs(numeric))
          << "d loss / d " << feeds[k].first << "[" << i << "]";
    }
  }
}

const GradCase kCases[] = {
    {"Add_broadcast", "input a: float64[2,3]\ninput b: float64[3]\ny = Add(a, b)\noutput y"},
    {"Sub_both_broadcast", "input a: float64[2,1,3]\ninput b: float64[4,1]\ny = Sub(a, b)\noutput y"},
    {"Mul_broadcast", "input a: float64[2,3]\ninput b: float64[2,1]\ny = Mul(a, b)\noutput y"},
    {"Div", "input a: float64[2,3]\ninput b: float64[3]\ny = Div(a, b)\noutput y", 0.5, 2},
    {"Pow_cube", "input x: float64[5]\ninit p: float64[] = 3\ny = Pow(x, p)\noutput y"},
    {"Pow_runtime_exponent_broadcast", "input a: float64[2,3]\ninput p: float64[3]\ny = Pow(a, p)\noutput y", 0.5, 2},
    {"Neg", "input x: float64[4]\ny = Neg(x)\noutput y"},
    {"Exp", "input x: float64[4]\ny = Exp(x)\noutput y"},
    {"Log", "input x: float64[4]\ny = Log(x)\noutput y", 0.5, 2},
    {"Sqrt", "input x: float64[4]\ny = Sqrt(x)\noutput y", 0.5, 2},
    {"Reciprocal", "input x: float64[4]\ny = Reciprocal(x)\noutput y", 0.5, 2},
    {"Tanh", "input x: float64[6]\ny = Tanh(x)\noutput y"},
    {"Sigmoid", "input x: float64[6]\ny = Sigmoid(x)\noutput y"},
    {"Relu", "input x: float64[8]\ny = Relu(x)\noutput y"},
    {"Sin", "input x: float64[4]\ny = Sin(x)\noutput y"},
    {"Cos", "input x: float64[4]\ny = Cos(x)\noutput y"},
    {"Erf", "input x: float64[6]\ny = Erf(x)\noutput y"},
    {"Tan", "input x: float64[6]\ny = Tan(x)\noutput y", -1.2, 1.2},
    {"Asin", "input x: float64[6]\ny = Asin(x)\noutput y", -0.9, 0.9},
    {"Acos", "input x: float64[6]\ny = Acos(x)\noutput y", -0.9, 0.9},
    {"Atan", "input x: float64[6]\ny = Atan(x)\noutput y"},
    {"Sinh", "input x: float64[6]\ny = Sinh(x)\noutput y"},
    {"Cosh", "input x: float64[6]\ny = Cosh(x)\noutput y"},
    {"Asinh", "input x: float64[6]\ny = Asinh(x)\noutput y"},
    {"Acosh", "input x: float64[6]\ny = Acosh(x)\noutput y", 1.2, 3},
    {"Atanh", "input x: float64[6]\ny = Atanh(x)\noutput y", -0.9, 0.9},
    {"Softplus", "input x: float64[6]\ny = Softplus(x)\noutput y", -6, 6},
    {"Softsign", "input x: float64[6]\ny = Softsign(x)\noutput y"},
    {"Mish", "opset 18\ninput x: float64[8]\ny = Mish(x)\noutput y", -4, 4},
    {"LeakyRelu", "input x: float64[8]\ny = LeakyRelu(x) {alpha = 0.1}\noutput y"},
    {"Elu", "input x: float64[8]\ny = Elu(x) {alpha = 0.5}\noutput y"},
    {"Selu", "input x: float64[8]\ny = Selu(x)\noutput y"},
    {"Celu", "input x: float64[8]\ny = Celu(x) {alpha = 2.0}\noutput y"},
    {"HardSigmoid", "input x: float64[8]\ny = HardSigmoid(x) {alpha = 0.3, beta = 0.4}\noutput y", -4, 4},
    {"HardSwish", "input x: float64[8]\ny = HardSwish(x)\noutput y", -5, 5},
    {"ThresholdedRelu", "input x: float64[8]\ny = ThresholdedRelu(x) {alpha = 0.5}\noutput y"},
    {"CastLike", "opset 15\ninput x: float64[4]\ninit t: float64[1] = 0\ny = CastLike(x, t)\noutput y"},
    {"ReduceL1", "input x: float64[2,3,4]\ny = ReduceL1(x) {axes = [1], keepdims = 0}\noutput y"},
    {"ReduceL2", "input x: float64[2,3,4]\ny = ReduceL2(x) {axes = [0, 2]}\noutput y"},
    {"ReduceSumSquare", "input x: float64[2,3,4]\ny = ReduceSumSquare(x) {axes = [-1], keepdims = 0}\noutput y"},
    {"ReduceLogSum", "input x: float64[2,3,4]\ny = ReduceLogSum(x) {axes = [1]}\noutput y", 0.5, 2},
    {"ReduceLogSumExp", "input x: float64[2,3,4]\ny = ReduceLogSumExp(x) {axes = [2], keepdims = 0}\noutput y", -4, 4},
    {"ReduceLogSumExp_axes_input", "opset 18\ninput x: float64[2,3,4]\ninit a: int64[2] = 0 2\ny = ReduceLogSumExp(x, a)\noutput y"},
    {"ReduceSumSquare_noop", "opset 18\ninput x: float64[2,3]\ninit a: int64[0] = \ny = ReduceSumSquare(x, a) {noop_with_empty_axes = 1}\noutput y"},
    {"CumSum", "input x: float64[3,4]\ninit a: int64[] = 1\ny = CumSum(x, a)\noutput y"},
    {"CumSum_exclusive_reverse", "input x: float64[3,4,2]\ninit a: int32[] = -2\ny = CumSum(x, a) {exclusive = 1, reverse = 1}\noutput y"},
    {"CumSum_exclusive", "input x: float64[5,2]\ninit a: int64[1] = 0\ny = CumSum(x, a) {exclusive = 1}\noutput y"},
    // Indices repeat (0 twice in a column), so the gradient sums where two elements were read.
    {"GatherElements", "input x: float64[3,2]\ninit i: int64[4,2] = 0 1 2 0 0 1 -1 1\ny = GatherElements(x, i)\noutput y"},
    {"GatherElements_axis1", "input x: float64[2,3]\ninit i: int32[2,2] = 2 0 1 1\ny = GatherElements(x, i) {axis = 1}\noutput y"},
    {"ScatterElements", "input x: float64[3,3]\ninit i: int64[1,3] = 2 0 1\ninput u: float64[1,3]\ny = ScatterElements(x, i, u)\noutput y"},
    {"ScatterElements_add", "opset 18\ninput x: float64[2,4]\ninit i: int64[2,3] = 1 1 3 0 2 2\ninput u: float64[2,3]\ny = ScatterElements(x, i, u) {axis = 1, reduction = \"add\"}\noutput y"},
    {"Sum_three_broadcast", "input a: float64[2,3]\ninput b: float64[3]\ninput c: float64[2,1]\ny = Sum(a, b, c)\noutput y"},
    {"Mean_two", "input a: float64[2,3]\ninput b: float64[1,3]\ny = Mean(a, b)\noutput y"},
    {"NegativeLogLikelihoodLoss_mean", "input x: float64[4,3]\ninit t: int64[4] = 2 0 1 2\ny = NegativeLogLikelihoodLoss(x, t)\noutput y"},
    {"NegativeLogLikelihoodLoss_weighted_ignored", "input x: float64[3,4,2]\ninit t: int64[3,2] = 0 3 -1 1 2 -1\ninit w: float64[4] = 0.5 2 1 1.5\ny = NegativeLogLikelihoodLoss(x, t, w) {ignore_index = -1}\noutput y"},
    {"NegativeLogLikelihoodLoss_none", "input x: float64[2,3,2]\ninit t: int32[2,2] = 1 0 2 2\ny = NegativeLogLikelihoodLoss(x, t) {reduction = \"none\"}\noutput y"},
    {"NegativeLogLikelihoodLoss_sum", "input x: float64[3,5]\ninit t: int64[3] = 4 4 0\ny = NegativeLogLikelihoodLoss(x, t) {reduction = \"sum\"}\noutput y"},
    {"Pad", "input x: float64[2,3]\ninit p: int64[4] = 1 0 0 2\ny = Pad(x, p)\noutput y"},
    {"Pad_crops_and_pads_on_axes", "opset 18\ninput x: float64[3,4,2]\ninit p: int64[4] = -1 2 1 -1\ninit v: float64[] = 0.5\ninit a: int64[2] = 0 -2\ny = Pad(x, p, v, a)\noutput y"},
    // The other modes read elements more than once (reflect and wrap past the dim's size, a dim of
    // one): ai.cleave.PadGrad sums what each element fed.
    {"Pad_reflect", "input x: float64[3,4]\ninit p: int64[4] = 2 1 4 5\ny = Pad(x, p) {mode = \"reflect\"}\noutput y"},
    {"Pad_reflect_dim_of_one", "input x: float64[1,3]\ninit p: int64[4] = 2 0 1 2\ny = Pad(x, p) {mode = \"reflect\"}\noutput y"},
    {"Pad_edge_on_axes", "opset 18\ninput x: float64[2,3,2]\ninit p: int64[4] = 1 2 3 0\ninit a: int64[2] = 1 -1\ny = Pad(x, p, _, a) {mode = \"edge\"}\noutput y"},
    {"Pad_wrap", "opset 19\ninput x: float64[2,3]\ninit p: int64[4] = 0 4 1 7\ny = Pad(x, p) {mode = \"wrap\"}\noutput y"},
    {"MaxPool_2d_overlapping_padded", "input x: float64[2,3,6,5]\ny = MaxPool(x) {kernel_shape = [3, 3], strides = [2, 1], pads = [1, 1, 1, 1]}\noutput y"},
    {"MaxPool_1d_dilated_ceil", "input x: float64[2,2,9]\ny = MaxPool(x) {kernel_shape = [2], strides = [2], dilations = [3], ceil_mode = 1}\noutput y"},
    {"MaxPool_3d_same_upper", "input x: float64[1,2,3,4,3]\ny = MaxPool(x) {kernel_shape = [2, 2, 2], auto_pad = \"SAME_UPPER\"}\noutput y"},
    {"MaxPool_with_indices", "input x: float64[1,2,4,4]\ny, i = MaxPool(x) {kernel_shape = [2, 2], strides = [2, 2]}\noutput y"},
    {"AveragePool_include_pad_ceil", "opset 19\ninput x: float64[2,2,5,4]\ny = AveragePool(x) {kernel_shape = [3, 2], strides = [2, 2], pads = [1, 0, 1, 1], ceil_mode = 1, count_include_pad = 1}\noutput y"},
    {"AveragePool_exclude_pad_dilated", "opset 19\ninput x: float64[1,3,7]\ny = AveragePool(x) {kernel_shape = [3], dilations = [2], pads = [2, 1]}\noutput y"},
    {"AveragePool_same_lower", "input x: float64[2,1,5,5]\ny = AveragePool(x) {kernel_shape = [2, 3], strides = [2, 2], auto_pad = \"SAME_LOWER\"}\noutput y"},
    {"BatchNormalization_training", "opset 15\ninput x: float64[3,4,2,3]\ninput scale: float64[4]\ninput b: float64[4]\ninit mean: float64[4] = 0.5 -1 0 2\ninit var: float64[4] = 1 0.25 4 2\ny = BatchNormalization(x, scale, b, mean, var) {epsilon = 0.01, training_mode = 1}\noutput y"},
    {"BatchNormalization_training_2d", "opset 15\ninput x: float64[5,3]\ninput scale: float64[3]\ninput b: float64[3]\ninit mean: float64[3] = 0 0 0\ninit var: float64[3] = 1 1 1\ny, rm, rv = BatchNormalization(x, scale, b, mean, var) {training_mode = 1, momentum = 0.8}\noutput y"},
    {"BatchNormalization_inference", "input x: float64[2,3,4]\ninput scale: float64[3]\ninput b: float64[3]\ninit mean: float64[3] = 0.5 -1 0\ninit var: float64[3] = 1 0.25 4\ny = BatchNormalization(x, scale, b, mean, var) {epsilon = 0.001}\noutput y"},
    {"InstanceNormalization", "input x: float64[3,2,4,3]\ninput scale: float64[2]\ninput b: float64[2]\ny = InstanceNormalization(x, scale, b) {epsilon = 0.01}\noutput y"},
    {"InstanceNormalization_1d", "input x: float64[2,3,5]\ninput scale: float64[3]\ninput b: float64[3]\ny = InstanceNormalization(x, scale, b)\noutput y"},
    {"Resize_linear_half_pixel_upsample", "opset 13\ninput x: float64[1,2,3,4]\ninit scales: float32[4] = 1 1 2 1.5\ny = Resize(x, _, scales) {mode = \"linear\"}\noutput y"},
    {"Resize_linear_align_corners_sizes", "opset 13\ninput x: float64[2,1,4,3]\ninit sizes: int64[4] = 2 1 3 5\ny = Resize(x, _, _, sizes) {mode = \"linear\", coordinate_transformation_mode = \"align_corners\"}\noutput y"},
    {"Resize_nearest_downsample", "opset 13\ninput x: float64[1,1,5,6]\ninit scales: float32[4] = 1 1 0.6 0.5\ny = Resize(x, _, scales) {mode = \"nearest\", nearest_mode = \"floor\", coordinate_transformation_mode = \"asymmetric\"}\noutput y"},
    {"Resize_nearest_upsample_axes", "opset 18\ninput x: float64[2,3,4]\ninit scales: float32[2] = 2 3\ny = Resize(x, _, scales) {axes = [1, 2]}\noutput y"},
    {"Resize_cubic_upsample", "opset 13\ninput x: float64[1,2,4,3]\ninit scales: float32[4] = 1 1 2 1.5\ny = Resize(x, _, scales) {mode = \"cubic\"}\noutput y"},
    {"Resize_cubic_antialias_exclude_outside", "opset 18\ninput x: float64[1,1,6,7]\ninit sizes: int64[4] = 1 1 3 2\ny = Resize(x, _, _, sizes) {mode = \"cubic\", antialias = 1, exclude_outside = 1, cubic_coeff_a = -0.5}\noutput y"},
    {"Resize_linear_antialias_half_pixel_symmetric", "opset 19\ninput x: float64[1,1,5,8]\ninit scales: float32[4] = 1 1 0.6 0.4\ny = Resize(x, _, scales) {mode = \"linear\", antialias = 1, coordinate_transformation_mode = \"half_pixel_symmetric\"}\noutput y"},
    {"Resize_tf_crop_and_resize", "opset 13\ninput x: float64[1,1,4,4]\ninit roi: float32[8] = 0 0 0.4 0.6 1 1 1.2 1.7\ninit scales: float32[4] = 1 1 1.5 1.25\ny = Resize(x, roi, scales) {mode = \"linear\", coordinate_transformation_mode = \"tf_crop_and_resize\", extrapolation_value = 10}\noutput y"},
    {"GlobalAveragePool", "input x: float64[2,3,4,5]\ny = GlobalAveragePool(x)\noutput y"},
    {"GlobalMaxPool", "input x: float64[2,3,3,2,2]\ny = GlobalMaxPool(x)\noutput y"},
    {"Tile", "input x: float64[2,3]\ninit reps: int64[2] = 3 2\ny = Tile(x, reps)\noutput y"},
    {"Conv_1d_stride_pad_dilation", "input x: float64[2,3,9]\ninput w: float64[4,3,3]\ninput b: float64[4]\ny = Conv(x, w, b) {strides = [2], pads = [1, 2], dilations = [2]}\noutput y"},
    {"Conv_2d_groups", "input x: float64[1,4,5,4]\ninput w: float64[6,2,3,2]\ny = Conv(x, w) {group = 2, pads = [1, 0, 1, 1]}\noutput y"},
    {"Conv_2d_same_upper_stride", "input x: float64[2,2,5,6]\ninput w: float64[3,2,3,3]\ny = Conv(x, w) {auto_pad = \"SAME_UPPER\", strides = [2, 2]}\noutput y"},
    {"Conv_3d", "input x: float64[1,2,3,4,3]\ninput w: float64[2,2,2,2,2]\ny = Conv(x, w)\noutput y"},
    {"ConvTranspose_1d_stride_pads_dilation_output_padding",
     "input x: float64[2,3,4]\ninput w: float64[3,2,3]\ninput b: float64[2]\n"
     "y = ConvTranspose(x, w, b) {strides = [3], pads = [1, 2], dilations = [2], output_padding = [1]}\noutput y"},
    {"ConvTranspose_2d_groups", "input x: float64[1,4,3,2]\ninput w: float64[4,3,2,3]\n"
     "y = ConvTranspose(x, w) {group = 2, strides = [2, 1]}\noutput y"},
    {"ConvTranspose_2d_same_lower_stride", "input x: float64[2,2,3,2]\ninput w: float64[2,3,3,3]\n"
     "y = ConvTranspose(x, w) {auto_pad = \"SAME_LOWER\", strides = [2, 2]}\noutput y"},
    {"ConvTranspose_2d_output_shape", "input x: float64[1,2,3,3]\ninput w: float64[2,1,3,3]\ninput b: float64[1]\n"
     "y = ConvTranspose(x, w, b) {strides = [3, 2], output_shape = [10, 8]}\noutput y"},
    // The step functions pass no gradient: x + step(x) has the gradient 1 of x alone.
    {"Floor", "input x: float64[6]\nf = Floor(x)\ny = Add(x, f)\noutput y", -3, 3},
    {"Ceil", "input x: float64[6]\nf = Ceil(x)\ny = Add(x, f)\noutput y", -3, 3},
    {"Round", "input x: float64[6]\nf = Round(x)\ny = Add(x, f)\noutput y", -3, 3},
    {"Sign", "input x: float64[6]\nf = Sign(x)\ny = Add(x, f)\noutput y", -3, 3},
    {"Gelu", "opset 20\ninput x: float64[6]\ny = Gelu(x)\noutput y"},
    {"Gelu_tanh", "opset 20\ninput x: float64[6]\ny = Gelu(x) {approximate = \"tanh\"}\noutput y"},
    {"CleaveGelu", "input x: float64[6]\ny = ai.cleave.Gelu(x)\noutput y"},
    {"CleaveGelu_tanh", "input x: float64[2,4]\ny = ai.cleave.Gelu(x) {approximate = \"tanh\"}\noutput y", -4, 4},
    {"MatMul_2d", "input a: float64[3,4]\ninput b: float64[4,2]\ny = MatMul(a, b)\noutput y"},
    {"MatMul_batched_shared_weight",
     "input a: float64[2,3,4]\ninput b: float64[4,2]\ny = MatMul(a, b)\noutput y"},
    {"MatMul_batch_broadcast",
     "input a: float64[2,1,3,4]\ninput b: float64[3,4,2]\ny = MatMul(a, b)\noutput y"},
    {"Transpose", "input x: float64[2,3,4]\ny = Transpose(x) {perm = [2, 0, 1]}\noutput y"},
    {"Reshape", "input x: float64[2,6]\ninit s: int64[3] = 3 -1 2\ny = Reshape(x, s)\noutput y"},
    {"Unsqueeze_Squeeze",
     "input x: float64[2,3]\ninit a: int64[1] = 1\nu = Unsqueeze(x, a)\nt = Tanh(u)\ny = Squeeze(t, a)\noutput y"},
    {"Flatten", "input x: float64[2,3,2]\ny = Flatten(x) {axis = 2}\noutput y"},
    {"Expand", "input x: float64[3,1]\ninit s: int64[3] = 2 3 4\ny = Expand(x, s)\noutput y"},
    {"Where",
     "input a: float64[2,3]\ninput b: float64[3]\ninit c: bool[2,3] = 1 0 1 0 0 1\ny = Where(c, a, b)\noutput y"},
    {"ReduceSum_axes", "input x: float64[2,3,4]\ninit a: int64[1] = 1\ny = ReduceSum(x, a) {keepdims = 0}\noutput y"},
    {"ReduceMean_last", "opset 18\ninput x: float64[2,5]\ninit a: int64[1] = -1\ny = ReduceMean(x, a)\noutput y"},
    {"ReduceMean_attr", "opset 13\ninput x: float64[3,4]\ny = ReduceMean(x) {axes = [0], keepdims = 0}\noutput y"},
    {"ReduceMax_keepdims0", "opset 18\ninput x: float64[3,4]\ninit a: int64[1] = 1\ny = ReduceMax(x, a) {keepdims = 0}\noutput y"},
    {"ReduceMin_all", "opset 13\ninput x: float64[2,3]\ny = ReduceMin(x)\noutput y"},
    {"Softmax", "input x: float64[2,5]\ny = Softmax(x) {axis = -1}\noutput y"},
    {"Softmax_axis1_3d", "input x: float64[2,3,4]\ny = Softmax(x) {axis = 1}\noutput y"},
    {"Softmax_v11_flattens_from_axis", "opset 11\ninput x: float64[2,3,4]\ny = Softmax(x) {axis = 1}\noutput y"},
    {"LogSoftmax_axis1", "input x: float64[3,4,2]\ny = LogSoftmax(x) {axis = 1}\noutput y"},
    {"LogSoftmax_last", "input x: float64[2,5]\ny = LogSoftmax(x)\noutput y"},
    {"LogSoftmax_v1_default_axis", "opset 9\ninput x: float64[2,3,2]\ny = LogSoftmax(x)\noutput y"},
    {"Value_read_twice", "input x: float64[4]\na = Mul(x, x)\ny = Add(a, x)\noutput y"},
    {"Abs", "input x: float64[6]\ny = Abs(x)\noutput y"},
    {"Max_broadcast", "input a: float64[2,3]\ninput b: float64[3]\ny = Max(a, b)\noutput y"},
    {"PRelu_channel_slope", "input x: float64[2,3,4]\ninput s: float64[3,1]\ny = PRelu(x, s)\noutput y"},
    {"PRelu_scalar_slope", "opset 16\ninput x: float64[5,2]\ninput s: float64[1]\ny = PRelu(x, s)\noutput y"},
    {"Min", "input a: float64[4]\ninput b: float64[4]\ny = Min(a, b)\noutput y"},
    {"Clip_inputs", "input x: float64[8]\ninit lo: float64[] = -0.5\ninit hi: float64[] = 0.7\ny = Clip(x, lo, hi)\noutput y"},
    {"Clip_attrs_v6", "opset 10\ninput x: float64[8]\ny = Clip(x) {min = -0.5, max = 0.7}\noutput y"},
    {"Gemm_plain", "input a: float64[3,4]\ninput b: float64[4,2]\ninput c: float64[2]\ny = Gemm(a, b, c) {alpha = 0.5, beta = 2.0}\noutput y"},
    {"Gemm_transposed", "input a: float64[4,3]\ninput b: float64[2,4]\ninput c: float64[3,1]\ny = Gemm(a, b, c) {transA = 1, transB = 1}\noutput y"},
    {"Attention", "input q: float64[2,3,4]\ninput k: float64[2,5,4]\ninput v: float64[2,5,3]\n"
                  "y = ai.cleave.Attention(q, k, v) {scale = 0.5}\noutput y"},
    {"Attention_causal", "input q: float64[1,2,4,3]\ninput k: float64[1,2,4,3]\ninput v: float64[1,2,4,3]\n"
                         "y = ai.cleave.Attention(q, k, v) {scale = 0.7, causal = 1}\noutput y"},
    // The bias (a padding mask from integers, so not differentiated) joins the scores.
    {"Attention_bias", "input q: float64[2,2,3,4]\ninput k: float64[2,2,5,4]\ninput v: float64[2,2,5,3]\n"
                       "init m: int64[2,1,3,5] = 0 0 0 -9 0  1 0 2 0 0  0 -1 0 0 -9  0 0 -9 -9 0  2 0 0 0 1  0 0 0 0 -9\n"
                       "b = Cast(m) {to = 11}\ny = ai.cleave.Attention(q, k, v, b) {scale = 0.5}\noutput y"},
    // A learned bias ([H, T, S], summed over the batch) gets the scores' gradient.
    {"Attention_bias_learned", "input q: float64[2,2,3,4]\ninput k: float64[2,2,5,4]\ninput v: float64[2,2,5,3]\n"
                               "input b: float64[2,3,5]\ny = ai.cleave.Attention(q, k, v, b) {scale = 0.5}\noutput y"},
    {"Attention_bias_causal", "input q: float64[1,2,4,3]\ninput k: float64[1,2,4,3]\ninput v: float64[1,2,4,3]\n"
                              "init m: int64[4,4] = 0 1 2 3  -2 0 1 2  -3 -1 0 1  1 2 -4 0\n"
                              "b = Cast(m) {to = 11}\ny = ai.cleave.Attention(q, k, v, b) {scale = 0.7, causal = 1}\noutput y"},
    {"LayerNorm_last", "input x: float64[2,3,4]\ninput s: float64[4]\ninput b: float64[4]\ny = LayerNormalization(x, s, b)\noutput y"},
    {"LayerNorm_axis1", "input x: float64[2,3,4]\ninput s: float64[3,4]\ny = LayerNormalization(x, s) {axis = 1, epsilon = 0.001}\noutput y"},
    {"LayerNorm_broadcast_scale_and_bias",
     "input x: float64[2,3,4]\ninput s: float64[4]\ninput b: float64[3,1]\ny = LayerNormalization(x, s, b) {axis = 1}\noutput y"},
    {"LayerNorm_statistics_already_output",
     "input x: float64[3,4]\ninput s: float64[4]\ninput b: float64[4]\ny, mu, rstd = LayerNormalization(x, s, b) {stash_type = 11}\noutput y"},
    {"CleaveLayerNorm_opset13", "opset 13\ninput x: float64[3,5]\ninput s: float64[5]\ninput b: float64[5]\ny = ai.cleave.LayerNormalization(x, s, b)\noutput y"},
    {"RMSNorm_last", "input x: float64[2,3,4]\ninput s: float64[4]\ny = ai.cleave.RMSNormalization(x, s) {epsilon = 0.001}\noutput y"},
    {"RMSNorm_axis1", "input x: float64[2,3,4]\ninput s: float64[3,4]\ny = ai.cleave.RMSNormalization(x, s) {axis = 1}\noutput y"},
    {"RMSNorm_broadcast_scale", "input x: float64[2,3,4]\ninput s: float64[4]\ny = ai.cleave.RMSNormalization(x, s) {axis = -2}\noutput y"},
    {"SwiGLU", "input g: float64[2,5]\ninput u: float64[2,5]\ny = ai.cleave.SwiGLU(g, u)\noutput y"},
    {"Rotary_tables_learned", "input x: float64[2,3,4]\ninput c: float64[3,4]\ninput s: float64[3,4]\n"
                              "y = ai.cleave.RotaryEmbedding(x, c, s)\noutput y"},
    {"Rotary_heads_and_one_column", "input x: float64[2,2,3,6]\ninput c: float64[2,1,3,1]\ninput s: float64[2,1,3,1]\n"
                                    "y = ai.cleave.RotaryEmbedding(x, c, s)\noutput y"},
    {"Dropout_inference", "input x: float64[6]\ninit p: float64[] = 0.3\ny, m = Dropout(x, p) {seed = 1}\noutput y"},
    {"Trilu_k", "input x: float64[3,4]\ninit k: int64[] = 1\ny = Trilu(x, k) {upper = 0}\noutput y"},
    {"Concat", "input a: float64[2,1]\ninput b: float64[2,3]\ninput c: float64[2,2]\ny = Concat(a, b, c) {axis = 1}\noutput y"},
    {"Split_one_output_used", "input x: float64[2,5]\ninit s: int64[2] = 2 3\nu, v = Split(x, s) {axis = 1}\ny = Tanh(v)\noutput y"},
    {"FusedMatMul_gelu", "input a: float64[2,3,4]\ninput w: float64[4,5]\ninput b: float64[5]\ny = ai.cleave.FusedMatMul(a, w, b) {activation = \"gelu\"}\noutput y"},
    {"FusedMatMul_transB_tanh", "input a: float64[2,3,4]\ninput w: float64[5,4]\ny = ai.cleave.FusedMatMul(a, w) {transB = 1, activation = \"gelu_tanh\"}\noutput y"},
    {"Gather_embedding_repeats_negative",
     "input x: float64[5,3]\ninit i: int64[2,3] = 0 2 -1 2 4 0\ny = Gather(x, i)\noutput y"},
    {"Gather_axis1", "input x: float64[2,4]\ninit i: int32[3] = 3 1 3\ny = Gather(x, i) {axis = 1}\noutput y"},
    {"Slice_omitted_axes",
     "input x: float64[4,5]\ninit st: int64[2] = 1 -4\ninit en: int64[2] = 100 3\ny = Slice(x, st, en)\noutput y"},
    {"Slice_negative_step",
     "input x: float64[3,6]\ninit st: int64[1] = -1\ninit en: int64[1] = 0\ninit ax: int64[1] = 1\n"
     "init sp: int64[1] = -2\ny = Slice(x, st, en, ax, sp)\noutput y"},
    {"Slice_steps_omitted_axes",
     "input x: float64[3,6]\ninit st: int64[2] = 0 1\ninit en: int64[2] = 3 6\ninit sp: int64[2] = 1 2\n"
     "y = Slice(x, st, en, _, sp)\noutput y"},
    {"Slice_v1_attrs", "opset 9\ninput x: float64[3,4]\ny = Slice(x) {starts = [1], ends = [3], axes = [1]}\noutput y"},
    {"SoftmaxCrossEntropyLoss_mean",
     "input s: float64[3,4]\ninit lab: int64[3] = 0 2 1\nl, lp = SoftmaxCrossEntropyLoss(s, lab) {reduction = \"mean\"}\noutput l"},
    {"SoftmaxCrossEntropyLoss_none_weights_ignore",
     "input s: float64[4,3,2]\ninit lab: int64[4,2] = 0 2 1 1 2 0 1 0\ninit w: float64[3] = 0.5 1 2\n"
     "l, lp = SoftmaxCrossEntropyLoss(s, lab, w) {reduction = \"none\", ignore_index = 1}\noutput l"},
    {"SoftmaxCrossEntropyLoss_mean_weights_ignore",
     "input s: float64[4,3]\ninit lab: int32[4] = 0 2 -1 2\ninit w: float64[3] = 0.5 1 2\n"
     "l, lp = SoftmaxCrossEntropyLoss(s, lab, w) {reduction = \"mean\", ignore_index = -1}\noutput l"},
    {"SoftmaxCrossEntropyLoss_sum_and_log_prob_used",
     "input s: float64[2,3]\ninit lab: int64[2] = 2 0\nl, lp = SoftmaxCrossEntropyLoss(s, lab) {reduction = \"sum\"}\n"
     "t = Mul(lp, lp)\nu = ReduceSum(t) {keepdims = 0}\ny = Add(l, u)\noutput y"},
    {"Einsum_batch_matmul",
     "opset 12\ninput a: float64[2,3,4]\ninput b: float64[2,4,5]\ny = Einsum(a, b) {equation = \"bij,bjk->bik\"}\noutput y"},
    {"Einsum_attention_scores_heads_swapped",
     "opset 13\ninput q: float64[2,3,2,4]\ninput k: float64[2,5,2,4]\n"
     "y = Einsum(q, k) {equation = \"bqhd,bkhd->bhqk\"}\noutput y"},
    {"Einsum_three_operands_summed_label",
     "opset 13\ninput a: float64[3,4]\ninput b: float64[4,2]\ninput c: float64[2]\n"
     "y = Einsum(a, b, c) {equation = \"ij,jk,k->i\"}\noutput y"},
    {"Einsum_ellipsis_broadcast",
     "opset 13\ninput a: float64[2,1,3,4]\ninput b: float64[3,4,2]\n"
     "y = Einsum(a, b) {equation = \"...ij,...jk->...ik\"}\noutput y"},
    {"Einsum_one_operand_sum_transpose_opset12",
     "opset 12\ninput a: float64[2,3,4]\ny = Einsum(a) {equation = \"ijk->ki\"}\noutput y"},
    {"Einsum_batch_diagonal", "opset 13\ninput a: float64[2,3,3]\ny = Einsum(a) {equation = \"...ii->...i\"}\noutput y"},
    {"TopK_middle_axis", "opset 11\ninput x: float64[2,5,3]\ninit k: int64[1] = 2\n"
     "v, i = TopK(x, k) {axis = 1}\noutput v"},
    {"TopK_smallest", "opset 11\ninput x: float64[3,4]\ninit k: int64[1] = 3\n"
     "v, i = TopK(x, k) {largest = 0}\noutput v"},
    {"LSTM_bidirectional_lengths_peepholes",
     "opset 14\ninput x: float64[3,2,2]\ninput w: float64[2,8,2]\ninput rw: float64[2,8,2]\ninput b: float64[2,16]\n"
     "init l: int32[2] = 3 2\ninput h: float64[2,2,2]\ninput c: float64[2,2,2]\ninput p: float64[2,6]\n"
     "y, yh, yc = LSTM(x, w, rw, b, l, h, c, p) {hidden_size = 2, direction = \"bidirectional\"}\noutput y"},
    {"LSTM_cell_state_batch_first_input_forget",
     "opset 14\ninput x: float64[2,3,2]\ninput w: float64[1,12,2]\ninput rw: float64[1,12,3]\n"
     "y, yh, yc = LSTM(x, w, rw) {hidden_size = 3, layout = 1, input_forget = 1}\noutput yc"},
    {"GRU_linear_before_reset_reverse",
     "opset 14\ninput x: float64[3,2,2]\ninput w: float64[1,6,2]\ninput rw: float64[1,6,2]\ninput b: float64[1,12]\n"
     "input h: float64[1,2,2]\ny, yh = GRU(x, w, rw, b, _, h) {hidden_size = 2, direction = \"reverse\", "
     "linear_before_reset = 1}\noutput y"},
    {"GRU_reset_before_product_lengths",
     "opset 14\ninput x: float64[3,2,2]\ninput w: float64[1,6,2]\ninput rw: float64[1,6,2]\ninput b: float64[1,12]\n"
     "init l: int32[2] = 1 3\ny, yh = GRU(x, w, rw, b, l) {hidden_size = 2}\noutput yh"},
    {"RNN_bidirectional_relu_tanh",
     "opset 14\ninput x: float64[3,2,2]\ninput w: float64[2,3,2]\ninput rw: float64[2,3,3]\ninput b: float64[2,6]\n"
     "y = RNN(x, w, rw, b) {hidden_size = 3, direction = \"bidirectional\", activations = [\"Tanh\", \"Softsign\"]}\n"
     "output y"},
    {"LpPool_p3_ceil_mode_pads", "opset 18\ninput x: float64[1,2,5,4]\n"
     "y = LpPool(x) {kernel_shape = [2, 2], strides = [2, 2], pads = [1, 0, 0, 0], ceil_mode = 1, p = 3}\noutput y"},
    {"GlobalLpPool_p2", "opset 13\ninput x: float64[2,3,2,2]\ny = GlobalLpPool(x)\noutput y"},
    {"MeanVarianceNormalization", "opset 13\ninput x: float64[2,3,2,2]\ny = MeanVarianceNormalization(x)\noutput y"},
    {"LpNormalization_l1", "opset 13\ninput x: float64[3,4]\ny = LpNormalization(x) {p = 1}\noutput y"},
    {"LpNormalization_l2_axis0", "opset 13\ninput x: float64[3,4]\ny = LpNormalization(x) {axis = 0}\noutput y"},
    {"ReduceProd_axes_keepdims0", "opset 18\ninput x: float64[2,3,4]\ninit a: int64[2] = 0 -1\n"
     "y = ReduceProd(x, a) {keepdims = 0}\noutput y"},
    {"ReduceProd_all_opset13", "opset 13\ninput x: float64[3,2]\ny = ReduceProd(x)\noutput y"},
    {"CenterCropPad_crop_and_pad", "opset 18\ninput x: float64[5,2,3]\ninit s: int64[2] = 2 6\n"
     "y = CenterCropPad(x, s) {axes = [0, 2]}\noutput y"},
    {"ReverseSequence_time_major", "opset 13\ninput x: float64[4,3,2]\ninit l: int64[3] = 4 1 2\n"
     "y = ReverseSequence(x, l)\noutput y"},
    {"MaxUnpool_strided", "opset 13\ninput x: float64[2,1,2,2]\ninit i: int64[2,1,2,2] = 0 3 9 15 16 18 25 31\n"
     "y = MaxUnpool(x, i) {kernel_shape = [2, 2], strides = [2, 2]}\noutput y"},
    // X and the grid both differentiated; coordinates in [-1.4, 1.4] reach past the borders.
    {"GridSample_bilinear_zeros", "opset 16\ninput x: float64[2,2,3,4]\ninput g: float64[2,3,2,2]\n"
     "y = GridSample(x, g)\noutput y", -1.4, 1.4},
    {"GridSample_bicubic_border_align_corners", "opset 16\ninput x: float64[1,2,4,3]\ninput g: float64[1,2,3,2]\n"
     "y = GridSample(x, g) {mode = \"bicubic\", padding_mode = \"border\", align_corners = 1}\noutput y", -1.4, 1.4},
    {"GridSample_volumetric_linear_reflection", "opset 20\ninput x: float64[1,2,3,2,4]\ninput g: float64[1,2,2,2,3]\n"
     "y = GridSample(x, g) {padding_mode = \"reflection\"}\noutput y", -1.4, 1.4},
    {"GridSample_1d_cubic_reflection_align_corners", "opset 20\ninput x: float64[2,1,5]\ninput g: float64[2,4,1]\n"
     "y = GridSample(x, g) {mode = \"cubic\", padding_mode = \"reflection\", align_corners = 1}\noutput y", -1.4, 1.4},
    {"GridSample_nearest", "opset 20\ninput x: float64[1,2,3,3]\ninput g: float64[1,2,2,2]\n"
     "y = GridSample(x, g) {mode = \"nearest\"}\noutput y", -1.4, 1.4},
    {"Col2Im_strided_dilated_padded", "opset 18\ninput x: float64[2,4,8]\ninit i: int64[2] = 4 5\n"
     "init b: int64[2] = 2 2\ny = Col2Im(x, i, b) {strides = [2, 1], dilations = [1, 2], pads = [0, 1, 1, 0]}\noutput y"},
    {"AffineGrid_2d", "opset 20\ninput t: float64[2,2,3]\ninit s: int64[4] = 2 1 3 4\n"
     "y = AffineGrid(t, s)\noutput y"},
    {"AffineGrid_3d_align_corners", "opset 20\ninput t: float64[1,3,4]\ninit s: int64[5] = 1 1 2 3 2\n"
     "y = AffineGrid(t, s) {align_corners = 1}\noutput y"},
    {"Shrink", "opset 13\ninput x: float64[7]\ny = Shrink(x) {lambd = 0.7, bias = 0.2}\noutput y"},
    {"LRN", "opset 13\ninput x: float64[2,5,2,2]\ny = LRN(x) {size = 3, alpha = 0.1, beta = 0.75, bias = 2}\noutput y"},
    {"GatherND_rows_repeated", "opset 16\ninput x: float64[3,4]\ninit i: int64[3,1] = 2 0 2\n"
     "y = GatherND(x, i)\noutput y"},
    {"ScatterND_none", "opset 16\ninput x: float64[4,2]\ninput u: float64[2,2]\ninit i: int64[2,1] = 3 -4\n"
     "y = ScatterND(x, i, u)\noutput y"},
    {"ScatterND_add_repeated", "opset 16\ninput x: float64[3,2]\ninput u: float64[3,2]\n"
     "init i: int64[3,1] = 1 1 0\ny = ScatterND(x, i, u) {reduction = \"add\"}\noutput y"},
    {"GroupNormalization_18_group_scale",
     "opset 18\ninput x: float64[2,4,3]\ninput s: float64[2]\ninput b: float64[2]\n"
     "y = GroupNormalization(x, s, b) {num_groups = 2}\noutput y"},
    {"GroupNormalization_21_channel_scale",
     "opset 21\ninput x: float64[2,4,2,2]\ninput s: float64[4]\ninput b: float64[4]\n"
     "y = GroupNormalization(x, s, b) {num_groups = 2, epsilon = 0.001}\noutput y"},
    {"DepthToSpace_CRD",
     "opset 13\ninput x: float64[1,8,2,3]\ny = DepthToSpace(x) {blocksize = 2, mode = \"CRD\"}\noutput y"},
    {"SpaceToDepth", "opset 13\ninput x: float64[2,1,4,6]\ny = SpaceToDepth(x) {blocksize = 2}\noutput y"},
    {"Mlp",
     "opset 20\ninput x: float64[2,3]\ninput w1: float64[3,4]\ninput b1: float64[4]\n"
     "input w2: float64[4,2]\nh = MatMul(x, w1)\nhb = Add(h, b1)\ng = Gelu(hb)\n"
     "o = MatMul(g, w2)\ny = Softmax(o) {axis = -1}\noutput y"},
};

INSTANTIATE_TEST_SUITE_P(Rules, GradientCheck, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Runs `text` (a loss `l` of an input `x`) with x's gradient as output 0, then the values named
// in `also`; the outputs, or empty with a test failure.
std::vector<Tensor> RunGradientOfX(const std::string& text, const Tensor& x, const std::vector<std::string>& also = {}) {
  auto g = graph::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok() || !graph::InferShapes(**g).ok()) return {};
  auto grads = BuildBackward(**g, (*g)->FindValue("l"), {(*g)->FindValue("x")});
  EXPECT_TRUE(grads.ok()) << grads.status();
  if (!grads.ok()) return {};
  std::vector<Value*> outs = {grads->at("x")};
  for (const std::string& name : also) outs.push_back((*g)->FindValue(name));
  (*g)->SetOutputs(outs);
  SessionOptions plain;
  plain.optimize = false;
  auto s = InferenceSession::FromGraph(std::move(*g), plain);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  auto out = (*s)->Run({{"x", x}});
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : std::vector<Tensor>{};
}

// Training-mode Dropout draws a new mask each run, so it is checked directly: the gradient is
// dy * mask / (1 - ratio) with the forward run's own mask.
TEST(Autodiff, TrainingDropoutUsesTheForwardMask) {
  const auto out = RunGradientOfX(R"(
    input x: float64[64]
    init p: float64[] = 0.25
    init t: bool[] = 1
    y, m = Dropout(x, p, t) {seed = 5}
    l = ReduceSum(y) {keepdims = 0}
    output l
  )", Tensor(DataType::kFloat64, {64}), {"m"});
  ASSERT_EQ(out.size(), 2u);
  int kept = 0;
  for (int i = 0; i < 64; ++i) {
    bool m = out[1].data<bool>()[i];
    kept += m;
    EXPECT_DOUBLE_EQ(out[0].data<double>()[i], m ? 1.0 / 0.75 : 0.0) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 64);
}

// ReduceProd's gradient where the slice holds zeros: the product of the other elements, with no
// division by a zero (finite differences above never meet an exact zero).
TEST(Autodiff, ReduceProdGradientAroundZeros) {
  const auto out = RunGradientOfX(R"(
    opset 18
    input x: float64[3,3]
    init a: int64[1] = 1
    y = ReduceProd(x, a) {keepdims = 0}
    l = ReduceSum(y) {keepdims = 0}
    output l
  )", Tensor::FromVector<double>({2, 3, 4, 0, 3, 4, 0, 0, 5}, {3, 3}));
  ASSERT_EQ(out.size(), 1u);
  const std::vector<double> want = {12, 8, 6, 12, 0, 0, 0, 0, 0};
  for (int i = 0; i < 9; ++i) EXPECT_DOUBLE_EQ(out[0].data<double>()[i], want[i]) << i;
}

TEST(Autodiff, MarksRolesAndGradOf) {
  auto g = *graph::ParseGraph("input x: float32[3]\ninput w: float32[3]\ny = Mul(x, w)\nl = ReduceSum(y) {keepdims = 0}\noutput l");
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  auto grads = BuildBackward(*g, g->FindValue("l"), {g->FindValue("w")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(grads->at("w")->name(), "w_grad");
  int fwd = 0, bwd = 0;
  for (const auto& n : g->nodes()) {
    const std::string& role = n->metadata().at("role");
    fwd += role == "fwd";
    bwd += role == "bwd";
    if (role == "bwd") {
      EXPECT_FALSE(n->metadata().at("grad_of").empty()) << n->Describe();
    }
  }
  EXPECT_EQ(fwd, 2);
  EXPECT_GT(bwd, 0);
}

// Softmax, LogSoftmax, Gelu, LayerNormalization and RMSNormalization each differentiate through
// one fused ai.cleave op, and the normalisations' forward nodes are made to output their
// statistics.
TEST(Autodiff, ActivationAndNormRulesEmitOneFusedOp) {
  const std::pair<const char*, const char*> cases[] = {
      {"input x: float32[2,3,4]\ny = Softmax(x) {axis = 1}", "SoftmaxGrad"},
      {"input x: float32[2,3]\ny = LogSoftmax(x)", "LogSoftmaxGrad"},
      {"opset 20\ninput x: float32[2,3]\ny = Gelu(x) {approximate = \"tanh\"}", "GeluGrad"},
      {"input x: float32[2,3]\ny = ai.cleave.Gelu(x)", "GeluGrad"},
      {"input x: float32[2,3,4]\ninput s: float32[3,4]\ninput b: float32[3,4]\n"
       "y = LayerNormalization(x, s, b) {axis = 1}", "LayerNormalizationGrad"},
      {"input x: float32[2,3]\ninput s: float32[3]\ny = ai.cleave.LayerNormalization(x, s)",
       "LayerNormalizationGrad"},
      {"input x: float32[2,3]\ninput s: float32[3]\ny = ai.cleave.RMSNormalization(x, s)", "RMSNormalizationGrad"},
  };
  for (auto [text, op] : cases) {
    SCOPED_TRACE(text);
    auto g = *graph::ParseGraph(std::string(text) + "\nl = ReduceSum(y) {keepdims = 0}\noutput l");
    ASSERT_TRUE(graph::InferShapes(*g).ok());
    std::vector<Value*> wrt(g->inputs().begin(), g->inputs().end());
    auto grads = BuildBackward(*g, g->FindValue("l"), wrt);
    ASSERT_TRUE(grads.ok()) << grads.status();
    std::vector<std::string> ops;
    for (const auto& n : g->nodes())
      if (n->metadata().at("role") == "bwd" && n->metadata().at("grad_of") == "y")
        ops.push_back(n->domain() + "." + n->op_type());
    EXPECT_EQ(ops, std::vector<std::string>{std::string("ai.cleave.") + op});
    const graph::Node* fwd = g->FindValue("y")->producer();
    if (std::string(op) == "LayerNormalizationGrad") {
      ASSERT_EQ(fwd->num_outputs(), 3);
      EXPECT_EQ(fwd->output(1)->shape().ToString(), fwd->output(2)->shape().ToString());
      EXPECT_EQ(fwd->output(1)->dtype(), DataType::kFloat32);
    }
    if (std::string(op) == "RMSNormalizationGrad") {  // InvStdDev only
      ASSERT_EQ(fwd->num_outputs(), 2);
      EXPECT_EQ(fwd->output(1)->shape().ToString(), "[2,1]");
    }
  }
}

TEST(Autodiff, NamesEveryOpWithoutARuleAtOnce) {
  // The gradient ops themselves have no rules (no second derivatives).
  auto g = *graph::ParseGraph(R"(
    input x: float32[2,3]
    init sh: int64[2] = 4 3
    init big: int64[2] = 5 3
    init i: int64[2] = 0 2
    init st: int64[1] = 0
    init en: int64[1] = 4
    a = ai.cleave.GatherGrad(sh, i, x)
    c = ai.cleave.SliceGrad(a, big, st, en)
    l = ReduceSum(c) {keepdims = 0}
    output l
  )");
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  auto grads = BuildBackward(*g, g->FindValue("l"), {g->FindValue("x")});
  ASSERT_FALSE(grads.ok());
  std::string m(grads.status().message());
  EXPECT_NE(m.find("GatherGrad 'a'"), std::string::npos) << m;
  EXPECT_NE(m.find("SliceGrad 'c'"), std::string::npos) << m;
}

TEST(Autodiff, SoftmaxCrossEntropyLossNeedsLogProb) {
  auto g = *graph::ParseGraph(R"(
    input s: float32[2,3]
    init lab: int64[2] = 0 1
    l = SoftmaxCrossEntropyLoss(s, lab)
    output l
  )");
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  auto grads = BuildBackward(*g, g->FindValue("l"), {g->FindValue("s")});
  ASSERT_FALSE(grads.ok());
  EXPECT_NE(std::string(grads.status().message()).find("must output log_prob"), std::string::npos)
      << grads.status();
}

TEST(Autodiff, IntegerInputsStopTheGradient) {
  auto g = *graph::ParseGraph(R"(
    input x: float32[2,6]
    init s: int64[2] = 3 4
    y = Reshape(x, s)
    l = ReduceSum(y) {keepdims = 0}
    output l
  )");
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  auto grads = BuildBackward(*g, g->FindValue("l"), {g->FindValue("x")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(grads->at("x")->shape().ToString(), "[2,6]");
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::trainer {
namespace {

// Every differentiable op of the op table has a gradient rule.
TEST(Autodiff, EveryDifferentiableOpHasARule) {
  const std::set<std::string> pending = {};
  std::set<std::string> missing;
  for (const graph::OpDef& d : graph::AllOps())
    if (d.differentiable && !d.decomposed && !HasGradientRule(d.domain, d.name))
      missing.insert(d.domain + "::" + d.name);
  EXPECT_EQ(missing, pending);
}

}  // namespace
}  // namespace cleave::trainer
