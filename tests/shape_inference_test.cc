// Shape-inference tests for the shape and data-movement ops (tests/). Each builds a small
// graph by hand, runs graph::InferShapes and checks the printed output shapes: static dims
// where constants allow, symbolic dims carried through, and the rank when only it is known.
#include <string>
#include <vector>

#include "graph/graph.h"
#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"

namespace cleave::graph {
namespace {

using I64 = std::vector<int64_t>;

Dim Sym(const char* s) { return Dim::Symbol(s); }

// A graph under construction: inputs, constant initializers, then one node.
class Builder {
 public:
  explicit Builder(int opset = 17) { g_.opset_imports()[""] = opset; }
  Value* In(const std::string& name, std::vector<Dim> dims, DataType t = DataType::kFloat32) {
    return g_.AddInput(name, t, Shape(std::move(dims)));
  }
  Value* InUnknownRank(const std::string& name, DataType t = DataType::kFloat32) {
    return g_.AddInput(name, t, Shape());
  }
  Value* Const(const std::string& name, const I64& v) {
    return g_.AddInitializer(name,
                             Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  Node* Op(const std::string& op, std::vector<Value*> ins, int num_outputs = 1) {
    std::vector<Value*> outs;
    for (int i = 0; i < num_outputs; ++i)
      outs.push_back(g_.GetOrCreateValue(op + "_out" + std::to_string(i)));
    return g_.AddNode(op, ins, outs, op + "_node");
  }
  absl::Status Infer() { return InferShapes(g_); }
  // Infers and returns output i's shape as text ("[batch,seq,4,16]"), or the error.
  std::string Out(Node* n, int i = 0) {
    absl::Status s = Infer();
    if (!s.ok()) return std::string(s.message());
    return n->output(i)->shape().ToString();
  }

 private:
  Graph g_;
};

TEST(ShapeInferenceTest, ReshapeCopiesSymbolsForZero) {
  Builder b;
  Node* n =
      b.Op("Reshape", {b.In("x", {Sym("batch"), Sym("seq"), 64}), b.Const("s", {0, 0, 4, 16})});
  EXPECT_EQ(b.Out(n), "[batch,seq,4,16]");
}

TEST(ShapeInferenceTest, ReshapeMinusOneCancelsSymbols) {
  Builder b;
  Value* x = b.In("x", {Sym("batch"), Sym("seq"), 4, 16});
  Node* merge = b.Op("Reshape", {x, b.Const("s1", {0, 0, -1})});
  EXPECT_EQ(b.Out(merge), "[batch,seq,64]");
  Builder b2;
  Value* x2 = b2.In("x", {Sym("batch"), Sym("seq"), 64});
  Node* split = b2.Op("Reshape", {x2, b2.Const("s", {0, -1, 4, 16})});
  EXPECT_EQ(b2.Out(split), "[batch,seq,4,16]");
  // batch * seq has no single-dim name, so it is unknown but the rank is kept.
  Builder b3;
  Node* flat =
      b3.Op("Reshape", {b3.In("x", {Sym("batch"), Sym("seq"), 64}), b3.Const("s", {-1, 64})});
  EXPECT_EQ(b3.Out(flat), "[?,64]");
}

TEST(ShapeInferenceTest, ReshapeRuntimeShapeKeepsRankWhenLengthKnown) {
  Builder b;
  Node* n = b.Op("Reshape", {b.In("x", {2, 3, 4}), b.In("s", {3}, DataType::kInt64)});
  EXPECT_EQ(b.Out(n), "[?,?,?]");
  Builder b2;
  Node* n2 = b2.Op("Reshape", {b2.In("x", {2, 3, 4}), b2.In("s", {Sym("k")}, DataType::kInt64)});
  EXPECT_EQ(b2.Out(n2), "?");
}

TEST(ShapeInferenceTest, ReshapeStaticMismatchNamesNodeAndCounts) {
  Builder b;
  Node* n = b.Op("Reshape", {b.In("x", {2, 3}), b.Const("s", {4, 2})});
  std::string err = b.Out(n);
  EXPECT_NE(err.find("Reshape 'Reshape_node'"), std::string::npos) << err;
  EXPECT_NE(err.find("(6 elements) to [4,2] (8 elements)"), std::string::npos) << err;
}

TEST(ShapeInferenceTest, ReshapeAllowZeroVersion14) {
  Builder b(14);
  Node* n = b.Op("Reshape", {b.In("x", {0, 3}), b.Const("s", {3, 0})});
  n->SetAttr("allowzero", Attribute::Int(1));
  EXPECT_EQ(b.Out(n), "[3,0]");
}

TEST(ShapeInferenceTest, TransposeKeepsSymbols) {
  Builder b;
  Node* n = b.Op("Transpose", {b.In("x", {Sym("batch"), Sym("seq"), 4, 16})});
  n->SetAttr("perm", Attribute::Ints({0, 2, 1, 3}));
  EXPECT_EQ(b.Out(n), "[batch,4,seq,16]");
  Builder b2;
  Node* rev = b2.Op("Transpose", {b2.In("x", {Sym("a"), 2, Sym("c")})});
  EXPECT_EQ(b2.Out(rev), "[c,2,a]");
  Builder b3;
  Node* bad = b3.Op("Transpose", {b3.In("x", {1, 2})});
  bad->SetAttr("perm", Attribute::Ints({0, 0}));
  EXPECT_NE(b3.Out(bad).find("not a permutation"), std::string::npos);
}

TEST(ShapeInferenceTest, ConcatSumsStaticAxisAndKeepsOthers) {
  Builder b;
  Node* n = b.Op("Concat", {b.In("a", {Sym("batch"), Sym("seq"), 3}),
                            b.In("b", {Sym("batch"), Sym("seq"), 5})});
  n->SetAttr("axis", Attribute::Int(-1));
  EXPECT_EQ(b.Out(n), "[batch,seq,8]");
  Builder b2;
  Node* m = b2.Op("Concat",
                  {b2.In("a", {Sym("batch"), Sym("past"), 8}), b2.In("b", {Sym("batch"), 1, 8})});
  m->SetAttr("axis", Attribute::Int(1));
  EXPECT_EQ(b2.Out(m), "[batch,?,8]");
}

TEST(ShapeInferenceTest, SplitForms) {
  Builder b(11);
  Node* n = b.Op("Split", {b.In("x", {Sym("batch"), 12})}, 3);
  n->SetAttr("axis", Attribute::Int(1));
  EXPECT_EQ(b.Out(n, 2), "[batch,4]");
  Builder b13(13);
  Node* m = b13.Op("Split", {b13.In("x", {Sym("batch"), 10}), b13.Const("s", {3, 7})}, 2);
  m->SetAttr("axis", Attribute::Int(-1));
  EXPECT_EQ(b13.Out(m, 1), "[batch,7]");
  Builder b18(18);
  Node* k = b18.Op("Split", {b18.In("x", {7})}, 3);
  k->SetAttr("num_outputs", Attribute::Int(3));
  EXPECT_EQ(b18.Out(k, 0), "[3]");
  EXPECT_EQ(b18.Out(k, 2), "[1]");
}

TEST(ShapeInferenceTest, SliceConstantAndRuntime) {
  Builder b;
  Value* x = b.In("x", {Sym("batch"), Sym("seq"), 64});
  Node* n = b.Op(
      "Slice", {x, b.Const("st", {16, 0}), b.Const("en", {32, INT64_MAX}), b.Const("ax", {2, 1})});
  EXPECT_EQ(b.Out(n), "[batch,seq,16]");
  Builder b2;
  Value* x2 = b2.In("x", {Sym("batch"), Sym("seq"), 64});
  Node* m = b2.Op("Slice", {x2, b2.In("st", {1}, DataType::kInt64),
                            b2.In("en", {1}, DataType::kInt64), b2.Const("ax", {-1})});
  EXPECT_EQ(b2.Out(m), "[batch,seq,?]");
  Builder b3;
  Value* x3 = b3.In("x", {10});
  Node* neg = b3.Op("Slice", {x3, b3.Const("st", {-1}), b3.Const("en", {-1000}),
                              b3.Const("ax", {0}), b3.Const("sp", {-2})});
  EXPECT_EQ(b3.Out(neg), "[5]");
}

TEST(ShapeInferenceTest, SqueezeUnsqueezeByVersion) {
  Builder b11(11);
  Node* s = b11.Op("Squeeze", {b11.In("x", {Sym("batch"), 1, 64})});
  s->SetAttr("axes", Attribute::Ints({1}));
  EXPECT_EQ(b11.Out(s), "[batch,64]");
  Builder b13(13);
  Node* s13 = b13.Op("Squeeze", {b13.In("x", {Sym("batch"), 1, 64}), b13.Const("ax", {-2})});
  EXPECT_EQ(b13.Out(s13), "[batch,64]");
  Builder b13u(13);
  Node* u =
      b13u.Op("Unsqueeze", {b13u.In("x", {Sym("batch"), Sym("seq")}), b13u.Const("ax", {1, -1})});
  EXPECT_EQ(b13u.Out(u), "[batch,1,seq,1]");
  Builder bad(13);
  Node* s3 = bad.Op("Squeeze", {bad.In("x", {2, 3}), bad.Const("ax", {0})});
  EXPECT_NE(bad.Out(s3).find("its size is 2, expected 1"), std::string::npos);
}

TEST(ShapeInferenceTest, FlattenExpandGather) {
  Builder b;
  Node* f = b.Op("Flatten", {b.In("x", {Sym("batch"), 4, 16})});
  EXPECT_EQ(b.Out(f), "[batch,64]");
  Builder be;
  Node* e = be.Op("Expand", {be.In("x", {Sym("batch"), 1, 64}), be.Const("s", {1, 8, 64})});
  EXPECT_EQ(be.Out(e), "[batch,8,64]");
  Builder bg;
  Node* g = bg.Op("Gather", {bg.In("table", {100, 64}),
                             bg.In("ids", {Sym("batch"), Sym("seq")}, DataType::kInt64)});
  EXPECT_EQ(bg.Out(g), "[batch,seq,64]");
  Builder bad;
  Node* g2 = bad.Op("Gather", {bad.In("table", {5, 2}), bad.Const("ids", {0, 5})});
  EXPECT_NE(bad.Out(g2).find("index 5 is out of range for axis 0 of size 5"), std::string::npos);
}

TEST(ShapeInferenceTest, ShapeConstantOfShapeRangeConstant) {
  Builder b(15);
  Node* s = b.Op("Shape", {b.In("x", {Sym("batch"), Sym("seq"), 64})});
  s->SetAttr("start", Attribute::Int(1));
  EXPECT_EQ(b.Out(s), "[2]");
  EXPECT_EQ(s->output(0)->dtype(), DataType::kInt64);
  Builder bc;
  Node* c = bc.Op("ConstantOfShape", {bc.Const("s", {2, 5})});
  c->SetAttr("value", Attribute::TensorValue(Tensor::FromVector<int32_t>({1}, {1})));
  EXPECT_EQ(bc.Out(c), "[2,5]");
  EXPECT_EQ(c->output(0)->dtype(), DataType::kInt32);
  Builder br;
  Value* st = br.Const("start", {0});
  Node* r = br.Op("Range", {st, br.Const("limit", {10}), br.Const("delta", {3})});
  EXPECT_EQ(br.Out(r), "[4]");  // 0, 3, 6, 9
  Builder bk;
  Node* k = bk.Op("Constant", {});
  k->SetAttr("value_ints", Attribute::Ints({1, 2, 3}));
  EXPECT_EQ(bk.Out(k), "[3]");
  EXPECT_EQ(k->output(0)->dtype(), DataType::kInt64);
}

TEST(ShapeInferenceTest, UnknownRankStaysUnknown) {
  Builder b;
  Node* t = b.Op("Transpose", {b.InUnknownRank("x")});
  EXPECT_EQ(b.Out(t), "?");
  Builder b2;
  Node* s = b2.Op("Shape", {b2.InUnknownRank("x")});
  EXPECT_EQ(b2.Out(s), "[?]");
}

// Attention's bias broadcasts to the scores [..., T, S]: a padding mask [B, 1, 1, S] over
// symbolic dims infers; one that does not broadcast, or of an integer type, is an error naming
// the node, the scores' shape and what it got.
TEST(ShapeInferenceTest, AttentionBiasMustBroadcastToTheScores) {
  const auto infer = [](const std::string& q, const std::string& bias) -> std::string {
    auto g = ParseGraph("input q: float32" + q + "\ninput m: " + bias +
                        "\ny = ai.cleave.Attention(q, q, q, m) {scale = 0.5}\noutput y\n");
    if (!g.ok()) return std::string(g.status().message());
    absl::Status st = InferShapes(**g);
    return st.ok() ? (*g)->FindValue("y")->shape().ToString() : std::string(st.message());
  };
  EXPECT_EQ(infer("[B,3,T,8]", "float32[B,1,1,T]"), "[B,3,T,8]");
  EXPECT_EQ(infer("[2,3,6,8]", "float32[6,6]"), "[2,3,6,8]");
  const std::string bad = infer("[2,3,6,8]", "float32[2,1,1,5]");
  EXPECT_NE(bad.find("Attention"), std::string::npos) << bad;
  EXPECT_NE(bad.find("[2,3,6,6]"), std::string::npos) << bad;
  EXPECT_NE(bad.find("[2,1,1,5]"), std::string::npos) << bad;
  const std::string typed = infer("[2,3,6,8]", "int64[2,1,1,6]");
  EXPECT_NE(typed.find("float32 bias"), std::string::npos) << typed;
  EXPECT_NE(typed.find("int64"), std::string::npos) << typed;
}

}  // namespace
}  // namespace cleave::graph
