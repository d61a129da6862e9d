// CUDA provider tests (label gpu): cuDNN's availability, the kernel table over the tiny GPT's
// graphs, the stream profile, placement and fallback, out-of-memory, the caching arena in steady
// state, and the tiny GPT's training on CUDA against the CPU's (the kernels one by one are in
// cuda_kernels_test.cc). Without a usable device (or driver) each test skips and says why.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "providers/cuda/cuda_provider.h"
#include "providers/cuda/cudnn_attention.h"
#include "runtime/inference_session.h"
#include "runtime/profiler.h"
#include "tests/cuda_test_util.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "tests/scoped_temp_dir.h"
#include "tests/variant_goldens.h"
#include "trainer/mixed_precision.h"
#include "trainer/train_loop.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

using namespace cuda_testing;

// Needs no device: without a driver, cuDNN's attention is refused with the reason, not a crash;
// with one, it is there or the reason says why not.
TEST(CudnnAttention, CreateSaysWhyNot) {
  std::string why;
  auto attention = providers::CudnnAttention::Create(nullptr, &why);
  if (!providers::CudaDeviceCount().ok()) {
    EXPECT_EQ(attention, nullptr);
    EXPECT_NE(why, "");
  } else {
    EXPECT_TRUE(attention != nullptr || !why.empty());
  }
  // What the fused engines are asked for at all.
  providers::SdpaShape s{DataType::kBFloat16, 8, 128, 128, 64, 64, 0.125f, true};
  EXPECT_TRUE(providers::CudnnAttention::Eligible(s));
  s.dtype = DataType::kFloat32;
  EXPECT_FALSE(providers::CudnnAttention::Eligible(s));
  s.dtype = DataType::kFloat16;
  s.Dv = 32;
  EXPECT_FALSE(providers::CudnnAttention::Eligible(s));
  s.Dv = s.D = 100;
  EXPECT_FALSE(providers::CudnnAttention::Eligible(s));
}

// Needs no device: the kernel table covers every node of the training, eval and optimizer graphs
// (as the session optimises them) of the tiny GPT and of the sample architectures
// (models/train_variants: an untied GPT; LLaMA, whose RMSNorm backward expands its mean's
// gradient and whose rotary attention slices; BERT, whose attention mask is cast from int64 and
// whose pooler gathers token 0 along the sequence axis and runs a Gemm), fp32 and bf16, with and
// without fused attention, AdamW and SGD, so none falls back.
TEST(CudaKernelTable, ClaimsEveryNodeOfTheSampleModelsGraphs) {
  auto table = providers::CudaExecutionProvider::ForCapabilityQueries();
  auto check = [&](const std::string& model_dir, trainer::TrainingSpec spec, const std::string& what) {
    SCOPED_TRACE(model_dir + " " + what);
    auto a = testing::BuildArtifacts(model_dir, 2, 16, spec);
    for (graph::Graph* g : {a.training.get(), a.eval.get(), a.optimizer.get()}) {
      // The graph as a session runs it: loaded through a CPU session (folding, fusions).
      auto s = InferenceSession::FromGraph(g->Clone());
      ASSERT_TRUE(s.ok()) << s.status();
      // ... plus the fusions device sessions run (residual norm, the cross-entropy gradient
      // from the scores; multi-tensor AdamW in the optimizer graph).
      auto fused = (*s)->graph().Clone();
      graph::SkipLayerNormFusion skip_norm;
      graph::SoftmaxCrossEntropyFusion cross_entropy;
      graph::MultiTensorFusion multi;
      ASSERT_TRUE(graph::RunPass(skip_norm, fused.get()).ok());
      ASSERT_TRUE(graph::RunPass(cross_entropy, fused.get()).ok());
      ASSERT_TRUE(graph::RunPass(multi, fused.get()).ok());
      providers::Capability cap = table->GetCapability(*fused);
      std::string rejected;
      for (const auto& r : cap.rejected) rejected += r.reason + "\n";
      EXPECT_EQ(rejected, "") << g->info().graph_name;
      EXPECT_EQ(cap.claimed.size(), fused->nodes().size());
      // The fused optimizer graph is the smallest: one MultiTensorAdamW that also forms the norm.
      EXPECT_GE(cap.claimed.size(), 1u);
    }
  };
  for (const char* precision : {"fp32", "bf16", "fp32 fused attention", "bf16 fused attention", "fp32 sgd"}) {
    trainer::TrainingSpec spec;
    spec.optimizer.max_grad_norm = 1.0f;
    if (std::string(precision).find("sgd") != std::string::npos) {
      spec.optimizer.kind = trainer::OptimizerConfig::Kind::kSgd;
      spec.optimizer.momentum = 0.9f;
    }
    spec.precision = *trainer::ParsePrecision(std::string(precision).substr(0, 4));
    spec.fuse_attention = std::string(precision).find("fused") != std::string::npos;
    check("tiny_gpt", spec, precision);
    if (spec.optimizer.kind == trainer::OptimizerConfig::Kind::kSgd) continue;
    for (const char* variant : {"gpt_untied", "llama", "bert_mse", "bert_cls"}) {
      trainer::TrainingSpec variant_spec = testing::LoadVariantGolden(testing::SourceDir(), variant).spec;
      variant_spec.precision = spec.precision;
      variant_spec.fuse_attention = spec.fuse_attention;
      check(std::string("train_variants/") + variant, variant_spec, precision);
    }
  }
  // The inference exports of models/variants, as a session loads them (dynamic batch and
  // sequence: the shape arithmetic stays in the graph). Shape has no CUDA kernel: it runs on the
  // host, reading only the dims of its input where it is.
  for (const char* variant : {"gpt_opset14", "gpt_opset17", "bert_opset15", "llama_opset18"}) {
    SCOPED_TRACE(variant);
    auto s = InferenceSession::Load(testing::SourceDir() + "/models/variants/" + variant + "/model.onnx");
    ASSERT_TRUE(s.ok()) << s.status();
    providers::Capability cap = table->GetCapability((*s)->graph());
    std::string rejected;
    int shapes = 0;
    for (const auto& r : cap.rejected) {
      if (r.node->op_type() == "Shape") ++shapes;
      else rejected += r.reason + "\n";
    }
    EXPECT_EQ(rejected, "");
    EXPECT_GT(shapes, 0);
    // Every other node is claimed, the products among them.
    EXPECT_EQ(cap.claimed.size() + shapes, (*s)->graph().nodes().size());
    int products = 0;
    for (const auto& c : cap.claimed) products += absl::StrContains(c.node->op_type(), "MatMul");
    EXPECT_GT(products, 1);
  }
  // And it says no where it has no kernel (float64 Exp and Sqrt; the Cast from float64 it has).
  auto g = graph::ParseGraph(
      "input x: float64[4,4]\nt = Exp(x)\nu = Sqrt(t)\ny = Cast(u) {to = 1}\nz = Relu(y)\noutput z\n");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  providers::Capability cap = table->GetCapability(**g);
  ASSERT_EQ(cap.rejected.size(), 2u);
  EXPECT_EQ(cap.rejected[0].node->op_type(), "Exp");
  EXPECT_NE(cap.rejected[0].reason.find("float64"), std::string::npos) << cap.rejected[0].reason;
  EXPECT_EQ(cap.rejected[1].node->op_type(), "Sqrt");
}

// A profiled run times each device node between two events on the provider's stream: the
// products show on the stream's track with their device time, which the run's wall time bounds.
TEST(CudaProvider, ProfiledRunTimesNodesOnTheStream) {
  REQUIRE_CUDA();
  SessionOptions o;
  o.device = DeviceChoice::kCuda;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input a: float32[1024,1024]
    input b: float32[1024,1024]
    m = MatMul(a, b)
    p = MatMul(m, b)
    y = Relu(p)
    output y
  )"), o);
  ASSERT_TRUE(s.ok()) << s.status();
  const Feeds feeds = {{"a", Random({1024, 1024}, 1)}, {"b", Random({1024, 1024}, 2)}};
  ASSERT_TRUE((*s)->Run(feeds).ok());  // warm: cuBLASLt's plans, the arena
  runtime::Profiler profiler("test");
  RunOptions options;
  options.profiler = &profiler;
  options.profile_track = profiler.Track("compute");
  std::vector<Tensor> outs = {Tensor(DataType::kFloat32, {1024, 1024})};
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*s)->RunInto(feeds, outs, options).ok());
  const double wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  const auto tracks = profiler.tracks();
  const auto it = std::find(tracks.begin(), tracks.end(), "CUDAExecutionProvider stream");
  ASSERT_NE(it, tracks.end()) << absl::StrJoin(tracks, ", ");
  int products = 0;
  double device_us = 0;
  for (const auto& e : profiler.events()) {
    if (e.track != it - tracks.begin()) continue;
    device_us += static_cast<double>(e.duration_us);
    if (e.category == "MatMul") {
      ++products;
      EXPECT_GT(e.duration_us, 0) << e.name << ": 2 GFLOP take more than a microsecond";
    }
  }
  EXPECT_EQ(products, 2);
  EXPECT_LE(device_us, wall_us);
  std::printf("profiled run: %.0f us on the stream of %.0f us wall\n", device_us, wall_us);
}

// Every node of the tiny GPT's training graph (as optimised) has a CUDA kernel.
TEST(CudaProvider, TinyGptTrainingGraphRunsWhollyOnCuda) {
  REQUIRE_CUDA();
  auto a = testing::BuildArtifacts("tiny_gpt", 2, 16, trainer::TrainingSpec{});
  SessionOptions o;
  o.device = DeviceChoice::kCuda;
  auto s = InferenceSession::FromGraph(a.training->Clone(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->warning(), "");
  EXPECT_EQ((*s)->placement().count("CPUExecutionProvider"), 0u);
}

// GPT-2's 50257-class head under bf16, which a CUDA session pads to 50304 classes (ClassPadding:
// rows of the scores and their gradient 16-byte aligned for cuBLASLt; the weight gradient's
// product forms only the real classes' rows): the loss and both gradient products against the
// CPU's unpadded graph, with labels at both ends of the
// vocabulary, and nothing falls back.
TEST(CudaProvider, PaddedVocabularyHeadMatchesTheCpu) {
  REQUIRE_CUDA();
  const char* text = R"(
    opset 17
    input hf: float32[12,64]
    input wf: float32[50257,64]
    input t: int64[12]
    init dy: float32[] = 1
    h = Cast(hf) {to = 16}
    w = Cast(wf) {to = 16}
    y = ai.cleave.MatMulBf16(h, w) {transB = 1}
    ds, loss = ai.cleave.SoftmaxCrossEntropyLossGrad(dy, y, t) {from_scores = 1, to = 16}
    dh = ai.cleave.MatMulBf16(ds, w)
    dw = ai.cleave.MatMulBf16(ds, h) {transA = 1}
    output loss
    output dh
    output dw
  )";
  Tensor labels = Ids({12}, 50257, 60);
  labels.data<int64_t>()[0] = 50256;
  labels.data<int64_t>()[1] = 0;
  const Feeds feeds = {{"hf", Random({12, 64}, 61, -0.5f, 0.5f)}, {"wf", Random({50257, 64}, 62, -0.5f, 0.5f)},
                       {"t", labels}};
  SessionOptions cpu_opts, cuda_opts;
  cpu_opts.optimize = false;
  cuda_opts.device = DeviceChoice::kCuda;
  // The CUDA session's scores are bf16 (LowPrecisionScores); the CPU's reference rounds them
  // so too.
  const std::string rounded = absl::StrReplaceAll(
      text, {{"y = ai.cleave.MatMulBf16(h, w) {transB = 1}",
              "y16 = ai.cleave.MatMulBf16(h, w) {transB = 1, to = 16}\n    y = Cast(y16) {to = 1}"}});
  ASSERT_NE(rounded, text);
  auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(rounded), cpu_opts);
  auto cuda = InferenceSession::FromGraph(*graph::ParseGraph(text), cuda_opts);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ((*cuda)->warning(), "") << "fell back";
  const graph::Node* dw = (*cuda)->graph().FindValue("dw")->producer();
  if (dw && dw->op_type() == "MemcpyToHost") dw = dw->input(0)->producer();  // the device value's
  ASSERT_TRUE(dw);
  EXPECT_EQ(dw->op_type(), "MatMulBf16") << "dW written by its product, never copied";
  EXPECT_EQ(dw->AttrInt("rows", -1), 50257) << "the padded rows left out";
  EXPECT_EQ(dw->input(0)->shape()[1].value, 50304) << "read from the padded gradient";
  EXPECT_EQ((*cuda)->graph().FindValue("y")->shape()[1].value, 50304);
  EXPECT_EQ((*cuda)->graph().FindValue("y")->dtype(), DataType::kBFloat16);
  auto want = (*cpu)->Run(feeds);
  auto got = (*cuda)->Run(feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  // The bf16 scores and gradient may round differently by an ulp where the two products or
  // log-sum-exps differ in the last bit; the gradient products sum those.
  EXPECT_EQ(testing::CompareTensors((*got)[0], (*want)[0], 1e-6, 1e-4), "") << "loss";
  EXPECT_EQ(testing::CompareTensors((*got)[1], (*want)[1], 1e-4, 2e-2), "") << "dh";
  EXPECT_EQ(testing::CompareTensors((*got)[2], (*want)[2], 1e-4, 2e-2), "") << "dw";
}

TEST(CudaProvider, OpsWithoutAKernelFallBackWithAWarning) {
  REQUIRE_CUDA();
  auto s = CudaSession(R"(
    input x: float64[4,8]
    t = Exp(x)
    a = Abs(t)
    c = Cast(a) {to = 1}
    y = Relu(c)
    output y
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE((*s)->warning().find("2 node(s) have no CUDAExecutionProvider kernel and run on CPUExecutionProvider"),
            std::string::npos)
      << (*s)->warning();
  EXPECT_NE((*s)->warning().find("Abs, Exp"), std::string::npos) << (*s)->warning();
  // Each op's reason follows, from its first node: here the dtype the kernels do not take.
  EXPECT_NE((*s)->warning().find("has dtype float64; the kernel takes"), std::string::npos) << (*s)->warning();
  Tensor x(DataType::kFloat64, {4, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = 0.25 * static_cast<double>(i % 7) - 0.5;
  auto r = (*s)->Run({{"x", x}});
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_FLOAT_EQ((*r)[0].data<float>()[i], static_cast<float>(std::exp(x.data<double>()[i])));
}

// The exports of models/variants on CUDA against their PyTorch outputs, in both data sets (the
// second a batch and sequence the export never traced): nothing falls back; the shape arithmetic
// runs on the host by design.
TEST(CudaProvider, VariantExportsMatchPyTorch) {
  REQUIRE_CUDA();
  for (const char* variant : {"gpt_opset14", "gpt_opset17", "bert_opset15", "llama_opset18"}) {
    SCOPED_TRACE(variant);
    const std::string dir = testing::SourceDir() + "/models/variants/" + variant;
    SessionOptions o;
    o.device = DeviceChoice::kCuda;
    auto s = InferenceSession::Load(dir + "/model.onnx", o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->warning(), "");
    for (const char* set : {"/test_data_set_0/", "/test_data_set_1/"}) {
      SCOPED_TRACE(set);
      Feeds feeds;
      for (size_t k = 0; k < (*s)->inputs().size(); ++k) {
        auto t = onnx_ext::LoadTensorFile(dir + set + "input_" + std::to_string(k) + ".pb");
        ASSERT_TRUE(t.ok()) << t.status();
        feeds.emplace_back((*s)->inputs()[k].name, t->second);
      }
      auto got = (*s)->Run(feeds);
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t k = 0; k < got->size(); ++k) {
        auto want = onnx_ext::LoadTensorFile(dir + set + "output_" + std::to_string(k) + ".pb");
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(testing::CompareTensors((*got)[k], want->second, 1e-5, 1e-3), "") << "output " << k;
      }
    }
  }
}

TEST(CudaProvider, OutOfDeviceMemoryIsAnErrorWithTheBytes) {
  REQUIRE_CUDA();
  auto p = providers::CudaExecutionProvider::Create(0, {.memory_limit_bytes = size_t{96} << 20});
  ASSERT_TRUE(p.ok()) << p.status();
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra;
  extra.push_back(std::move(*p));
  SessionOptions o;
  o.optimize = false;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input x: float32[4096,4096]
    y = Relu(x)
    z = Tanh(y)
    output z
  )"),
                                       o, std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Run({{"x", Random({4096, 4096}, 44)}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("out of memory on cuda:0: requested 67108864 bytes"),
            std::string::npos)
      << r.status();
}

TEST(CudaProvider, SteadyStateRunsTakeNoNewDeviceMemory) {
  REQUIRE_CUDA();
  auto p = providers::CudaExecutionProvider::Create(0);
  ASSERT_TRUE(p.ok()) << p.status();
  auto* cuda = static_cast<providers::CudaExecutionProvider*>(p->get());
  std::vector<std::shared_ptr<providers::ExecutionProvider>> extra;
  extra.push_back(std::move(*p));
  SessionOptions o;
  o.optimize = false;
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(R"(
    input x: float32[64,256]
    init w: float32[256,256] = fill 0.01
    h = MatMul(x, w)
    g = ai.cleave.Gelu(h)
    y = Softmax(g) {axis = -1}
    output y
  )"),
                                       o, std::move(extra));
  ASSERT_TRUE(s.ok()) << s.status();
  const Feeds feeds = {{"x", Random({64, 256}, 45)}};
  ASSERT_TRUE((*s)->Run(feeds).ok());
  const int64_t regions = cuda->arena().stats().device_allocations;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*s)->Run(feeds).ok());
  EXPECT_EQ(cuda->arena().stats().device_allocations, regions);
}

// The tiny GPT trained 20 AdamW steps on CUDA follows the CPU trajectory: fp32 within 1e-4
// relative per step (unfused, and with fused attention on CUDA), bf16 within 2%. And with its
// GELUs in the tanh form (GPT-2's), whose bf16 forward and backward the products' epilogues form
// (GeluEpilogueFusion), bf16 within 2% of the CPU's fp32 tanh-form trajectory.
TEST(CudaProvider, TinyGptTrainingTrajectoryMatchesTheCpu) {
  REQUIRE_CUDA();
  Tensor ids = Ids({4, 32}, 256, 46), labels = Ids({4, 32}, 256, 47);
  const Feeds feeds = {{"input_ids", ids}, {"labels", labels}};
  auto trajectory = [&](DeviceChoice device, bool fused, const char* precision, bool tanh_gelu = false) {
    trainer::TrainingSpec spec;
    spec.optimizer.max_grad_norm = 1.0f;
    spec.optimizer.weight_decay = 0.1f;
    spec.fuse_attention = fused;
    spec.precision = *trainer::ParsePrecision(precision);
    auto a = testing::BuildArtifacts("tiny_gpt", 4, 32, spec);
    int gelus = 0;
    if (tanh_gelu)
      for (const auto& n : a.training->nodes())
        if (n->domain() == graph::kCleaveDomain && (n->op_type() == "Gelu" || n->op_type() == "GeluGrad")) {
          n->SetAttr("approximate", graph::Attribute::String("tanh"));
          ++gelus;
        }
    EXPECT_EQ(gelus, tanh_gelu ? 4 : 0) << "a Gelu and a GeluGrad per layer";
    trainer::TrainingSessionOptions o;
    o.device = device;
    std::vector<float> loss;
    auto s = trainer::TrainingSession::Create(std::move(a), o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return loss;
    EXPECT_EQ((*s)->warnings(), "") << precision;
    if (tanh_gelu && device == DeviceChoice::kCuda && std::string(precision) == "bf16") {
      int left = 0, forward = 0, backward = 0;
      for (const auto& n : (*s)->training_graph()->nodes()) {
        left += n->op_type() == "Gelu" || n->op_type() == "GeluGrad";
        forward += n->AttrString("activation", "") == "gelu_tanh";
        backward += n->AttrString("activation_grad", "") == "gelu_tanh";
      }
      EXPECT_EQ(left, 0) << "every GELU in an epilogue";
      EXPECT_EQ(forward, 2);
      EXPECT_EQ(backward, 2);
    }
    for (int step = 0; step < 20; ++step) {
      auto l = (*s)->TrainStep(feeds);
      EXPECT_TRUE(l.ok()) << l.status();
      if (!l.ok()) break;
      EXPECT_TRUE((*s)->OptimizerStep().ok());
      loss.push_back(*l);
    }
    return loss;
  };
  const std::vector<float> cpu = trajectory(DeviceChoice::kCpu, false, "fp32");
  const std::vector<float> cuda = trajectory(DeviceChoice::kCuda, false, "fp32");
  const std::vector<float> fused = trajectory(DeviceChoice::kCuda, true, "fp32");
  const std::vector<float> bf16 = trajectory(DeviceChoice::kCuda, true, "bf16");
  const std::vector<float> cpu_tanh = trajectory(DeviceChoice::kCpu, false, "fp32", true);
  const std::vector<float> bf16_tanh = trajectory(DeviceChoice::kCuda, true, "bf16", true);
  ASSERT_EQ(cpu_tanh.size(), 20u);
  ASSERT_EQ(bf16_tanh.size(), 20u);
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(cuda.size(), 20u);
  ASSERT_EQ(fused.size(), 20u);
  ASSERT_EQ(bf16.size(), 20u);
  double worst[4] = {0, 0, 0, 0};
  for (int step = 0; step < 20; ++step) {
    EXPECT_NEAR(bf16_tanh[step], cpu_tanh[step], 2e-2 * cpu_tanh[step]) << "bf16 tanh GELU, step " << step;
    worst[3] = std::max(worst[3], std::abs(bf16_tanh[step] - cpu_tanh[step]) / double{cpu_tanh[step]});
    EXPECT_NEAR(cuda[step], cpu[step], 1e-4 * cpu[step]) << "fp32, step " << step;
    EXPECT_NEAR(fused[step], cpu[step], 1e-4 * cpu[step]) << "fp32 fused attention, step " << step;
    EXPECT_NEAR(bf16[step], cpu[step], 2e-2 * cpu[step]) << "bf16, step " << step;
    const float* runs[3] = {cuda.data(), fused.data(), bf16.data()};
    for (int r = 0; r < 3; ++r) worst[r] = std::max(worst[r], std::abs(runs[r][step] - cpu[step]) / double{cpu[step]});
  }
  EXPECT_LT(cuda.back(), cuda.front());
  EXPECT_NE(cpu_tanh.back(), cpu.back()) << "the tanh form is another model";
  std::printf("largest relative loss difference from the CPU over 20 steps: fp32 %.2e, fp32 fused attention %.2e, "
              "bf16 %.2e (loss %.4f -> %.4f); bf16 with tanh GELUs in the epilogues %.2e\n",
              worst[0], worst[1], worst[2], cpu.front(), cpu.back(), worst[3]);
}

// The sample architectures (models/train_variants: an untied GPT; LLaMA with RMSNorm, SwiGLU and
// rotary attention; BERT under an MSE and a pooled classification loss; a CNN with batch norm,
// max, average and global pooling; an encoder-decoder with group and instance norms, PReLU, a
// transposed convolution and a bilinear Resize) train wholly on CUDA and follow PyTorch's
// 8-step trajectory, as the CPU does (training_test.cc VariantTrajectory): fp32 within 1e-4
// relative, bf16 with fused attention within 2%.
class CudaVariantTrajectory : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaVariantTrajectory, FollowsPyTorchWhollyOnCuda) {
  REQUIRE_CUDA();
  const testing::VariantGolden golden = testing::LoadVariantGolden(testing::SourceDir(), GetParam());
  ASSERT_EQ(golden.losses.size(), 8u);
  auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const bool fp32 = std::string(precision) == "fp32";
    trainer::TrainingSpec spec = golden.spec;
    spec.precision = *trainer::ParsePrecision(precision);
    spec.fuse_attention = !fp32;
    auto a = trainer::BuildTrainingArtifacts(**model, spec);
    ASSERT_TRUE(a.ok()) << a.status();
    const Feeds feeds = testing::InOrder(golden.feeds, a->data_inputs);
    trainer::TrainingSessionOptions o;
    o.device = DeviceChoice::kCuda;
    auto s = trainer::TrainingSession::Create(std::move(*a), o);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->warnings(), "") << "nothing may fall back";
    (*s)->RegisterScheduler({trainer::LrSchedule::Kind::kCosine, 2e-3, 2e-4, 2, 8});
    const double tolerance = fp32 ? 1e-4 : 2e-2;
    double worst = 0;
    for (int step = 0; step < 8; ++step) {
      (*s)->LazyResetGrad();
      auto loss = (*s)->TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      auto norm = (*s)->OptimizerStep();
      ASSERT_TRUE(norm.ok()) << norm.status();
      const double want = golden.losses[step];
      EXPECT_NEAR(*loss, want, tolerance * want) << "step " << step;
      if (fp32) {
        EXPECT_NEAR(*norm, golden.norms[step], 1e-4 * golden.norms[step]) << "step " << step;
      }
      worst = std::max(worst, std::abs(*loss - want) / want);
    }
    std::printf("%s %s on CUDA: largest relative loss difference from PyTorch over 8 steps %.2e\n", GetParam(),
                precision, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaVariantTrajectory,
                         ::testing::Values("gpt_untied", "llama", "bert_mse", "bert_cls", "cnn", "decoder"));

// `cleave train --device auto` in bf16 where a device is present fuses attention, as
// `--device cuda` does: the default is taken once the device is known. The run uses the one
// provider it made, and trains on it.
TEST(TrainLoop, DeviceAutoOnAGpuFusesAttentionInBf16) {
  REQUIRE_CUDA();
  const testing::ScopedTempDir tmp("cuda_train_auto");
  trainer::TrainConfig c;
  c.model = testing::SourceDir() + "/models/tiny_gpt/model.onnx";
  c.data = testing::SourceDir() + "/models/tiny_gpt/corpus.txt";
  c.batch = 2;
  c.seq = 32;
  c.steps = 2;
  c.plot = "none";
  c.precision = trainer::Precision::kBf16;
  c.device = DeviceChoice::kCudaIfAvailable;
  c.artifacts_dir = tmp.path();
  std::ostringstream log;
  auto r = trainer::RunTraining(c, log);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(r->losses.back()));
  auto g = onnx_ext::LoadModel(tmp.path() + "/training_model.onnx");
  ASSERT_TRUE(g.ok()) << g.status();
  int fused = 0, unfused = 0;
  for (const auto& n : (*g)->nodes()) {
    fused += n->op_type() == "AttentionGrad";
    unfused += n->op_type() == "SoftmaxGrad";
  }
  EXPECT_EQ(fused, 2) << "one AttentionGrad per layer of the tiny GPT";
  EXPECT_EQ(unfused, 0);
  EXPECT_NE(log.str().find("step"), std::string::npos) << log.str();
}

#ifdef CLEAVE_CUDA_EMULATED_DEVICE
// Copies to the device, and within it, return without waiting for it (a step's token ids do not
// wait for the step before), and a host source may be reused at once: each goes through a
// page-locked buffer that is not taken again before the device has read it. The provider's
// stream lags here, so a buffer taken back too early is read overwritten. (The emulated device
// counts the waits.)
TEST(CudaProvider, CopiesToTheDeviceDoNotWaitAndKeepTheirData) {
  cuda_emu::SetNewStreamLag(std::chrono::milliseconds(5));
  auto made = providers::CudaExecutionProvider::Create(0);
  cuda_emu::SetNewStreamLag(std::chrono::microseconds(0));
  ASSERT_TRUE(made.ok()) << made.status();
  providers::ExecutionProvider& p = **made;
  constexpr int kCopies = 10, kN = 1024;
  const int64_t dims[1] = {kN};
  std::vector<void*> device;
  for (int c = 0; c < kCopies; ++c) device.push_back(p.allocator()->Allocate(kN * sizeof(float)));
  std::vector<float> host(kN);
  std::vector<int64_t> waits_after;
  cuda_emu::ThisThreadCalls() = {};
  for (int c = 0; c < kCopies; ++c) {
    for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(c * kN + i);  // the source, reused
    TensorView dst(device[c], DataType::kFloat32, dims);
    ASSERT_TRUE(p.CopyTensor(TensorView(host.data(), DataType::kFloat32, dims), dst).ok());
    waits_after.push_back(cuda_emu::ThisThreadCalls().waits());
  }
  // The first copies, one per buffer, waited for nothing; later ones wait for their buffer.
  EXPECT_EQ(waits_after[3], 0) << "copies to the device waited for the device";
  // A copy within the device's memory is ordered by the stream alone: it waits for nothing.
  cuda_emu::ThisThreadCalls() = {};
  TensorView second(device[1], DataType::kFloat32, dims);
  ASSERT_TRUE(p.CopyTensor(TensorView(device[0], DataType::kFloat32, dims), second).ok());
  EXPECT_EQ(cuda_emu::ThisThreadCalls().waits(), 0) << "a copy on the device waited for the device";
  for (int c = 0; c < kCopies; ++c) {
    std::vector<float> back(kN, -1.f);
    TensorView dst(back.data(), DataType::kFloat32, dims);
    ASSERT_TRUE(p.CopyTensor(TensorView(device[c], DataType::kFloat32, dims), dst).ok());
    const int from = c == 1 ? 0 : c;  // the second buffer holds the first's copy
    for (int i = 0; i < kN; ++i) ASSERT_EQ(back[i], static_cast<float>(from * kN + i)) << "copy " << c << " [" << i << "]";
  }
  for (void* d : device) p.allocator()->Free(d);
}

// A steady-state training step on CUDA queues its work and waits for the device only to read
// back what it returns: TrainStep the loss, OptimizerStep the gradient norm and, with fp16 loss
// scaling, the one flag that says the gradients are finite (not the gradients themselves). No
// cudaMalloc and no other synchronisation, so the host runs ahead of a GPU, as it must to keep
// it busy.
TEST(CudaProvider, SteadyTrainingStepsWaitOnlyForWhatTheyReturn) {
  Tensor ids = Ids({4, 32}, 256, 46), labels = Ids({4, 32}, 256, 47);
  const Feeds feeds = {{"input_ids", ids}, {"labels", labels}};
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    trainer::TrainingSpec spec;
    spec.optimizer.max_grad_norm = 1.0f;
    spec.fuse_attention = true;
    spec.precision = *trainer::ParsePrecision(precision);
    trainer::TrainingSessionOptions o;
    o.device = DeviceChoice::kCuda;
    auto s = trainer::TrainingSession::Create(testing::BuildArtifacts("tiny_gpt", 4, 32, spec), o);
    ASSERT_TRUE(s.ok()) << s.status();
    const bool fp16 = std::string(precision) == "fp16";
    for (int step = 0; step < 4; ++step) {
      cuda_emu::HostCalls& calls = cuda_emu::ThisThreadCalls();
      calls = {};
      (*s)->LazyResetGrad();
      ASSERT_TRUE((*s)->TrainStep(feeds).ok());
      const cuda_emu::HostCalls train = calls;
      calls = {};
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      const cuda_emu::HostCalls update = calls;
      if (step < 2) continue;  // the first steps make the arena's regions
      for (int part = 0; part < 2; ++part) {
        const cuda_emu::HostCalls& c = part == 0 ? train : update;
        SCOPED_TRACE(part == 0 ? "TrainStep" : "OptimizerStep");
        EXPECT_GT(c.launches, 0);
        EXPECT_EQ(c.mallocs, 0);
        EXPECT_EQ(c.copies_to_host, part == 1 && fp16 ? 2 : 1);
        EXPECT_EQ(c.stream_syncs, c.copies_to_host);  // each read's own
        EXPECT_EQ(c.event_syncs + c.device_syncs + c.frees, 0);
      }
    }
  }
}
#endif

}  // namespace
}  // namespace cleave
