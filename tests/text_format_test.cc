// The IR's text form: parsing, errors with line numbers, and print -> parse round trips.
#include "graph/text_format.h"

#include "graph/op_table.h"
#include "graph/verifier.h"
#include "gtest/gtest.h"

namespace cleave::graph {
namespace {

constexpr char kMlp[] = R"(
  opset 17
  input x: float32[batch,4]
  init w: float32[4,2] = 1 0 0 1 1 1 0 0
  init b: float32[2] = fill 0.5
  mm = MatMul(x, w)
  y = Add(mm, b)
  top: t = Transpose(y) {perm = [1, 0]}
  output t
)";

TEST(TextFormat, ParsesInputsInitializersNodesAndAttributes) {
  auto g = ParseGraph(kMlp);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Verify(**g).ok());
  EXPECT_EQ((*g)->inputs()[0]->shape().ToString(), "[batch,4]");
  EXPECT_FLOAT_EQ((*g)->FindValue("b")->initializer()->data<float>()[1], 0.5f);
  EXPECT_FLOAT_EQ((*g)->FindValue("w")->initializer()->data<float>()[4], 1.f);
  const Node* top = (*g)->FindValue("t")->producer();
  EXPECT_EQ(top->name(), "top");
  EXPECT_EQ(top->AttrInts("perm"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ((*g)->FindValue("mm")->consumers()[0].first->op_type(), "Add");
  ASSERT_TRUE(InferShapes(**g).ok());
  EXPECT_EQ((*g)->FindValue("t")->shape().ToString(), "[2,batch]");
}

TEST(TextFormat, OmittedInputsDomainsAndStrings) {
  auto g = ParseGraph(R"(
    input x: float32[3]
    y = ai.cleave.Gelu(x) {approximate = "tanh"}
    z, m = Dropout(y, _, _) {seed = 7}
    output z
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  const Node* gelu = (*g)->FindValue("y")->producer();
  EXPECT_EQ(gelu->domain(), "ai.cleave");
  EXPECT_EQ(gelu->AttrString("approximate", ""), "tanh");
  EXPECT_EQ((*g)->OpsetFor("ai.cleave"), 1);
  EXPECT_EQ((*g)->FindValue("z")->producer()->input(1), nullptr);
}

TEST(TextFormat, ErrorsNameTheLine) {
  auto g = ParseGraph("input x: float32[2]\ny = Relu(nope)\noutput y");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(std::string(g.status().message()).find("line 2"), std::string::npos) << g.status();
  EXPECT_NE(std::string(g.status().message()).find("'nope'"), std::string::npos);
  EXPECT_FALSE(ParseGraph("init w: float32[2] = 1 2 3").ok());
  EXPECT_FALSE(ParseGraph("input x: floaty[2]").ok());
}

TEST(TextFormat, PrintThenParseGivesTheSameStructure) {
  auto g = ParseGraph(R"(
    input x: float32[2,3]
    y = Softmax(x) {axis = -1}
    s, r = Split(y) {axis = 1, num_outputs = 2}
    output s, r
  )");
  ASSERT_TRUE(g.ok());
  std::string text = PrintGraph(**g);
  auto h = ParseGraph(text);
  ASSERT_TRUE(h.ok()) << h.status() << "\n" << text;
  EXPECT_EQ(PrintGraph(**h), text);
  EXPECT_NE(text.find("s, r = Split(y) {axis = 1, num_outputs = 2}"), std::string::npos) << text;
}

}  // namespace
}  // namespace cleave::graph
