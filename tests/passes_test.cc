// Graph passes: dead-code elimination, constant folding, and the transformer fusions checked
// on exported models against their unfused graphs.
#include "graph/passes/pass.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "graph/op_table.h"
#include "graph/text_format.h"
#include "graph/verifier.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"
#include "tests/test_graphs.h"

namespace cleave::graph {
namespace {

TEST(DeadCodeElimination, RemovesUnreachableNodesAndInitializers) {
  auto g = testing::MakeMlp();
  auto* unused_w = g->AddInitializer("unused_w", Tensor::Scalar<float>(2.f));
  auto* dead = g->GetOrCreateValue("dead");
  g->AddNode("Mul", {g->FindValue("x"), unused_w}, {dead}, "dead_mul");
  DeadCodeElimination dce;
  auto changed = RunPass(dce, g.get());
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  EXPECT_EQ(g->nodes().size(), 3u);
  EXPECT_EQ(g->FindValue("unused_w"), nullptr);
  EXPECT_EQ(g->FindValue("dead"), nullptr);
  EXPECT_FALSE(*RunPass(dce, g.get()));  // nothing left to do
}

TEST(ConstantFolding, FoldsConstantSubgraphsButNotVariables) {
  auto g = std::make_unique<Graph>();
  g->opset_imports()[""] = 17;
  auto* x = g->AddInput("x", DataType::kFloat32, Shape::FromDims({2}));
  auto* a = g->AddInitializer("a", Tensor::FromVector<float>({1, 2}, {2}));
  auto* b = g->AddInitializer("b", Tensor::FromVector<float>({3, 4}, {2}));
  auto* ab = g->GetOrCreateValue("ab");
  auto* y = g->GetOrCreateValue("y");
  g->AddNode("Mul", {a, b}, {ab}, "const_mul");
  g->AddNode("Add", {x, ab}, {y}, "add");
  g->AddOutput(y);
  ASSERT_TRUE(InferShapes(*g).ok());
  providers::CpuExecutionProvider cpu(1);
  ConstantFolding fold(runtime::MakeConstantEvaluator(*g, cpu));
  auto changed = RunPass(fold, g.get());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_EQ(g->nodes().size(), 1u);
  const Tensor* folded = g->FindValue("ab")->initializer();
  ASSERT_NE(folded, nullptr);
  EXPECT_FLOAT_EQ(folded->data<float>()[1], 8.f);

  // With `a` marked as a variable (a trainable parameter), nothing folds.
  auto h = std::make_unique<Graph>();
  h->opset_imports()[""] = 17;
  auto* ha = h->AddInitializer("a", Tensor::FromVector<float>({1, 2}, {2}));
  auto* hb = h->AddInitializer("b", Tensor::FromVector<float>({3, 4}, {2}));
  auto* hy = h->GetOrCreateValue("y");
  h->AddNode("Mul", {ha, hb}, {hy}, "mul");
  h->AddOutput(hy);
  ASSERT_TRUE(InferShapes(*h).ok());
  ConstantFolding keep(runtime::MakeConstantEvaluator(*h, cpu),
                       [](const Value* v) { return v->name() == "a"; });
  EXPECT_FALSE(*RunPass(keep, h.get()));
}

// An export's reshape target over a dynamic batch and sequence, `target` being the Concat's
// operands in order (from b1, q1 and the constants).
std::string SymbolicReshape(const std::string& target, const std::string& attrs = "") {
  return absl::StrCat(R"(
    input x: float32[batch,seq,64]
    init i0: int64[] = 0
    init i1: int64[] = 1
    init ax: int64[1] = 0
    init heads: int64[2] = 4 16
    init rest: int64[2] = -1 64
    s = Shape(x)
    b = Gather(s, i0)
    q = Gather(s, i1)
    b1 = Unsqueeze(b, ax)
    q1 = Unsqueeze(q, ax)
    t = Concat()", target, R"() {axis = 0}
    y = Reshape(x, t))", attrs, R"(
    output y
  )");
}

// The Reshape's target after constant folding and DCE, or "computed" where it still is.
std::string FoldedTarget(const std::string& text, std::unique_ptr<Graph>* out = nullptr) {
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return "";
  EXPECT_TRUE(InferShapes(**g).ok());
  providers::CpuExecutionProvider cpu(1);
  ConstantFolding fold(runtime::MakeConstantEvaluator(**g, cpu));
  DeadCodeElimination dce;
  EXPECT_TRUE(RunToFixedPoint({&fold, &dce}, g->get()).ok());
  const Node* reshape = (*g)->FindValue("y")->producer();
  const Tensor* t = reshape->input(1)->initializer();
  std::string result = "computed";
  if (t) result = absl::StrJoin(std::span<const int64_t>(t->data<int64_t>(), t->numel()), " ");
  if (out) *out = std::move(*g);
  return result;
}

TEST(ConstantFolding, SymbolicReshapeTargetBecomesAConstantThatCopiesTheDims) {
  std::unique_ptr<Graph> g;
  EXPECT_EQ(FoldedTarget(SymbolicReshape("b1, q1, heads"), &g), "0 0 4 16");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->nodes().size(), 1u) << "the Shape, Gathers, Unsqueezes and Concat are left to DCE";
  EXPECT_EQ(g->FindValue("y")->shape().ToString(), "[batch,seq,4,16]");
  // It computes what the computed target does, at two sizes.
  SessionOptions plain;
  plain.optimize = false;
  auto folded = InferenceSession::FromGraph(std::move(g), plain);
  auto original = InferenceSession::FromGraph(*ParseGraph(SymbolicReshape("b1, q1, heads")), plain);
  ASSERT_TRUE(folded.ok() && original.ok()) << folded.status() << original.status();
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{2, 3, 64}, std::vector<int64_t>{1, 7, 64}}) {
    Tensor x(DataType::kFloat32, dims);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 13);
    auto a = (*folded)->Run({{"x", x}});
    auto b = (*original)->Run({{"x", x}});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ((*a)[0].dims(), (*b)[0].dims());
    EXPECT_EQ(testing::CompareTensors((*a)[0], (*b)[0], 0, 0), "");
  }
  // -1 stays -1.
  EXPECT_EQ(FoldedTarget(SymbolicReshape("b1, rest")), "0 -1 64");
  // A named dim at another axis than the input's, or with allowzero = 1 (a 0 is then a zero):
  // left computed.
  EXPECT_EQ(FoldedTarget(SymbolicReshape("q1, b1, heads")), "computed");
  EXPECT_EQ(FoldedTarget(SymbolicReshape("b1, q1, heads", " {allowzero = 1}")), "computed");
}

// The head size computed from the width at run time (x.size(-1) // heads, as an export traces
// it): the width gathered from Shape(x) is a number whatever batch and seq are, so it folds,
// and the division and the target after it.
TEST(ConstantFolding, ANumberGatheredFromASymbolicShapeFoldsAndWhatIsComputedFromIt) {
  constexpr char kText[] = R"(
    input x: float32[batch,seq,64]
    init i0: int64[] = 0
    init i1: int64[] = 1
    init i2: int64[] = 2
    init four: int64[] = 4
    init ax: int64[1] = 0
    init heads: int64[1] = 4
    s = Shape(x)
    b = Gather(s, i0)
    q = Gather(s, i1)
    c = Gather(s, i2)
    d = Div(c, four)
    b1 = Unsqueeze(b, ax)
    q1 = Unsqueeze(q, ax)
    d1 = Unsqueeze(d, ax)
    t = Concat(b1, q1, heads, d1) {axis = 0}
    y = Reshape(x, t)
    output y
  )";
  std::unique_ptr<Graph> g;
  EXPECT_EQ(FoldedTarget(kText, &g), "0 0 4 16");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->nodes().size(), 1u);
  EXPECT_EQ(g->FindValue("y")->shape().ToString(), "[batch,seq,4,16]");
  // A symbolic element stays computed: the batch gathered alone is not a number.
  auto h = ParseGraph(absl::StrReplaceAll(kText, {{"d = Div(c, four)", "d = Div(b, four)"}}));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(InferShapes(**h).ok());
  providers::CpuExecutionProvider cpu(1);
  ConstantFolding fold(runtime::MakeConstantEvaluator(**h, cpu));
  ASSERT_TRUE(RunPass(fold, h->get()).ok());
  EXPECT_FALSE((*h)->FindValue("b")->is_initializer());
  EXPECT_TRUE((*h)->FindValue("c")->is_initializer());
}

}  // namespace
}  // namespace cleave::graph

// Fusions on real exported graphs: the fused graph holds the fused ops, none of the pattern's
// ops, and computes what the unfused graph computes.
namespace cleave {
namespace {

struct FusionCase {
  const char* model;
  const char* absent_op;         // an op the fusion must have removed
  const char* fused_activation;  // FusedMatMul activation expected somewhere, or null
  int min_layer_norms;           // ai.cleave or ONNX LayerNormalization nodes expected
  int attentions = 2;            // ai.cleave.Attention nodes expected (one a layer; no Softmax)
};

void PrintTo(const FusionCase& c, std::ostream* os) { *os << c.model; }

class TransformerFusionTest : public ::testing::TestWithParam<FusionCase> {};

TEST_P(TransformerFusionTest, FusedGraphMatchesUnfused) {
  const FusionCase& c = GetParam();
  std::string dir = std::string(CLEAVE_SOURCE_DIR) + "/models/" + c.model;
  SessionOptions plain;
  plain.optimize = false;
  auto fused = InferenceSession::Load(dir + "/model.onnx");
  auto unfused = InferenceSession::Load(dir + "/model.onnx", plain);
  ASSERT_TRUE(fused.ok() && unfused.ok()) << fused.status() << unfused.status();
  int layer_norms = 0, attentions = 0;
  bool activation_seen = c.fused_activation == nullptr;
  for (const auto& n : (*fused)->graph().nodes()) {
    EXPECT_NE(n->op_type(), c.absent_op) << n->Describe();
    EXPECT_NE(n->op_type(), "Softmax") << n->Describe();
    EXPECT_NE(n->op_type(), "Transpose") << "the head swaps fold into attention's layout: " << n->Describe();
    layer_norms += n->op_type() == "LayerNormalization";
    attentions += n->op_type() == "Attention";
    activation_seen |= n->op_type() == "FusedMatMul" &&
                       n->AttrString("activation", "") == c.fused_activation;
  }
  EXPECT_GE(layer_norms, c.min_layer_norms);
  EXPECT_EQ(attentions, c.attentions);
  EXPECT_TRUE(activation_seen) << "no FusedMatMul with activation " << c.fused_activation;
  Feeds feeds;
  for (size_t i = 0; i < (*fused)->inputs().size(); ++i) {
    auto t = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/input_" + std::to_string(i) + ".pb");
    ASSERT_TRUE(t.ok());
    feeds.emplace_back((*fused)->inputs()[i].name, t->second);
  }
  auto a = (*fused)->Run(feeds);
  auto b = (*unfused)->Run(feeds);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i)
    EXPECT_EQ(testing::CompareTensors((*a)[i], (*b)[i], 1e-5, 1e-4), "") << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Models, TransformerFusionTest,
    ::testing::Values(FusionCase{"variants/gpt_opset14", "Erf", "gelu", 5},
                      FusionCase{"variants/gpt_opset17", "Tanh", "gelu_tanh", 5},
                      FusionCase{"variants/bert_opset15", "Erf", "gelu", 5},
                      FusionCase{"tiny_gpt", "Erf", "gelu", 5},
                      // Rotary q and k: their sequence dim comes through the table's slice
                      // to seq, so the additive causal mask is provably square.
                      FusionCase{"variants/llama_opset18", "Trilu", nullptr, 0}),
    [](const auto& info) {
      std::string n = info.param.model;
      for (char& ch : n)
        if (ch == '/') ch = '_';
      return n;
    });

}  // namespace
}  // namespace cleave
