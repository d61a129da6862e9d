// IR construction, editing, ordering, verification and shape inference.
#include "graph/graph.h"

#include "graph/op_table.h"
#include "graph/verifier.h"
#include "gtest/gtest.h"
#include "tests/test_graphs.h"

namespace cleave::graph {
namespace {

TEST(Graph, BuildsAndOrdersTopologically) {
  auto g = testing::MakeMlp();
  auto order = g->TopologicalOrder();
  ASSERT_TRUE(order.ok());
  ASSERT_EQ(order->size(), 3u);
  EXPECT_EQ((*order)[0]->name(), "matmul");
  EXPECT_EQ((*order)[2]->name(), "relu");
  EXPECT_TRUE(Verify(*g).ok());
  EXPECT_EQ(g->FindValue("mm")->consumers().size(), 1u);
}

TEST(Graph, DetectsCycles) {
  Graph g;
  g.opset_imports()[""] = 17;
  Value* a = g.GetOrCreateValue("a");
  Value* b = g.GetOrCreateValue("b");
  g.AddNode("Relu", {b}, {a}, "n1");
  g.AddNode("Relu", {a}, {b}, "n2");
  g.AddOutput(b);
  auto order = g.TopologicalOrder();
  ASSERT_FALSE(order.ok());
  EXPECT_NE(std::string(order.status().message()).find("cycle"), std::string::npos);
}

TEST(Graph, ReplaceAllUsesAndRemoveNode) {
  auto g = testing::MakeMlp();
  Value* mm = g->FindValue("mm");
  Value* add = g->FindValue("add");
  Node* bias = add->producer();
  g->ReplaceAllUsesWith(add, mm);  // bypass the bias
  g->RemoveNode(bias);
  EXPECT_TRUE(mm->consumers().size() == 1 && mm->consumers()[0].first->name() == "relu");
  EXPECT_TRUE(Verify(*g).ok());
  g->RemoveUnusedValues();
  EXPECT_EQ(g->FindValue("add"), nullptr);
}

TEST(Graph, SetNodeOutputAddsAnOptionalOutput) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, Shape::FromDims({2}));
  Value* y = g.GetOrCreateValue("y");
  Node* n = g.AddNode("Dropout", {x}, {y}, "drop");
  Value* extra = g.GetOrCreateValue("extra");
  g.SetNodeOutput(n, 2, extra);  // output 1 stays omitted
  ASSERT_EQ(n->num_outputs(), 3);
  EXPECT_EQ(n->output(1), nullptr);
  EXPECT_EQ(extra->producer(), n);
  EXPECT_EQ(extra->producer_output(), 2);
  Value* other = g.GetOrCreateValue("other");
  g.SetNodeOutput(n, 2, other);  // the replaced value loses its producer
  EXPECT_EQ(extra->producer(), nullptr);
  EXPECT_EQ(other->producer(), n);
}

TEST(Graph, CloneIsDeepForStructure) {
  auto g = testing::MakeMlp();
  auto c = g->Clone();
  EXPECT_EQ(c->nodes().size(), 3u);
  EXPECT_NE(c->FindValue("mm"), g->FindValue("mm"));
  EXPECT_TRUE(Verify(*c).ok());
  EXPECT_EQ(c->outputs()[0]->name(), "y");
}

TEST(Graph, VerifierRejectsUndefinedInput) {
  Graph g;
  g.opset_imports()[""] = 17;
  Value* ghost = g.GetOrCreateValue("ghost");
  Value* y = g.GetOrCreateValue("y");
  g.AddNode("Relu", {ghost}, {y}, "r");
  g.AddOutput(y);
  absl::Status s = Verify(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("'ghost'"), std::string::npos);
  EXPECT_NE(std::string(s.message()).find("Relu 'r'"), std::string::npos);
}

TEST(ShapeInference, KeepsSymbolicDimsThroughMlp) {
  auto g = testing::MakeMlp();
  ASSERT_TRUE(InferShapes(*g).ok());
  const Shape& y = g->FindValue("y")->shape();
  ASSERT_EQ(y.rank(), 2);
  EXPECT_EQ(y[0].symbol, "batch");
  EXPECT_EQ(y[1].value, 3);
  EXPECT_EQ(g->FindValue("y")->dtype(), DataType::kFloat32);
}

TEST(ShapeInference, BroadcastErrorNamesTheNode) {
  Graph g;
  g.opset_imports()[""] = 17;
  Value* a = g.AddInput("a", DataType::kFloat32, Shape::FromDims({2, 3}));
  Value* b = g.AddInput("b", DataType::kFloat32, Shape::FromDims({4}));
  Value* c = g.GetOrCreateValue("c");
  g.AddNode("Add", {a, b}, {c}, "bad_add");
  g.AddOutput(c);
  absl::Status s = InferShapes(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("bad_add"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace cleave::graph
