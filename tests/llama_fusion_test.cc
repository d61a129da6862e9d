// LLaMA's patterns as exporters write them: RMSNorm (x * rsqrt(mean(x^2) + eps) * weight)
// becomes one ai.cleave.RMSNormalization, the SwiGLU MLP's silu(gate) * up one ai.cleave.SwiGLU
// and the rotary embedding's x * cos + rotate_half(x) * sin one ai.cleave.RotaryEmbedding, each
// computing the same; variants that are not these are left alone, a
// LLaMA training graph differentiates them through RMSNormalizationGrad and SwiGLUGrad, and the
// device sessions' norm folds take the RMSNorm ops.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "graph/passes/pass.h"
#include "gtest/gtest.h"
#include "tests/fusion_test_util.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"

namespace cleave::graph {
namespace {

// LLaMA's export at opset 18 (torch 1.13): rsqrt as Div(1, Sqrt), the weight on the left.
constexpr char kRMSNorm[] = R"(
  opset 18
  input x: float32[2,3,8]
  init two: float32[] = 2
  init axes: int64[1] = -1
  init eps: float32[] = 1e-6
  init one: float32[] = 1
  init w: float32[8] = 1 2 3 4 -1 -2 0.5 0.25
  sq = Pow(x, two)
  ms = ReduceMean(sq, axes) {keepdims = 1}
  ve = Add(ms, eps)
  st = Sqrt(ve)
  r = Div(one, st)
  n = Mul(x, r)
  y = Mul(w, n)
  output y
)";

TEST(RMSNormFusion, EveryExportedFormBecomesOneOpComputingTheSame) {
  const std::vector<std::pair<std::string, std::string>> forms = {
      {"as LLaMA exports it", kRMSNorm},
      {"Mul(x, x), Reciprocal, the weight on the right",
       absl::StrReplaceAll(kRMSNorm, {{"sq = Pow(x, two)", "sq = Mul(x, x)"},
                                      {"r = Div(one, st)", "r = Reciprocal(st)"},
                                      {"n = Mul(x, r)", "n = Mul(r, x)"},
                                      {"y = Mul(w, n)", "y = Mul(n, w)"}})},
      {"Div(x, sqrt)",
       absl::StrReplaceAll(kRMSNorm, {{"r = Div(one, st)\n", ""}, {"n = Mul(x, r)", "n = Div(x, st)"}})},
      {"ReduceMean's axes as an attribute (opset 13)",
       absl::StrReplaceAll(kRMSNorm, {{"opset 18", "opset 13"},
                                      {"ReduceMean(sq, axes) {keepdims = 1}", "ReduceMean(sq) {axes = [2]}"}})},
  };
  for (const auto& [what, text] : forms) {
    SCOPED_TRACE(what);
    ActivationNormFusion fusion;
    auto fused = Rewritten(text, fusion);
    ASSERT_NE(fused, nullptr);
    ASSERT_EQ(OpNames(*fused), std::vector<std::string>{"ai.cleave.RMSNormalization"});
    const Node* rn = fused->FindValue("y")->producer();
    EXPECT_EQ(rn->input(0)->name(), "x");
    EXPECT_EQ(rn->input(1)->name(), "w");
    EXPECT_NEAR(rn->AttrFloat("epsilon", 0), 1e-6, 1e-12);
    EXPECT_EQ(rn->AttrInt("axis", 0), -1);
    ExpectGraphsAgree(std::move(fused), *ParseGraph(text), {{"x", Random({2, 3, 8}, 5)}}, 1e-6, 1e-5);
  }
}

TEST(RMSNormFusion, WhatIsNotAnRMSNormIsLeftAlone) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a cube, not a square", absl::StrReplaceAll(kRMSNorm, {{"init two: float32[] = 2", "init two: float32[] = 3"}})},
      {"the reciprocal also read elsewhere", absl::StrCat(kRMSNorm, "output r\n")},
      {"a weight of another width", absl::StrReplaceAll(kRMSNorm, {{"init w: float32[8] = 1 2 3 4 -1 -2 0.5 0.25",
                                                                     "init w: float32[1] = 2"}})},
      {"the mean over another axis",
       absl::StrReplaceAll(kRMSNorm, {{"init axes: int64[1] = -1", "init axes: int64[1] = 1"}})},
      {"another value normalised than squared",
       absl::StrReplaceAll(kRMSNorm, {{"input x: float32[2,3,8]", "input x: float32[2,3,8]\n  input z: float32[2,3,8]"},
                                      {"n = Mul(x, r)", "n = Mul(z, r)"}})},
      {"a weight computed at run time",
       absl::StrReplaceAll(kRMSNorm, {{"init w: float32[8] = 1 2 3 4 -1 -2 0.5 0.25", "input w: float32[8]"}})},
  };
  for (const auto& [what, text] : cases) {
    SCOPED_TRACE(what);
    ActivationNormFusion fusion;
    EXPECT_FALSE(Changes(fusion, text));
  }
}

// SwiGLU as exported (F.silu as gate * Sigmoid(gate)), in every operand order -> one op.
constexpr char kSwiGlu[] = R"(
  input gate: float32[2,3,8]
  input up: float32[2,3,8]
  s = Sigmoid(gate)
  silu = Mul(gate, s)
  y = Mul(silu, up)
  output y
)";

TEST(SwiGluFusion, EveryOperandOrderBecomesOneOpComputingTheSame) {
  const Feeds feeds = {{"gate", Random({2, 3, 8}, 81)}, {"up", Random({2, 3, 8}, 82)}};
  for (const std::string& text :
       {std::string(kSwiGlu), absl::StrReplaceAll(kSwiGlu, {{"Mul(gate, s)", "Mul(s, gate)"}}),
        absl::StrReplaceAll(kSwiGlu, {{"Mul(silu, up)", "Mul(up, silu)"}})}) {
    SCOPED_TRACE(text);
    ActivationNormFusion fusion;
    auto fused = Rewritten(text, fusion);
    ASSERT_NE(fused, nullptr);
    ASSERT_EQ(OpNames(*fused), std::vector<std::string>{"ai.cleave.SwiGLU"});
    const Node* n = fused->FindValue("y")->producer();
    EXPECT_EQ(n->input(0)->name(), "gate");
    EXPECT_EQ(n->input(1)->name(), "up");
    ExpectGraphsAgree(std::move(fused), *ParseGraph(text), feeds, 1e-6, 1e-6);
  }
  ActivationNormFusion fusion;
  EXPECT_FALSE(Changes(fusion, absl::StrCat(kSwiGlu, "output silu\n"))) << "silu read elsewhere";
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(kSwiGlu, {{"input up: float32[2,3,8]", "input up: float32[8]"}})))
      << "an up that broadcasts";
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(kSwiGlu, {{"Mul(gate, s)", "Mul(up, s)"}, {"Mul(silu, up)",
                                                                                             "Mul(silu, gate)"}})))
      << "the sigmoid of another value than it multiplies";
}

// Rotary embedding as LLaMA exports it: q * cos + Concat(Neg(q[..., 8:]), q[..., :8]) * sin over
// a [B, H, T, 16] q with [T, 16] tables.
constexpr char kRotary[] = R"(
  opset 18
  input q: float32[2,3,5,16]
  input cos: float32[5,16]
  input sin: float32[5,16]
  init h: int64[1] = 8
  init zero: int64[1] = 0
  init big: int64[1] = 9223372036854775807
  init last: int64[1] = -1
  init one: int64[1] = 1
  m1 = Mul(q, cos)
  x2 = Slice(q, h, big, last, one)
  n2 = Neg(x2)
  x1 = Slice(q, zero, h, last, one)
  rot = Concat(n2, x1) {axis = -1}
  m2 = Mul(rot, sin)
  y = Add(m1, m2)
  output y
)";

TEST(RotaryFusion, RotateHalfBecomesOneOpComputingTheSame) {
  const Feeds feeds = {{"q", Random({2, 3, 5, 16}, 83)}, {"cos", Random({5, 16}, 84)}, {"sin", Random({5, 16}, 85)}};
  for (const std::string& text :
       {std::string(kRotary),
        absl::StrReplaceAll(kRotary, {{"Mul(q, cos)", "Mul(cos, q)"}, {"Mul(rot, sin)", "Mul(sin, rot)"},
                                      {"Add(m1, m2)", "Add(m2, m1)"}, {"{axis = -1}", "{axis = 3}"}}),
        absl::StrReplaceAll(kRotary, {{"init big: int64[1] = 9223372036854775807", "init big: int64[1] = 16"},
                                      {"init last: int64[1] = -1", "init last: int64[1] = 3"}})}) {
    SCOPED_TRACE(text);
    ActivationNormFusion fusion;
    auto fused = Rewritten(text, fusion);
    ASSERT_NE(fused, nullptr);
    ASSERT_EQ(OpNames(*fused), std::vector<std::string>{"ai.cleave.RotaryEmbedding"});
    const Node* n = fused->FindValue("y")->producer();
    EXPECT_EQ(n->input(1)->name(), "cos");
    EXPECT_EQ(n->input(2)->name(), "sin");
    ExpectGraphsAgree(std::move(fused), *ParseGraph(text), feeds, 0, 0);
  }
  ActivationNormFusion fusion;
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(kRotary, {{"Concat(n2, x1)", "Concat(x1, n2)"}})))
      << "the halves the other way round";
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(kRotary, {{"init h: int64[1] = 8", "init h: int64[1] = 6"}})))
      << "not halves";
  EXPECT_FALSE(Changes(fusion, absl::StrCat(kRotary, "output rot\n"))) << "rotate_half read elsewhere";
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(kRotary, {{"input cos: float32[5,16]", "input cos: float32[2,2,3,5,16]"},
                                                             {"input sin: float32[5,16]",
                                                              "input sin: float32[2,2,3,5,16]"}})))
      << "tables that broadcast q";
}

// The rotary embedding of q swapped into [B, H, T, D] runs ahead of the swap, on the product's
// [B, T, H, D], its tables laid out against that: [T, D] tables as [T, 1, D] (an Unsqueeze),
// [1, 1, T, D] ones transposed, in both of Unsqueeze's forms; the same values, bit for bit.
// A swap that moves the last axis, or whose result has another reader, stays where it is.
TEST(RotaryFusion, MovesAheadOfTheHeadSwapWithItsTablesLaidOutForTheProduct) {
  const std::string swapped = absl::StrReplaceAll(
      kRotary, {{"input q: float32[2,3,5,16]", "input qp: float32[2,5,3,16]"},
                {"  m1 = Mul(q, cos)", "  q = Transpose(qp) {perm = [0, 2, 1, 3]}\n  m1 = Mul(q, cos)"}});
  struct Case {
    std::string what, text;
    std::vector<int64_t> table;
    std::vector<std::string> ops;
    Shape laid_out;
  };
  const std::vector<std::string> unsqueezed = {"Unsqueeze", "Unsqueeze", "ai.cleave.RotaryEmbedding", "Transpose"};
  const std::vector<Case> cases = {
      {"[T, D] tables", swapped, {5, 16}, unsqueezed, Shape::FromDims({5, 1, 16})},
      {"Unsqueeze's axes an attribute (opset 12)", absl::StrReplaceAll(swapped, {{"opset 18", "opset 12"}}),
       {5, 16}, unsqueezed, Shape::FromDims({5, 1, 16})},
      {"[1, 1, T, D] tables",
       absl::StrReplaceAll(swapped, {{"input cos: float32[5,16]", "input cos: float32[1,1,5,16]"},
                                     {"input sin: float32[5,16]", "input sin: float32[1,1,5,16]"}}),
       {1, 1, 5, 16}, {"Transpose", "Transpose", "ai.cleave.RotaryEmbedding", "Transpose"},
       Shape::FromDims({1, 5, 1, 16})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ActivationNormFusion fusion;
    auto fused = Rewritten(c.text, fusion);
    ASSERT_NE(fused, nullptr);
    std::vector<std::string> ops = OpNames(*fused);
    std::sort(ops.begin(), ops.end());
    std::vector<std::string> want = c.ops;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(ops, want);
    const Node* swap = fused->FindValue("y")->producer();
    ASSERT_TRUE(swap && swap->op_type() == "Transpose");
    const Node* rot = swap->input(0)->producer();
    ASSERT_TRUE(rot && rot->op_type() == "RotaryEmbedding");
    EXPECT_EQ(rot->input(0)->name(), "qp");
    EXPECT_EQ(rot->input(1)->shape(), c.laid_out);
    EXPECT_EQ(rot->input(2)->shape(), c.laid_out);
    const Feeds feeds = {
        {"qp", Random({2, 5, 3, 16}, 86)}, {"cos", Random(c.table, 87)}, {"sin", Random(c.table, 88)}};
    ExpectGraphsAgree(std::move(fused), *ParseGraph(c.text), feeds, 0, 0);
  }
  ActivationNormFusion fusion;
  auto kept = Rewritten(absl::StrReplaceAll(swapped, {{"[0, 2, 1, 3]", "[0, 1, 3, 2]"},
                                                      {"input qp: float32[2,5,3,16]", "input qp: float32[2,3,16,5]"}}),
                        fusion);
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->FindValue("y")->producer()->input(0)->producer()->op_type(), "Transpose")
      << "a swap of the rotated axis";
  kept = Rewritten(absl::StrCat(swapped, "output q\n"), fusion);
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->FindValue("y")->producer()->input(0)->name(), "q") << "the swapped q read elsewhere";
}

// The kernels' own checks: x's last dim even, the tables broadcasting to x.
TEST(RotaryFusion, TablesThatDoNotBroadcastAreAnErrorNamingTheShapes) {
  testing::OpTester("RotaryEmbedding", 1, kCleaveDomain)
      .Input<float>("x", {2, 4}, std::vector<float>(8, 1.f))
      .Input<float>("cos", {3}, std::vector<float>(3, 1.f))
      .Input<float>("sin", {3}, std::vector<float>(3, 1.f))
      .Output<float>("y", {2, 4}, std::vector<float>(8, 1.f))
      .ExpectFailure("expected x with an even last dim and cos/sin broadcasting to it, got x [2,4] and cos [3]")
      .Run();
  testing::OpTester("RotaryEmbedding", 1, kCleaveDomain)
      .Input<float>("x", {2, 3}, std::vector<float>(6, 1.f))
      .Input<float>("cos", {3}, std::vector<float>(3, 1.f))
      .Input<float>("sin", {3}, std::vector<float>(3, 1.f))
      .Output<float>("y", {2, 3}, std::vector<float>(6, 1.f))
      .ExpectFailure("even")
      .Run();
}

// The LLaMA sample trains through the fused ops: one RMSNormalization per norm (two a layer and
// the final one) and one SwiGLU a layer, each differentiated by its own gradient op, and none
// of the decomposed patterns' ops left.
TEST(LlamaFusion, TrainsThroughTheFusedOpsAndTheirGradients) {
  auto a = testing::BuildArtifacts("train_variants/llama", 2, 16, trainer::TrainingSpec{});
  ASSERT_NE(a.training, nullptr);
  std::map<std::string, int> ops = OpCounts(*a.training);
  EXPECT_EQ(ops["RMSNormalization"], 5);
  EXPECT_EQ(ops["RMSNormalizationGrad"], 5);
  EXPECT_EQ(ops["SwiGLU"], 2);
  EXPECT_EQ(ops["SwiGLUGrad"], 2);
  EXPECT_EQ(ops["RotaryEmbedding"], 4);  // q and k of each layer
  EXPECT_EQ(ops["RotaryEmbeddingGrad"], 4);
  EXPECT_EQ(ops["Sqrt"], 0);
  EXPECT_EQ(ops["Sigmoid"], 0);
  EXPECT_EQ(ops["Neg"], 0);
}

// LLaMA's q and k meet attention in the products' own layout once their rotary embeddings run
// ahead of the head swaps: a CPU training session's graph keeps none of a layer's eight
// attention transposes (forward and backward), its Attention and AttentionGrad read "bshd", and
// the embeddings' tables are constants laid out [T, 1, D].
TEST(LlamaFusion, AttentionReadsTheRotatedProductsInTheirOwnLayout) {
  trainer::TrainingSpec spec;
  spec.fuse_attention = true;
  auto s = trainer::TrainingSession::Create(testing::BuildArtifacts("train_variants/llama", 2, 16, spec),
                                            testing::OneThread());
  ASSERT_TRUE(s.ok()) << s.status();
  const Graph* g = (*s)->training_graph();
  ASSERT_NE(g, nullptr);
  std::map<std::string, int> ops = OpCounts(*g);
  EXPECT_EQ(ops["Transpose"], 0);
  int bshd = 0, rotary = 0;
  for (const auto& n : g->nodes()) {
    bshd += (n->op_type() == "Attention" || n->op_type() == "AttentionGrad") && n->AttrString("layout", "") == "bshd";
    if (n->op_type() != "RotaryEmbedding" && n->op_type() != "RotaryEmbeddingGrad") continue;
    ++rotary;
    for (int i : {1, 2}) {
      EXPECT_TRUE(n->input(i)->is_initializer()) << n->Describe();
      const Shape& table = n->input(i)->shape();
      ASSERT_EQ(table.rank(), 3) << n->Describe();
      EXPECT_EQ(table[0], Dim(16));
      EXPECT_EQ(table[1], Dim(1));
    }
  }
  EXPECT_EQ(bshd, 4) << "each layer's Attention and AttentionGrad";
  EXPECT_EQ(rotary, 8) << "q's and k's embeddings and their gradients, two layers";
  auto loss = (*s)->TrainStep(testing::TokenBatch(16, 64));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(std::isfinite(*loss));
}

// The device sessions' folds into the norm gradients take RMSNormalizationGrad too: the
// residual gradient's Add becomes dX_add, its Cast to bf16 / fp16 dX_low, and a low-precision
// product read only as dY (or as SkipRMSNormalization's skip) writes its own type. Each computes
// what the graph before it computes.
TEST(RMSNormFusion, TheGradientTakesTheResidualItsRoundingAndALowPrecisionDy) {
  const std::string head = R"(
    input dy: float32[6,8]
    input x: float32[6,8]
    input r: float32[6,8]
    input g: float32[8]
    input inv: float32[6,1]
  )";
  const Feeds feeds = {{"dy", Random({6, 8}, 71)}, {"x", Random({6, 8}, 72)}, {"r", Random({6, 8}, 73)},
                       {"g", Random({8}, 74)}, {"inv", Random({6, 1}, 75)}};
  const std::string residual = head + R"(
    dx, dg = ai.cleave.RMSNormalizationGrad(dy, x, g, inv)
    s = Add(r, dx)
    output s
    output dg
  )";
  SkipLayerNormFusion skip;
  std::unique_ptr<Graph> folded = Rewritten(residual, skip);
  ASSERT_TRUE(folded);
  ASSERT_EQ(OpNames(*folded), std::vector<std::string>{"ai.cleave.RMSNormalizationGrad"});
  EXPECT_EQ(folded->FindValue("s")->producer()->input(4)->name(), "r");
  ExpectGraphsAgree(std::move(folded), *ParseGraph(residual), feeds, 0, 0);
  for (int to : {16, 10}) {
    const std::string rounding = head + absl::StrCat(R"(
      dx, dg = ai.cleave.RMSNormalizationGrad(dy, x, g, inv, r)
      low = Cast(dx) {to = )", to, R"(}
      wide = Cast(low) {to = 1}
      output wide
      output dx
      output dg
    )");
    LayerNormGradCastFusion cast;
    std::unique_ptr<Graph> g = Rewritten(rounding, cast);
    ASSERT_TRUE(g);
    const Node* n = g->FindValue("low")->producer();
    ASSERT_TRUE(n && n->op_type() == "RMSNormalizationGrad") << to;
    EXPECT_EQ(n->output(2)->name(), "low");
    EXPECT_EQ(n->AttrInt("low_to", 0), to);
    ExpectGraphsAgree(std::move(g), *ParseGraph(rounding), feeds, 0, 0);
  }
  const std::string product = R"(
    input a: float32[6,16]
    input w: float32[16,8]
    input x: float32[6,8]
    input g: float32[8]
    input inv: float32[6,1]
    ha = Cast(a) {to = 16}
    hw = Cast(w) {to = 16}
  )";
  LowPrecisionNormInputs narrow;
  std::unique_ptr<Graph> g = Rewritten(product + R"(
    q = ai.cleave.MatMulBf16(ha, hw)
    dx, dg = ai.cleave.RMSNormalizationGrad(q, x, g, inv)
    p = ai.cleave.MatMulBf16(ha, hw)
    y, i, sum = ai.cleave.SkipRMSNormalization(x, p, g)
    output dx
    output dg
    output y
    output sum
  )", narrow);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->FindValue("q")->dtype(), DataType::kBFloat16);
  EXPECT_EQ(g->FindValue("p")->dtype(), DataType::kBFloat16);
  ExpectGraphsAgree(std::move(g), *ParseGraph(product + R"(
    hq = ai.cleave.MatMulBf16(ha, hw) {to = 16}
    q = Cast(hq) {to = 1}
    dx, dg = ai.cleave.RMSNormalizationGrad(q, x, g, inv)
    hp = ai.cleave.MatMulBf16(ha, hw) {to = 16}
    p = Cast(hp) {to = 1}
    y, i, sum = ai.cleave.SkipRMSNormalization(x, p, g)
    output dx
    output dg
    output y
    output sum
  )"), {{"a", Random({6, 16}, 76)}, {"w", Random({16, 8}, 77)}, {"x", Random({6, 8}, 78)}, {"g", Random({8}, 79)},
        {"inv", Random({6, 1}, 80)}}, 0, 0);
}

}  // namespace
}  // namespace cleave::graph
