// Graph passes: dead-code elimination and constant folding.
#include "graph/passes/pass.h"

#include "graph/op_table.h"
#include "graph/verifier.h"
#include "gtest/gtest.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
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

}  // namespace
}  // namespace cleave::graph
