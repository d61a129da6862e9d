// CUDA kernel tests (label gpu): every CUDA kernel against the CPU kernel on the same graph, in
// fp32, bf16 and fp16 where they apply: the norms and softmax, the gradient ops, the losses, the
// optimizers, the reductions and dropout (the elementwise ops and casts are in
// cuda_elementwise_test.cc, the products in cuda_matmul_test.cc, attention in
// cuda_attention_kernels_test.cc, Transpose, the views, Gather, Expand and SliceGrad in
// cuda_layout_kernels_test.cc, Pad, CumSum and the other axis kernels in
// cuda_axis_kernels_test.cc, Conv in cuda_conv_test.cc, LLaMA's fused ops in
// cuda_llama_kernels_test.cc). Without a usable device (or driver) each test skips and says why.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/cuda/cuda_provider.h"
#include "runtime/inference_session.h"
#include "tests/cuda_test_util.h"
#include "tests/op_tester.h"
#include "trainer/mixed_precision.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, SoftmaxAndLayerNorm) {
  REQUIRE_CUDA();
  ExpectSame("input x: float32[6,1000]\ny = Softmax(x) {axis = -1}\nz = LogSoftmax(x) {axis = -1}\noutput y\noutput z\n",
             {{"x", Random({6, 1000}, 22, -30.f, 30.f)}}, 1e-6, 1e-5, "Softmax");
  ExpectSame(R"(
    input x: float32[2,3,768]
    input g: float32[768]
    input b: float32[768]
    y, mean, inv = LayerNormalization(x, g, b) {axis = -1, epsilon = 1e-5}
    output y
    output mean
    output inv
  )",
             {{"x", Random({2, 3, 768}, 23)}, {"g", Random({768}, 24)}, {"b", Random({768}, 25)}}, 1e-5, 1e-4,
             "LayerNormalization");
}

// Softmax and LogSoftmax off the last axis (and their gradients; before opset 13 over rows
// flattened at the axis), and LayerNormalization over several trailing dims with its gradient.
TEST(CudaProvider, SoftmaxAlongAnyAxisAndLayerNormOverTrailingDims) {
  REQUIRE_CUDA();
  // Version 13 on: along one axis (lines 20, 4 and 1 elements apart), and the gradients too.
  ExpectSame(R"(
    input x: float32[3,5,4]
    input g: float32[3,5,4]
    s0 = Softmax(x) {axis = 0}
    s1 = Softmax(x) {axis = 1}
    l1 = LogSoftmax(x) {axis = -2}
    l2 = LogSoftmax(x) {axis = 2}
    d0 = ai.cleave.SoftmaxGrad(g, s0) {axis = 0}
    d1 = ai.cleave.LogSoftmaxGrad(g, l1) {axis = 1}
    output s0
    output s1
    output l1
    output l2
    output d0
    output d1
  )",
             {{"x", Random({3, 5, 4}, 26, -6.f, 6.f)}, {"g", Random({3, 5, 4}, 27)}}, 1e-6, 1e-5, "*");
  // Before version 13: over x flattened into rows at the axis.
  ExpectSame(R"(
    opset 11
    input x: float32[3,5,4]
    s = Softmax(x)
    l = LogSoftmax(x) {axis = 2}
    output s
    output l
  )",
             {{"x", Random({3, 5, 4}, 28, -6.f, 6.f)}}, 1e-6, 1e-5, "*");
  // LayerNormalization over the last two dims, its statistics [2, 3, 1, 1], and the gradient.
  ExpectSame(R"(
    input x: float32[2,3,5,4]
    input sc: float32[5,4]
    input b: float32[5,4]
    input dy: float32[2,3,5,4]
    y, mean, inv = LayerNormalization(x, sc, b) {axis = -2, epsilon = 1e-3}
    dx, dsc, db = ai.cleave.LayerNormalizationGrad(dy, x, sc, mean, inv) {axis = 2}
    output y
    output mean
    output inv
    output dx
    output dsc
    output db
  )",
             {{"x", Random({2, 3, 5, 4}, 29)}, {"sc", Random({5, 4}, 30)}, {"b", Random({5, 4}, 31)},
              {"dy", Random({2, 3, 5, 4}, 32)}},
             1e-5, 1e-4, "*");
}

TEST(CudaProvider, SkipLayerNorm) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[3,5,768]
    input r: float32[3,5,768]
    input g: float32[768]
    input b: float32[768]
    y, mean, inv, sum = ai.cleave.SkipLayerNormalization(x, r, g, b) {epsilon = 1e-5}
    output y
    output mean
    output inv
    output sum
  )",
             {{"x", Random({3, 5, 768}, 80)}, {"r", Random({3, 5, 768}, 81)}, {"g", Random({768}, 82)},
              {"b", Random({768}, 83)}},
             1e-5, 1e-4, "SkipLayerNormalization");
  // y written in bf16 / fp16 (`to`, mixed precision's next operand): one rounding of the float32
  // value, which may fall either side of a rounding boundary on the two devices.
  for (int to : {16, 10})
    ExpectSame(absl::StrCat(R"(
      input x: float32[3,5,768]
      input r: float32[3,5,768]
      input g: float32[768]
      input b: float32[768]
      hy, mean, inv, sum = ai.cleave.SkipLayerNormalization(x, r, g, b) {epsilon = 1e-5, to = )", to, R"(}
      y = Cast(hy) {to = 1}
      output y
      output mean
      output inv
      output sum
    )"),
               {{"x", Random({3, 5, 768}, 84)}, {"r", Random({3, 5, 768}, 85)}, {"g", Random({768}, 86)},
                {"b", Random({768}, 87)}},
               to == 16 ? 1e-2 : 1e-3, to == 16 ? 8e-3 : 1e-3, "SkipLayerNormalization");
  // A bf16 / fp16 skip (LowPrecisionNormInputs: the residual branch's product) added to the
  // float32 x as float32.
  for (int to : {16, 10})
    ExpectSame(absl::StrCat(R"(
      input x: float32[3,5,768]
      input r: float32[3,5,768]
      input g: float32[768]
      input b: float32[768]
      hr = Cast(r) {to = )", to, R"(}
      y, mean, inv, sum = ai.cleave.SkipLayerNormalization(x, hr, g, b) {epsilon = 1e-5}
      output y
      output mean
      output inv
      output sum
    )"),
               {{"x", Random({3, 5, 768}, 88)}, {"r", Random({3, 5, 768}, 89)}, {"g", Random({768}, 90)},
                {"b", Random({768}, 91)}},
               1e-5, 1e-4, "SkipLayerNormalization");
}

TEST(CudaProvider, GradientOps) {
  REQUIRE_CUDA();
  // A small LayerNorm, and a training step's shape, whose scale and bias gradients sum 4096 rows
  // in chunks and add the chunks' partial sums in a second pass (sums of 4096 terms: float32
  // rounding of either order).
  for (const auto& [rows, cols, atol] : {std::tuple{5, 64, 1e-5}, std::tuple{4096, 768, 2e-3}}) {
    const std::string dims = absl::StrCat("[", rows, ",", cols, "]"), vec = absl::StrCat("[", cols, "]");
    ExpectSame(absl::StrCat("input dy: float32", dims, "\ninput x: float32", dims, "\ninput g: float32", vec,
                            "\ninput b: float32", vec, R"(
      y, mean, inv = LayerNormalization(x, g, b) {axis = -1}
      dx, dg, db = ai.cleave.LayerNormalizationGrad(dy, x, g, mean, inv) {axis = -1}
      output dx
      output dg
      output db
    )"),
               {{"dy", Random({rows, cols}, 26)}, {"x", Random({rows, cols}, 27)}, {"g", Random({cols}, 28)},
                {"b", Random({cols}, 29)}},
               atol, 1e-4, "LayerNormalizationGrad");
  }
  // With the residual stream's gradient folded in (dX_add): dX + r, written once.
  const std::string ln_inputs = R"(
    input dy: float32[64,768]
    input x: float32[64,768]
    input r: float32[64,768]
    input g: float32[768]
    input b: float32[768]
    y, mean, inv = LayerNormalization(x, g, b) {axis = -1}
  )";
  const Feeds ln_feeds = {{"dy", Random({64, 768}, 36)}, {"x", Random({64, 768}, 37)}, {"r", Random({64, 768}, 38)},
                          {"g", Random({768}, 39)}, {"b", Random({768}, 40)}};
  ExpectSame(ln_inputs + R"(
    dx, dg, db = ai.cleave.LayerNormalizationGrad(dy, x, g, mean, inv, r) {axis = -1}
    output dx
    output dg
    output db
  )",
             ln_feeds, 1e-5, 1e-4, "LayerNormalizationGrad");
  for (int to : {16, 10}) {
    // With a bf16 / fp16 dY (LowPrecisionNormInputs: the product forming it) read as float32.
    ExpectSame(absl::StrCat(ln_inputs, "hdy = Cast(dy) {to = ", to, R"(}
      dx, dg, db = ai.cleave.LayerNormalizationGrad(hdy, x, g, mean, inv, r) {axis = -1}
      output dx
      output dg
      output db
    )"),
               ln_feeds, 1e-5, 1e-4, "LayerNormalizationGrad");
    // And dX's rounding to bf16 / fp16 written too (dX_low, LayerNormGradCastFusion): within one
    // rounding of the low type where the float32 dX differs in its last bits.
    ExpectSame(absl::StrCat(ln_inputs, "dx, dg, db, dl = ai.cleave.LayerNormalizationGrad(dy, x, g, mean, inv, r) ",
                            "{axis = -1, low_to = ", to, R"(}
      w = Cast(dl) {to = 1}
      output dx
      output w
    )"),
               ln_feeds, 1e-5, to == 16 ? 8e-3 : 1e-3, "LayerNormalizationGrad");
  }
  for (const char* approx : {"none", "tanh"})
    ExpectSame(absl::StrCat("input dy: float32[4,300]\ninput x: float32[4,300]\ndx = ai.cleave.GeluGrad(dy, x) "
                            "{approximate = \"", approx, "\"}\noutput dx\n"),
               {{"dy", Random({4, 300}, 30)}, {"x", Random({4, 300}, 31)}}, 1e-6, 1e-5, "GeluGrad");
  // Embedding lookup and its scatter-add gradient (repeated ids accumulate).
  ExpectSame(R"(
    input table: float32[50,16]
    input ids: int64[4,7]
    input dy: float32[4,7,16]
    init shape: int64[2] = 50 16
    e = Gather(table, ids) {axis = 0}
    dt = ai.cleave.GatherGrad(shape, ids, dy) {axis = 0}
    output e
    output dt
  )",
             {{"table", Random({50, 16}, 32)}, {"ids", Ids({4, 7}, 10, 33)}, {"dy", Random({4, 7, 16}, 34)}}, 1e-5,
             1e-5, "GatherGrad");
  // Onto a base (an accumulated gradient), or onto zeros after all on reset.
  for (bool reset : {false, true}) {
    Tensor flag(DataType::kBool, {});
    flag.data<bool>()[0] = reset;
    ExpectSame(R"(
      input base: float32[50,16]
      input ids: int64[4,7]
      input dy: float32[4,7,16]
      input reset: bool[]
      init shape: int64[2] = 50 16
      dt = ai.cleave.GatherGrad(shape, ids, dy, base, reset)
      output dt
    )",
               {{"base", Random({50, 16}, 36)}, {"ids", Ids({4, 7}, 10, 37)}, {"dy", Random({4, 7, 16}, 38)},
                {"reset", flag}},
               1e-5, 1e-5, "GatherGrad");
  }
}

TEST(CudaProvider, CrossEntropyForwardAndBackward) {
  REQUIRE_CUDA();
  Tensor labels = Ids({12}, 40, 35);
  labels.data<int64_t>()[3] = -100;  // ignored
  for (const char* red : {"mean", "sum"})
    ExpectSame(absl::StrCat(R"(
      input s: float32[12,40]
      input labels: int64[12]
      init dy: float32[] = 1.5
      loss, lp = SoftmaxCrossEntropyLoss(s, labels) {reduction = ")", red, R"(", ignore_index = -100}
      d = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, lp, labels) {reduction = ")", red, R"(", ignore_index = -100}
      output loss
      output lp
      output d
    )"),
               {{"s", Random({12, 40}, 36, -5.f, 5.f)}, {"labels", labels}}, 1e-5, 1e-5, "SoftmaxCrossEntropyLoss");
  // With no reduction and the loss unread, log_prob is still formed (the rows' losses go to scratch).
  ExpectSame(R"(
    input s: float32[12,40]
    input labels: int64[12]
    _, lp = SoftmaxCrossEntropyLoss(s, labels) {reduction = "none", ignore_index = -100}
    output lp
  )",
             {{"s", Random({12, 40}, 40, -5.f, 5.f)}, {"labels", labels}}, 1e-5, 1e-5, "SoftmaxCrossEntropyLoss");
  // One rank's columns [20, 40) of a vocabulary-parallel loss.
  ExpectSame(R"(
    input lp: float32[12,20]
    input labels: int64[12]
    init dy: float32[] = 1
    d = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, lp, labels) {reduction = "mean", ignore_index = -100, class_offset = 20, num_classes = 40}
    output d
  )",
             {{"lp", Random({12, 20}, 37, -6.f, -1.f)}, {"labels", labels}}, 1e-6, 1e-5,
             "SoftmaxCrossEntropyLossGrad");
  // The gradient from the scores (each row's log-sum-exp formed in one online pass over a
  // GPT-2-sized vocabulary), in float32 and written as bf16 (widened here to compare).
  Tensor wide_labels = Ids({6}, 50257, 38);
  wide_labels.data<int64_t>()[2] = -100;
  const Feeds wide = {{"s", Random({6, 50257}, 39, -8.f, 8.f)}, {"labels", wide_labels}};
  ExpectSame(R"(
    input s: float32[6,50257]
    input labels: int64[6]
    init dy: float32[] = 1.5
    d = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, s, labels) {reduction = "mean", ignore_index = -100, from_scores = 1}
    output d
  )",
             wide, 1e-9, 1e-4, "SoftmaxCrossEntropyLossGrad");
  ExpectSame(R"(
    input s: float32[6,50257]
    input labels: int64[6]
    init dy: float32[] = 1.5
    h = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, s, labels) {reduction = "sum", ignore_index = -100, from_scores = 1, to = 16}
    hw = Cast(h) {to = 1}
    output hw
  )",
             wide, 1e-9, 1e-2, "SoftmaxCrossEntropyLossGrad");
  // bf16 scores (LowPrecisionScores: the logits product writes bf16), read as float32 by both,
  // with the loss folded in.
  ExpectSame(R"(
    input s: float32[6,50257]
    input labels: int64[6]
    init dy: float32[] = 1.5
    sb = Cast(s) {to = 16}
    h, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, sb, labels) {reduction = "mean", ignore_index = -100, from_scores = 1, to = 16}
    hw = Cast(h) {to = 1}
    output hw
    output loss
  )",
             wide, 1e-9, 1e-2, "SoftmaxCrossEntropyLossGrad");
  // The forward folded into the gradient: its loss output, for each reduction, against the
  // CPU's (which forms it with the forward's kernel).
  for (const char* reduction : {"mean", "sum", "none"})
    ExpectSame(absl::StrCat(R"(
      input s: float32[6,50257]
      input labels: int64[6]
      init dy: float32)", std::string(reduction) == "none" ? "[6] = 1 2 3 4 5 6" : "[] = 1.5", R"(
      d, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, s, labels) {reduction = ")", reduction,
                            R"(", ignore_index = -100, from_scores = 1}
      output d
      output loss
    )"),
               wide, 1e-6, 1e-4, "SoftmaxCrossEntropyLossGrad");
}

// Cross-entropy beyond the one-pass kernels: scores [N, C, d1, d2], class weights, int32
// labels, every reduction, the gradient from log_prob and from the scores (with the loss).
TEST(CudaProvider, CrossEntropyOverSpatialDimsWithClassWeights) {
  REQUIRE_CUDA();
  Tensor labels = Ids({4, 3, 2}, 6, 41);
  labels.data<int64_t>()[5] = -1;  // ignored
  Tensor l32(DataType::kInt32, {5});
  for (int k = 0; k < 5; ++k) l32.data<int32_t>()[k] = (k * 2) % 7;
  Tensor l32_3(DataType::kInt32, {4, 3});
  for (int k = 0; k < 12; ++k) l32_3.data<int32_t>()[k] = (k * 5) % 6;
  for (const char* red : {"none", "sum", "mean"}) {
    const std::string attrs = absl::StrCat("{reduction = \"", red, "\", ignore_index = -1}");
    ExpectSame(absl::StrCat(R"(
      input s: float32[4,6,3,2]
      input labels: int64[4,3,2]
      input w: float32[6]
      input a: float32[5,7]
      input u: int32[5]
      loss, lp = SoftmaxCrossEntropyLoss(s, labels, w) )", attrs, R"(
      m = SoftmaxCrossEntropyLoss(a, u) {reduction = ")", red, R"("}
      dl = Sin(loss)
      dm = Cos(m)
      d = ai.cleave.SoftmaxCrossEntropyLossGrad(dl, lp, labels, w) )", attrs, R"(
      da = ai.cleave.SoftmaxCrossEntropyLossGrad(dm, a, u) {reduction = ")", red, R"(", from_scores = 1}
      output loss
      output lp
      output m
      output d
      output da
    )"),
               {{"s", Random({4, 6, 3, 2}, 42, -4.f, 4.f)}, {"labels", labels}, {"w", Random({6}, 43, 0.5f, 2.f)},
                {"a", Random({5, 7}, 44, -4.f, 4.f)}, {"u", l32}},
               1e-5, 1e-5, "*");
  }
  // bf16 scores and weights, against the CPU on the rounded operands in float32.
  ExpectSame(R"(
    input s: float32[4,6,3]
    input labels: int32[4,3]
    input w: float32[6]
    hs = Cast(s) {to = 16}
    hw = Cast(w) {to = 16}
    hl, hp = SoftmaxCrossEntropyLoss(hs, labels, hw)
    l = Cast(hl) {to = 1}
    p = Cast(hp) {to = 1}
    output l
    output p
  )",
             {{"s", Random({4, 6, 3}, 48, -4.f, 4.f)}, {"labels", l32_3}, {"w", Random({6}, 49, 0.5f, 2.f)}}, 2e-2,
             2e-2, "*", R"(
    input s: float32[4,6,3]
    input labels: int32[4,3]
    input w: float32[6]
    hs = Cast(s) {to = 16}
    hw = Cast(w) {to = 16}
    fs = Cast(hs) {to = 1}
    fw = Cast(hw) {to = 1}
    l, p = SoftmaxCrossEntropyLoss(fs, labels, fw)
    output l
    output p
  )");
  // The loss folded into the gradient from [N, C, d] scores.
  ExpectSame(R"(
    input s: float32[4,6,3]
    input labels: int64[4,3]
    init dy: float32[] = 0.75
    d, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, s, labels) {from_scores = 1}
    output d
    output loss
  )",
             {{"s", Random({4, 6, 3}, 45, -4.f, 4.f)}, {"labels", Ids({4, 3}, 6, 46)}}, 1e-5, 1e-5, "*");
}

TEST(CudaProvider, OptimizerOps) {
  REQUIRE_CUDA();
  Tensor step(DataType::kInt64, std::vector<int64_t>{});
  step.data<int64_t>()[0] = 7;
  Tensor reset(DataType::kBool, std::vector<int64_t>{});
  reset.data<bool>()[0] = false;
  ExpectSame(R"(
    input lr: float32[]
    input step: int64[]
    input scale: float32[]
    input p: float32[1000]
    input g: float32[1000]
    input m: float32[1000]
    input v: float32[1000]
    input reset: bool[]
    po, mo, vo = ai.cleave.AdamW(lr, step, scale, p, g, m, v) {beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1}
    n = ai.cleave.SquaredNorm(g, p, m)
    acc = ai.cleave.InPlaceAccumulator(m, g, reset)
    output po
    output mo
    output vo
    output n
    output acc
  )",
             {{"lr", Tensor::Scalar<float>(3e-3f)}, {"step", step}, {"scale", Tensor::Scalar<float>(0.5f)},
              {"p", Random({1000}, 38)}, {"g", Random({1000}, 39)}, {"m", Random({1000}, 40)},
              {"v", Random({1000}, 41, 0.f, 1.f)}, {"reset", reset}},
             1e-6, 1e-5, "AdamW");
}

// The loss scaler's test on the device against the CPU's: true over finite gradients, false
// with one infinite or NaN element in any of them.
TEST(CudaProvider, IsAllFinite) {
  REQUIRE_CUDA();
  const char* text = R"(
    input a: float32[1000]
    input b: float32[7,3]
    y = ai.cleave.IsAllFinite(a, b)
    output y
  )";
  ExpectSame(text, {{"a", Random({1000}, 42)}, {"b", Random({7, 3}, 43)}}, 0, 0, "IsAllFinite");
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    Tensor b = Random({7, 3}, 44);
    b.data<float>()[20] = bad;
    ExpectSame(text, {{"a", Random({1000}, 42)}, {"b", b}}, 0, 0, "IsAllFinite");
  }
}

// The optimizers over two parameters: MultiTensorAdamW and MultiTensorSGD (with and without
// momentum), plain and with compute_norm (the norm output and the update clipped with it, as
// max_grad_norm 1 clips these random gradients, or not), the scale formed on the device; and
// SGD alone.
TEST(CudaProvider, Optimizers) {
  Tensor step(DataType::kInt64, std::vector<int64_t>{});
  step.data<int64_t>()[0] = 4;
  Feeds feeds = {{"lr", Tensor::Scalar<float>(3e-3f)}, {"step", step}, {"scale", Tensor::Scalar<float>(0.5f)}};
  const std::vector<int64_t> shapes[2] = {{1000}, {7, 3}};
  const char* state_names[] = {"g", "m", "v"};  // grad, then the optimizer's state
  unsigned seed = 90;
  for (int k = 1; k <= 2; ++k) {
    feeds.emplace_back(absl::StrCat("p", k), Random(shapes[k - 1], seed++));
    for (const char* x : state_names)
      feeds.emplace_back(absl::StrCat(x, k), x[0] == 'v' ? Random(shapes[k - 1], seed++, 0.f, 1.f)
                                                         : Random(shapes[k - 1], seed++));
  }
  const struct {
    const char* op;
    int state;  // optimizer state tensors per parameter
    const char* attrs;
  } variants[] = {
      {"MultiTensorAdamW", 2, "beta1 = 0.9, beta2 = 0.95, epsilon = 1e-8, weight_decay = 0.1"},
      {"MultiTensorAdamW", 2, "weight_decay = 0.1, compute_norm = 1, clip_epsilon = 1e-6, max_grad_norm = 1.0"},
      {"MultiTensorAdamW", 2, "weight_decay = 0.1, compute_norm = 1, max_grad_norm = 0.0"},
      {"MultiTensorSGD", 0, "weight_decay = 0.1"},
      {"MultiTensorSGD", 1, "momentum = 0.9, dampening = 0.1, nesterov = 1, compute_norm = 1, max_grad_norm = 1.0"},
      {"MultiTensorSGD", 1, "momentum = 0.9, compute_norm = 1, max_grad_norm = 0.0"},
      {"SGD", 1, "momentum = 0.9, weight_decay = 0.01"}};
  struct Case {
    std::string text, op;
  };
  std::vector<Case> cases;
  for (const auto& v : variants) {
    const bool norm = std::string(v.attrs).find("compute_norm") != std::string::npos;
    const int groups = std::string(v.op) == "SGD" ? 1 : 2;
    std::string text = "input lr: float32[]\ninput step: int64[]\ninput scale: float32[]\n";
    std::vector<std::string> in = {"lr", "step", "scale"}, out;
    for (int k = 1; k <= groups; ++k) {
      const std::string dims = absl::StrCat("[", absl::StrJoin(shapes[k - 1], ","), "]");
      for (int j = -1; j <= v.state; ++j) {
        const std::string name = j < 0 ? absl::StrCat("p", k) : absl::StrCat(state_names[j], k);
        absl::StrAppend(&text, "input ", name, ": float32", dims, "\n");
        in.push_back(name);
        if (j != 0) out.push_back(absl::StrCat("out_", name));
      }
    }
    if (norm) out.push_back("norm");
    absl::StrAppend(&text, absl::StrJoin(out, ", "), " = ai.cleave.", v.op, "(", absl::StrJoin(in, ", "), ") {",
                    v.attrs, "}\n");
    for (const std::string& o : out) absl::StrAppend(&text, "output ", o, "\n");
    // The graph is well formed and runs on the CPU, on any machine.
    SessionOptions o;
    o.optimize = false;
    auto parsed = graph::ParseGraph(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
    auto cpu = InferenceSession::FromGraph(std::move(*parsed), o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    Feeds mine;
    for (const std::string& name : in)
      for (const auto& f : feeds)
        if (f.first == name) mine.push_back(f);
    auto got = (*cpu)->Run(mine);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), out.size());
    cases.push_back({text, v.op});
  }
  REQUIRE_CUDA();
  for (const Case& c : cases) {
    Feeds mine;
    for (const auto& f : feeds)
      if (c.text.find("input " + f.first + ":") != std::string::npos) mine.push_back(f);
    ExpectSame(c.text, mine, 1e-6, 1e-5, c.op);
  }
}

TEST(CudaProvider, ReductionsSelectionConcatSplit) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[4,6,32]
    init axes: int64[2] = 0 1
    s = ReduceSum(x, axes) {keepdims = 0}
    m = ReduceMean(x) {axes = [-1], keepdims = 1}
    k = ReduceMax(x) {axes = [1], keepdims = 0}
    output s
    output m
    output k
  )",
             {{"x", Random({4, 6, 32}, 50)}}, 1e-5, 1e-5, "ReduceSum");
  // Long rows (a block per output), a whole tensor to one value, and leading axes (columns).
  ExpectSame(R"(
    input x: float32[3,4096]
    input big: float32[64,512]
    init one: int64[1] = 1
    init zero: int64[1] = 0
    s = ReduceSum(x, one) {keepdims = 0}
    t = ReduceSum(big) {keepdims = 0}
    c = ReduceSum(big, zero) {keepdims = 1}
    k = ReduceMax(x) {axes = [1], keepdims = 0}
    output s
    output t
    output c
    output k
  )",
             {{"x", Random({3, 4096}, 55)}, {"big", Random({64, 512}, 56)}}, 1e-4, 1e-5, "ReduceSum");
  // A bias gradient of a training step ([8, 1024, 768] to [768], and 2304 columns in bf16): the
  // rows are split into chunks, and the chunks' partial sums combined in a fixed order.
  for (const char* type : {"float32", "bfloat16"})
    ExpectSame(absl::StrCat(R"(
      input x: float32[8,1024,2304]
      init axes: int64[2] = 0 1
      hx = Cast(x) {to = )", std::string(type) == "float32" ? 1 : 16, R"(}
      s = ReduceSum(hx, axes) {keepdims = 1}
      m = ReduceMean(hx) {axes = [0, 1], keepdims = 0}
      k = ReduceMax(hx) {axes = [0, 1], keepdims = 0}
      ws = Cast(s) {to = 1}
      wm = Cast(m) {to = 1}
      wk = Cast(k) {to = 1}
      output ws
      output wm
      output wk
    )"),
               {{"x", Random({8, 1024, 2304}, 57)}}, 1e-3, std::string(type) == "float32" ? 1e-5 : 8e-3, "*");
  // A NaN in one row reaches its column's max and sum through both passes, and only its column.
  Tensor with_nan = Random({4096, 40}, 58);
  with_nan.data<float>()[3000 * 40 + 7] = std::nanf("");
  ExpectSame(R"(
    input x: float32[4096,40]
    init zero: int64[1] = 0
    s = ReduceSum(x, zero) {keepdims = 0}
    k = ReduceMax(x) {axes = [0], keepdims = 0}
    output s
    output k
  )",
             {{"x", with_nan}}, 1e-3, 1e-5, "*");
  Tensor cond(DataType::kBool, {6, 1});
  for (int i = 0; i < 6; ++i) cond.data<bool>()[i] = i % 2 == 0;
  ExpectSame(R"(
    input c: bool[6,1]
    input a: float32[2,6,32]
    init b: float32[] = -10000
    y = Where(c, a, b)
    output y
  )",
             {{"c", cond}, {"a", Random({2, 6, 32}, 51)}}, 0, 0, "Where");
  ExpectSame(R"(
    input x: float32[2,5,24]
    init split: int64[3] = 8 8 8
    q, k, v = Split(x, split) {axis = 2}
    c = Concat(v, q, k) {axis = 1}
    output c
    output k
  )",
             {{"x", Random({2, 5, 24}, 52)}}, 0, 0, "Split");
  ExpectSame(R"(
    input dy: float32[3,7,50]
    input x: float32[3,7,50]
    y = Softmax(x) {axis = -1}
    l = LogSoftmax(x) {axis = -1}
    dx = ai.cleave.SoftmaxGrad(dy, y) {axis = -1}
    dl = ai.cleave.LogSoftmaxGrad(dy, l) {axis = -1}
    output dx
    output dl
  )",
             {{"dy", Random({3, 7, 50}, 53)}, {"x", Random({3, 7, 50}, 54)}}, 1e-6, 1e-5, "SoftmaxGrad");
}

// Training-mode Dropout under a run seed draws the CPU's mask bit for bit.
TEST(CudaProvider, DropoutDrawsTheCpuMaskForTheSameSeed) {
  REQUIRE_CUDA();
  const char* text = R"(
    input x: float32[8,1000]
    init ratio: float32[] = 0.3
    init training: bool[] = 1
    y, mask = Dropout(x, ratio, training)
    output y
    output mask
  )";
  std::vector<Tensor> got[2];
  for (int dev = 0; dev < 2; ++dev) {
    SessionOptions o;
    o.optimize = false;
    o.device = dev ? DeviceChoice::kCuda : DeviceChoice::kCpu;
    auto s = InferenceSession::FromGraph(*graph::ParseGraph(text), o);
    ASSERT_TRUE(s.ok()) << s.status();
    if (dev) {
      EXPECT_EQ((*s)->warning(), "");
    }
    got[dev] = {Tensor(DataType::kFloat32, {8, 1000}), Tensor(DataType::kBool, {8, 1000})};
    RunOptions ro;
    ro.seed = 7;
    ASSERT_TRUE((*s)->RunInto({{"x", Random({8, 1000}, 70)}}, got[dev], ro).ok());
  }
  EXPECT_EQ(testing::CompareTensors(got[1][0], got[0][0], 0, 1e-6), "");
  EXPECT_EQ(std::memcmp(got[1][1].raw(), got[0][1].raw(), 8000), 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < 8000; ++i) kept += got[0][1].data<bool>()[i];
  EXPECT_NEAR(kept / 8000.0, 0.7, 0.03);
}

// Without a run seed, a Dropout with a seed attribute replays numpy's sequence of masks (the
// ONNX reference's) as the CPU's does, run after run; one before version 12 is the identity
// with a mask of ones.
TEST(CudaProvider, SeededDropoutDrawsTheCpuSequenceWithoutARunSeed) {
  REQUIRE_CUDA();
  const char* text = R"(
    input x: float32[4,300]
    init ratio: float32[] = 0.4
    init training: bool[] = 1
    y, mask = Dropout(x, ratio, training) {seed = 11}
    output y
    output mask
  )";
  SessionOptions o;
  o.optimize = false;
  auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(text), o);
  o.device = DeviceChoice::kCuda;
  auto cuda = InferenceSession::FromGraph(*graph::ParseGraph(text), o);
  ASSERT_TRUE(cpu.ok() && cuda.ok()) << cpu.status() << cuda.status();
  EXPECT_EQ((*cuda)->warning(), "");
  std::vector<uint8_t> first;
  for (int run = 0; run < 2; ++run) {
    auto want = (*cpu)->Run({{"x", Random({4, 300}, 71)}});
    auto got = (*cuda)->Run({{"x", Random({4, 300}, 71)}});
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_EQ(testing::CompareTensors((*got)[0], (*want)[0], 0, 1e-6), "") << "run " << run;
    EXPECT_EQ(std::memcmp((*got)[1].raw(), (*want)[1].raw(), 1200), 0) << "run " << run;
    const uint8_t* m = static_cast<const uint8_t*>((*got)[1].raw());
    if (run == 0) first.assign(m, m + 1200);
    else EXPECT_NE(std::memcmp(first.data(), m, 1200), 0) << "the second run drew the first run's mask again";
  }
  ExpectSame(R"(
    opset 7
    input x: float32[4,30]
    y, mask = Dropout(x) {ratio = 0.3}
    output y
    output mask
  )",
             {{"x", Random({4, 30}, 72)}}, 0, 0, "*");
}

// NegativeLogLikelihoodLoss and its gradient in each reduction, [N, C] and [N, C, d] inputs,
// class weights, ignore_index, int32 targets, and bf16 against the CPU on the rounded operands.
TEST(CudaProvider, NegativeLogLikelihoodLossAndItsGradient) {
  REQUIRE_CUDA();
  Tensor t2 = Ids({6, 5}, 7, 31);
  t2.data<int64_t>()[3] = -1;  // ignored
  Tensor t1(DataType::kInt32, {9});
  for (int k = 0; k < 9; ++k) t1.data<int32_t>()[k] = (k * 3) % 4;
  for (const char* red : {"none", "sum", "mean"}) {
    const std::string attrs = absl::StrCat("{reduction = \"", red, "\", ignore_index = -1}");
    const std::string plain = absl::StrCat("{reduction = \"", red, "\"}");
    ExpectSame(absl::StrCat(R"(
      input x: float32[6,7,5]
      input t: int64[6,5]
      input w: float32[7]
      input a: float32[9,4]
      input u: int32[9]
      l = NegativeLogLikelihoodLoss(x, t, w) )", attrs, R"(
      m = NegativeLogLikelihoodLoss(a, u) )", plain, R"(
      ds = Sin(l)
      dm = Cos(m)
      dx = ai.cleave.NegativeLogLikelihoodLossGrad(ds, x, t, w) )", attrs, R"(
      da = ai.cleave.NegativeLogLikelihoodLossGrad(dm, a, u) )", plain, R"(
      output l
      output m
      output dx
      output da
    )"),
               {{"x", Random({6, 7, 5}, 32)}, {"t", t2}, {"w", Random({7}, 33, 0.5f, 2.f)},
                {"a", Random({9, 4}, 34)}, {"u", t1}},
               1e-5, 1e-5, "*");
  }
  ExpectSame(R"(
    input a: float32[9,4]
    input u: int32[9]
    ha = Cast(a) {to = 16}
    hl = NegativeLogLikelihoodLoss(ha, u) {reduction = "sum"}
    l = Cast(hl) {to = 1}
    output l
  )",
             {{"a", Random({9, 4}, 35)}, {"u", t1}}, 1e-3, 8e-3, "*", R"(
    input a: float32[9,4]
    input u: int32[9]
    ha = Cast(a) {to = 16}
    fa = Cast(ha) {to = 1}
    fl = NegativeLogLikelihoodLoss(fa, u) {reduction = "sum"}
    hl = Cast(fl) {to = 16}
    l = Cast(hl) {to = 1}
    output l
  )");
  // A target outside [0, C) is an error naming the node.
  auto s = cuda_testing::CudaSession(R"(
    input a: float32[2,3]
    input u: int64[2]
    l = NegativeLogLikelihoodLoss(a, u)
    output l
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Run({{"a", Random({2, 3}, 36)}, {"u", Ids({2}, 1, 37)}});
  ASSERT_TRUE(r.ok()) << r.status();
  Tensor bad = Ids({2}, 1, 38);
  bad.data<int64_t>()[1] = 3;
  r = (*s)->Run({{"a", Random({2, 3}, 36)}, {"u", bad}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("NegativeLogLikelihoodLoss"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace cleave
