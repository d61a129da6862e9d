// bf16 mixed precision: the oneDNN bf16 matrix product (ai.cleave MatMulBf16) against a
// double-precision product of the same bf16 values, and the autocast of a training graph
// (every product in bf16, master weights and optimizer in fp32) against the fp32 step, and the
// fused attention in bf16.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "kernels/cpu/gemm_bf16.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "tests/variant_goldens.h"
#include "trainer/mixed_precision.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave::trainer {
namespace {

struct Case {
  std::vector<int64_t> a, b;
  bool ta, tb;
};

TEST(MatMulBf16, MatchesADoubleProductOfTheBf16Values) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const Case& c : {Case{{3, 4}, {4, 5}, false, false}, Case{{2, 3, 4}, {5, 4}, false, true},
                        Case{{2, 4, 3}, {4, 5}, true, false}, Case{{2, 3, 4}, {2, 4, 5}, false, false},
                        Case{{2, 4, 3}, {2, 5, 4}, true, true}, Case{{1, 70, 33}, {33, 17}, false, false}}) {
    auto g = std::make_unique<graph::Graph>();
    g->opset_imports()[""] = 17;
    g->opset_imports()[graph::kCleaveDomain] = 1;
    graph::Value* a = g->AddInput("A", DataType::kBFloat16, Shape::FromDims(c.a));
    graph::Value* b = g->AddInput("B", DataType::kBFloat16, Shape::FromDims(c.b));
    graph::Value* y = g->GetOrCreateValue("Y");
    graph::Node* n = g->AddNode("MatMulBf16", {a, b}, {y}, "mm", graph::kCleaveDomain);
    if (c.ta) n->SetAttr("transA", graph::Attribute::Int(1));
    if (c.tb) n->SetAttr("transB", graph::Attribute::Int(1));
    g->AddOutput(y);
    SessionOptions so;
    so.intra_op_threads = 1;
    auto s = InferenceSession::FromGraph(std::move(g), so);
    ASSERT_TRUE(s.ok()) << s.status();
    Tensor ta(DataType::kBFloat16, c.a), tb(DataType::kBFloat16, c.b);
    for (int64_t i = 0; i < ta.numel(); ++i) ta.data<uint16_t>()[i] = FloatToBFloat16(dist(rng));
    for (int64_t i = 0; i < tb.numel(); ++i) tb.data<uint16_t>()[i] = FloatToBFloat16(dist(rng));
    auto out = (*s)->Run({{"A", ta}, {"B", tb}});
    ASSERT_TRUE(out.ok()) << out.status();
    const Tensor& got = (*out)[0];
    ASSERT_EQ(got.dtype(), DataType::kFloat32);
    const int ra = static_cast<int>(c.a.size()), rb = static_cast<int>(c.b.size());
    const int64_t M = c.ta ? c.a[ra - 1] : c.a[ra - 2], K = c.ta ? c.a[ra - 2] : c.a[ra - 1];
    const int64_t N = c.tb ? c.b[rb - 2] : c.b[rb - 1];
    const int64_t batch = ta.numel() / (M * K);
    ASSERT_EQ(got.numel(), batch * M * N);
    for (int64_t bt = 0; bt < batch; ++bt)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double want = 0;
          for (int64_t k = 0; k < K; ++k) {
            const uint16_t av = ta.data<uint16_t>()[bt * M * K + (c.ta ? k * M + i : i * K + k)];
            const int64_t bb = rb > 2 ? bt * K * N : 0;
            const uint16_t bv = tb.data<uint16_t>()[bb + (c.tb ? j * K + k : k * N + j)];
            want += static_cast<double>(BFloat16ToFloat(av)) * BFloat16ToFloat(bv);
          }
          EXPECT_NEAR(got.data<float>()[(bt * M + i) * N + j], want, 1e-5 * (1 + std::abs(want)))
              << DimsToString(c.a) << " x " << DimsToString(c.b) << " at " << bt << "," << i << "," << j;
        }
  }
}

// The intra-op pool's shares of a bf16 product (whole products of a batch, panels of rows, or of
// columns where there are few rows; transposed operands and a slice of a wider A among them), each
// a one-thread oneDNN call run concurrently, form the product of one call: the same values within
// float32 rounding of the K sums, and every element written.
TEST(GemmBf16, ThePoolsSharesFormTheProductOfOneCall) {
  struct Shape {
    int64_t batch, M, N, K;
    bool ta, tb, b_batched;
    int64_t lda;
  };
  const Shape shapes[] = {{4, 64, 48, 96, false, false, true, 0},   // whole products
                          {1, 300, 70, 128, false, true, false, 0},  // rows
                          {1, 300, 70, 128, true, false, false, 0},  // rows of a transposed A
                          {1, 24, 500, 160, false, false, false, 0},  // columns
                          {1, 24, 500, 160, true, true, false, 0},    // columns, both transposed
                          {1, 200, 64, 96, true, false, false, 256},  // the first 200 of 256 columns of A
                          {3, 130, 40, 64, false, false, false, 0}};  // a batch under the pool's size
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (const int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (const Shape& c : shapes) {
      SCOPED_TRACE(absl::StrCat(threads, " threads, ", c.batch, " x [", c.M, ", ", c.K, "] x [", c.K, ", ", c.N, "]",
                                c.ta ? " transA" : "", c.tb ? " transB" : "", c.lda ? " lda" : ""));
      kernels::cpu::GemmBf16Params p;
      p.batch = c.batch;
      p.b_batched = c.b_batched;
      p.M = c.M;
      p.N = c.N;
      p.K = c.K;
      p.trans_a = c.ta;
      p.trans_b = c.tb;
      p.lda = c.lda;
      const int64_t a_stored = c.batch * (c.ta ? c.K * (c.lda ? c.lda : c.M) : c.M * c.K);
      std::vector<uint16_t> a(static_cast<size_t>(a_stored)), b(static_cast<size_t>((c.b_batched ? c.batch : 1) * c.K * c.N));
      for (uint16_t& v : a) v = FloatToBFloat16(dist(rng));
      for (uint16_t& v : b) v = FloatToBFloat16(dist(rng));
      const size_t out = static_cast<size_t>(c.batch * c.M * c.N);
      std::vector<float> one(out, std::nanf("")), shared(out, std::nanf(""));
      ASSERT_TRUE(kernels::cpu::GemmBf16(p, a.data(), b.data(), one.data()).ok());
      ASSERT_TRUE(kernels::cpu::GemmBf16(p, a.data(), b.data(), shared.data(), &pool).ok());
      for (size_t i = 0; i < out; ++i) {
        ASSERT_FALSE(std::isnan(shared[i])) << i << " was not written";
        ASSERT_NEAR(shared[i], one[i], 1e-5 * (1 + std::abs(one[i]))) << i;
      }
      // And one element against the definition, so that a share reading the wrong rows would show
      // even where both calls agreed.
      const int64_t bt = c.batch - 1, i = c.M - 1, j = c.N / 2, lda = c.lda ? c.lda : (c.ta ? c.M : c.K);
      double want = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const int64_t a_at = bt * (c.ta ? c.K : c.M) * lda + (c.ta ? k * lda + i : i * lda + k);
        const int64_t b_at = (c.b_batched ? bt * c.K * c.N : 0) + (c.tb ? j * c.K + k : k * c.N + j);
        want += static_cast<double>(BFloat16ToFloat(a[a_at])) * BFloat16ToFloat(b[b_at]);
      }
      EXPECT_NEAR(shared[(bt * c.M + i) * c.N + j], want, 1e-4 * (1 + std::abs(want)));
    }
  }
}

// Runs a text graph (every "T[" spelled `type`) on the CPU and returns its outputs.
std::vector<Tensor> RunText(std::string text, const char* type, const Feeds& feeds) {
  for (size_t at; (at = text.find("T[")) != std::string::npos;) text.replace(at, 1, type);
  auto g = graph::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return {};
  SessionOptions so;
  so.intra_op_threads = 1;
  so.optimize = false;
  auto s = InferenceSession::FromGraph(std::move(*g), so);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  auto out = (*s)->Run(feeds);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move(*out) : std::vector<Tensor>{};
}

// A random tensor of `low` (bf16 or fp16) and the same values in float32.
std::pair<Tensor, Tensor> RandomLow(DataType low, const std::vector<int64_t>& dims, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Tensor l(low, dims), f(DataType::kFloat32, dims);
  for (int64_t i = 0; i < l.numel(); ++i) {
    const float x = normal(rng);
    l.data<uint16_t>()[i] = low == DataType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x);
    f.data<float>()[i] = low == DataType::kBFloat16 ? BFloat16ToFloat(l.data<uint16_t>()[i])
                                                    : HalfToFloat(l.data<uint16_t>()[i]);
  }
  return {std::move(l), std::move(f)};
}

uint16_t RoundTo(DataType low, float x) { return low == DataType::kBFloat16 ? FloatToBFloat16(x) : FloatToHalf(x); }

// Creating a session on the text graph fails, the message naming `op` and saying `want`.
void ExpectRejected(const std::string& text, const std::string& op, const std::string& want) {
  auto g = graph::ParseGraph(text);
  ASSERT_TRUE(g.ok()) << g.status();
  auto s = InferenceSession::FromGraph(std::move(*g));
  ASSERT_FALSE(s.ok()) << text;
  EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find(op), std::string::npos) << s.status();
}

// With `to`, MatMulBf16 / MatMulF16 write their own type: the float32 result, bias included (a
// bias of that type), rounded once, bit for bit.
TEST(MatMulBf16, LowPrecisionResultIsTheFloat32ResultRoundedOnce) {
  for (const auto& [op, low] : {std::pair{"MatMulBf16", DataType::kBFloat16}, std::pair{"MatMulF16", DataType::kFloat16}}) {
    const char* type = DataTypeName(low);
    const int to = static_cast<int>(low);
    auto [a, a32] = RandomLow(low, {2, 5, 24}, 1);
    auto [b, b32] = RandomLow(low, {7, 24}, 2);
    auto [c, c32] = RandomLow(low, {7}, 3);
    const std::vector<Tensor> low_out =
        RunText(absl::StrCat("input a: T[2,5,24]\ninput b: T[7,24]\ninput c: T[7]\n",
                             "y = ai.cleave.", op, "(a, b, c) {transB = 1, to = ", to, "}\noutput y\n"),
                type, {{"a", a}, {"b", b}, {"c", c}});
    const std::vector<Tensor> wide_out =
        RunText(absl::StrCat("input a: T[2,5,24]\ninput b: T[7,24]\ninput c: float32[7]\n",
                             "y = ai.cleave.", op, "(a, b, c) {transB = 1}\noutput y\n"),
                type, {{"a", a}, {"b", b}, {"c", c32}});
    ASSERT_EQ(low_out.size(), 1u);
    ASSERT_EQ(wide_out.size(), 1u);
    ASSERT_EQ(low_out[0].dtype(), low);
    ASSERT_EQ(low_out[0].numel(), wide_out[0].numel());
    for (int64_t i = 0; i < low_out[0].numel(); ++i)
      ASSERT_EQ(low_out[0].data<uint16_t>()[i], RoundTo(low, wide_out[0].data<float>()[i])) << op << " at " << i;
  }
  // A `to` other than float32 or the operands' type, and a bias of the other type, are errors
  // naming the node and what it expected.
  for (const auto& [attrs, bias, want] :
       {std::tuple{"to = 10", "bfloat16", "attribute to = 10: expected 1 (float32) or 16 (bfloat16)"},
        std::tuple{"to = 16", "float32", "has dtype float32, expected one of bfloat16"}}) {
    ExpectRejected(absl::StrCat("input a: bfloat16[2,4]\ninput b: bfloat16[4,3]\ninput c: ", bias,
                                "[3]\ny = ai.cleave.MatMulBf16(a, b, c) {", attrs, "}\noutput y\n"),
                   "MatMulBf16", want);
  }
}

// With `rows`, MatMulBf16 / MatMulF16 form only op(A)'s first rows rows: A's first columns
// read where they lie with transA (a padded operand's product), or A's first rows without; the
// rows are those of the whole product, with and without an accumulation buffer. A `rows` past
// op(A)'s rows, a 3-D A, and a dbias of A with rows are errors naming the node.
TEST(MatMulBf16, RowsFormsOnlyTheFirstRowsOfTheProduct) {
  for (const auto& [op, low] : {std::pair{"MatMulBf16", DataType::kBFloat16}, std::pair{"MatMulF16", DataType::kFloat16}}) {
    const char* type = DataTypeName(low);
    for (const bool trans_a : {true, false}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(absl::StrCat(op, trans_a ? " transA" : "", accumulate ? " accumulating" : ""));
        // op(A) is [40, 24]: A [24, 40] with transA, else [40, 24]; 37 rows kept.
        auto [a, a32] = RandomLow(low, trans_a ? std::vector<int64_t>{24, 40} : std::vector<int64_t>{40, 24}, 4);
        auto [b, b32] = RandomLow(low, {24, 9}, 5);
        Tensor acc = RandomLow(low, {37, 9}, 6).second, reset(DataType::kBool, {});
        reset.data<bool>()[0] = false;
        const std::string a_dims = trans_a ? "[24,40]" : "[40,24]";
        const std::string attrs = trans_a ? "transA = 1, " : "";
        const std::vector<Tensor> part =
            RunText(absl::StrCat("input a: T", a_dims, "\ninput b: T[24,9]\ninput acc: float32[37,9]\n",
                                 "input reset: bool[]\ny = ai.cleave.", op, "(a, b",
                                 accumulate ? ", _, acc, reset" : "", ") {", attrs, "rows = 37}\noutput y\n"),
                    type, {{"a", a}, {"b", b}, {"acc", acc}, {"reset", reset}});
        const std::vector<Tensor> whole = RunText(
            absl::StrCat("input a: T", a_dims, "\ninput b: T[24,9]\ny = ai.cleave.", op, "(a, b) {",
                         trans_a ? "transA = 1" : "", "}\noutput y\n"),
            type, {{"a", a}, {"b", b}});
        ASSERT_EQ(part.size(), 1u);
        ASSERT_EQ(whole.size(), 1u);
        ASSERT_EQ(part[0].dims(), (std::vector<int64_t>{37, 9}));
        ASSERT_EQ(whole[0].dims(), (std::vector<int64_t>{40, 9}));
        for (int64_t i = 0; i < 37 * 9; ++i) {
          const float want = whole[0].data<float>()[i] + (accumulate ? acc.data<float>()[i] : 0.f);
          ASSERT_NEAR(part[0].data<float>()[i], want, 1e-5f * (1 + std::abs(want))) << i;
        }
      }
    }
  }
  for (const auto& [text, want] : {
           std::pair{"input a: bfloat16[4,6]\ninput b: bfloat16[4,3]\ny = ai.cleave.MatMulBf16(a, b) {transA = 1, rows = 7}",
                     "rows = 7: expected 0 to op(A)'s 6 rows"},
           std::pair{"input a: bfloat16[2,4,6]\ninput b: bfloat16[6,3]\ny = ai.cleave.MatMulBf16(a, b) {rows = 2}",
                     "rows = 2 needs a 2-D A, got [2,4,6]"},
           std::pair{"input a: bfloat16[4,6]\ninput b: bfloat16[4,3]\ny, db = ai.cleave.MatMulBf16(a, b) "
                     "{transA = 1, rows = 5, dbias_operand = 0}",
                     "dbias of A with rows"}}) {
    ExpectRejected(absl::StrCat(text, "\noutput y\n"), "MatMulBf16", want);
  }
}

// SkipLayerNormalization with `to` writes y in bf16 / fp16: the float32 y rounded once; a `to`
// that is neither x's type nor a low one is an error naming the node and what it expected.
TEST(MixedPrecision, SkipLayerNormWritesTheLowTypeRoundedOnce) {
  const std::string text = R"(
    input x: float32[3,40]
    input r: float32[3,40]
    input g: float32[40]
    y, mean, inv, sum = ai.cleave.SkipLayerNormalization(x, r, g) {epsilon = 1e-5TO}
    output y
    output sum
  )";
  auto with = [&](const std::string& attr) {
    std::string t = text;
    t.replace(t.find("TO"), 2, attr);
    return t;
  };
  Feeds feeds = {{"x", RandomLow(DataType::kBFloat16, {3, 40}, 21).second},
                 {"r", RandomLow(DataType::kBFloat16, {3, 40}, 22).second},
                 {"g", RandomLow(DataType::kBFloat16, {40}, 23).second}};
  const std::vector<Tensor> wide = RunText(with(""), "float32", feeds);
  ASSERT_EQ(wide.size(), 2u);
  for (DataType low : {DataType::kBFloat16, DataType::kFloat16}) {
    const std::vector<Tensor> got = RunText(with(absl::StrCat(", to = ", static_cast<int>(low))), "float32", feeds);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_EQ(got[0].dtype(), low);
    EXPECT_EQ(got[1].dtype(), DataType::kFloat32) << "the sum stays x's type";
    for (int64_t i = 0; i < got[0].numel(); ++i)
      ASSERT_EQ(got[0].data<uint16_t>()[i], RoundTo(low, wide[0].data<float>()[i])) << i;
  }
  ExpectRejected(with(", to = 7"), "SkipLayerNormalization",
                 "attribute to = 7: expected x's type 1 (float32), 16 (bfloat16) or 10 (float16)");
}

// The CPU runs the bias Add, Gelu, GeluGrad and the bias gradient's ReduceSum (ReduceMean and
// ReduceMax too) in bf16 and fp16 by widening to float32 and rounding each result once: bit for
// bit the float32 kernel on the widened values, rounded.
TEST(MixedPrecision, LowPrecisionKernelsAreTheFloat32KernelsRoundedOnce) {
  // S and DX: what Gelu / GeluGrad and the reductions read. The float32 reference reads the low
  // graph's own rounded s and dx (inputs), so each op is compared on the same values.
  const std::string text = R"(
    opset 20
    input x: T[4,6,32]
    input dy: T[4,6,32]
    input bias: T[32]
    INPUTS
    init axes: int64[2] = 0 1
    s = Add(x, bias)
    g = ai.cleave.Gelu(S)
    gt = ai.cleave.Gelu(x) {approximate = "tanh"}
    g20 = Gelu(x)
    dx = ai.cleave.GeluGrad(dy, S)
    dxt = ai.cleave.GeluGrad(dy, x) {approximate = "tanh"}
    db = ReduceSum(DX, axes) {keepdims = 0}
    dm = ReduceMean(DX, axes) {keepdims = 0}
    dmax = ReduceMax(DX, axes) {keepdims = 1}
    output s
    output g
    output gt
    output g20
    output dx
    output dxt
    output db
    output dm
    output dmax
  )";
  auto form = [&](const std::string& inputs, const std::string& s_name, const std::string& dx_name) {
    std::string t = text;
    t.replace(t.find("INPUTS"), 6, inputs);
    for (size_t at; (at = t.find("(S)")) != std::string::npos;) t.replace(at + 1, 1, s_name);
    for (size_t at; (at = t.find(", S)")) != std::string::npos;) t.replace(at + 2, 1, s_name);
    for (size_t at; (at = t.find("(DX,")) != std::string::npos;) t.replace(at + 1, 2, dx_name);
    return t;
  };
  for (DataType low : {DataType::kBFloat16, DataType::kFloat16}) {
    auto [x, x32] = RandomLow(low, {4, 6, 32}, 11);
    auto [dy, dy32] = RandomLow(low, {4, 6, 32}, 12);
    auto [bias, bias32] = RandomLow(low, {32}, 13);
    const std::vector<Tensor> got =
        RunText(form("", "s", "dx"), DataTypeName(low), {{"x", x}, {"dy", dy}, {"bias", bias}});
    ASSERT_EQ(got.size(), 9u);
    auto widen = [&](const Tensor& t) {
      Tensor f(DataType::kFloat32, t.dims());
      for (int64_t i = 0; i < t.numel(); ++i)
        f.data<float>()[i] = low == DataType::kBFloat16 ? BFloat16ToFloat(t.data<uint16_t>()[i])
                                                        : HalfToFloat(t.data<uint16_t>()[i]);
      return f;
    };
    const std::vector<Tensor> ref =
        RunText(form("input s_in: T[4,6,32]\n    input dx_in: T[4,6,32]", "s_in", "dx_in"), "float32",
                {{"x", x32}, {"dy", dy32}, {"bias", bias32}, {"s_in", widen(got[0])}, {"dx_in", widen(got[4])}});
    ASSERT_EQ(ref.size(), 9u);
    for (size_t o = 0; o < got.size(); ++o) {
      ASSERT_EQ(got[o].dtype(), low) << o;
      ASSERT_EQ(got[o].numel(), ref[o].numel()) << o;
      for (int64_t i = 0; i < got[o].numel(); ++i)
        ASSERT_EQ(got[o].data<uint16_t>()[i], RoundTo(low, ref[o].data<float>()[i]))
            << DataTypeName(low) << " output " << o << " at " << i;
    }
  }
}

// Builds `model`'s training artifacts from `spec` in fp32 and in bf16, hands each to `inspect`,
// and runs one step of each on `feeds` (in the artifacts' data-input order): the bf16 step's loss
// is within 1% of fp32's and its gradient norm within 3%, and the loss differs (bf16's rounding
// shows, so the bf16 graph did run).
void ExpectBf16StepTracksFp32(const graph::Graph& model, TrainingSpec spec, const Feeds& feeds,
                              const std::function<void(Precision, const TrainingArtifacts&)>& inspect) {
  std::vector<float> loss, norm;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(PrecisionName(p));
    spec.precision = p;
    auto a = BuildTrainingArtifacts(model, spec);
    ASSERT_TRUE(a.ok()) << a.status();
    inspect(p, *a);
    if (::testing::Test::HasFatalFailure()) return;
    const Feeds ordered = testing::InOrder(feeds, a->data_inputs);
    auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
    ASSERT_TRUE(s.ok()) << s.status();
    auto l = (*s)->TrainStep(ordered);
    ASSERT_TRUE(l.ok()) << l.status();
    loss.push_back(*l);
    auto g = (*s)->OptimizerStep();
    ASSERT_TRUE(g.ok()) << g.status();
    norm.push_back(*g);
  }
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_NEAR(loss[1], loss[0], 0.01 * loss[0]);
  EXPECT_NEAR(norm[1], norm[0], 0.03 * norm[0]);
  EXPECT_NE(loss[1], loss[0]);
}

TEST(MixedPrecision, Bf16TrainingGraphRunsEveryProductInBf16AndTracksFp32) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/train_variants/llama/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  ExpectBf16StepTracksFp32(**model, spec, testing::TokenBatch(16, 64), [](Precision p, const TrainingArtifacts& a) {
    int bf16 = 0, fp32 = 0;
    for (const auto& n : a.training->nodes()) {
      bf16 += n->op_type() == "MatMulBf16";
      fp32 += n->op_type() == "MatMul" || n->op_type() == "FusedMatMul";
    }
    if (p == Precision::kBf16) {
      EXPECT_GT(bf16, 20);  // every projection forward and both of its gradients, attention too
      EXPECT_EQ(fp32, 0);
      // Master weights: the parameters and the optimizer stay fp32.
      for (const std::string& name : a.params) EXPECT_EQ(a.training->FindValue(name)->dtype(), DataType::kFloat32);
    } else {
      EXPECT_EQ(bf16, 0);
    }
  });
  EXPECT_FALSE(ParsePrecision("fp8").ok());
  EXPECT_EQ(*ParsePrecision("fp16"), Precision::kFp16);
}

// BERT's pooler is a Gemm (torch's Linear on a 2-D input: C of [N], transB) and the rule makes
// Gemms of its gradients: under bf16 each becomes a MatMulBf16, the pooler's C its bias, and the
// step tracks fp32.
TEST(MixedPrecision, Bf16AutocastTakesTheLinearGemms) {
  const testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, "bert_cls");
  auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  ExpectBf16StepTracksFp32(**model, golden.spec, golden.feeds, [](Precision p, const TrainingArtifacts& a) {
    int gemms = 0, with_bias = 0;
    for (const auto& n : a.training->nodes()) {
      gemms += n->op_type() == "Gemm";
      with_bias += n->op_type() == "MatMulBf16" && n->num_inputs() > 2 && n->input(2) &&
                   n->input(2)->dtype() == DataType::kFloat32 && n->AttrInt("transB", 0) == 1;
    }
    EXPECT_EQ(gemms, p == Precision::kFp32 ? 3 : 0);  // the pooler and its two gradients
    EXPECT_EQ(with_bias, p == Precision::kFp32 ? 0 : 1);
  });
}

// The convolutions (the CNN's Convs and their ConvGrads; the decoder's Convs, ConvTranspose and
// their gradients) run in bf16 under autocast, every operand cast once and every result widened, while
// the batch, group and instance norms stay fp32; each model's step tracks fp32, and its 8-step
// trajectory follows PyTorch's fp32 one within 2% (the tolerance of the GPT's bf16 run).
TEST(MixedPrecision, Bf16ConvolutionsTrackFp32AndFollowPyTorch) {
  for (const char* name : {"cnn", "decoder"}) {
    SCOPED_TRACE(name);
    const testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, name);
    auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
    ASSERT_TRUE(model.ok()) << model.status();
    // Each convolution and its gradient: the CNN's two Convs, the decoder's three and its
    // ConvTranspose.
    const int convolutions = std::string(name) == "cnn" ? 4 : 8;
    ExpectBf16StepTracksFp32(**model, golden.spec, golden.feeds, [&](Precision p, const TrainingArtifacts& a) {
      int low = 0, wide = 0;
      for (const auto& n : a.training->nodes()) {
        const std::string& t = n->op_type();
        if (t != "Conv" && t != "ConvTranspose" && t != "ConvGrad" && t != "ConvTransposeGrad") continue;
        (n->input(0)->dtype() == DataType::kBFloat16 ? low : wide) += 1;
        for (int i = 0; i < n->num_inputs(); ++i) {
          if (n->input(i)) {
            EXPECT_EQ(n->input(i)->dtype(), n->input(0)->dtype()) << n->Describe();
          }
        }
      }
      EXPECT_EQ(low, p == Precision::kBf16 ? convolutions : 0);
      EXPECT_EQ(wide, p == Precision::kBf16 ? 0 : convolutions);
      for (const auto& n : a.training->nodes()) {
        if (n->op_type() == "BatchNormalization" || n->op_type() == "InstanceNormalization") {
          EXPECT_EQ(n->input(0)->dtype(), DataType::kFloat32) << n->Describe();
        }
      }
    });
    if (HasFatalFailure()) return;
    TrainingSpec spec = golden.spec;
    spec.precision = Precision::kBf16;
    auto a = BuildTrainingArtifacts(**model, spec);
    ASSERT_TRUE(a.ok()) << a.status();
    const Feeds feeds = testing::InOrder(golden.feeds, a->data_inputs);
    auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 2});
    ASSERT_TRUE(s.ok()) << s.status();
    (*s)->RegisterScheduler({LrSchedule::Kind::kCosine, 2e-3, 2e-4, 2, 8});
    for (int step = 0; step < 8; ++step) {
      (*s)->LazyResetGrad();
      auto loss = (*s)->TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      EXPECT_NEAR(*loss, golden.losses[step], 0.02 * golden.losses[step]) << "step " << step;
    }
  }
}

// BERT's fused attention under bf16 autocast: q, k and v go to bf16 while the padding mask's
// bias stays fp32 in the forward and the gradient alike, and the step tracks fp32.
TEST(MixedPrecision, Bf16FusedAttentionKeepsItsBiasInFp32) {
  const testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, "bert_cls");
  auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  TrainingSpec spec = golden.spec;
  spec.fuse_attention = true;
  ExpectBf16StepTracksFp32(**model, spec, golden.feeds, [](Precision p, const TrainingArtifacts& a) {
    const DataType low = p == Precision::kFp32 ? DataType::kFloat32 : DataType::kBFloat16;
    int forward = 0, backward = 0;
    for (const auto& n : a.training->nodes()) {
      if (n->op_type() == "Attention") {
        ASSERT_EQ(n->num_inputs(), 4);
        EXPECT_EQ(n->input(0)->dtype(), low);
        EXPECT_EQ(n->input(3)->dtype(), DataType::kFloat32);
        ++forward;
      } else if (n->op_type() == "AttentionGrad") {
        ASSERT_EQ(n->num_inputs(), 7);
        EXPECT_EQ(n->input(1)->dtype(), low);
        EXPECT_EQ(n->input(6)->dtype(), DataType::kFloat32);
        ++backward;
      }
    }
    EXPECT_EQ(forward, 2);
    EXPECT_EQ(backward, 2);
  });
}

// The tiny GPT's training artifacts (batch 2, seq 16, attention fused) in precision p, and its
// training graph as sessions run it: their transformer fusions also swap a product that only a
// Transpose reads (a weight gradient) and fold the biases into the products.
std::pair<TrainingArtifacts, std::unique_ptr<graph::Graph>> TinyGptAsSessionsRunIt(Precision p) {
  TrainingSpec spec;
  spec.precision = p;
  spec.fuse_attention = true;
  TrainingArtifacts a = testing::BuildArtifacts("tiny_gpt", 2, 16, spec);
  std::unique_ptr<graph::Graph> g = a.training->Clone();
  graph::TransformerFusion fusion;
  graph::DeadCodeElimination dce;
  EXPECT_TRUE(graph::InferShapes(*g).ok());
  EXPECT_TRUE(graph::RunToFixedPoint({&fusion, &dce}, g.get()).ok());
  return {std::move(a), std::move(g)};
}

// The fused attention under bf16 autocast: q, k and v are cast once for the forward and the
// gradient, the gradient reads the forward's bf16 output, lse stays fp32, and the output goes
// on in bf16; the weights are read through the products' trans flags (no Transpose of a
// parameter or of a product's result is left), a Reshape of a value already cast reshapes the
// cast, narrowing casts sit above and widening ones below the layout ops (and Concats) between
// them, so no value makes a round trip; and the step tracks fp32.
TEST(MixedPrecision, Bf16FusedAttentionAndWeightLayouts) {
  const Feeds batch = testing::TokenBatch(16, 64);
  std::vector<std::vector<float>> loss(2);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    auto [a, fused] = TinyGptAsSessionsRunIt(p);
    const graph::Graph& g = *fused;
    int attention = 0, grads = 0;
    for (const auto& n : g.nodes()) {
      const std::string& op = n->op_type();
      if (p == Precision::kFp32) continue;
      if (op == "Attention") {
        ++attention;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(n->input(i)->dtype(), DataType::kBFloat16) << n->name();
        EXPECT_EQ(n->output(0)->dtype(), DataType::kBFloat16);
        EXPECT_EQ(n->output(1)->dtype(), DataType::kFloat32) << "lse";
        // The output goes on to the projection in bf16 (its layout ops too), never widened.
        for (const auto& [reader, slot] : n->output(0)->consumers())
          EXPECT_NE(reader->op_type(), "Cast") << reader->name() << " widens the attention output";
      }
      if (op == "AttentionGrad") {
        ++grads;
        for (int i = 0; i < 5; ++i) EXPECT_EQ(n->input(i)->dtype(), DataType::kBFloat16) << n->name() << " " << i;
        EXPECT_EQ(n->input(4)->producer()->op_type(), "Attention") << "reads the forward's bf16 output";
        for (int i = 1; i < 4; ++i)
          EXPECT_NE(n->input(i)->consumers().size(), 1u) << "q, k, v: one cast for forward and gradient";
      }
      if (op == "Transpose") {
        const graph::Value* x = n->input(0);
        EXPECT_FALSE(std::count(a.params.begin(), a.params.end(), x->name())) << n->name() << " transposes a weight";
        EXPECT_FALSE(x->producer() && x->producer()->op_type() == "MatMulBf16") << n->name();
      }
      if (op == "Cast" && n->input(0)->producer()) {
        EXPECT_NE(n->input(0)->producer()->op_type(), "Cast") << n->name() << ": a round trip through another type";
      }
      // Attention's layout, forward and backward, and the q, k, v gradients' Concat move bf16.
      if (op == "Transpose" || op == "Concat") {
        EXPECT_EQ(n->input(0)->dtype(), DataType::kBFloat16) << n->name();
      }
      if (op == "Cast" && n->input(0)->producer() && n->input(0)->producer()->op_type() == "Reshape") {
        const graph::Value* before = n->input(0)->producer()->input(0);
        for (const auto& [reader, slot] : before->consumers())
          EXPECT_NE(reader->op_type(), "Cast") << n->name() << " casts a Reshape of a value cast already";
      }
    }
    if (p == Precision::kBf16) {
      EXPECT_EQ(attention, 2);
      EXPECT_EQ(grads, 2);
    }
    auto s = TrainingSession::Create(std::move(a), {.intra_op_threads = 1});
    ASSERT_TRUE(s.ok()) << s.status();
    for (int step = 0; step < 3; ++step) {
      auto l = (*s)->TrainStep(batch);
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      loss[p == Precision::kBf16].push_back(*l);
    }
  }
  for (int step = 0; step < 3; ++step) EXPECT_NEAR(loss[1][step], loss[0][step], 0.01 * loss[0][step]) << step;
  EXPECT_NE(loss[1], loss[0]);  // bf16 rounding does show
}

// Between the products, a layer's activations stay in the low type, as PyTorch's autocast keeps
// them: the products that only casts read write the low type (the MLP's first product with its
// bias and GELU, the q/k/v product with its bias and Split, the gradients into GELU and into
// attention), GeluGrad runs low, and the bias gradients sum low values. Casts to the low type
// are left only after the LayerNorms, the residual stream's gradient and the loss gradient,
// which stay float32.
TEST(MixedPrecision, ActivationsBetweenProductsStayLowPrecision) {
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    const DataType low = p == Precision::kBf16 ? DataType::kBFloat16 : DataType::kFloat16;
    const std::string product = p == Precision::kBf16 ? "MatMulBf16" : "MatMulF16";
    auto [a, g] = TinyGptAsSessionsRunIt(p);
    int low_products = 0, low_biased = 0, gelus = 0, gelu_grads = 0, splits = 0, low_sums = 0;
    for (const auto& n : g->nodes()) {
      const std::string& op = n->op_type();
      const graph::Value* y = n->num_outputs() ? n->output(0) : nullptr;
      if (op == product && n->AttrInt("to", 1) == static_cast<int64_t>(low)) {
        ++low_products;
        EXPECT_EQ(y->dtype(), low);
        if (n->num_inputs() == 3) {
          ++low_biased;
          EXPECT_EQ(n->input(2)->dtype(), low) << n->name();
        }
      }
      if (op == "Gelu") {
        ++gelus;
        EXPECT_EQ(n->input(0)->dtype(), low) << n->name();
      }
      if (op == "GeluGrad") {
        ++gelu_grads;
        for (int i = 0; i < 2; ++i) EXPECT_EQ(n->input(i)->dtype(), low) << n->name();
      }
      if (op == "Split") {
        ++splits;
        EXPECT_EQ(n->input(0)->dtype(), low) << n->name();
      }
      if (op == "ReduceSum" && n->input(0)->dtype() == low) ++low_sums;
      // What a cast to the low type may still read.
      if (op == "Cast" && y->dtype() == low && n->input(0)->producer()) {
        const std::string& from = n->input(0)->producer()->op_type();
        // (The loss gradient's cast folds into the loss gradient in device sessions: its `to`.)
        EXPECT_TRUE(from == "LayerNormalization" || from == "LayerNormalizationGrad" || from == "Add" ||
                    from == "SoftmaxCrossEntropyLossGrad")
            << n->name() << " narrows a " << from;
        if (from == "Add") {
          // The residual stream's gradient (a sum of two float32 gradients), not a bias Add.
          for (const graph::Value* x : n->input(0)->producer()->inputs())
            EXPECT_EQ(x->shape().rank(), 3) << n->name() << " narrows a bias Add";
        }
      }
    }
    // Per layer of the two: the MLP's first product and the q/k/v product, with their biases,
    // and the gradients into GELU and into the attention's layout.
    EXPECT_EQ(low_biased, 4) << PrecisionName(p);
    EXPECT_EQ(low_products, 8) << PrecisionName(p);
    EXPECT_EQ(gelus, 2);
    EXPECT_EQ(gelu_grads, 2);
    EXPECT_EQ(splits, 2);
    EXPECT_EQ(low_sums, 4) << "the MLP's first bias and the q/k/v bias, per layer";
    // Still a valid ONNX model for the checker (as --save-artifacts writes it).
    absl::Status checked = onnx_ext::CheckModel(*a.training);
    EXPECT_TRUE(checked.ok()) << checked;
  }
}

// Under tensor and sequence parallelism the gathers of the products' operands (the
// sequence-split LayerNorm outputs, attention's layouts, weight shards) move bf16 (half the
// bytes, as Megatron gathers them), and the plan's records count the bytes they now move.
TEST(MixedPrecision, SequenceParallelGathersMoveTheLowType) {
  PlanConfig c;
  c.model = std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx";
  c.mesh = "tp=2";
  c.batch = 4;
  c.seq = 16;
  c.sp = true;
  int64_t fp32_gathered = 0, bf16_gathered = 0;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    c.spec.precision = p;
    auto plan = BuildPlan(c);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const RankPlan& r0 = plan->ranks[0];
    const graph::Graph& g = *r0.artifacts.training;
    int low = 0, wide = 0;
    for (const auto& n : g.nodes()) {
      if (n->op_type() != "AllGather") continue;
      const graph::Value* x = n->input(0);
      if (x->dtype() == DataType::kBFloat16) ++low;
      if (x->dtype() != DataType::kFloat32) continue;
      ++wide;
      for (const auto& [reader, slot] : n->output(0)->consumers())
        EXPECT_FALSE(p == Precision::kBf16 && reader->op_type() == "Cast") << n->name() << " gathers fp32 to narrow it";
    }
    if (p == Precision::kBf16) {
      EXPECT_GE(low, 20);
      EXPECT_LE(wide, 1) << "the loss's scores";
    } else {
      EXPECT_EQ(low, 0);
    }
    int64_t& gathered = p == Precision::kBf16 ? bf16_gathered : fp32_gathered;
    for (const auto& [part, rec] : r0.collectives)
      if (part == "training" && rec.kind == "AllGather") gathered += rec.bytes;
  }
  // Every gather but the scores' halves.
  EXPECT_LT(bf16_gathered, fp32_gathered * 6 / 10) << fp32_gathered << " -> " << bf16_gathered;
  EXPECT_GT(bf16_gathered, fp32_gathered * 4 / 10);
}

// The CPU's bf16 attention and its gradient compute in float32 from the bf16 values: they
// equal the float32 kernels on those values, to bf16's rounding of the results.
TEST(MixedPrecision, Bf16AttentionMatchesFloat32OnTheSameValues) {
  const std::string text = R"(
    input q: T[2,3,8,16]
    input k: T[2,3,8,16]
    input v: T[2,3,8,16]
    input dy: T[2,3,8,16]
    y, lse = ai.cleave.Attention(q, k, v) {scale = 0.25, causal = 1}
    dq, dk, dv = ai.cleave.AttentionGrad(dy, q, k, v, y, lse) {scale = 0.25, causal = 1}
    output y
    output dq
    output dk
    output dv
  )";
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  Feeds f32, bf16;
  for (const char* name : {"q", "k", "v", "dy"}) {
    Tensor a(DataType::kFloat32, {2, 3, 8, 16}), b(DataType::kBFloat16, {2, 3, 8, 16});
    for (int64_t i = 0; i < a.numel(); ++i) {
      b.data<uint16_t>()[i] = FloatToBFloat16(normal(rng));
      a.data<float>()[i] = BFloat16ToFloat(b.data<uint16_t>()[i]);
    }
    f32.emplace_back(name, std::move(a));
    bf16.emplace_back(name, std::move(b));
  }
  auto run = [&](const char* type, const Feeds& feeds) {
    std::string t = text;
    for (size_t at; (at = t.find("T[")) != std::string::npos;) t.replace(at, 1, type);
    auto g = graph::ParseGraph(t);
    EXPECT_TRUE(g.ok()) << g.status();
    auto s = InferenceSession::FromGraph(std::move(*g));
    EXPECT_TRUE(s.ok()) << s.status();
    auto out = (*s)->Run(feeds);
    EXPECT_TRUE(out.ok()) << out.status();
    return std::move(*out);
  };
  const std::vector<Tensor> want = run("float32", f32), got = run("bfloat16", bf16);
  ASSERT_EQ(got.size(), 4u);
  for (size_t o = 0; o < got.size(); ++o) {
    ASSERT_EQ(got[o].dtype(), DataType::kBFloat16);
    // dq, dk, dv read the bf16-rounded y: a difference of bf16's rounding, propagated.
    const double tol = o == 0 ? 4e-3 : 3e-2;
    for (int64_t i = 0; i < got[o].numel(); ++i) {
      const double w = want[o].data<float>()[i], x = BFloat16ToFloat(got[o].data<uint16_t>()[i]);
      ASSERT_NEAR(x, w, tol * (1 + std::abs(w))) << "output " << o << " at " << i;
    }
  }
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::trainer {
namespace {

// fp16's dynamic loss scaling: an overflowing step leaves parameters and state untouched and
// halves the scale; clean steps update, and a window of them doubles it.
TEST(MixedPrecision, Fp16LossScalingSkipsOverflowingStepsAndGrows) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/train_variants/llama/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  TrainingSpec spec;
  spec.dims = {{"batch", 2}, {"seq", 16}};
  spec.precision = Precision::kFp16;
  auto a = BuildTrainingArtifacts(**model, spec);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->training->FindValue(kLossScale), nullptr);
  const std::string p0 = a->params[0];
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1,
                                                   .initial_loss_scale = 1e12f,
                                                   .loss_scale_growth_interval = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  TrainingSession& t = **s;
  ASSERT_TRUE(t.loss_scaling());
  const Feeds batch = testing::TokenBatch(16, 64);
  const Tensor before = *t.GetState(p0);
  int skipped = 0;
  while (true) {
    ASSERT_TRUE(t.TrainStep(batch).ok());
    const double scale = t.loss_scale();
    auto norm = t.OptimizerStep();
    ASSERT_TRUE(norm.ok()) << norm.status();
    if (!t.last_step_skipped()) {
      EXPECT_TRUE(std::isfinite(*norm));
      break;
    }
    ++skipped;
    EXPECT_TRUE(std::isinf(*norm));
    EXPECT_EQ(t.loss_scale(), scale / 2);
    EXPECT_EQ(testing::CompareTensors(*t.GetState(p0), before, 0, 0), "") << "a skipped step changed " << p0;
    ASSERT_LT(skipped, 40);
  }
  EXPECT_GT(skipped, 0);
  EXPECT_NE(testing::CompareTensors(*t.GetState(p0), before, 0, 0), "");  // the clean step updated
  const double scale = t.loss_scale();
  ASSERT_TRUE(t.TrainStep(batch).ok());
  ASSERT_TRUE(t.OptimizerStep().ok());
  EXPECT_FALSE(t.last_step_skipped());
  EXPECT_EQ(t.loss_scale(), 2 * scale);  // two clean steps in a row: the window of 2
}

}  // namespace
}  // namespace cleave::trainer
