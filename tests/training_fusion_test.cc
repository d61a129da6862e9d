// The training graphs' fusions on graphs written as text: the device sessions' rewrites of the
// weight-gradient products and the LayerNorms under mixed precision (bias gradients in the
// products, the residual gradient's bf16 copy, bf16 products the LayerNorms read), each
// against the unfused graph, and the optimizer graph's multi-tensor update.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "onnx_ext/cleave_schemas.h"
#include "partition/op_rules.h"
#include "gtest/gtest.h"
#include "tests/fusion_test_util.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/training_graph.h"

namespace cleave::graph {
namespace {

// A weight-gradient product reading the gradient dz [K, C] first (B without transB, or A with
// transA) takes the bias gradient that sums dz over its leading axes: a bf16 dz's low-type sum
// with its Reshape and widening Cast, or the float32 sum of the value dz rounds. The fused
// graph computes the same within bf16 rounding (its sums stay float32); the product that
// reads dz as [K, C] with K its columns (dX = dz W), a sum with another reader and a sum over
// other axes are left alone.
TEST(BiasGradientFusion, TheWeightGradientProductFormsTheBiasGradient) {
  const std::string header = R"(
    opset 17
    input g: float32[2,3,5]
    input x: float32[2,3,4]
    init s65: int64[2] = 6 5
    init s64: int64[2] = 6 4
    init s5: int64[1] = 5
    init lead: int64[2] = 0 1
    hg = Cast(g) {to = 16}
    hx = Cast(x) {to = 16}
    g2 = Reshape(hg, s65)
    x2 = Reshape(hx, s64)
  )";
  const std::string low_sum = header + R"(
    dw = ai.cleave.MatMulBf16(x2, g2) {transA = 1}
    s = ReduceSum(hg, lead) {keepdims = 1}
    r = Reshape(s, s5)
    db = Cast(r) {to = 1}
    output dw
    output db
  )";
  const std::string wide_sum = header + R"(
    dw = ai.cleave.MatMulBf16(g2, x2) {transA = 1}
    db = ReduceSum(g, lead) {keepdims = 0}
    output dw
    output db
  )";
  const Feeds feeds = {{"g", Random({2, 3, 5}, 11)}, {"x", Random({2, 3, 4}, 12)}};
  for (const auto& [text, side] : {std::pair{low_sum, 1}, std::pair{wide_sum, 0}}) {
    BiasGradientFusion fusion;
    std::unique_ptr<Graph> g = Rewritten(text, fusion);
    ASSERT_TRUE(g);
    const Node* p = g->FindValue("db")->producer();
    ASSERT_TRUE(p && p->op_type() == "MatMulBf16") << side;
    EXPECT_EQ(p->output(0)->name(), "dw");
    EXPECT_EQ(p->AttrInt("dbias_operand", -1), side);
    int sums = 0, casts = 0;
    for (const auto& n : g->nodes()) {
      sums += n->op_type() == "ReduceSum";
      casts += n->op_type() == "Cast";
    }
    EXPECT_EQ(sums, 0) << side;
    EXPECT_EQ(casts, 2) << "the operands' casts alone";
    EXPECT_EQ(g->FindValue("db")->dtype(), DataType::kFloat32);
    auto original = ParseGraph(text);
    ASSERT_TRUE(original.ok());
    ExpectGraphsAgree(std::move(g), std::move(*original), feeds, 2e-2, 1e-2);
  }
  BiasGradientFusion fusion;
  // dX = dz W reads dz with K = C: its sum over the rows is no bias gradient of it.
  EXPECT_FALSE(Changes(fusion, header + R"(
    input w: bfloat16[5,4]
    dx = ai.cleave.MatMulBf16(g2, w)
    db = ReduceSum(g, lead) {keepdims = 0}
    output dx
    output db
  )"));
  // The sum's intermediate is read elsewhere.
  EXPECT_FALSE(Changes(fusion, absl::StrReplaceAll(low_sum, {{"output db", "output db\n    output s"}})));
  // A sum over the last axis.
  EXPECT_FALSE(Changes(fusion, header + R"(
    init last: int64[1] = 2
    dw = ai.cleave.MatMulBf16(x2, g2) {transA = 1}
    db = ReduceSum(g, last) {keepdims = 0}
    output dw
    output db
  )"));
}

// An embedding's gradient accumulated as the training graph builds it, over a [10, 4] table
// with a repeated id: GatherGrad alone (`tied` false) or summed with a language-model head's
// bf16 weight-gradient product (tied, the Add's operands in either order).
std::string EmbeddingGradient(bool tied, bool head_first = true, const std::string& extra = "") {
  std::string head = tied ? R"(
    input h: float32[6,4]
    input ds: float32[6,10]
    hh = Cast(h) {to = 16}
    hds = Cast(ds) {to = 16}
    dwh = ai.cleave.MatMulBf16(hds, hh) {transA = 1}
  )" : "";
  const std::string sum = !tied ? "" : head_first ? "grad = Add(dwh, gw)" : "grad = Add(gw, dwh)";
  return absl::StrCat(R"(
    opset 17
    input dy: float32[6,4]
    input ids: int64[6]
    input buf: float32[10,4]
    input reset: bool[]
    init shape: int64[2] = 10 4
  )", head, R"(
    gw = ai.cleave.GatherGrad(shape, ids, dy)
  )", sum, R"(
    acc = ai.cleave.InPlaceAccumulator(buf, )", tied ? "grad" : "gw", R"(, reset)
    output acc
  )", extra);
}

// The untied embedding's rows scatter into the accumulation buffer (GatherGrad's base and
// reset); the tied one's head gradient is accumulated in its product (with
// GradientAccumulationFusion) and the rows scatter onto that: no Add, no InPlaceAccumulator,
// no table of zeros. Both compute what the unfused graphs compute, reset or not. A scatter
// something else reads, a sum that broadcasts, and a scatter with a base already are left alone.
TEST(EmbeddingGradientAccumulation, TheRowsScatterIntoTheAccumulation) {
  Tensor ids(DataType::kInt64, {6});
  for (int64_t i = 0; i < 6; ++i) ids.data<int64_t>()[i] = std::vector<int64_t>{3, 0, 9, 3, 5, 3}[i];
  for (const auto& [tied, head_first] : {std::pair{false, true}, std::pair{true, true}, std::pair{true, false}}) {
    SCOPED_TRACE(tied ? (head_first ? "tied" : "tied, the scatter first") : "untied");
    const std::string text = EmbeddingGradient(tied, head_first);
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(InferShapes(**g).ok());
    EmbeddingGradientAccumulation embedding;
    GradientAccumulationFusion accumulation;
    DeadCodeElimination dce;
    ASSERT_TRUE(RunToFixedPoint({&embedding, &accumulation, &dce}, g->get()).ok());
    const Node* scatter = (*g)->FindValue("acc")->producer();
    ASSERT_TRUE(scatter && scatter->op_type() == "GatherGrad");
    ASSERT_GE(scatter->num_inputs(), 4);
    if (tied) {
      const Node* head = scatter->input(3)->producer();
      ASSERT_TRUE(head && head->op_type() == "MatMulBf16") << "the head's product accumulates";
      ASSERT_EQ(head->num_inputs(), 5);
      EXPECT_EQ(head->input(3)->name(), "buf");
      EXPECT_EQ(head->input(4)->name(), "reset");
      EXPECT_TRUE(scatter->num_inputs() < 5 || !scatter->input(4)) << "the head's accumulation already reset";
    } else {
      EXPECT_EQ(scatter->input(3)->name(), "buf");
      ASSERT_EQ(scatter->num_inputs(), 5);
      EXPECT_EQ(scatter->input(4)->name(), "reset");
    }
    for (const auto& n : (*g)->nodes()) {
      EXPECT_NE(n->op_type(), "Add");
      EXPECT_NE(n->op_type(), "InPlaceAccumulator");
    }
    for (bool reset : {false, true}) {
      Tensor flag(DataType::kBool, {});
      flag.data<bool>()[0] = reset;
      Feeds feeds = {{"dy", Random({6, 4}, 21)}, {"ids", ids}, {"buf", Random({10, 4}, 22)}, {"reset", flag}};
      if (tied) {
        feeds.push_back({"h", Random({6, 4}, 23)});
        feeds.push_back({"ds", Random({6, 10}, 24)});
      }
      ExpectGraphsAgree((*g)->Clone(), *ParseGraph(text), feeds, 1e-5, 1e-6);
    }
  }
  EmbeddingGradientAccumulation embedding;
  EXPECT_FALSE(Changes(embedding, EmbeddingGradient(false, true, "output gw"))) << "the scatter is read elsewhere";
  EXPECT_FALSE(Changes(embedding, EmbeddingGradient(true, true, "output gw"))) << "the scatter is read elsewhere";
  EXPECT_FALSE(Changes(embedding, absl::StrReplaceAll(EmbeddingGradient(true),
                                                      {{"grad = Add(dwh, gw)", "grad = Add(gw, row)"},
                                                       {"input reset: bool[]", "input reset: bool[]\n    input row: float32[4]"}})))
      << "a sum that broadcasts";
  EXPECT_FALSE(Changes(embedding, absl::StrReplaceAll(EmbeddingGradient(false),
                                                      {{"GatherGrad(shape, ids, dy)", "GatherGrad(shape, ids, dy, buf)"}})))
      << "a scatter onto a base already";
}

// The partitioner has a rule for the training graph's GatherGrad, not for the device session's
// fused one onto a base: that is an error naming the node, not a wrong sharding.
TEST(EmbeddingGradientAccumulation, TheFusedScatterIsNotPartitioned) {
  for (bool fused : {false, true}) {
    auto g = ParseGraph(EmbeddingGradient(false));
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(InferShapes(**g).ok());
    if (fused) {
      EmbeddingGradientAccumulation embedding;
      DeadCodeElimination dce;
      ASSERT_TRUE(RunToFixedPoint({&embedding, &dce}, g->get()).ok());
    }
    const Node* scatter = nullptr;
    for (const auto& n : (*g)->nodes())
      if (n->op_type() == "GatherGrad") scatter = n.get();
    ASSERT_TRUE(scatter);
    auto rule = partition::RuleFor(**g, *scatter);
    if (!fused) {
      EXPECT_TRUE(rule.ok()) << rule.status();
      continue;
    }
    ASSERT_FALSE(rule.ok());
    EXPECT_NE(rule.status().message().find("GatherGrad onto a base"), std::string::npos) << rule.status();
    EXPECT_NE(rule.status().message().find(scatter->name()), std::string::npos) << rule.status();
  }
}

// A dbias output must sum K of a 2-D operand stored K first, into a float32 [C]; anything else
// is an error naming what was expected.
TEST(BiasGradientFusion, DbiasThatSumsNoKIsRefused) {
  struct Case {
    const char *a, *b, *attrs, *want;
  };
  for (const Case& c : {Case{"6,4", "6,5", "transA = 1, dbias_operand = 2", "expected 0 (A) or 1 (B)"},
                        Case{"4,6", "6,5", "dbias_operand = 0", "expected transA = 1"},
                        Case{"4,6", "5,6", "transB = 1", "expected transB = 0"},
                        Case{"6,4", "6,5", "transA = 1, to = 16", "dbias needs a float32 result"},
                        Case{"2,6,4", "2,6,5", "transA = 1", "dbias needs 2-D A and B"}}) {
    auto g = ParseGraph(absl::StrCat("input a: bfloat16[", c.a, "]\ninput b: bfloat16[", c.b,
                                     "]\ny, db = ai.cleave.MatMulBf16(a, b) {", c.attrs, "}\noutput db\n"));
    ASSERT_TRUE(g.ok()) << g.status();
    absl::Status st = InferShapes(**g);
    EXPECT_FALSE(st.ok()) << c.attrs;
    EXPECT_NE(std::string(st.message()).find(c.want), std::string::npos) << st;
  }
  auto g = ParseGraph("input a: bfloat16[6,4]\ninput b: bfloat16[6,5]\n"
                      "y, db = ai.cleave.MatMulBf16(a, b) {transA = 1, dbias_operand = 0}\noutput db\n");
  ASSERT_TRUE(g.ok() && InferShapes(**g).ok());
  EXPECT_EQ((*g)->FindValue("db")->shape().ToString(), "[4]");
}

// The residual gradient's Cast to bf16 / fp16 folds into the LayerNorm gradient that forms it
// (dX_low): the same bits as the Cast, dX still there for its float32 readers. A Cast of
// another output, or to float64, is left alone.
TEST(LayerNormGradCastFusion, TheGradientWritesItsOwnRounding) {
  for (int to : {16, 10}) {
    const std::string text = absl::StrCat(R"(
      input dy: float32[6,8]
      input x: float32[6,8]
      input add: float32[6,8]
      input g: float32[8]
      input mean: float32[6,1]
      input inv: float32[6,1]
      dx, dg, db = ai.cleave.LayerNormalizationGrad(dy, x, g, mean, inv, add)
      low = Cast(dx) {to = )", to, R"(}
      wide = Cast(low) {to = 1}
      twice = Add(dx, dx)
      output wide
      output twice
      output dg
    )");
    LayerNormGradCastFusion fusion;
    std::unique_ptr<Graph> g = Rewritten(text, fusion);
    ASSERT_TRUE(g);
    const Node* n = g->FindValue("low")->producer();
    ASSERT_TRUE(n && n->op_type() == "LayerNormalizationGrad") << to;
    EXPECT_EQ(n->output(3)->name(), "low");
    EXPECT_EQ(n->output(0)->name(), "dx");
    EXPECT_EQ(n->AttrInt("low_to", 0), to);
    EXPECT_EQ(g->FindValue("low")->dtype(), to == 16 ? DataType::kBFloat16 : DataType::kFloat16);
    auto original = ParseGraph(text);
    ASSERT_TRUE(original.ok());
    ExpectGraphsAgree(std::move(g), std::move(*original),
                      {{"dy", Random({6, 8}, 31)}, {"x", Random({6, 8}, 32)}, {"add", Random({6, 8}, 33)},
                       {"g", Random({8}, 34)}, {"mean", Random({6, 1}, 35)}, {"inv", Random({6, 1}, 36)}},
                      0, 0);
  }
  LayerNormGradCastFusion fusion;
  const std::string head = R"(
    input dy: float32[6,8]
    input x: float32[6,8]
    input g: float32[8]
    input mean: float32[6,1]
    input inv: float32[6,1]
    dx, dg, db = ai.cleave.LayerNormalizationGrad(dy, x, g, mean, inv)
  )";
  EXPECT_FALSE(Changes(fusion, head + "c = Cast(dg) {to = 16}\noutput c\noutput dx\n"));
  EXPECT_FALSE(Changes(fusion, head + "c = Cast(dx) {to = 11}\noutput c\n"));
}

// A float32 low-precision product read only as a SkipLayerNormalization's skip or a
// LayerNormalizationGrad's dY writes bf16 (its bias cast to bf16), which they widen: exactly
// what the same graph computes with that rounding spelled out as Casts. A product with another
// reader, or read as the SkipLayerNormalization's x, is left alone.
TEST(LowPrecisionNormInputs, ProductsTheNormsReadWriteBf16) {
  const std::string inputs = R"(
    input a: float32[6,16]
    input w: float32[16,8]
    input b: float32[8]
    input r: float32[6,8]
    input g: float32[8]
    input beta: float32[8]
    input mean: float32[6,1]
    input inv: float32[6,1]
    ha = Cast(a) {to = 16}
    hw = Cast(w) {to = 16}
  )";
  const std::string fused = inputs + R"(
    p = ai.cleave.MatMulBf16(ha, hw, b)
    y, m, i, sum = ai.cleave.SkipLayerNormalization(r, p, g, beta)
    q = ai.cleave.MatMulBf16(ha, hw)
    dx, dg, db = ai.cleave.LayerNormalizationGrad(q, r, g, mean, inv)
    output y
    output sum
    output dx
    output dg
  )";
  const std::string spelled_out = inputs + R"(
    hb = Cast(b) {to = 16}
    hp = ai.cleave.MatMulBf16(ha, hw, hb) {to = 16}
    p = Cast(hp) {to = 1}
    y, m, i, sum = ai.cleave.SkipLayerNormalization(r, p, g, beta)
    hq = ai.cleave.MatMulBf16(ha, hw) {to = 16}
    q = Cast(hq) {to = 1}
    dx, dg, db = ai.cleave.LayerNormalizationGrad(q, r, g, mean, inv)
    output y
    output sum
    output dx
    output dg
  )";
  LowPrecisionNormInputs pass;
  std::unique_ptr<Graph> g = Rewritten(fused, pass);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->FindValue("p")->dtype(), DataType::kBFloat16);
  EXPECT_EQ(g->FindValue("q")->dtype(), DataType::kBFloat16);
  const Node* p = g->FindValue("p")->producer();
  ASSERT_EQ(p->num_inputs(), 3);
  EXPECT_EQ(p->input(2)->dtype(), DataType::kBFloat16) << "the bias in the result's type";
  EXPECT_EQ(p->input(2)->producer()->op_type(), "Cast");
  auto reference = ParseGraph(spelled_out);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectGraphsAgree(std::move(g), std::move(*reference),
                    {{"a", Random({6, 16}, 41)}, {"w", Random({16, 8}, 42)}, {"b", Random({8}, 43)},
                     {"r", Random({6, 8}, 44)}, {"g", Random({8}, 45)}, {"beta", Random({8}, 46)},
                     {"mean", Random({6, 1}, 47)}, {"inv", Random({6, 1}, 48)}},
                    0, 0);
  EXPECT_FALSE(Changes(pass, inputs + R"(
    p = ai.cleave.MatMulBf16(ha, hw, b)
    y, m, i, sum = ai.cleave.SkipLayerNormalization(r, p, g, beta)
    output y
    output p
  )"));
  EXPECT_FALSE(Changes(pass, inputs + R"(
    p = ai.cleave.MatMulBf16(ha, hw, b)
    y, m, i, sum = ai.cleave.SkipLayerNormalization(p, r, g, beta)
    output y
  )"));
}

// A bf16 MLP's tanh-form GELU, forward and backward: x = the first product (with its bias),
// y = Gelu(x), and the GELU's gradient dx from the product dy = dz W2 that only it reads.
// Its inputs and their bf16 copies.
constexpr char kGeluMlpInputs[] = R"(
    input a: float32[6,16]
    input w1: float32[32,16]
    input b1: float32[32]
    input w2: float32[8,32]
    input dz: float32[6,8]
    ha = Cast(a) {to = 16}
    hw1 = Cast(w1) {to = 16}
    hb1 = Cast(b1) {to = 16}
    hw2 = Cast(w2) {to = 16}
    hdz = Cast(dz) {to = 16}
)";

std::string GeluMlp(const std::string& gelu_attrs, const std::string& extra = "") {
  return absl::StrCat(kGeluMlpInputs, R"(
    x = ai.cleave.MatMulBf16(ha, hw1, hb1) {transB = 1, to = 16}
    y = ai.cleave.Gelu(x) )", gelu_attrs, R"(
    z = ai.cleave.MatMulBf16(y, hw2) {transB = 1, to = 16}
    dy = ai.cleave.MatMulBf16(hdz, hw2) {to = 16}
    dx = ai.cleave.GeluGrad(dy, x) )", gelu_attrs, "\n", extra, R"(
    output z
    output dx
  )");
}

Feeds GeluMlpFeeds() {
  return {{"a", Random({6, 16}, 51)}, {"w1", Random({32, 16}, 52)}, {"b1", Random({32}, 53)},
          {"w2", Random({8, 32}, 54)}, {"dz", Random({6, 8}, 55)}};
}

// The forward GELU folds into the product that forms its input, which keeps that input for the
// gradient (output 2), and the gradient into the product of its output gradient (input 5). The
// fused graph computes what the epilogues compute, spelled out: the GELU of the float32 result
// rounded once (its input rounded apart), the gradient's product times GELU' rounded once. It
// is the unfused graph within bf16 rounding. The erf form (which the CPU sessions' pass folds as
// well, against the same spelled-out graph), an output gradient with another reader and a product
// with a dbias are left alone; a GELU whose input nothing else reads keeps no copy of it.
TEST(GeluEpilogueFusion, TheProductsFormTheTanhGeluAndItsGradient) {
  const std::string tanh = "{approximate = \"tanh\"}";
  GeluEpilogueFusion pass;
  std::unique_ptr<Graph> g = Rewritten(GeluMlp(tanh), pass);
  ASSERT_TRUE(g);
  std::map<std::string, int> ops;
  for (const auto& n : g->nodes()) ++ops[n->op_type()];
  EXPECT_EQ(ops["Gelu"], 0);
  EXPECT_EQ(ops["GeluGrad"], 0);
  const Node* fwd = g->FindValue("y")->producer();
  ASSERT_EQ(fwd->op_type(), "MatMulBf16");
  EXPECT_EQ(fwd->AttrString("activation", ""), "gelu_tanh");
  ASSERT_EQ(fwd->num_outputs(), 3);
  EXPECT_EQ(fwd->output(2)->name(), "x");
  EXPECT_EQ(fwd->input(2)->name(), "hb1") << "the bias stays";
  const Node* bwd = g->FindValue("dx")->producer();
  ASSERT_EQ(bwd->op_type(), "MatMulBf16");
  EXPECT_EQ(bwd->AttrString("activation_grad", ""), "gelu_tanh");
  ASSERT_EQ(bwd->num_inputs(), 6);
  EXPECT_EQ(bwd->input(5)->name(), "x");
  EXPECT_EQ(g->FindValue("dy"), nullptr) << "the output gradient is never stored";
  absl::Status checked = onnx_ext::CheckModel(*g);  // the new input, output and attributes in the schema
  EXPECT_TRUE(checked.ok()) << checked;
  const std::string spelled_out = absl::StrCat(kGeluMlpInputs, R"(
    fb1 = Cast(hb1) {to = 1}
    x32 = ai.cleave.MatMulBf16(ha, hw1, fb1) {transB = 1}
    x = Cast(x32) {to = 16}
    y32 = ai.cleave.Gelu(x32) {approximate = "tanh"}
    y = Cast(y32) {to = 16}
    z = ai.cleave.MatMulBf16(y, hw2) {transB = 1, to = 16}
    dy32 = ai.cleave.MatMulBf16(hdz, hw2)
    fx = Cast(x) {to = 1}
    dx32 = ai.cleave.GeluGrad(dy32, fx) {approximate = "tanh"}
    dx = Cast(dx32) {to = 16}
    output z
    output dx
  )");
  auto reference = ParseGraph(spelled_out);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectGraphsAgree(Rewritten(GeluMlp(tanh), pass), std::move(*reference), GeluMlpFeeds(), 1e-6, 1e-6);
  ExpectGraphsAgree(std::move(g), *ParseGraph(GeluMlp(tanh)), GeluMlpFeeds(), 0.05, 0.02);

  // Inference: the GELU's input has no other reader, so the product keeps none.
  std::unique_ptr<Graph> inference = Rewritten(R"(
    input a: bfloat16[6,16]
    input w: bfloat16[32,16]
    x = ai.cleave.MatMulBf16(a, w) {transB = 1, to = 16}
    y = ai.cleave.Gelu(x) {approximate = "tanh"}
    output y
  )", pass);
  ASSERT_TRUE(inference);
  ASSERT_EQ(inference->nodes().size(), 1u);
  EXPECT_EQ(inference->FindValue("y")->producer()->num_outputs(), 1);
  EXPECT_EQ(inference->FindValue("x"), nullptr);

  const std::pair<std::string, std::string> left_alone[] = {
      {GeluMlp(""), "the erf form, which cuBLASLt has no epilogue for"},
      {absl::StrReplaceAll(GeluMlp(tanh), {{"dy = ai.cleave.MatMulBf16(hdz, hw2) {to = 16}",
                                            "dy = ai.cleave.MatMulBf16(hdz, hw2) {to = 16}\n    output dy"},
                                           {"y = ai.cleave.Gelu(x) {approximate = \"tanh\"}", "y = Tanh(x)"}}),
       "an output gradient that is also an output (and no forward GELU)"},
  };
  for (const auto& [text, why] : left_alone) EXPECT_FALSE(Changes(pass, text)) << why;
  // The CPU sessions' pass folds the erf form too, computing what its epilogue would.
  GeluEpilogueFusion erf_too(/*erf_too=*/true);
  std::unique_ptr<Graph> erf = Rewritten(GeluMlp(""), erf_too);
  ASSERT_TRUE(erf);
  EXPECT_EQ(erf->FindValue("y")->producer()->AttrString("activation", ""), "gelu");
  EXPECT_EQ(erf->FindValue("dx")->producer()->AttrString("activation_grad", ""), "gelu");
  auto erf_reference = ParseGraph(absl::StrReplaceAll(spelled_out, {{" {approximate = \"tanh\"}", ""}}));
  ASSERT_TRUE(erf_reference.ok()) << erf_reference.status();
  ExpectGraphsAgree(std::move(erf), std::move(*erf_reference), GeluMlpFeeds(), 1e-6, 1e-6);
  // The forward alone fuses where the gradient's product already has a dbias (it is a weight
  // gradient's product then, not the GELU's output gradient).
  std::unique_ptr<Graph> with_dbias = Rewritten(absl::StrReplaceAll(GeluMlp(tanh), {{
      "dy = ai.cleave.MatMulBf16(hdz, hw2) {to = 16}", "dy, sums = ai.cleave.MatMulBf16(hdz, hw2)"},
      {"dx = ai.cleave.GeluGrad(dy, x)", "dy16 = Cast(dy) {to = 16}\n    dx = ai.cleave.GeluGrad(dy16, x)"},
      {"output dx", "output dx\n    output sums"}}), pass);
  ASSERT_TRUE(with_dbias);
  EXPECT_EQ(with_dbias->FindValue("dx")->producer()->op_type(), "GeluGrad");
  EXPECT_EQ(with_dbias->FindValue("y")->producer()->op_type(), "MatMulBf16");
}

// What a product's GELU may be: the attributes and inputs are checked at load, each error naming
// what it expected.
TEST(GeluEpilogueFusion, ProductGeluAttributesAreChecked) {
  const std::string head = R"(
    input a: bfloat16[6,16]
    input w: bfloat16[16,8]
    input x: bfloat16[6,8]
    input xf: float32[6,8]
  )";
  const std::pair<std::string, std::string> bad[] = {
      {"y = ai.cleave.MatMulBf16(a, w) {to = 16, activation = \"relu\"}", "expected 'gelu' or 'gelu_tanh'"},
      {"y, _, p = ai.cleave.MatMulBf16(a, w) {to = 16}", "output 2 (the GELU input) needs an activation"},
      {"y = ai.cleave.MatMulBf16(a, w, _, _, _, x) {to = 16}", "input 5 (the GELU input) needs activation_grad"},
      {"y = ai.cleave.MatMulBf16(a, w) {to = 16, activation_grad = \"gelu_tanh\"}",
       "activation_grad needs the GELU input (input 5)"},
      {"y = ai.cleave.MatMulBf16(a, w, _, _, _, xf) {to = 16, activation_grad = \"gelu_tanh\"}", "bfloat16"},
      {"y = ai.cleave.MatMulBf16(a, w, _, _, _, x) {to = 16, activation = \"gelu\", activation_grad = \"gelu\"}",
       "activation_grad with an activation or a bias"},
  };
  for (const auto& [node, want] : bad) {
    auto g = ParseGraph(head + node + "\noutput y\n");
    ASSERT_TRUE(g.ok()) << node << ": " << g.status();
    absl::Status s = InferShapes(**g);
    EXPECT_FALSE(s.ok()) << node;
    EXPECT_NE(s.message().find(want), std::string::npos) << node << ": " << s;
  }
}

// The optimizer graph's per-parameter AdamW (or SGD) nodes become one MultiTensorAdamW (or
// MultiTensorSGD) that updates every parameter and its state exactly as they did, and that also
// forms the global gradient norm and clips with it (max_grad_norm 1, whose clipping the random
// gradients trigger), or only forms it (no clipping).
struct MultiTensorCase {
  const char* name;
  trainer::OptimizerConfig::Kind kind;
  float momentum;
  bool nesterov;
  float max_norm;
};

class MultiTensorFusionTest : public ::testing::TestWithParam<MultiTensorCase> {};

TEST_P(MultiTensorFusionTest, OneUpdateForAllParametersComputingTheSame) {
  const MultiTensorCase& c = GetParam();
  trainer::TrainingSpec spec;
  spec.optimizer.kind = c.kind;
  spec.optimizer.momentum = c.momentum;
  spec.optimizer.nesterov = c.nesterov;
  spec.optimizer.max_grad_norm = c.max_norm;
  spec.optimizer.weight_decay = 0.1f;
  auto a = testing::BuildArtifacts("tiny_gpt", 2, 16, spec);
  auto fused_graph = a.optimizer->Clone();
  MultiTensorFusion fusion;
  auto changed = RunPass(fusion, fused_graph.get());
  ASSERT_TRUE(changed.ok() && *changed) << changed.status();
  const bool adamw = c.kind == trainer::OptimizerConfig::Kind::kAdamW;
  int single = 0, multi = 0, norm_ops = 0;
  const Node* fused = nullptr;
  for (const auto& n : fused_graph->nodes()) {
    single += n->op_type() == "AdamW" || n->op_type() == "SGD";
    if (n->op_type() == (adamw ? "MultiTensorAdamW" : "MultiTensorSGD")) ++multi, fused = n.get();
    for (const char* op : {"SquaredNorm", "Sqrt", "Min", "Div"}) norm_ops += n->op_type() == op;
  }
  EXPECT_EQ(single, 0);
  ASSERT_EQ(multi, 1);
  EXPECT_EQ(norm_ops, 0);  // the norm and the clipping moved into the fused op
  EXPECT_EQ(fused->AttrInt("compute_norm", 0), 1);
  EXPECT_EQ(fused->AttrFloat("max_grad_norm", -1), c.max_norm);
  EXPECT_EQ(fused->output(fused->num_outputs() - 1)->name(), "grad_norm");
  EXPECT_EQ(fused_graph->nodes().size(), 1u);
  Feeds feeds = {{"learning_rate", Tensor::Scalar<float>(3e-3f)}, {"grad_scale", Tensor::Scalar<float>(0.5f)}};
  Tensor step(DataType::kInt64, std::vector<int64_t>{});
  step.data<int64_t>()[0] = 3;  // past SGD's first step, so the momentum buffers are read
  feeds.emplace_back("step", step);
  unsigned seed = 10;
  for (const Value* in : a.optimizer->inputs())
    if (in->dtype() == DataType::kFloat32 && in->shape().rank() > 0)
      feeds.emplace_back(in->name(), Random(in->shape().StaticDims(), seed++));
  ExpectGraphsAgree(std::move(fused_graph), a.optimizer->Clone(), feeds, 0, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, MultiTensorFusionTest,
    ::testing::Values(MultiTensorCase{"adamw_clip1", trainer::OptimizerConfig::Kind::kAdamW, 0, false, 1.0f},
                      MultiTensorCase{"adamw_noclip", trainer::OptimizerConfig::Kind::kAdamW, 0, false, 0.0f},
                      MultiTensorCase{"sgd_clip1", trainer::OptimizerConfig::Kind::kSgd, 0, false, 1.0f},
                      MultiTensorCase{"sgd_momentum_nesterov_clip1", trainer::OptimizerConfig::Kind::kSgd, 0.9f,
                                      true, 1.0f},
                      MultiTensorCase{"sgd_momentum_noclip", trainer::OptimizerConfig::Kind::kSgd, 0.9f, false, 0.0f}),
    [](const auto& info) { return std::string(info.param.name); });

// A norm something else also reads stays a separate computation.
TEST(MultiTensorFusion, KeepsANormThatOthersRead) {
  trainer::TrainingSpec spec;
  spec.optimizer.max_grad_norm = 1.0f;
  auto a = testing::BuildArtifacts("tiny_gpt", 2, 16, spec);
  auto g = a.optimizer->Clone();
  Value* twice = g->GetOrCreateValue("norm_twice");
  g->AddNode("Add", {g->FindValue("grad_norm"), g->FindValue("grad_norm")}, {twice}, "extra");
  g->AddOutput(twice);
  MultiTensorFusion fusion;
  auto changed = RunPass(fusion, g.get());
  ASSERT_TRUE(changed.ok() && *changed) << changed.status();
  int squared = 0;
  for (const auto& n : g->nodes()) {
    squared += n->op_type() == "SquaredNorm";
    if (n->op_type() == "MultiTensorAdamW") {
      EXPECT_EQ(n->AttrInt("compute_norm", 0), 0);
    }
  }
  EXPECT_EQ(squared, 1);
}

}  // namespace
}  // namespace cleave::graph
