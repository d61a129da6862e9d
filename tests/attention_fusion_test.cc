// Attention fusions on graphs written as text: scaled dot-product attention with its causal mask
// (a constant, or computed from the sequence length), a padding mask or learned bias becomes one
// ai.cleave.Attention, masks that are not causal are left alone; and the layout folds read q, k
// and v in the products' layout. Each fused graph computes what the original computes.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/fusion_test_util.h"
#include "tests/op_tester.h"

namespace cleave::graph {
namespace {

// Scaled dot-product attention as exporters write it (q @ k^T * scale, masked_fill of the
// causally hidden positions with -inf, softmax, @ v) becomes one Attention op.
constexpr char kAttention[] = R"(
  input q: float32[2,3,4,8]
  input k: float32[2,3,4,8]
  input v: float32[2,3,4,8]
  init hidden: bool[4,4] = MASK
  init neg: float32[] = -inf
  init scale: float32[] = 0.35355339
)";
// What follows the mask `hidden`: the scaled scores, masked, softmax, @ v.
constexpr char kAttentionCore[] = R"(
  kt = Transpose(k) {perm = [0, 1, 3, 2]}
  s = MatMul(q, kt)
  ss = Mul(s, scale)
  m = Where(hidden, neg, ss)
  p = Softmax(m) {axis = -1}
  y = MatMul(p, v)
  output y
)";
constexpr char kCausalHidden[] = "0 1 1 1 0 0 1 1 0 0 0 1 0 0 0 0";

std::string AttentionText(const std::string& mask, const std::string& extra = "") {
  return absl::StrReplaceAll(kAttention, {{"MASK", mask}}) + kAttentionCore + extra;
}

// Runs AttentionFusion; returns the op types left.
std::vector<std::string> FuseAttention(Graph& g) {
  EXPECT_TRUE(InferShapes(g).ok());
  AttentionFusion fusion;
  auto changed = RunPass(fusion, &g);
  EXPECT_TRUE(changed.ok()) << changed.status();
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) ops.push_back(n->op_type());
  return ops;
}

TEST(AttentionFusion, CausalAttentionBecomesOneOpWithTheSameOutput) {
  auto g = ParseGraph(AttentionText(kCausalHidden));
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(FuseAttention(**g), std::vector<std::string>{"Attention"});
  const Node& n = *(*g)->nodes()[0];
  EXPECT_EQ(n.AttrInt("causal", 0), 1);
  EXPECT_NEAR(n.AttrFloat("scale", 0), 0.35355339, 1e-7);
  ExpectGraphsAgree(std::move(*g), *ParseGraph(AttentionText(kCausalHidden)),
                    {{"q", Random({2, 3, 4, 8}, 1)}, {"k", Random({2, 3, 4, 8}, 2)}, {"v", Random({2, 3, 4, 8}, 3)}},
                    1e-6, 1e-5);
}

TEST(AttentionFusion, OtherMasksAndSharedIntermediatesAreLeftAlone) {
  // A mask that also hides the diagonal is not causal.
  auto g = ParseGraph(AttentionText("1 1 1 1 0 1 1 1 0 0 1 1 0 0 0 1"));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(FuseAttention(**g).size(), 6u);
  // The probabilities read by another node too (as a backward would read them).
  auto g2 = ParseGraph(AttentionText(kCausalHidden, "  output p\n"));
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(FuseAttention(**g2).size(), 6u);
}

// The causal mask as exporters compute it for a sequence length known only at run time: a
// [T, T] block of ones from q's shape, its lower triangle, negated into the hidden positions.
// DIAG, UPPER and MASK_TAIL vary the triangle, KEYS names the input whose shape gives its
// size; the key and value lengths are symbol S.
constexpr char kComputedMaskAttention[] = R"(
  input q: float32[2,3,T,8]
  input k: float32[2,3,S,8]
  input v: float32[2,3,S,8]
  init neg: float32[] = -inf
  init scale: float32[] = 0.35355339
  init seq_axis: int64[] = 2
  init axes: int64[1] = 0
  init diag: int64[] = DIAG
  shp = Shape(KEYS)
  t = Gather(shp, seq_axis) {axis = 0}
  t1 = Unsqueeze(t, axes)
  sq = Concat(t1, t1) {axis = 0}
  ones = ConstantOfShape(sq)
  tri = Trilu(ones, diag) {upper = UPPER}
  MASK_TAIL
)";

// Sets every ConstantOfShape's value (the text form has no tensor attributes): the float
// `value`, or true where there is none.
void FillConstantsOfShape(Graph& g, std::optional<float> value) {
  for (const auto& n : g.nodes()) {
    if (n->op_type() != "ConstantOfShape") continue;
    Tensor fill(value ? DataType::kFloat32 : DataType::kBool, {1});
    if (value) fill.data<float>()[0] = *value;
    else fill.data<bool>()[0] = true;
    n->SetAttr("value", Attribute::TensorValue(std::move(fill)));
  }
}

// The graph, with ConstantOfShape's value set to true (the text form has no tensor attributes)
// and, where `same_length`, k and v over q's length T.
std::unique_ptr<Graph> ComputedMaskAttention(const std::string& diag, const std::string& upper,
                                             const std::string& mask_tail, bool same_length = true) {
  std::string text = absl::StrReplaceAll(absl::StrCat(kComputedMaskAttention, kAttentionCore),
                                         {{"DIAG", diag}, {"UPPER", upper}, {"MASK_TAIL", mask_tail}, {"KEYS", "q"}});
  if (same_length) text = absl::StrReplaceAll(text, {{"[2,3,S,8]", "[2,3,T,8]"}});
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  FillConstantsOfShape(**g, std::nullopt);
  return std::move(*g);
}

constexpr char kNotLower[] = "nh = Not(tri)\n  hidden = Cast(nh) {to = 9}";

TEST(AttentionFusion, MaskComputedForARuntimeLengthFusesAndComputesTheSame) {
  // Lower triangle negated (the exporters' form), and the upper triangle above the diagonal.
  for (const auto& [diag, upper, tail] : {std::tuple<std::string, std::string, std::string>{"0", "0", kNotLower},
                                          {"1", "1", "hidden = Identity(tri)"}}) {
    SCOPED_TRACE("upper = " + upper);
    std::unique_ptr<Graph> g = ComputedMaskAttention(diag, upper, tail);
    ASSERT_TRUE(g);
    const std::vector<std::string> ops = FuseAttention(*g);
    ASSERT_EQ(std::count(ops.begin(), ops.end(), "Attention"), 1);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Softmax"), 0);
    for (const auto& n : g->nodes()) {
      if (n->op_type() == "Attention") {
        EXPECT_EQ(n->AttrInt("causal", 0), 1);
      }
    }
    // 70 rows: more than one block of the CPU kernel's query rows.
    for (int64_t T : {1, 5, 70}) {
      const Feeds feeds = {{"q", Random({2, 3, T, 8}, 1)}, {"k", Random({2, 3, T, 8}, 2)},
                           {"v", Random({2, 3, T, 8}, 3)}};
      DeadCodeElimination dce;
      std::unique_ptr<Graph> fused = ComputedMaskAttention(diag, upper, tail);
      FuseAttention(*fused);
      ASSERT_TRUE(RunPass(dce, fused.get()).ok());
      ExpectGraphsAgree(std::move(fused), ComputedMaskAttention(diag, upper, tail), feeds, 1e-5, 1e-5);
    }
  }
}

TEST(AttentionFusion, ComputedMasksThatAreNotCausalAreLeftAlone) {
  auto attention_ops = [](std::unique_ptr<Graph> g) {
    const std::vector<std::string> ops = FuseAttention(*g);
    return std::count(ops.begin(), ops.end(), "Softmax") + std::count(ops.begin(), ops.end(), "Attention") * 10;
  };
  // One future key visible (diagonal 1), the diagonal hidden too (upper, diagonal 0), the
  // visible positions used as the hidden ones (no Not): the softmax stays.
  EXPECT_EQ(attention_ops(ComputedMaskAttention("1", "0", kNotLower)), 1);
  EXPECT_EQ(attention_ops(ComputedMaskAttention("0", "1", "hidden = Identity(tri)")), 1);
  EXPECT_EQ(attention_ops(ComputedMaskAttention("0", "0", "hidden = Cast(tri) {to = 9}")), 1);
  // Keys of another length S, with the mask over [T, T]: not provably the same lengths.
  EXPECT_EQ(attention_ops(ComputedMaskAttention("0", "0", kNotLower, /*same_length=*/false)), 1);
  // The control: the exporters' form fuses.
  EXPECT_EQ(attention_ops(ComputedMaskAttention("0", "0", kNotLower)), 10);
}


// BERT's padding mask: the int attention mask [B, T] unsqueezed to [B, 1, 1, T] and turned into
// (1 - mask) * -10000, added to the scaled scores; batch and length are symbols. CAUSAL_MASK
// puts a causal Where under the Add (GPT-2's export with a padding mask), or nothing.
constexpr char kPaddedAttention[] = R"(
  input q: float32[B,3,T,8]
  input k: float32[B,3,T,8]
  input v: float32[B,3,T,8]
  input mask: int64[B,T]
  init one: float32[] = 1
  init big: float32[] = -10000
  init neg: float32[] = -inf
  init scale: float32[] = 0.35355339
  init axes: int64[2] = 1 2
  init seq_axis: int64[] = 2
  init axes0: int64[1] = 0
  init diag: int64[] = 1
  u = Unsqueeze(mask, axes)
  f = Cast(u) {to = 1}
  inv = Sub(one, f)
  bias = Mul(inv, big)
  kt = Transpose(k) {perm = [0, 1, 3, 2]}
  s = MatMul(q, kt)
  ss = Mul(s, scale)
  CAUSAL_MASK
  a = Add(BIAS_SIDES)
  p = Softmax(a) {axis = -1}
  y = MatMul(p, v)
  output y
)";
constexpr char kCausalWhere[] = R"(shp = Shape(q)
  t = Gather(shp, seq_axis) {axis = 0}
  t1 = Unsqueeze(t, axes0)
  sq = Concat(t1, t1) {axis = 0}
  ones = ConstantOfShape(sq)
  tri = Trilu(ones, diag) {upper = 1}
  hidden = Cast(tri) {to = 9}
  masked = Where(hidden, neg, ss))";

// The graph with the causal mask (CAUSAL_MASK: kCausalWhere's, or `mask`) and the Add of
// `sides`; ConstantOfShape fills with true, or with the float `additive` (LLaMA's export adds
// a -inf triangle to the scores).
std::unique_ptr<Graph> PaddedAttention(bool causal, const std::string& sides, const char* mask = kCausalWhere,
                                       std::optional<float> additive = std::nullopt) {
  auto g = ParseGraph(absl::StrReplaceAll(kPaddedAttention, {{"CAUSAL_MASK", causal ? mask : ""},
                                                             {"BIAS_SIDES", sides}}));
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  FillConstantsOfShape(**g, additive);
  return std::move(*g);
}

// The padding mask's feed: row b hides its last b keys.
Tensor PaddingMask(int64_t B, int64_t T) {
  std::vector<int64_t> m(B * T, 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = std::max<int64_t>(0, T - b); j < T; ++j) m[b * T + j] = 0;
  return Tensor::FromVector<int64_t>(m, {B, T});
}

TEST(AttentionFusion, APaddingMaskBecomesTheOpsBiasAndComputesTheSame) {
  for (const auto& [causal, sides] : {std::pair<bool, std::string>{false, "ss, bias"},
                                      {false, "bias, ss"},
                                      {true, "masked, bias"}}) {
    SCOPED_TRACE(absl::StrCat(causal ? "causal, " : "", "Add(", sides, ")"));
    std::unique_ptr<Graph> g = PaddedAttention(causal, sides);
    ASSERT_TRUE(g);
    const std::vector<std::string> ops = FuseAttention(*g);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Softmax"), 0);
    ASSERT_EQ(std::count(ops.begin(), ops.end(), "Attention"), 1);
    for (const auto& n : g->nodes()) {
      if (n->op_type() != "Attention") continue;
      EXPECT_EQ(n->AttrInt("causal", 0), causal ? 1 : 0);
      ASSERT_EQ(n->num_inputs(), 4);
      EXPECT_EQ(n->input(3)->name(), "bias");
    }
    for (int64_t T : {3, 70}) {  // 70: more than one block of query rows
      const Feeds feeds = {{"q", Random({3, 3, T, 8}, 1)}, {"k", Random({3, 3, T, 8}, 2)},
                           {"v", Random({3, 3, T, 8}, 3)}, {"mask", PaddingMask(3, T)}};
      std::unique_ptr<Graph> fused = PaddedAttention(causal, sides);
      FuseAttention(*fused);
      DeadCodeElimination dce;
      ASSERT_TRUE(RunPass(dce, fused.get()).ok());
      ExpectGraphsAgree(std::move(fused), PaddedAttention(causal, sides), feeds, 1e-5, 1e-5);
    }
  }
}

// LLaMA's causal mask: Trilu(ConstantOfShape(-inf), 1, upper) added to the scores, beside the
// padding mask's Add.
constexpr char kAdditiveCausal[] = R"(shp = Shape(q)
  t = Gather(shp, seq_axis) {axis = 0}
  t1 = Unsqueeze(t, axes0)
  sq = Concat(t1, t1) {axis = 0}
  ones = ConstantOfShape(sq)
  tri = Trilu(ones, diag) {upper = 1}
  masked = Add(ss, tri))";

TEST(AttentionFusion, AnAddedMinusInfinityTriangleIsTheCausalMask) {
  const float inf = std::numeric_limits<float>::infinity();
  std::unique_ptr<Graph> g = PaddedAttention(true, "masked, bias", kAdditiveCausal, -inf);
  ASSERT_TRUE(g);
  const std::vector<std::string> ops = FuseAttention(*g);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), "Softmax"), 0);
  for (const auto& n : g->nodes()) {
    if (n->op_type() == "Attention") {
      EXPECT_EQ(n->AttrInt("causal", 0), 1);
    }
  }
  const Feeds feeds = {{"q", Random({2, 3, 20, 8}, 1)}, {"k", Random({2, 3, 20, 8}, 2)},
                       {"v", Random({2, 3, 20, 8}, 3)}, {"mask", PaddingMask(2, 20)}};
  ExpectGraphsAgree(std::move(g), PaddedAttention(true, "masked, bias", kAdditiveCausal, -inf), feeds, 1e-5, 1e-5);
  // A triangle of a small fill is no causal mask but a second bias, and the op takes one: the
  // softmax stays.
  std::unique_ptr<Graph> f = PaddedAttention(true, "masked, bias", kAdditiveCausal, -1.f);
  const std::vector<std::string> kept = FuseAttention(*f);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), "Softmax"), 1);
}

TEST(AttentionFusion, ABiasOfTheWrongShapeIsLeftAloneAndALearnedOneFuses) {
  const auto softmaxes = [](const std::string& bias_def, const std::string& bias_name) {
    std::string text =
        absl::StrReplaceAll(kPaddedAttention, {{"CAUSAL_MASK", bias_def}, {"BIAS_SIDES", "ss, " + bias_name}});
    auto g = ParseGraph(text);
    EXPECT_TRUE(g.ok()) << g.status();
    const std::vector<std::string> ops = FuseAttention(**g);
    return std::count(ops.begin(), ops.end(), "Softmax");
  };
  // A bias that varies along D's axis cannot be over [B, 3, T, T]: [B, 3, T, 8] is the q's shape.
  EXPECT_EQ(softmaxes("qb = Identity(q)", "qb"), 1);
  // A learned bias (a float initializer, which training updates: the gradient gives it one).
  EXPECT_EQ(softmaxes("init w: float32[3,1,1] = 0.5 -1 2\n  pb = Mul(bias, w)", "pb"), 0);
  // The padding mask itself.
  EXPECT_EQ(softmaxes("", "bias"), 0);
}

// Attention and its gradient over [B, T, H, D] values that Transposes swap into [B, H, T, D]
// (and back), as attention over the q/k/v products comes out of export and autodiff, in `type`;
// `extra` adds statements.
std::string SwappedAttention(const char* type, const std::string& extra = "") {
  return absl::StrCat(R"(
    input qs: )", type, R"([2,5,3,8]
    input ks: )", type, R"([2,7,3,8]
    input vs: )", type, R"([2,7,3,8]
    input gs: )", type, R"([2,5,3,8]
    q = Transpose(qs) {perm = [0, 2, 1, 3]}
    k = Transpose(ks) {perm = [0, 2, 1, 3]}
    v = Transpose(vs) {perm = [0, 2, 1, 3]}
    o, lse = ai.cleave.Attention(q, k, v) {scale = 0.35, causal = 1}
    y = Transpose(o) {perm = [0, 2, 1, 3]}
    g = Transpose(gs) {perm = [0, 2, 1, 3]}
    dq, dk, dv = ai.cleave.AttentionGrad(g, q, k, v, o, lse) {scale = 0.35, causal = 1}
    dqs = Transpose(dq) {perm = [0, 2, 1, 3]}
    dks = Transpose(dk) {perm = [0, 2, 1, 3]}
    dvs = Transpose(dv) {perm = [0, 2, 1, 3]}
    output y
    output lse
    output dqs
    output dks
    output dvs
  )", extra);
}

// The eight layout transposes around attention fold into the ops (layout "bshd"), forward and
// backward, causal with fewer queries than keys, in float32 and bf16, and every output is the
// same (the CPU kernels run on the same values); a swapped value that something else reads
// keeps its Transposes.
TEST(AttentionLayoutFusion, TransposesFoldIntoTheOpsAndComputeTheSame) {
  for (const char* type : {"float32", "bfloat16"}) {
    SCOPED_TRACE(type);
    AttentionLayoutFusion fusion;
    std::unique_ptr<Graph> g = Rewritten(SwappedAttention(type), fusion);
    ASSERT_TRUE(g);
    EXPECT_EQ(OpCounts(*g)["Transpose"], 0);
    for (const auto& n : g->nodes()) EXPECT_EQ(n->AttrString("layout", ""), "bshd") << n->name();
    EXPECT_EQ(g->FindValue("lse")->shape(), Shape::FromDims({2, 3, 5}));
    EXPECT_EQ(g->FindValue("y")->shape(), Shape::FromDims({2, 5, 3, 8}));
    const bool low = std::string(type) == "bfloat16";
    auto feed = [&](std::vector<int64_t> dims, unsigned seed) {
      return low ? RandomBf16(dims, seed, 1.f) : Random(dims, seed);
    };
    const Feeds feeds = {{"qs", feed({2, 5, 3, 8}, 1)}, {"ks", feed({2, 7, 3, 8}, 2)}, {"vs", feed({2, 7, 3, 8}, 3)},
                         {"gs", feed({2, 5, 3, 8}, 4)}};
    ExpectGraphsAgree(std::move(g), *ParseGraph(SwappedAttention(type)), feeds, 0, 0);
  }
  AttentionLayoutFusion fusion;
  EXPECT_FALSE(Changes(fusion, SwappedAttention("float32", "z = Neg(k)\noutput z"))) << "k has another reader";
  // The layout is checked: rank 4 only, and a known name.
  auto bad = ParseGraph(R"(
    input q: float32[2,5,8]
    o = ai.cleave.Attention(q, q, q) {layout = "bshd"}
    output o
  )");
  ASSERT_TRUE(bad.ok());
  absl::Status s = InferShapes(**bad);
  EXPECT_NE(std::string(s.message()).find("rank 4 [B, T, H, D]"), std::string::npos) << s;
  auto unknown = ParseGraph(R"(
    input q: float32[2,5,3,8]
    o = ai.cleave.Attention(q, q, q) {layout = "sbhd"}
    output o
  )");
  ASSERT_TRUE(unknown.ok());
  s = InferShapes(**unknown);
  EXPECT_NE(std::string(s.message()).find("expected \"bhsd\", \"bshd\" or \"bs3hd\""), std::string::npos) << s;
}

// Attention over the q/k/v product [B, T, 3 C] as a GPT exports it: a Split into q, k, v, their
// Reshapes to [B, T, H, D] and Transposes, and in the backward the gradients swapped back,
// reshaped and concatenated. The fusion leaves one Reshape of the product to [B, T, 3, H, D]
// (layout "bs3hd") and one of the packed gradient back: no Split, Concat or Transpose, and the
// same outputs.
std::string PackedQkvAttention(const char* type) {
  return absl::StrCat(R"(
    input qkv: )", type, R"([2,6,72]
    input gs: )", type, R"([2,6,24]
    init sizes: int64[3] = 24 24 24
    init heads: int64[4] = 2 6 3 8
    init flat: int64[3] = 2 6 24
    q3, k3, v3 = Split(qkv, sizes) {axis = 2}
    q4 = Reshape(q3, heads)
    k4 = Reshape(k3, heads)
    v4 = Reshape(v3, heads)
    q = Transpose(q4) {perm = [0, 2, 1, 3]}
    k = Transpose(k4) {perm = [0, 2, 1, 3]}
    v = Transpose(v4) {perm = [0, 2, 1, 3]}
    o, lse = ai.cleave.Attention(q, k, v) {scale = 0.35, causal = 1}
    o4 = Transpose(o) {perm = [0, 2, 1, 3]}
    y = Reshape(o4, flat)
    g4 = Reshape(gs, heads)
    g = Transpose(g4) {perm = [0, 2, 1, 3]}
    dq, dk, dv = ai.cleave.AttentionGrad(g, q, k, v, o, lse) {scale = 0.35, causal = 1}
    dq4 = Transpose(dq) {perm = [0, 2, 1, 3]}
    dk4 = Transpose(dk) {perm = [0, 2, 1, 3]}
    dv4 = Transpose(dv) {perm = [0, 2, 1, 3]}
    dq3 = Reshape(dq4, flat)
    dk3 = Reshape(dk4, flat)
    dv3 = Reshape(dv4, flat)
    dqkv = Concat(dq3, dk3, dv3) {axis = 2}
    output y
    output lse
    output dqkv
  )");
}

TEST(AttentionLayoutFusion, PackedQkvProductFeedsAttentionWhole) {
  for (const char* type : {"float32", "bfloat16"}) {
    SCOPED_TRACE(type);
    AttentionLayoutFusion fusion;
    std::unique_ptr<Graph> g = Rewritten(PackedQkvAttention(type), fusion);
    ASSERT_TRUE(g);
    std::map<std::string, int> ops = OpCounts(*g);
    EXPECT_EQ(ops["Transpose"] + ops["Split"] + ops["Concat"], 0);
    int packed = 0;
    for (const auto& n : g->nodes()) packed += n->AttrString("layout", "") == "bs3hd";
    EXPECT_EQ(packed, 2);
    EXPECT_EQ(g->FindValue("dqkv")->shape(), Shape::FromDims({2, 6, 72}));
    const bool low = std::string(type) == "bfloat16";
    auto feed = [&](std::vector<int64_t> dims, unsigned seed) {
      return low ? RandomBf16(dims, seed, 1.f) : Random(dims, seed);
    };
    ExpectGraphsAgree(std::move(g), *ParseGraph(PackedQkvAttention(type)),
                      {{"qkv", feed({2, 6, 72}, 5)}, {"gs", feed({2, 6, 24}, 6)}}, 0, 0);
  }
  // A q/k/v Split whose parts something else reads stays (the layout fold still applies).
  AttentionLayoutFusion fusion;
  std::unique_ptr<Graph> g =
      Rewritten(absl::StrReplaceAll(PackedQkvAttention("float32"), {{"output dqkv", "output dqkv\n    output k3"}}), fusion);
  ASSERT_TRUE(g);
  EXPECT_EQ(OpCounts(*g)["Split"], 1);
  EXPECT_EQ(OpCounts(*g)["Transpose"], 0);
}

// With a bias (a [B, 1, T, S] mask) and its gradient (the scores' gradient, [B, H, T, S] in
// every layout): both folds carry them along, in "bshd" and "bs3hd", and compute the same.
TEST(AttentionLayoutFusion, TheBiasAndItsGradientRideAlong) {
  const auto biased = [](const std::string& text, const char* mask_dims) {
    return absl::StrReplaceAll(
        text, {{"o, lse = ai.cleave.Attention(q, k, v)", absl::StrCat("input m: float32", mask_dims,
                                                                      "\n    o, lse = ai.cleave.Attention(q, k, v, m)")},
               {"dq, dk, dv = ai.cleave.AttentionGrad(g, q, k, v, o, lse)",
                "dq, dk, dv, dm = ai.cleave.AttentionGrad(g, q, k, v, o, lse, m)"},
               {"output lse", "output lse\n    output dm"}});
  };
  AttentionLayoutFusion fusion;
  const std::string swapped = biased(SwappedAttention("float32"), "[2,1,5,7]");
  std::unique_ptr<Graph> g = Rewritten(swapped, fusion);
  ASSERT_TRUE(g);
  EXPECT_EQ(OpCounts(*g)["Transpose"], 0);
  EXPECT_EQ(g->FindValue("dm")->shape(), Shape::FromDims({2, 3, 5, 7}));
  ExpectGraphsAgree(std::move(g), *ParseGraph(swapped),
                    {{"qs", Random({2, 5, 3, 8}, 1)}, {"ks", Random({2, 7, 3, 8}, 2)}, {"vs", Random({2, 7, 3, 8}, 3)},
                     {"gs", Random({2, 5, 3, 8}, 4)}, {"m", Random({2, 1, 5, 7}, 5)}},
                    0, 0);
  const std::string packed_text = biased(PackedQkvAttention("float32"), "[2,1,6,6]");
  std::unique_ptr<Graph> packed = Rewritten(packed_text, fusion);
  ASSERT_TRUE(packed);
  std::map<std::string, int> ops = OpCounts(*packed);
  EXPECT_EQ(ops["Transpose"] + ops["Split"] + ops["Concat"], 0);
  int bs3hd = 0;
  for (const auto& n : packed->nodes()) bs3hd += n->AttrString("layout", "") == "bs3hd";
  EXPECT_EQ(bs3hd, 2);
  ExpectGraphsAgree(std::move(packed), *ParseGraph(packed_text),
                    {{"qkv", Random({2, 6, 72}, 5)}, {"gs", Random({2, 6, 24}, 6)}, {"m", Random({2, 1, 6, 6}, 7)}}, 0,
                    0);
}

// An inference graph's q/k/v product has a symbolic batch and sequence: its Reshapes copy them
// (ONNX's 0), and the fold keeps them symbolic. Where the parts' dims are not known to be the
// product's (an unnamed dim), it leaves the Split.
std::string SymbolicQkvAttention(const char* heads, const char* batch = "batch") {
  return absl::StrCat(R"(
    input qkv: float32[)", batch, R"(,seq,72]
    init sizes: int64[3] = 24 24 24
    init heads: int64[4] = )", heads, R"(
    init flat: int64[3] = 0 0 24
    q3, k3, v3 = Split(qkv, sizes) {axis = 2}
    q4 = Reshape(q3, heads)
    k4 = Reshape(k3, heads)
    v4 = Reshape(v3, heads)
    q = Transpose(q4) {perm = [0, 2, 1, 3]}
    k = Transpose(k4) {perm = [0, 2, 1, 3]}
    v = Transpose(v4) {perm = [0, 2, 1, 3]}
    o, lse = ai.cleave.Attention(q, k, v) {scale = 0.35, causal = 1}
    o4 = Transpose(o) {perm = [0, 2, 1, 3]}
    y = Reshape(o4, flat)
    output y
  )");
}

TEST(AttentionLayoutFusion, PackedQkvKeepsASymbolicBatchAndSequence) {
  AttentionLayoutFusion fusion;
  std::unique_ptr<Graph> g = Rewritten(SymbolicQkvAttention("0 0 3 8"), fusion);
  ASSERT_TRUE(g);
  std::map<std::string, int> ops = OpCounts(*g);
  EXPECT_EQ(ops["Transpose"] + ops["Split"], 0);
  const Node* attention = nullptr;
  for (const auto& n : g->nodes())
    if (n->op_type() == "Attention") attention = n.get();
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->AttrString("layout", ""), "bs3hd");
  EXPECT_EQ(attention->input(0)->shape().ToString(), "[batch,seq,3,3,8]");
  EXPECT_EQ(g->FindValue("y")->shape().ToString(), "[batch,seq,24]");
  // Two sizes of the same graph, as an inference session runs it.
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{2, 6, 72}, std::vector<int64_t>{1, 9, 72}}) {
    auto fused = Rewritten(SymbolicQkvAttention("0 0 3 8"), fusion);
    ASSERT_TRUE(fused);
    ExpectGraphsAgree(std::move(fused), *ParseGraph(SymbolicQkvAttention("0 0 3 8")), {{"qkv", Random(dims, 7)}},
                      0, 0);
  }
  // A -1 in the heads' Reshape works out to the same symbol (batch * seq * 24 / (seq * 24)).
  g = Rewritten(SymbolicQkvAttention("-1 0 3 8"), fusion);
  ASSERT_TRUE(g);
  EXPECT_EQ(OpCounts(*g)["Split"], 0);
  // An unnamed batch: the parts' and the product's are not known to be one dim, so the Split
  // stays (the layout fold still applies).
  g = Rewritten(SymbolicQkvAttention("0 0 3 8", "?"), fusion);
  ASSERT_TRUE(g);
  EXPECT_EQ(OpCounts(*g)["Split"], 1);
  EXPECT_EQ(OpCounts(*g)["Transpose"], 0);
}

}  // namespace
}  // namespace cleave::graph
