// InferenceSession: runs, feed validation, unsupported-op reports, memory-plan reuse,
// shape-arithmetic folding, and the tiny GPT against its PyTorch golden logits.
#include "runtime/inference_session.h"

#include <cmath>
#include <filesystem>

#include "graph/graph.h"
#include "graph/op_table.h"
#include "graph/text_format.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
#include "runtime/executor.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "onnx_ext/onnx_io.h"
#include "tests/op_tester.h"
#include "tests/scoped_temp_dir.h"
#include "tests/test_graphs.h"

namespace cleave {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(Session, RunsMlp) {
  auto s = InferenceSession::FromGraph(testing::MakeMlp());
  ASSERT_TRUE(s.ok()) << s.status();
  // x rows: [1,2,3,4] and [-1,-1,-1,-1]; w = [I3; 1 1 1]; b = [0.5, -10, 0].
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4, -1, -1, -1, -1}, {2, 4});
  auto out = (*s)->Run({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> want = {1 + 4 + 0.5f, 0.f, 3 + 4, 0.f, 0.f, 0.f};
  Tensor expected = Tensor::FromVector<float>(want, {2, 3});
  EXPECT_EQ(testing::CompareTensors((*out)[0], expected, 1e-6, 0), "");
}

// A node that only makes a graph output runs as soon as its inputs are ready (a gradient is
// final early), and each output is reported final right after the step that writes it.
TEST(Session, OutputsAreMadeAndReportedAsEarlyAsTheirInputsAllow) {
  auto g = graph::ParseGraph(R"(
    input x: float32[4]
    a = Exp(x)
    b = Exp(a)
    c = Exp(b)
    early = Neg(a)
    output c
    output early
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  SessionOptions o;
  o.optimize = false;
  auto s = InferenceSession::FromGraph(std::move(*g), o);
  ASSERT_TRUE(s.ok()) << s.status();
  // In insertion order Neg would run last; it runs right after Exp(x).
  EXPECT_EQ((*s)->OutputSteps(), std::vector<int>({3, 1}));
  std::vector<int> reported;
  std::vector<Tensor> outs(2);
  RunOptions run;
  run.output_ready = [&](int i) {
    reported.push_back(i);
    // A reported output is already written.
    if (i == 1) {
      EXPECT_NEAR(outs[1].data<float>()[0], -std::exp(1.0f), 1e-5);
    }
  };
  outs = {Tensor(DataType::kFloat32, {4}), Tensor(DataType::kFloat32, {4})};
  ASSERT_TRUE((*s)->RunInto({{"x", Tensor::FromVector<float>({1, 1, 1, 1}, {4})}}, outs, run).ok());
  EXPECT_EQ(reported, std::vector<int>({1, 0}));
}

TEST(Session, RejectsBadFeedsWithNamesAndShapes) {
  auto s = InferenceSession::FromGraph(testing::MakeMlp());
  ASSERT_TRUE(s.ok());
  auto wrong_dtype = (*s)->Run({{"x", Tensor(DataType::kInt64, {2, 4})}});
  ASSERT_FALSE(wrong_dtype.ok());
  EXPECT_NE(Message(wrong_dtype.status()).find("expected dtype float32, got int64"), std::string::npos);
  auto wrong_dim = (*s)->Run({{"x", Tensor(DataType::kFloat32, {2, 5})}});
  ASSERT_FALSE(wrong_dim.ok());
  EXPECT_NE(Message(wrong_dim.status()).find("dim 1 expected 4, got 5"), std::string::npos)
      << wrong_dim.status();
  auto wrong_rank = (*s)->Run({{"x", Tensor(DataType::kFloat32, {8})}});
  EXPECT_FALSE(wrong_rank.ok());
  auto unknown = (*s)->Run({{"x", Tensor(DataType::kFloat32, {1, 4})}, {"z", Tensor()}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(Message(unknown.status()).find("unknown input 'z'"), std::string::npos);
  auto missing = (*s)->Run({});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(Message(missing.status()).find("'x' was not fed"), std::string::npos);
}

TEST(Session, ListsEveryUnsupportedNodeAtOnce) {
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  auto* x = g->AddInput("x", DataType::kFloat32, Shape::FromDims({2}));
  auto* a = g->GetOrCreateValue("a");
  auto* b = g->GetOrCreateValue("b");
  g->AddNode("Frobnicate", {x}, {a}, "first");
  g->AddNode("DeformConv", {a}, {b}, "second");
  g->AddOutput(b);
  auto s = InferenceSession::FromGraph(std::move(g));
  ASSERT_FALSE(s.ok());
  std::string m = Message(s.status());
  EXPECT_TRUE(absl::IsUnimplemented(s.status()));
  EXPECT_NE(m.find("Frobnicate 'first'"), std::string::npos) << m;
  EXPECT_NE(m.find("DeformConv 'second'"), std::string::npos) << m;
}

// Feeds bind by name, in any order: here 600 inputs (an optimizer graph's four per parameter)
// fed backwards, one of them twice (the last one counts), then one missing and one unknown.
TEST(Session, BindsManyFeedsByNameInAnyOrder) {
  const int n = 600;
  auto name = [](int i) { return absl::StrCat("blocks.", i / 12, ".mlp.fc.weight.exp_avg_", i % 12); };
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  std::vector<graph::Value*> ins;
  for (int i = 0; i < n; ++i) ins.push_back(g->AddInput(name(i), DataType::kFloat32, Shape::FromDims({1})));
  auto* y = g->GetOrCreateValue("y");
  g->AddNode("Concat", ins, {y}, "cat")->SetAttr("axis", graph::Attribute::Int(0));
  g->AddOutput(y);
  auto s = InferenceSession::FromGraph(std::move(g));
  ASSERT_TRUE(s.ok()) << s.status();
  Feeds feeds;
  for (int i = n - 1; i >= 0; --i) feeds.emplace_back(name(i), Tensor::FromVector<float>({float(i)}, {1}));
  feeds.emplace_back(name(7), Tensor::FromVector<float>({-7.f}, {1}));
  std::vector<Tensor> outs = {Tensor(DataType::kFloat32, {n})};
  for (int run = 0; run < 2; ++run) {  // the second binding starts afresh
    ASSERT_TRUE((*s)->RunInto(feeds, outs).ok());
    for (int i = 0; i < n; ++i) ASSERT_EQ(outs[0].data<float>()[i], i == 7 ? -7.f : float(i)) << i;
  }
  Feeds missing(feeds.begin() + 1, feeds.end() - 1);  // without the last input
  auto m = (*s)->RunInto(missing, outs);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(Message(m).find("input '" + name(n - 1) + "' was not fed"), std::string::npos) << m;
  Feeds unknown = feeds;
  unknown.emplace_back("blocks.0.mlp.fc.weight.exp_avg", Tensor::FromVector<float>({0.f}, {1}));
  auto u = (*s)->RunInto(unknown, outs);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(Message(u).find("unknown input 'blocks.0.mlp.fc.weight.exp_avg'"), std::string::npos) << u;
}

TEST(Session, PlansMemoryOncePerShapeAndThenAllocatesNothing) {
  auto s = InferenceSession::FromGraph(testing::MakeMlp());
  ASSERT_TRUE(s.ok());
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4}, {1, 4});
  std::vector<Tensor> outs = {Tensor(DataType::kFloat32, {1, 3})};
  ASSERT_TRUE((*s)->RunInto({{"x", x}}, outs).ok());
  int64_t allocs = (*s)->stats().heap_allocations;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*s)->RunInto({{"x", x}}, outs).ok());
  EXPECT_EQ((*s)->stats().heap_allocations, allocs);
  EXPECT_EQ((*s)->stats().plans, 1);
  EXPECT_FLOAT_EQ(outs[0].data<float>()[0], 5.5f);
  // A new batch size makes a new plan.
  ASSERT_TRUE((*s)->Run({{"x", Tensor(DataType::kFloat32, {3, 4})}}).ok());
  EXPECT_EQ((*s)->stats().plans, 2);
}

// A scatter's base (an accumulated gradient, GatherGrad's input 3) is written where the
// scatter's result lies when that is the caller's output tensor, here the accumulation buffer
// fed as an input too, as a training session binds it: the scatter then adds only its rows.
// The result is the same as through a separate base. Where another step reads, after the
// base is made, an input the caller gave the result's memory, the base gets its own buffer.
TEST(Session, AScattersBaseIsWrittenWhereItsResultLies) {
  const std::string text = R"(
    input buf: float32[10,4]
    input g: float32[10,4]
    input dy: float32[6,4]
    input ids: int64[6]
    init shape: int64[2] = 10 4
    head = Add(buf, g)
    acc = ai.cleave.GatherGrad(shape, ids, dy, head)
    output acc
  )";
  const Tensor ids = Tensor::FromVector<int64_t>({3, 0, 9, 3, 5, 3}, {6});
  std::vector<float> b(40), gv(40), d(24);
  for (int i = 0; i < 40; ++i) b[i] = 0.5f * i, gv[i] = 1.f - 0.25f * i;
  for (int i = 0; i < 24; ++i) d[i] = 0.125f * (i + 1);
  std::vector<float> want(40);
  for (int i = 0; i < 40; ++i) want[i] = b[i] + gv[i];
  for (int j = 0; j < 6; ++j)
    for (int c = 0; c < 4; ++c) want[ids.data<int64_t>()[j] * 4 + c] += d[j * 4 + c];
  const Tensor g = Tensor::FromVector<float>(gv, {10, 4}), dy = Tensor::FromVector<float>(d, {6, 4});
  {
    auto s = InferenceSession::FromGraph(*graph::ParseGraph(text));
    ASSERT_TRUE(s.ok()) << s.status();
    Tensor buf = Tensor::FromVector<float>(b, {10, 4});
    std::vector<Tensor> outs = {buf};  // the same memory as the feed
    ASSERT_TRUE((*s)->RunInto({{"buf", buf}, {"g", g}, {"dy", dy}, {"ids", ids}}, outs).ok());
    EXPECT_EQ(outs[0].raw(), buf.raw());
    for (int i = 0; i < 40; ++i) EXPECT_EQ(buf.data<float>()[i], want[i]) << i;
    EXPECT_EQ((*s)->stats().bases_in_place, 1);
    auto fresh = (*s)->Run({{"buf", Tensor::FromVector<float>(b, {10, 4})}, {"g", g}, {"dy", dy}, {"ids", ids}});
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    for (int i = 0; i < 40; ++i) EXPECT_EQ((*fresh)[0].data<float>()[i], want[i]) << i;
    EXPECT_EQ((*s)->stats().bases_in_place, 2);
  }
  // A step reads `other` after the base is made: where the caller gave `other` the result's
  // memory, the base gets its own buffer (writing it there early would overwrite `other`);
  // elsewhere it is written in place.
  const std::string late = text + R"(
    input other: float32[10,4]
    sum = Add(acc, other)
    output sum
  )";
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(late));
  ASSERT_TRUE(s.ok()) << s.status();
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "other in the result's memory" : "other apart");
    const int64_t before = (*s)->stats().bases_in_place;
    Tensor other(DataType::kFloat32, {10, 4});
    std::vector<Tensor> outs = {shared ? other : Tensor(DataType::kFloat32, {10, 4}), Tensor(DataType::kFloat32, {10, 4})};
    ASSERT_TRUE((*s)->RunInto({{"buf", Tensor::FromVector<float>(b, {10, 4})}, {"g", g}, {"dy", dy}, {"ids", ids},
                               {"other", other}},
                              outs)
                    .ok());
    for (int i = 0; i < 40; ++i) EXPECT_EQ(outs[0].data<float>()[i], want[i]) << i;
    EXPECT_EQ((*s)->stats().bases_in_place - before, shared ? 0 : 1);
  }
}

// Reshape(x, Concat(Gather(Shape(x), 0), [-1])): the exporter idiom for flattening. With
// the batch dim fixed, the shape arithmetic folds away and only Reshape remains.
TEST(Session, FoldsShapeArithmeticOnceShapesAreFixed) {
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  auto* x = g->AddInput("x", DataType::kFloat32, Shape({Dim::Symbol("batch"), Dim(2), Dim(3)}));
  auto* shape = g->GetOrCreateValue("shape");
  auto* idx = g->AddInitializer("zero", Tensor::Scalar<int64_t>(0));
  auto* minus1 = g->AddInitializer("minus1", Tensor::FromVector<int64_t>({-1}, {1}));
  auto* batch = g->GetOrCreateValue("batch");
  auto* batch1 = g->GetOrCreateValue("batch1");
  auto* axes = g->AddInitializer("axes", Tensor::FromVector<int64_t>({0}, {1}));
  auto* target = g->GetOrCreateValue("target");
  auto* y = g->GetOrCreateValue("y");
  g->AddNode("Shape", {x}, {shape}, "shape");
  g->AddNode("Gather", {shape, idx}, {batch}, "gather");
  g->AddNode("Unsqueeze", {batch, axes}, {batch1}, "unsqueeze");
  auto* cat = g->AddNode("Concat", {batch1, minus1}, {target}, "concat");
  cat->SetAttr("axis", graph::Attribute::Int(0));
  g->AddNode("Reshape", {x, target}, {y}, "reshape");
  g->AddOutput(y);
  SessionOptions opts;
  opts.free_dimension_overrides["batch"] = 4;
  auto s = InferenceSession::FromGraph(std::move(g), opts);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->graph().nodes().size(), 1u);
  EXPECT_EQ((*s)->graph().nodes()[0]->op_type(), "Reshape");
  EXPECT_EQ((*s)->graph().outputs()[0]->shape().ToString(), "[4,6]");
  auto out = (*s)->Run({{"x", Tensor(DataType::kFloat32, {4, 2, 3})}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].dims(), (std::vector<int64_t>{4, 6}));
}

std::string ModelsDir() { return std::string(CLEAVE_SOURCE_DIR) + "/models"; }

TEST(TinyGpt, LogitsMatchPyTorchGolden) {
  std::string dir = ModelsDir() + "/tiny_gpt";
  if (!std::filesystem::exists(dir + "/model.onnx")) GTEST_FAIL() << "missing " << dir;
  auto s = InferenceSession::Load(dir + "/model.onnx");
  ASSERT_TRUE(s.ok()) << s.status();
  auto in = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/input_0.pb");
  auto want = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/output_0.pb");
  ASSERT_TRUE(in.ok() && want.ok());
  auto out = (*s)->Run({{(*s)->inputs()[0].name, in->second}});
  ASSERT_TRUE(out.ok()) << out.status();
  const Tensor& got = (*out)[0];
  ASSERT_EQ(got.dims(), want->second.dims());
  double max_err = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    max_err = std::max(max_err, std::fabs(got.DoubleAt(i) - want->second.DoubleAt(i)));
  EXPECT_LT(max_err, 1e-4);
  // The fusions fired: the optimised graph holds fused ops.
  int fused = 0;
  for (const auto& n : (*s)->graph().nodes()) fused += n->domain() == "ai.cleave";
  EXPECT_GT(fused, 0);
}

// With batch and seq fixed, all of the exporter's shape arithmetic in the tiny GPT folds:
// no Shape, ConstantOfShape or Range is left, and the logits are unchanged.
TEST(TinyGpt, ShapeArithmeticFoldsWhenDimsAreFixed) {
  std::string dir = ModelsDir() + "/tiny_gpt";
  SessionOptions fixed;
  fixed.free_dimension_overrides = {{"batch", 2}, {"seq", 64}};
  auto s = InferenceSession::Load(dir + "/model.onnx", fixed);
  auto dynamic = InferenceSession::Load(dir + "/model.onnx");
  ASSERT_TRUE(s.ok() && dynamic.ok()) << s.status();
  size_t dynamic_nodes = (*dynamic)->graph().nodes().size();
  for (const auto& n : (*s)->graph().nodes())
    EXPECT_TRUE(n->op_type() != "Shape" && n->op_type() != "ConstantOfShape" &&
                n->op_type() != "Range")
        << n->Describe() << " was not folded";
  EXPECT_LT((*s)->graph().nodes().size(), dynamic_nodes);
  auto in = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/input_0.pb");
  ASSERT_TRUE(in.ok());
  auto a = (*s)->Run({{"input_ids", in->second}});
  auto b = (*dynamic)->Run({{"input_ids", in->second}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(testing::CompareTensors((*a)[0], (*b)[0], 1e-6, 1e-5), "");
}

// The optimised graph (folded and fused, with ai.cleave ops) saves as a valid ONNX model that
// loads back and computes the same logits.
TEST(TinyGpt, OptimisedGraphSavesAsCheckedOnnx) {
  std::string dir = ModelsDir() + "/tiny_gpt";
  auto original = onnx_ext::LoadModel(dir + "/model.onnx");
  ASSERT_TRUE(original.ok());
  EXPECT_TRUE(onnx_ext::CheckModel(**original).ok());
  auto s = InferenceSession::Load(dir + "/model.onnx");
  ASSERT_TRUE(s.ok());
  absl::Status checked = onnx_ext::CheckModel((*s)->graph());
  EXPECT_TRUE(checked.ok()) << checked;
  const testing::ScopedTempDir tmp("tiny_gpt_optimised");
  const std::string path = tmp.path() + "/model.onnx";
  ASSERT_TRUE(onnx_ext::SaveModel((*s)->graph(), path).ok());
  auto reloaded = InferenceSession::Load(path);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  auto in = onnx_ext::LoadTensorFile(dir + "/test_data_set_0/input_0.pb");
  auto a = (*s)->Run({{"input_ids", in->second}});
  auto b = (*reloaded)->Run({{"input_ids", in->second}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(testing::CompareTensors((*a)[0], (*b)[0], 0, 0), "");
}

// The executor checks every kernel's output dims against shape inference's static dims.
TEST(Executor, ReportsKernelsThatDisagreeWithShapeInference) {
  auto g = testing::MakeMlp();
  ASSERT_TRUE(graph::InferShapes(*g).ok());
  g->FindValue("mm")->set_shape(Shape::FromDims({7, 3}));  // what a broken rule would say
  std::vector<std::shared_ptr<providers::ExecutionProvider>> eps;
  eps.push_back(std::make_unique<providers::CpuExecutionProvider>(1));
  auto ex = runtime::Executor::Create(std::move(g), std::move(eps));
  ASSERT_TRUE(ex.ok()) << ex.status();
  Tensor x(DataType::kFloat32, {2, 4});
  std::vector<Tensor> outs;
  absl::Status s = (*ex)->Run({x.view()}, outs);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(Message(s).find("MatMul 'matmul'"), std::string::npos) << s;
  EXPECT_NE(Message(s).find("the kernel made [2,3] but shape inference gave [7,3]"), std::string::npos) << s;
}

// A run's error names the failing node once, whether or not its kernel's message already did
// (Clip's does, Reshape's does not).
TEST(Executor, NamesTheFailingNodeOnce) {
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  SessionOptions o;
  o.optimize = false;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input x: float32[4]
    input lo: float32[n]
    input shape: int64[2]
    c = Clip(x, lo)
    r = Reshape(x, shape)
    output c
    output r
  )"),
                                       o);
  ASSERT_TRUE(s.ok()) << s.status();
  const Tensor x(DataType::kFloat32, {4});
  auto clip = (*s)->Run({{"x", x}, {"lo", Tensor(DataType::kFloat32, {2})},
                         {"shape", Tensor::FromVector<int64_t>({2, 2}, {2})}});
  ASSERT_FALSE(clip.ok());
  const std::string a(clip.status().message());
  EXPECT_EQ(count(a, "Clip 'c'"), 1) << a;
  EXPECT_NE(a.find("expected one element for min"), std::string::npos) << a;
  auto reshape = (*s)->Run({{"x", x}, {"lo", Tensor(DataType::kFloat32, {1})},
                            {"shape", Tensor::FromVector<int64_t>({3, 3}, {2})}});
  ASSERT_FALSE(reshape.ok());
  const std::string b(reshape.status().message());
  EXPECT_EQ(count(b, "Reshape 'r'"), 1) << b;
}

// An output no host could hold is an error naming the node and the output, not an abort: a
// Range of 2^61 int64s (a byte size past int64) and a Range of 2^58 int64s (2^61 bytes), after
// which the session still runs a feasible one. The constant evaluator (folding, at load)
// reports such outputs the same way.
TEST(Executor, OutputsNoHostCanHoldAreErrorsNamingTheNode) {
  // Constant folding leaves a node whose known output is too large to fold; the run then
  // reports it.
  auto folded = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    init start: int64[] = 0
    init limit: int64[] = 2305843009213693952
    init delta: int64[] = 1
    r = Range(start, limit, delta)
    output r
  )"));
  ASSERT_TRUE(folded.ok()) << folded.status();
  auto too_large = (*folded)->Run({});
  ASSERT_FALSE(too_large.ok());
  const std::string a(too_large.status().message());
  EXPECT_NE(a.find("Range 'r'"), std::string::npos) << a;
  EXPECT_NE(a.find("output 0 'r' of dims [2305843009213693952]: expected non-negative dims whose byte size fits int64"),
            std::string::npos)
      << a;

  SessionOptions plain;
  plain.optimize = false;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input start: int64[]
    input limit: int64[]
    input delta: int64[]
    r = Range(start, limit, delta)
    output r
  )"),
                                       plain);
  ASSERT_TRUE(s.ok()) << s.status();
  auto run = [&](int64_t limit) {
    return (*s)->Run({{"start", Tensor::Scalar<int64_t>(0)}, {"limit", Tensor::Scalar<int64_t>(limit)},
                      {"delta", Tensor::Scalar<int64_t>(1)}});
  };
  auto huge = run(int64_t{1} << 58);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  const std::string b(huge.status().message());
  EXPECT_NE(b.find("Range 'r'"), std::string::npos) << b;
  EXPECT_NE(b.find("output 0 'r' needs 2305843009213693952 bytes: the host allocation failed"), std::string::npos) << b;
  auto small = run(5);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)[0].ToInt64Vector(), (std::vector<int64_t>{0, 1, 2, 3, 4}));

  // The constant evaluator, which folding calls on nodes it can afford (it is given this one).
  auto g = graph::ParseGraph(R"(
    init start: int64[] = 0
    init limit: int64[] = 288230376151711744
    init delta: int64[] = 1
    r = Range(start, limit, delta)
    output r
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  providers::CpuExecutionProvider cpu(1);
  auto evaluated = runtime::EvaluateNode(**g, *(*g)->nodes()[0], cpu);
  ASSERT_FALSE(evaluated.ok());
  EXPECT_EQ(evaluated.status().code(), absl::StatusCode::kResourceExhausted) << evaluated.status();
  const std::string c(evaluated.status().message());
  EXPECT_NE(c.find("Range 'r'"), std::string::npos) << c;
  EXPECT_NE(c.find("output 0 'r' needs 2305843009213693952 bytes: the host allocation failed"), std::string::npos) << c;

  const std::vector<int64_t> overflowing = {int64_t{1} << 40, int64_t{1} << 30};
  EXPECT_EQ(DenseBytes(DataType::kFloat32, overflowing), -1);
  EXPECT_EQ(DenseBytes(DataType::kFloat32, std::vector<int64_t>{3, -1}), -1);
  EXPECT_EQ(DenseBytes(DataType::kFloat32, std::vector<int64_t>{3, 0}), 0);
  EXPECT_EQ(DenseBytes(DataType::kFloat32, std::vector<int64_t>{3, 5}), 60);
  EXPECT_FALSE(Tensor::TryAllocate(DataType::kFloat32, overflowing).defined());
}

// A node the checker must reject: an ai.cleave op with an input too many.
TEST(CleaveSchemas, CheckerRejectsMalformedCleaveOps) {
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  g->opset_imports()["ai.cleave"] = 1;
  auto* x = g->AddInput("x", DataType::kFloat32, Shape::FromDims({2}));
  auto* y = g->GetOrCreateValue("y");
  y->set_dtype(DataType::kFloat32);
  y->set_shape(Shape::FromDims({2}));
  g->AddNode("Gelu", {x, x}, {y}, "gelu", "ai.cleave");
  g->AddOutput(y);
  absl::Status s = onnx_ext::CheckModel(*g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("Gelu"), std::string::npos) << s;
}

}  // namespace
}  // namespace cleave
