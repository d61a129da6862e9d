// Each transformer fusion on a graph written as text: the pattern becomes one ai.cleave op,
// a pattern whose intermediate has another reader is left alone, and the fused graph
// computes what the original computes.
#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/fusion_test_util.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/mixed_precision.h"
#include "trainer/training_graph.h"

namespace cleave::graph {
namespace {

// Parses, infers shapes, runs the fusion pass, and returns the fused graph's op list.
std::vector<std::string> Fuse(Graph& g) {
  EXPECT_TRUE(InferShapes(g).ok());
  TransformerFusion fusion;
  auto changed = RunPass(fusion, &g);
  EXPECT_TRUE(changed.ok()) << changed.status();
  return OpNames(g);
}

// Runs `text` with and without the optimiser on `feeds` (default: x of shape [2, 3, 8]).
void ExpectSameOutputs(const std::string& text, Feeds feeds = {}) {
  if (feeds.empty()) feeds = {{"x", Random({2, 3, 8}, 3)}};
  SessionOptions plain;
  plain.optimize = false;
  auto a = InferenceSession::FromGraph(*ParseGraph(text));
  auto b = InferenceSession::FromGraph(*ParseGraph(text), plain);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto ra = (*a)->Run(feeds);
  auto rb = (*b)->Run(feeds);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(testing::CompareTensors((*ra)[0], (*rb)[0], 1e-5, 1e-5), "");
}

constexpr char kErfGelu[] = R"(
  input x: float32[2,3,8]
  init sqrt2: float32[] = 1.4142135
  init one: float32[] = 1
  init half: float32[] = 0.5
  d = Div(x, sqrt2)
  e = Erf(d)
  a = Add(e, one)
  m = Mul(x, a)
  y = Mul(m, half)
  output y
)";

TEST(TransformerFusion, ErfGeluBecomesGelu) {
  auto g = ParseGraph(kErfGelu);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.Gelu"});
  EXPECT_EQ((*g)->FindValue("y")->producer()->input(0)->name(), "x");
  ExpectSameOutputs(kErfGelu);
}

TEST(TransformerFusion, ErfGeluWithHalfFirst) {
  constexpr char kText[] = R"(
    input x: float32[2,3,8]
    init c: float32[] = 0.70710677
    init one: float32[] = 1
    init half: float32[] = 0.5
    h = Mul(x, half)
    d = Mul(x, c)
    e = Erf(d)
    a = Add(one, e)
    y = Mul(h, a)
    output y
  )";
  auto g = ParseGraph(kText);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.Gelu"});
  ExpectSameOutputs(kText);
}

TEST(TransformerFusion, SharedIntermediateBlocksTheFusion) {
  // `e` is also a graph output: fusing would lose it.
  auto g = ParseGraph(std::string(kErfGelu) + "output e\n");
  ASSERT_TRUE(g.ok());
  auto ops = Fuse(**g);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Erf"), 1);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "ai.cleave.Gelu"), 0);
}

TEST(TransformerFusion, TanhGeluBecomesGeluTanh) {
  constexpr char kText[] = R"(
    input x: float32[2,3,8]
    init k: float32[] = 0.044715
    init s: float32[] = 0.7978846
    init one: float32[] = 1
    init half: float32[] = 0.5
    x2 = Mul(x, x)
    x3 = Mul(x, x2)
    kx3 = Mul(x3, k)
    inner = Add(x, kx3)
    scaled = Mul(inner, s)
    t = Tanh(scaled)
    a = Add(one, t)
    m = Mul(x, a)
    y = Mul(half, m)
    output y
  )";
  auto g = ParseGraph(kText);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.Gelu"});
  EXPECT_EQ((*g)->FindValue("y")->producer()->AttrString("approximate", ""), "tanh");
  ExpectSameOutputs(kText);
}

constexpr char kLayerNorm[] = R"(
  opset 13
  input x: float32[2,3,8]
  init two: float32[] = 2
  init eps: float32[] = 1e-5
  init gamma: float32[8] = 1 2 3 4 5 6 7 8
  init beta: float32[8] = fill 0.25
  mean = ReduceMean(x) {axes = [-1]}
  d = Sub(x, mean)
  sq = Pow(d, two)
  var = ReduceMean(sq) {axes = [-1]}
  ve = Add(var, eps)
  std = Sqrt(ve)
  n = Div(d, std)
  g = Mul(n, gamma)
  y = Add(g, beta)
  output y
)";

TEST(TransformerFusion, DecomposedLayerNormBecomesOneOp) {
  auto g = ParseGraph(kLayerNorm);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.LayerNormalization"});
  const Node* ln = (*g)->FindValue("y")->producer();
  EXPECT_NEAR(ln->AttrFloat("epsilon", 0), 1e-5, 1e-9);
  EXPECT_EQ(ln->input(1)->name(), "gamma");
  ExpectSameOutputs(kLayerNorm);
}

// The pre-autodiff variant fuses GELU and LayerNorm only: the MatMul and its bias stay (their
// gradient rules handle them), the LayerNorm keeps gamma and beta as the same Values, and
// each fused node keeps the metadata of the node whose output it now produces.
TEST(ActivationNormFusion, FusesGeluAndLayerNormOnly) {
  constexpr char kText[] = R"(
    opset 13
    input x: float32[2,3,8]
    init w: float32[8,8] = fill 0.125
    init bias: float32[8] = fill 0.5
    init sqrt2: float32[] = 1.4142135
    init one: float32[] = 1
    init half: float32[] = 0.5
    init two: float32[] = 2
    init eps: float32[] = 1e-5
    init gamma: float32[8] = 1 2 3 4 5 6 7 8
    init beta: float32[8] = fill 0.25
    mm = MatMul(x, w)
    h = Add(mm, bias)
    dv = Div(h, sqrt2)
    er = Erf(dv)
    ad = Add(er, one)
    mu = Mul(h, ad)
    gl = Mul(mu, half)
    mean = ReduceMean(gl) {axes = [-1]}
    d = Sub(gl, mean)
    sq = Pow(d, two)
    var = ReduceMean(sq) {axes = [-1]}
    ve = Add(var, eps)
    std = Sqrt(ve)
    n = Div(d, std)
    g = Mul(n, gamma)
    y = Add(g, beta)
    output y
  )";
  auto g = ParseGraph(kText);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(InferShapes(**g).ok());
  const Value* gamma = (*g)->FindValue("gamma");
  (*g)->FindValue("gl")->producer()->metadata()["role"] = "fwd";
  ActivationNormFusion fusion;
  auto changed = RunPass(fusion, g->get());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(OpNames(**g), (std::vector<std::string>{"MatMul", "Add", "ai.cleave.Gelu", "ai.cleave.LayerNormalization"}));
  const Node* ln = (*g)->FindValue("y")->producer();
  EXPECT_EQ(ln->input(1), gamma);
  EXPECT_EQ(ln->input(0)->producer()->metadata().at("role"), "fwd");
  // The fused graph computes what the pattern computes.
  ExpectGraphsAgree(std::move(*g), *ParseGraph(kText), {{"x", Random({2, 3, 8}, 4)}}, 1e-5, 1e-5);
}

constexpr char kMlp[] = R"(
  input x: float32[2,3,8]
  init w: float32[8,4] = fill 0.125
  init b: float32[4] = 1 2 3 4
  mm = MatMul(x, w)
  h = Add(b, mm)
  y = Gelu(h)
  output y
)";

TEST(TransformerFusion, MatMulBiasGeluBecomesOneFusedMatMul) {
  auto text = std::string("opset 20\n") + kMlp;
  auto g = ParseGraph(text);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.FusedMatMul"});
  const Node* f = (*g)->FindValue("y")->producer();
  EXPECT_EQ(f->AttrString("activation", ""), "gelu");
  EXPECT_EQ(f->input(2)->name(), "b");
  ExpectSameOutputs(text);
}

// Mixed precision's products take the layer's bias (a float32 [N] vector, here a graph input
// as a parameter is in a training graph) as their third input; a bias of the wrong size or an
// Add whose product has another reader stays an Add.
TEST(TransformerFusion, LowPrecisionProductTakesTheBias) {
  for (const auto& [op, to] : {std::pair{"MatMulBf16", 16}, std::pair{"MatMulF16", 10}}) {
    const std::string text = absl::StrCat(R"(
      input x: float32[2,3,8]
      input w: float32[5,8]
      input b: float32[5]
      hx = Cast(x) {to = )", to, R"(}
      hw = Cast(w) {to = )", to, R"(}
      m = ai.cleave.)", op, R"((hx, hw) {transB = 1}
      y = Add(m, b)
      output y
    )");
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(Fuse(**g), (std::vector<std::string>{"Cast", "Cast", std::string("ai.cleave.") + op})) << op;
    const Node* f = (*g)->FindValue("y")->producer();
    ASSERT_EQ(f->num_inputs(), 3);
    EXPECT_EQ(f->input(2)->name(), "b");
    EXPECT_EQ(f->AttrInt("transB", 0), 1);
    ExpectSameOutputs(text, {{"x", Random({2, 3, 8}, 5)}, {"w", Random({5, 8}, 6)}, {"b", Random({5}, 7)}});
  }
  for (const auto& [bias, extra] : {std::pair{"float32[3,5]", ""}, std::pair{"float32[5]", "output m"}}) {
    auto g = ParseGraph(absl::StrCat(R"(
      input x: float32[2,3,8]
      input w: float32[8,5]
      input b: )", bias, R"(
      hx = Cast(x) {to = 16}
      hw = Cast(w) {to = 16}
      m = ai.cleave.MatMulBf16(hx, hw)
      y = Add(m, b)
      output y
      )", extra, "\n"));
    ASSERT_TRUE(g.ok()) << g.status();
    Fuse(**g);
    EXPECT_EQ((*g)->FindValue("y")->producer()->op_type(), "Add") << bias << " " << extra;
  }
}

// A product that writes the low type itself (`to`, mixed precision's activations) takes a bias of
// that type, and swapped for a Transpose of its result it still writes the low type.
TEST(TransformerFusion, LowPrecisionResultTakesItsBiasAndSurvivesTheTransposeSwap) {
  for (const auto& [op, to] : {std::pair{"MatMulBf16", 16}, std::pair{"MatMulF16", 10}}) {
    const std::string text = absl::StrCat(R"(
      input x: float32[2,3,8]
      input w: float32[5,8]
      input b: float32[5]
      hx = Cast(x) {to = )", to, R"(}
      hw = Cast(w) {to = )", to, R"(}
      hb = Cast(b) {to = )", to, R"(}
      m = ai.cleave.)", op, R"((hx, hw) {transB = 1, to = )", to, R"(}
      y = Add(m, hb)
      p = ai.cleave.)", op, R"((hx, hx) {transB = 1, to = )", to, R"(}
      t = Transpose(p) {perm = [0, 2, 1]}
      wy = Cast(y) {to = 1}
      wt = Cast(t) {to = 1}
      output wy
      output wt
    )");
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status();
    std::unique_ptr<Graph> fused = (*g)->Clone();
    Fuse(*fused);
    const Node* f = fused->FindValue("y")->producer();
    ASSERT_EQ(f->op_type(), op);
    ASSERT_EQ(f->num_inputs(), 3);
    EXPECT_EQ(f->input(2)->name(), "hb");
    EXPECT_EQ(f->AttrInt("to", 1), to);
    const Node* swapped = fused->FindValue("t")->producer();
    ASSERT_EQ(swapped->op_type(), op) << "the Transpose folds into the product";
    EXPECT_EQ(swapped->AttrInt("to", 1), to) << "and it still writes the low type";
    EXPECT_EQ(fused->FindValue("t")->dtype(), to == 16 ? DataType::kBFloat16 : DataType::kFloat16);
    // The bias is added before the one rounding instead of after a first: a rounding apart.
    ExpectGraphsAgree(std::move(fused), std::move(*g),
                      {{"x", Random({2, 3, 8}, 8)}, {"w", Random({5, 8}, 9)}, {"b", Random({5}, 10)}}, 1e-2, 1e-2);
  }
}

TEST(TransformerFusion, TransposedWeightIsReadInPlace) {
  constexpr char kText[] = R"(
    input x: float32[2,3,8]
    input w: float32[5,8]
    t = Transpose(w) {perm = [1, 0]}
    y = MatMul(x, t)
    output y
  )";
  auto g = ParseGraph(kText);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), std::vector<std::string>{"ai.cleave.FusedMatMul"});
  const Node* f = (*g)->FindValue("y")->producer();
  EXPECT_EQ(f->AttrInt("transB", 0), 1);
  EXPECT_EQ(f->input(1)->name(), "w");
  ExpectSameOutputs(kText, {{"x", Random({2, 3, 8}, 5)}, {"w", Random({5, 8}, 6)}});
}

TEST(TransformerFusion, MatMulWithNonConstantWeightIsLeftAlone) {
  auto g = ParseGraph(R"(
    input x: float32[2,8]
    input w: float32[8,4]
    init b: float32[4] = fill 1
    mm = MatMul(x, w)
    y = Add(mm, b)
    output y
  )");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(Fuse(**g), (std::vector<std::string>{"MatMul", "Add"}));
}


// The residual add feeding a LayerNormalization fuses, the sum staying the residual stream's
// value for its other reader; the fused op computes exactly what the pair computes.
constexpr char kSkipNorm[] = R"(
  input x: float32[2,5,16]
  input r: float32[2,5,16]
  input g: float32[16]
  input b: float32[16]
  h = Add(x, r)
  y, mean, inv = LayerNormalization(h, g, b) {axis = -1, epsilon = 1e-5}
  z = Mul(h, y)
  output z
  output mean
  output h
)";

TEST(SkipLayerNormFusion, ResidualAddAndLayerNormBecomeOneOpComputingTheSame) {
  auto g = ParseGraph(kSkipNorm);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(InferShapes(**g).ok());
  SkipLayerNormFusion fusion;
  auto changed = RunPass(fusion, g->get());
  ASSERT_TRUE(changed.ok() && *changed) << changed.status();
  std::vector<std::string> ops;
  for (const auto& n : (*g)->nodes()) ops.push_back(n->op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"SkipLayerNormalization", "Mul"}));
  ExpectGraphsAgree(std::move(*g), *ParseGraph(kSkipNorm),
                    {{"x", Random({2, 5, 16}, 4)}, {"r", Random({2, 5, 16}, 5)}, {"g", Random({16}, 6)},
                     {"b", Random({16}, 7)}},
                    0, 0);
}

// One step's feeds of a language model's training graph (batch 2, seq 16): tokens, labels, the
// initial parameters, zero gradient buffers and a reset.
Feeds TrainingFeeds(const trainer::TrainingArtifacts& a, int64_t vocab) {
  Feeds feeds = testing::TokenBatch(16, vocab);
  for (const std::string& p : a.params) {
    feeds.emplace_back(p, a.initial.at(p));
    const Value* buf = a.training->FindValue(trainer::AccumulationBuffer(p));
    feeds.emplace_back(buf->name(), Tensor(DataType::kFloat32, buf->shape().StaticDims()));
  }
  feeds.emplace_back(trainer::kLazyResetGrad, Tensor::Scalar<bool>(true));
  return feeds;
}
Feeds TinyGptTrainingFeeds(const trainer::TrainingArtifacts& a) { return TrainingFeeds(a, 256); }

// In a training graph (after autodiff) every pre-norm residual add fuses (the tiny GPT's
// LayerNorms, LLaMA's RMSNorms) and the step computes the same loss and gradients, bit for bit.
// Under mixed precision the normalisation also writes the next product's bf16 / fp16 operand
// itself (`to`): the same float32 values rounded once; and the backward's residual sums fold into
// the norm gradients (dX_add), added as the Add added them: still bit for bit.
struct SkipNormCase {
  const char* model;
  int64_t vocab;
  const char* fused_op;  // the forward's fused op, whose last output is the sum
  const char* grad_op;   // the norm gradient, with dX_add its last input
  int grad_inputs;       // its inputs with dX_add
};

void PrintTo(const SkipNormCase& c, std::ostream* os) { *os << c.model; }

class SkipNormTrainingTest : public ::testing::TestWithParam<SkipNormCase> {};

TEST_P(SkipNormTrainingTest, TrainingGraphComputesTheSame) {
  const SkipNormCase& c = GetParam();
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    trainer::TrainingSpec spec;
    spec.precision = *trainer::ParsePrecision(precision);
    auto a = testing::BuildArtifacts(c.model, 2, 16, spec);
    auto fused_graph = a.training->Clone();
    ASSERT_TRUE(InferShapes(*fused_graph).ok());
    SkipLayerNormFusion fusion;
    DeadCodeElimination dce;
    ASSERT_TRUE(RunToFixedPoint({&fusion, &dce}, fused_graph.get()).ok());
    int fused = 0, low = 0, residual_grads = 0;
    for (const auto& n : fused_graph->nodes()) {
      residual_grads += n->op_type() == c.grad_op && n->num_inputs() == c.grad_inputs;
      if (n->op_type() != c.fused_op) continue;
      ++fused;
      if (n->HasAttr("to")) {
        ++low;
        EXPECT_EQ(n->output(0)->dtype(), std::string(precision) == "bf16" ? DataType::kBFloat16 : DataType::kFloat16);
      }
      EXPECT_EQ(n->outputs().back()->dtype(), DataType::kFloat32) << "the residual stream stays float32";
    }
    // Every norm but the first layer's first, which reads the embeddings: the tiny GPT's is their
    // sum with the positions' (an Add too), LLaMA's the lookup alone.
    EXPECT_GE(fused, 4) << precision;
    EXPECT_EQ(low, std::string(precision) == "fp32" ? 0 : fused) << precision;
    // The backward's residual sums: every norm's gradient but the first's.
    EXPECT_GE(residual_grads, 4) << precision;
    if (std::string(precision) == "fp16") continue;  // fp16 training graphs take a loss scale
    ExpectGraphsAgree(std::move(fused_graph), a.training->Clone(), TrainingFeeds(a, c.vocab), 0, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, SkipNormTrainingTest,
    ::testing::Values(SkipNormCase{"tiny_gpt", 256, "SkipLayerNormalization", "LayerNormalizationGrad", 6},
                      SkipNormCase{"train_variants/llama", 64, "SkipRMSNormalization", "RMSNormalizationGrad", 5}),
    [](const auto& info) { return std::string(info.param.fused_op); });

// The forward loss folds into the gradient only where they agree (reduction, ignore_index, no
// weights) and the gradient's dY does not depend on the loss; the step computes the same for
// each reduction.
TEST(SoftmaxCrossEntropyFusion, ForwardLossFoldsIntoTheGradientWhereItMay) {
  for (const char* reduction : {"mean", "sum", "none"}) {
    const bool none = std::string(reduction) == "none";
    const std::string text = absl::StrCat(R"(
      input s: float32[6,10]
      input t: int64[6]
      input dy: float32)", none ? "[6]" : "[]", R"(
      loss, lp = SoftmaxCrossEntropyLoss(s, t) {reduction = ")", reduction, R"(", ignore_index = 3}
      ds = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, lp, t) {reduction = ")", reduction, R"(", ignore_index = 3}
      output loss
      output ds
    )");
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(InferShapes(**g).ok());
    SoftmaxCrossEntropyFusion fusion;
    DeadCodeElimination dce;
    ASSERT_TRUE(RunToFixedPoint({&fusion, &dce}, g->get()).ok());
    ASSERT_EQ((*g)->nodes().size(), 1u) << reduction;
    EXPECT_EQ((*g)->FindValue("loss")->producer()->op_type(), "SoftmaxCrossEntropyLossGrad");
    Tensor labels = Tensor::FromVector<int64_t>({1, 3, 9, 0, 3, 4}, {6});
    Tensor dy = none ? Random({6}, 12) : Tensor::Scalar<float>(0.5f);
    // (The gradient's log-softmax formed from the scores may differ in the last bit, as with
    // from_scores alone; the loss is formed as the forward forms it.)
    ExpectGraphsAgree(std::move(*g), *ParseGraph(text), {{"s", Random({6, 10}, 11)}, {"t", labels}, {"dy", dy}},
                      1e-7, 1e-5);
  }
  // Not folded: another reduction or ignore_index, class weights, or a dY formed from the loss.
  for (const char* grad_attrs : {"reduction = \"sum\"", "ignore_index = 2", ""}) {
    const std::string text = absl::StrCat(R"(
      input s: float32[6,10]
      input t: int64[6]
      input w: float32[10]
      init k: float32[] = 2
      loss, lp = SoftmaxCrossEntropyLoss(s, t)", std::string(grad_attrs).empty() ? ", w" : "", R"()
      dy = Mul(loss, k)
      ds = ai.cleave.SoftmaxCrossEntropyLossGrad()", std::string(grad_attrs).empty() ? "dy" : "k", R"(, lp, t)", 
      std::string(grad_attrs).empty() ? ", w" : "", R"() {)", grad_attrs, R"(}
      output loss
      output ds
    )");
    auto g = ParseGraph(text);
    ASSERT_TRUE(g.ok()) << g.status() << text;
    ASSERT_TRUE(InferShapes(**g).ok());
    SoftmaxCrossEntropyFusion fusion;
    DeadCodeElimination dce;
    ASSERT_TRUE(RunToFixedPoint({&fusion, &dce}, g->get()).ok());
    EXPECT_EQ((*g)->FindValue("loss")->producer()->op_type(), "SoftmaxCrossEntropyLoss") << grad_attrs;
  }
  // A dY that depends on the loss, without weights: everything else agrees.
  const std::string cyclic = R"(
    input s: float32[6,10]
    input t: int64[6]
    loss, lp = SoftmaxCrossEntropyLoss(s, t)
    dy = Neg(loss)
    ds = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, lp, t)
    output loss
    output ds
  )";
  auto g = ParseGraph(cyclic);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(InferShapes(**g).ok());
  SoftmaxCrossEntropyFusion fusion;
  DeadCodeElimination dce;
  ASSERT_TRUE(RunToFixedPoint({&fusion, &dce}, g->get()).ok());
  EXPECT_EQ((*g)->FindValue("loss")->producer()->op_type(), "SoftmaxCrossEntropyLoss");
  EXPECT_EQ((*g)->FindValue("ds")->producer()->AttrInt("from_scores", 0), 1) << "the scores are still read";
}

// The bf16 head of a tied language model over `vocab` classes as mixed precision and the
// device fusions leave it: the scores' product, the from-scores gradient with the loss, and the
// two gradient products; `extra` adds statements (another reader, a bias).
std::string BfloatHead(int64_t vocab, const std::string& extra = "", const char* bias = "", int opset = 17,
                       const char* to = "") {
  return absl::StrCat("opset ", opset, R"(
    input h: bfloat16[3,4,16]
    input w: bfloat16[)", vocab, R"(,16]
    input b: float32[)", vocab, R"(]
    input t: int64[12]
    init dy: float32[] = 1
    init sshape: int64[2] = -1 )", vocab, R"(
    init gshape: int64[3] = 3 4 )", vocab, R"(
    init g2shape: int64[2] = 12 -1
    init hshape: int64[2] = 12 16
    init keep: int64[3] = 0 0 0
    y0 = ai.cleave.MatMulBf16(h, w)", bias, R"() {transB = 1)", to, R"(}
    y = Reshape(y0, keep)
    s = Reshape(y, sshape)
    ds, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, s, t) {from_scores = 1, to = 16}
    ds3 = Reshape(ds, gshape)
    dh = ai.cleave.MatMulBf16(ds3, w)
    ds2 = Reshape(ds3, g2shape)
    h2 = Reshape(h, hshape)
    dw = ai.cleave.MatMulBf16(ds2, h2) {transA = 1}
    output loss
    output dh
    output dw
  )", extra);
}

// A vocabulary whose rows are not 16-byte aligned is padded to a multiple of 8 (1027 -> 1032)
// or of 128 where that adds at most 1% (50257 -> 50304), with or without the product's own
// bias, and the loss and both gradients are what they were, labels at both ends included: the
// weight gradient's product forms only the V real rows (`rows`), at every opset. A head whose
// scores anything else reads and a vocabulary already aligned or small are left alone.
TEST(ClassPadding, PadsTheHeadToAlignedRowsAndComputesTheSame) {
  for (const auto& [vocab, padded] : std::vector<std::pair<int64_t, int64_t>>{{1027, 1032}, {50257, 50304}}) {
    // Without a bias, with the product's float32 bias, with bf16 scores (LowPrecisionScores'
    // `to`: a bf16 mask), and at opset 12.
    for (const auto& [bias, to, opset] : {std::tuple{"", "", 17}, std::tuple{", b", "", 17},
                                          std::tuple{"", ", to = 16", 17}, std::tuple{"", "", 12}}) {
      SCOPED_TRACE(absl::StrCat(vocab, bias, to, " opset ", opset));
      ClassPadding padding;
      std::unique_ptr<Graph> g = Rewritten(BfloatHead(vocab, "", bias, opset, to), padding);
      ASSERT_TRUE(g);
      const Graph& p = *g;
      std::map<std::string, int> ops = OpCounts(p);
      EXPECT_EQ(ops["Concat"], bias[0] ? 2 : 1) << "the weight's zero rows (and the bias's -inf tail)";
      EXPECT_EQ(ops["Split"], 0) << "dW is never copied";
      EXPECT_EQ(p.FindValue("y")->shape(), Shape::FromDims({3, 4, padded}));
      EXPECT_EQ(p.FindValue("ds")->shape(), Shape::FromDims({12, padded}));
      EXPECT_EQ(p.FindValue("ds2")->shape(), Shape::FromDims({12, padded}));
      EXPECT_EQ(p.FindValue("dw")->shape(), Shape::FromDims({vocab, 16}));
      EXPECT_EQ(p.FindValue("dw")->producer()->op_type(), "MatMulBf16");
      EXPECT_EQ(p.FindValue("dw")->producer()->AttrInt("rows", -1), vocab);
      Tensor labels(DataType::kInt64, {12});
      for (int64_t i = 0; i < 12; ++i) labels.data<int64_t>()[i] = i == 0 ? vocab - 1 : (i * 389 + 2) % vocab;
      // Scores near 0, as at initialisation, so that a padded class given any finite score
      // would move the log-sum-exp well past the tolerance.
      const Feeds feeds = {{"h", RandomBf16({3, 4, 16}, 1, 0.25f)}, {"w", RandomBf16({vocab, 16}, 2, 0.25f)},
                           {"b", Random({vocab}, 3)}, {"t", labels}};
      ExpectGraphsAgree(std::move(g), *ParseGraph(BfloatHead(vocab, "", bias, opset, to)), feeds, 1e-6, 1e-5);
    }
  }
  const std::pair<std::string, std::string> left_alone[] = {
      {BfloatHead(1027, "output y"), "the scores are an output"},
      {BfloatHead(1027, "p = Softmax(s)\noutput p"), "another reader of the scores"},
      {BfloatHead(1027, "e = Exp(ds)\noutput e"), "another reader of the gradient"},
      {BfloatHead(1024), "aligned already"},
      {BfloatHead(1001), "fewer than 1024 classes"},
  };
  for (const auto& [text, why] : left_alone) {
    ClassPadding padding;
    EXPECT_FALSE(Changes(padding, text)) << why;
  }
}

// The logits product writes bf16 scores when only from-scores gradients read them; the
// gradient reads bf16 scores as float32, so it computes exactly what it computes from the same
// rounded values in float32, and its loss stays float32. A product with a bias, scores another
// op reads, or scores that are a graph output stay float32.
TEST(LowPrecisionScores, TheLogitsProductWritesBf16ForTheGradientFromTheScores) {
  LowPrecisionScores low;
  std::unique_ptr<Graph> g = Rewritten(BfloatHead(1024), low);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->FindValue("y0")->producer()->AttrInt("to", 0), 16);
  EXPECT_EQ(g->FindValue("s")->dtype(), DataType::kBFloat16);
  EXPECT_EQ(g->FindValue("loss")->dtype(), DataType::kFloat32);
  EXPECT_EQ(g->FindValue("ds")->dtype(), DataType::kBFloat16);
  Tensor labels(DataType::kInt64, {12});
  for (int64_t i = 0; i < 12; ++i) labels.data<int64_t>()[i] = (i * 389 + 2) % 1024;
  const Feeds feeds = {{"h", RandomBf16({3, 4, 16}, 1, 0.25f)}, {"w", RandomBf16({1024, 16}, 2, 0.25f)},
                       {"b", Random({1024}, 3)}, {"t", labels}};
  // Against the same graph whose product rounds its result to bf16 and widens it again.
  const std::string rounded = absl::StrReplaceAll(
      BfloatHead(1024), {{"y0 = ai.cleave.MatMulBf16(h, w) {transB = 1}",
                          "y1 = ai.cleave.MatMulBf16(h, w) {transB = 1, to = 16}\n    y0 = Cast(y1) {to = 1}"}});
  ExpectGraphsAgree(std::move(g), *ParseGraph(rounded), feeds, 0, 0);
  // A gradient without `to` stays float32 (it reads bf16 scores, it does not write them).
  const std::string fp32_grad = R"(
    input h: bfloat16[12,16]
    input w: bfloat16[40,16]
    input t: int64[12]
    init dy: float32[] = 1
    y = ai.cleave.MatMulBf16(h, w) {transB = 1}
    ds, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, y, t) {from_scores = 1}
    output ds
    output loss
  )";
  std::unique_ptr<Graph> plain = Rewritten(fp32_grad, low);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->FindValue("y")->dtype(), DataType::kBFloat16);
  EXPECT_EQ(plain->FindValue("ds")->dtype(), DataType::kFloat32);
  Tensor few(DataType::kInt64, {12});
  for (int64_t i = 0; i < 12; ++i) few.data<int64_t>()[i] = (i * 7) % 40;
  ExpectGraphsAgree(std::move(plain),
                    *ParseGraph(absl::StrReplaceAll(fp32_grad, {{"y = ai.cleave.MatMulBf16(h, w) {transB = 1}",
                                                                 "y16 = ai.cleave.MatMulBf16(h, w) {transB = 1, to = 16}\n"
                                                                 "    y = Cast(y16) {to = 1}"}})),
                    {{"h", RandomBf16({12, 16}, 7, 0.5f)}, {"w", RandomBf16({40, 16}, 8, 0.5f)}, {"t", few}}, 0, 0);
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {BfloatHead(1024, "", ", b"), "a float32 bias"},
           {BfloatHead(1024, "p = Softmax(s)\noutput p"), "another reader"},
           {BfloatHead(1024, "output y"), "a graph output"}})
    EXPECT_FALSE(Changes(low, text)) << why;
}

// The cross-entropy gradient reads the scores: the forward outputs the loss alone, and under
// bf16 autocast the gradient is written in bf16 (its Cast gone); the training step computes
// what it did (the bf16 gradient rounds the same float32 values the Cast rounded).
TEST(SoftmaxCrossEntropyFusion, TinyGptGradientFromTheScoresComputesTheSame) {
  for (const char* precision : {"fp32", "bf16"}) {
    trainer::TrainingSpec spec;
    spec.precision = *trainer::ParsePrecision(precision);
    auto a = testing::BuildArtifacts("tiny_gpt", 2, 16, spec);
    auto fused_graph = a.training->Clone();
    ASSERT_TRUE(InferShapes(*fused_graph).ok());
    SoftmaxCrossEntropyFusion fusion;
    DeadCodeElimination dce;
    auto changed = RunToFixedPoint({&fusion, &dce}, fused_graph.get());
    ASSERT_TRUE(changed.ok()) << changed;
    int grads = 0;
    for (const auto& n : fused_graph->nodes()) {
      // The forward folds into the gradient, which outputs the loss (no log_prob anywhere).
      EXPECT_NE(n->op_type(), "SoftmaxCrossEntropyLoss") << "the forward is left";
      if (n->op_type() != "SoftmaxCrossEntropyLossGrad") continue;
      ++grads;
      EXPECT_EQ(n->AttrInt("from_scores", 0), 1);
      EXPECT_EQ(n->input(1)->shape().ToString(), "[32,256]");
      const bool bf16 = std::string(precision) == "bf16";
      EXPECT_EQ(n->output(0)->dtype(), bf16 ? DataType::kBFloat16 : DataType::kFloat32) << precision;
      for (const auto& [reader, slot] : n->output(0)->consumers()) EXPECT_NE(reader->op_type(), "Cast");
      ASSERT_EQ(n->num_outputs(), 2);
      EXPECT_TRUE(n->output(1)->is_graph_output()) << "the loss";
      EXPECT_EQ(n->output(1)->shape().rank(), 0);
    }
    EXPECT_EQ(grads, 1) << precision;
    const Feeds feeds = TinyGptTrainingFeeds(a);
    // The log-softmax formed again may differ from the forward's in the last bit. In bf16 such
    // a bit can round one gradient element to its neighbour (1 of the 8192 here), and every
    // later bf16 rounding of the backward can differ from there: bf16's noise, not an error.
    SCOPED_TRACE(precision);
    const bool bf16 = std::string(precision) == "bf16";
    ExpectGraphsAgree(std::move(fused_graph), a.training->Clone(), feeds, bf16 ? 1e-4 : 1e-6, bf16 ? 1e-2 : 1e-5);
  }
}

}  // namespace
}  // namespace cleave::graph
