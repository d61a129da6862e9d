// Symbolic values of shape tensors: an exporter's Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape chain keeps named dims through shape inference.
#include "graph/dims_value.h"

#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"

namespace cleave::graph {
namespace {

std::string ShapeOf(const std::string& text, const std::string& value) {
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return "";
  absl::Status s = InferShapes(**g);
  EXPECT_TRUE(s.ok()) << s;
  return (*g)->FindValue(value)->shape().ToString();
}

constexpr char kHeads[] = R"(
  input x: float32[batch,seq,64]
  init i0: int64[] = 0
  init i1: int64[] = 1
  init ax: int64[1] = 0
  init heads: int64[2] = 4 16
  s = Shape(x)
  b = Gather(s, i0)
  q = Gather(s, i1)
  b1 = Unsqueeze(b, ax)
  q1 = Unsqueeze(q, ax)
  t = Concat(b1, q1, heads) {axis = 0}
  y = Reshape(x, t)
  output y
)";

TEST(DimsValue, ReshapeTargetBuiltFromShapeKeepsNames) {
  EXPECT_EQ(ShapeOf(kHeads, "y"), "[batch,seq,4,16]");
  auto g = ParseGraph(kHeads);
  ASSERT_TRUE(InferShapes(**g).ok());
  const auto& t = (*g)->FindValue("t")->dims_value();
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->size(), 4u);
  EXPECT_EQ((*t)[1].symbol, "seq");
  EXPECT_EQ((*t)[3].value, 16);
}

TEST(DimsValue, MinusOneIsSolvedSymbolically) {
  EXPECT_EQ(ShapeOf(R"(
    input x: float32[batch,seq,4,16]
    init i0: int64[1] = 0
    init i1: int64[1] = 1
    init tail: int64[2] = -1 64
    s = Shape(x)
    b = Slice(s, i0, i1)
    t = Concat(b, tail) {axis = 0}
    y = Reshape(x, t)
    output y
  )", "y"), "[batch,seq,64]");
}

TEST(DimsValue, RangeOverASymbolicLengthAndExpand) {
  constexpr char kText[] = R"(
    input x: float32[batch,seq,64]
    init i1: int64[] = 1
    init zero: int64[] = 0
    init one: int64[] = 1
    s = Shape(x)
    n = Gather(s, i1)
    pos = Range(zero, n, one)
    m = ConstantOfShape(s)
    e = Expand(pos, s)
    output pos, m, e
  )";
  EXPECT_EQ(ShapeOf(kText, "pos"), "[seq]");
  EXPECT_EQ(ShapeOf(kText, "m"), "[batch,seq,64]");
  EXPECT_EQ(ShapeOf(kText, "e"), "[batch,seq,64]");
}

// A rotary table of 32 rows cut to the sequence length: Slice(table, 0, seq) keeps
// min(seq, 32) rows, which broadcasts against seq as seq (a longer sequence cannot run).
TEST(DimsValue, ATableSlicedToASymbolicEndBroadcastsAsThatSymbol) {
  constexpr char kText[] = R"(
    input x: float32[batch,2,seq,16]
    input table: float32[32,16]
    init i2: int64[] = 2
    init ax: int64[1] = 0
    init zero: int64[1] = 0
    init one: int64[1] = 1
    init two: int64[1] = 2
    s = Shape(x)
    n = Gather(s, i2)
    end = Unsqueeze(n, ax)
    cos = Slice(table, zero, end)
    from1 = Slice(table, one, end)
    y = Mul(x, cos)
    z = Mul(cos, x)
    w = Mul(x, from1)
    xs = Slice(x, zero, end, two)
    output y, z, w, xs
  )";
  EXPECT_EQ(ShapeOf(kText, "cos"), "[min(seq,32),16]");
  EXPECT_EQ(ShapeOf(kText, "y"), "[batch,2,seq,16]");
  EXPECT_EQ(ShapeOf(kText, "z"), "[batch,2,seq,16]");
  // A slice from row 1 may be one row shorter than seq: nothing is claimed.
  EXPECT_EQ(ShapeOf(kText, "from1"), "[?,16]");
  EXPECT_EQ(ShapeOf(kText, "w"), "[batch,2,?,16]");
  // x's own seq axis sliced to seq keeps the name.
  EXPECT_EQ(ShapeOf(kText, "xs"), "[batch,2,seq,16]");
}

TEST(DimsValue, DataTensorsCarryNoValue) {
  auto g = ParseGraph(R"(
    input x: float32[batch,4]
    input ids: int64[batch,4]
    y = Identity(ids)
    output y
  )");
  ASSERT_TRUE(InferShapes(**g).ok());
  EXPECT_FALSE((*g)->FindValue("y")->dims_value().has_value());
}

}  // namespace
}  // namespace cleave::graph
