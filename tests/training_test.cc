// Single-rank training (the optimizer kernels, Philox and the LR schedules are in
// optimizer_kernels_test.cc): the training artifacts' layout, gradient accumulation, the
// 20-step AdamW trajectory PyTorch recorded for the tiny GPT (models/tiny_gpt/train_golden),
// bit-exact resume, and every bad-input path the trainer promises to report (checkpoints that
// are truncated, corrupt or from another model, data that is too short or outside the vocab, a
// non-finite loss).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "onnx_ext/onnx_io.h"
#include "tests/fusion_test_util.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "tests/scoped_temp_dir.h"
#include "tests/variant_goldens.h"
#include "trainer/autodiff.h"
#include "trainer/checkpoint.h"
#include "trainer/train_loop.h"
#include "trainer/training_session.h"

namespace cleave::trainer {
namespace {

namespace fs = std::filesystem;

std::string Src(const std::string& rel) { return std::string(CLEAVE_SOURCE_DIR) + "/" + rel; }

Tensor LoadPb(const std::string& path) {
  auto t = onnx_ext::LoadTensorFile(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->second : Tensor();
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

using testing::JsonNumbers;

// ---- artifacts and session -----------------------------------------------------------------

TrainingSpec TinySpec(int64_t batch = 2, int64_t seq = 64) {
  TrainingSpec spec;
  spec.dims = {{"batch", batch}, {"seq", seq}};
  spec.optimizer.weight_decay = 0.1f;
  spec.optimizer.max_grad_norm = 1.0f;
  return spec;
}

std::unique_ptr<graph::Graph> TinyModel() {
  auto g = onnx_ext::LoadModel(Src("models/tiny_gpt/model.onnx"));
  EXPECT_TRUE(g.ok()) << g.status();
  return std::move(*g);
}

TEST(TrainingArtifacts, FollowOrtLayoutAndRoleMetadataAndPassTheOnnxChecker) {
  auto a = BuildTrainingArtifacts(*TinyModel(), TinySpec());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->params.size(), 28u);
  EXPECT_EQ(a->state_suffixes, (std::vector<std::string>{".exp_avg", ".exp_avg_sq"}));
  const auto& in = a->training->inputs();
  ASSERT_EQ(in.size(), 2 + 28 * 2 + 1u);
  EXPECT_EQ(in[0]->name(), "input_ids");
  EXPECT_EQ(in[1]->name(), "labels");
  EXPECT_EQ(in[2]->name(), a->params[0]);
  EXPECT_EQ(in[30]->name(), a->params[0] + "_grad.accumulation.buffer");
  EXPECT_EQ(in.back()->name(), "lazy_reset_grad");
  EXPECT_EQ(a->training->outputs()[0]->name(), "loss");
  EXPECT_EQ(a->training->outputs()[1]->name(), a->params[0] + "_grad.accumulation.out");
  EXPECT_EQ(a->eval->outputs()[0]->name(), "loss");
  EXPECT_EQ(a->eval->outputs()[1]->name(), "logits");
  for (const auto& n : a->training->nodes()) {
    const auto& md = n->metadata();
    ASSERT_TRUE(md.count("role")) << n->Describe();
    EXPECT_TRUE(md.at("role") == "fwd" || md.at("role") == "bwd") << n->Describe();
    if (md.at("role") == "bwd") {
      EXPECT_TRUE(md.count("grad_of")) << n->Describe();
    }
  }
  int updates = 0;
  for (const auto& n : a->optimizer->nodes()) {
    EXPECT_EQ(n->metadata().at("role"), "opt");
    if (n->op_type() == "AdamW") {
      ++updates;
      EXPECT_TRUE(n->metadata().count("param"));
    }
  }
  EXPECT_EQ(updates, 28);
  const testing::ScopedTempDir tmp("training_test_artifacts");
  const std::string& dir = tmp.path();
  ASSERT_TRUE(SaveArtifacts(*a, dir).ok());
  for (const char* f : {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"}) {
    auto g = onnx_ext::LoadModel(dir + "/" + f);
    ASSERT_TRUE(g.ok()) << f << ": " << g.status();
    EXPECT_TRUE(onnx_ext::CheckModel(**g).ok()) << f << ": " << onnx_ext::CheckModel(**g);
  }
}

// An MLP layer whose GELU and LayerNorm are spelled out in small ops, as exports before
// opset 17 (LayerNorm) and 20 (Gelu) write them; `loss_lines` are appended before the output.
std::string DecomposedGeluLayerNorm(const std::string& loss_lines, const std::string& out) {
  std::string w;
  for (int i = 0; i < 64; ++i) {
    w += ' ';
    w += std::to_string(((i * 37) % 17 - 8) / 16.0);
  }
  return "opset 13\ninput x: float32[4,8]\ninit w: float32[8,8] =" + w + R"(
    init gamma: float32[8] = 1 2 3 4 5 6 7 8
    init beta: float32[8] = 0.5 -0.5 0.25 -0.25 0 0.125 1 -1
    init sqrt2: float32[] = 1.4142135
    init one: float32[] = 1
    init half: float32[] = 0.5
    init two: float32[] = 2
    init eps: float32[] = 1e-5
    h = MatMul(x, w)
    dv = Div(h, sqrt2)
    er = Erf(dv)
    ad = Add(er, one)
    mu = Mul(h, ad)
    gl = Mul(mu, half)
    mean = ReduceMean(gl) {axes = [-1]}
    d = Sub(gl, mean)
    sq = Pow(d, two)
    var = ReduceMean(sq) {axes = [-1]}
    ve = Add(var, eps)
    sd = Sqrt(ve)
    n = Div(d, sd)
    g = Mul(n, gamma)
    y = Add(g, beta)
  )" + loss_lines + "\noutput " + out + "\n";
}

// The builder fuses them before autodiff: the backward runs GeluGrad and
// LayerNormalizationGrad, gamma and beta stay parameters, every node has a role, and the
// gradients equal those of differentiating the small ops one by one.
TEST(TrainingArtifacts, DecomposedGeluAndLayerNormTrainThroughFusedGradOps) {
  TrainingSpec spec;
  spec.loss.kind = LossKind::kMse;
  auto a = BuildTrainingArtifacts(**graph::ParseGraph(DecomposedGeluLayerNorm("", "y")), spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->params, (std::vector<std::string>{"beta", "gamma", "w"}));
  std::set<std::string> ops;
  for (const auto& n : a->training->nodes()) {
    ops.insert(n->domain() + "." + n->op_type());
    ASSERT_TRUE(n->metadata().count("role")) << n->Describe();
  }
  for (const char* op : {"ai.cleave.Gelu", "ai.cleave.LayerNormalization", "ai.cleave.GeluGrad",
                         "ai.cleave.LayerNormalizationGrad"})
    EXPECT_TRUE(ops.count(op)) << op;
  for (const char* op : {".Erf", ".Sqrt", ".Pow"}) EXPECT_FALSE(ops.count(op)) << op;

  // The reference: the same graph and loss, differentiated op by op without fusion.
  auto ref = *graph::ParseGraph(DecomposedGeluLayerNorm(
      "input labels: float32[4,8]\ndf = Sub(y, labels)\nsq2 = Mul(df, df)\nloss = ReduceMean(sq2) {keepdims = 0}",
      "loss"));
  ASSERT_TRUE(graph::InferShapes(*ref).ok());
  std::vector<graph::Value*> wrt;
  for (const std::string& p : a->params) wrt.push_back(ref->FindValue(p));
  auto grads = BuildBackward(*ref, ref->FindValue("loss"), wrt);
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<graph::Value*> outs;
  for (const std::string& p : a->params) outs.push_back(grads->at(p));
  ref->SetOutputs(outs);
  SessionOptions plain;
  plain.optimize = false;
  auto ref_session = InferenceSession::FromGraph(std::move(ref), plain);
  ASSERT_TRUE(ref_session.ok()) << ref_session.status();
  Tensor x(DataType::kFloat32, {4, 8}), labels(DataType::kFloat32, {4, 8});
  for (int i = 0; i < 32; ++i) {
    x.data<float>()[i] = 0.3f * static_cast<float>(i % 9) - 1.1f;
    labels.data<float>()[i] = 0.05f * static_cast<float>(i % 5);
  }
  const Feeds feeds = {{"x", x}, {"labels", labels}};
  auto want = (*ref_session)->Run(feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->TrainStep(feeds).ok());
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& p = (*s)->parameter_names()[i];
    EXPECT_EQ(testing::CompareTensors(*(*s)->GetGradient(p), (*want)[i], 1e-6, 1e-4), "") << p;
  }
}

TEST(TrainingArtifacts, FrozenParametersStayInitializers) {
  TrainingSpec spec = TinySpec();
  spec.frozen = {"wpe.weight", "blocks\\.1\\..*"};
  auto a = BuildTrainingArtifacts(*TinyModel(), spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->params.size(), 28u - 1 - 12);
  for (const std::string& p : a->params) EXPECT_TRUE(p != "wpe.weight" && p.rfind("blocks.1.", 0) != 0) << p;
  // Frozen weights are constants: they fold with everything computed from them alone (the
  // position embedding of a fixed sequence length becomes one folded tensor).
  for (const graph::Value* v : a->training->inputs()) EXPECT_NE(v->name(), "wpe.weight");
  const graph::Value* frozen = a->training->FindValue("blocks.1.mlp.fc.bias");
  ASSERT_NE(frozen, nullptr);
  EXPECT_TRUE(frozen->is_initializer());
  spec.frozen = {"("};
  EXPECT_FALSE(BuildTrainingArtifacts(*TinyModel(), spec).ok());
}

TEST(TrainingArtifacts, MissingLossOutputAndLabelClashAreReported) {
  TrainingSpec spec = TinySpec();
  spec.loss.output = "logitz";
  auto a = BuildTrainingArtifacts(*TinyModel(), spec);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("'logitz' is not an output"), std::string::npos) << a.status();
  EXPECT_NE(a.status().message().find("logits"), std::string::npos) << a.status();
  spec = TinySpec();
  spec.loss.labels = "input_ids";
  a = BuildTrainingArtifacts(*TinyModel(), spec);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("already has a value named 'input_ids'"), std::string::npos) << a.status();
  spec = TinySpec();
  spec.loss.kind = LossKind::kModelOutput;  // logits are not a scalar loss
  a = BuildTrainingArtifacts(*TinyModel(), spec);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("expected a float32 scalar"), std::string::npos) << a.status();
}

std::unique_ptr<TrainingSession> TinySession(TrainingSpec spec = TinySpec()) {
  auto a = BuildTrainingArtifacts(*TinyModel(), spec);
  EXPECT_TRUE(a.ok()) << a.status();
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 2});
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

Feeds GoldenFeeds() {
  return {{"input_ids", LoadPb(Src("models/tiny_gpt/test_data_set_0/input_0.pb"))},
          {"labels", LoadPb(Src("models/tiny_gpt/grad_golden/labels.pb"))}};
}

TEST(TrainingSession, AccumulatesGradientsInPlaceUntilLazyReset) {
  auto s = TinySession();
  const std::string golden = Src("models/tiny_gpt/grad_golden/");
  auto loss = s->TrainStep(GoldenFeeds());
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, *LoadPb(golden + "loss.pb").data<float>(), 1e-5);
  for (const std::string& p : s->parameter_names()) {
    auto g = s->GetGradient(p);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(testing::CompareTensors(*g, LoadPb(golden + p + "_grad.pb"), 1e-6, 1e-4), "") << p;
  }
  ASSERT_TRUE(s->TrainStep(GoldenFeeds()).ok());  // no reset: the buffer holds twice the gradient
  const std::string p0 = s->parameter_names()[0];
  Tensor twice = LoadPb(golden + p0 + "_grad.pb");
  for (int64_t i = 0; i < twice.numel(); ++i) twice.data<float>()[i] *= 2;
  EXPECT_EQ(testing::CompareTensors(*s->GetGradient(p0), twice, 2e-6, 1e-4), "");
  s->LazyResetGrad();
  ASSERT_TRUE(s->TrainStep(GoldenFeeds()).ok());
  EXPECT_EQ(testing::CompareTensors(*s->GetGradient(p0), LoadPb(golden + p0 + "_grad.pb"), 1e-6, 1e-4), "");
  // An optimizer step moves the parameters and counts the step.
  Tensor before = *s->GetState(p0);
  auto norm = s->OptimizerStep();
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_GT(*norm, 0.0f);
  EXPECT_EQ(s->step(), 1);
  EXPECT_NE(testing::CompareTensors(*s->GetState(p0), before, 0, 0), "");
  s->LazyResetGrad();  // no TrainStep since: nothing to apply
  EXPECT_FALSE(s->OptimizerStep().ok());
}

TEST(TrainingSession, NonFiniteLossNamesTheFirstNonFiniteTensor) {
  auto s = TinySession();
  Tensor w = *s->GetState("blocks.0.mlp.fc.weight");
  w.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(s->SetState("blocks.0.mlp.fc.weight", w).ok());
  auto loss = s->TrainStep(GoldenFeeds());
  ASSERT_TRUE(loss.ok());
  EXPECT_TRUE(std::isnan(*loss));
  auto where = s->FirstNonFinite(GoldenFeeds());
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(*where, "input 'blocks.0.mlp.fc.weight' holds nan at flat index 5");
}

TEST(TrainingSession, CheckpointRoundTripAndEveryBrokenCheckpointIsRefusedWithoutChanges) {
  const testing::ScopedTempDir tmp("training_test_ckpt");
  const std::string& dir = tmp.path();
  auto s = TinySession();
  ASSERT_TRUE(s->TrainStep(GoldenFeeds()).ok());
  ASSERT_TRUE(s->OptimizerStep().ok());
  const std::string path = dir + "/a.ckpt";
  ASSERT_TRUE(s->SaveCheckpoint(path, {{"data.next_step", "1"}}).ok());
  const std::string good = ReadFile(path);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_TRUE(ListCheckpoints(dir).empty());  // not a step_*.ckpt name

  auto fresh = TinySession();
  auto props = fresh->LoadCheckpoint(path);
  ASSERT_TRUE(props.ok()) << props.status();
  EXPECT_EQ(props->at("data.next_step"), "1");
  EXPECT_EQ(fresh->step(), 1);
  for (const std::string& p : s->parameter_names()) {
    EXPECT_EQ(testing::CompareTensors(*fresh->GetState(p), *s->GetState(p), 0, 0), "") << p;
    EXPECT_EQ(testing::CompareTensors(*fresh->GetState(p + ".exp_avg_sq"), *s->GetState(p + ".exp_avg_sq"), 0, 0), "");
  }

  auto other = TinySession();
  const Tensor untouched = *other->GetState("wte.weight");
  auto expect_refused = [&](const std::string& file, const std::string& needle) {
    auto r = other->LoadCheckpoint(file);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status();
    EXPECT_EQ(testing::CompareTensors(*other->GetState("wte.weight"), untouched, 0, 0), "");
    EXPECT_EQ(other->step(), 0);
  };
  WriteFile(dir + "/truncated.ckpt", good.substr(0, good.size() / 2));
  expect_refused(dir + "/truncated.ckpt", "truncated");
  std::string flipped = good;
  flipped[flipped.size() / 3] ^= 0x40;
  WriteFile(dir + "/corrupt.ckpt", flipped);
  expect_refused(dir + "/corrupt.ckpt", "checksum mismatch");
  expect_refused(dir + "/missing.ckpt", "cannot open");
  WriteFile(dir + "/garbage.ckpt", std::string(100, 'x'));
  expect_refused(dir + "/garbage.ckpt", "not a cleave checkpoint");
  // A checkpoint of a different model: the same architecture with one block frozen has
  // fewer parameters and no optimizer state for them.
  TrainingSpec spec = TinySpec();
  spec.frozen = {"blocks\\.1\\..*"};
  auto smaller = TinySession(spec);
  ASSERT_TRUE(smaller->SaveCheckpoint(dir + "/smaller.ckpt").ok());
  expect_refused(dir + "/smaller.ckpt", "does not belong to this model");
  auto r = other->LoadCheckpoint(dir + "/smaller.ckpt");
  EXPECT_NE(r.status().message().find("missing 'blocks.1.attn.qkv.weight'"), std::string::npos) << r.status();
  // The good file was never touched by any of this.
  EXPECT_EQ(ReadFile(path), good);
}

TEST(TrainingSession, ExportedModelRunsWithTheTrainedWeights) {
  const testing::ScopedTempDir tmp("training_test_export");
  const std::string& dir = tmp.path();
  auto s = TinySession();
  ASSERT_TRUE(s->TrainStep(GoldenFeeds()).ok());
  ASSERT_TRUE(s->OptimizerStep().ok());
  ASSERT_TRUE(s->ExportModelForInferencing(dir + "/m.onnx").ok());
  auto g = onnx_ext::LoadModel(dir + "/m.onnx");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->inputs()[0]->shape().ToString(), "[batch,seq]");  // dynamic dims kept
  const std::string p = "blocks.0.mlp.fc.weight";
  EXPECT_EQ(testing::CompareTensors(*(*g)->FindValue(p)->initializer(), *s->GetState(p), 0, 0), "");
}

// Architectures the trainer was not written against (models/train_variants): an untied GPT,
// LLaMA (RMSNorm, SwiGLU, rotary), and a BERT encoder under MSE and classification losses.
// Each trains 8 AdamW steps on one batch and must follow PyTorch's trajectory.
// Trains the golden run's 8 AdamW steps (cosine schedule 2e-3 -> 2e-4, 2 warmup) on its
// batch and expects each step's loss and gradient norm within 1e-4 of PyTorch's.
void FollowGolden(TrainingSession& s, const Feeds& ordered, const testing::VariantGolden& golden) {
  s.RegisterScheduler({LrSchedule::Kind::kCosine, 2e-3, 2e-4, 2, 8});
  ASSERT_EQ(golden.losses.size(), 8u);
  for (int step = 0; step < 8; ++step) {
    s.LazyResetGrad();
    auto loss = s.TrainStep(ordered);
    ASSERT_TRUE(loss.ok()) << loss.status();
    auto norm = s.OptimizerStep();
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_NEAR(*loss, golden.losses[step], 1e-4 * golden.losses[step]) << "step " << step;
    EXPECT_NEAR(*norm, golden.norms[step], 1e-4 * golden.norms[step]) << "step " << step;
  }
}

class VariantTrajectory : public ::testing::TestWithParam<const char*> {};

TEST_P(VariantTrajectory, FollowsPyTorch) {
  const testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, GetParam());
  const std::string& dir = golden.dir;
  const std::vector<std::string>& unreached = golden.unreached;
  auto model = onnx_ext::LoadModel(dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  auto a = BuildTrainingArtifacts(**model, golden.spec);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->unreached, unreached);  // both sorted by name
  const Feeds ordered = testing::InOrder(golden.feeds, a->data_inputs);
  ASSERT_EQ(ordered.size(), golden.feeds.size());
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  FollowGolden(**s, ordered, golden);
  if (HasFatalFailure()) return;
  int checked = 0;
  for (const auto& e : fs::directory_iterator(dir + "golden/params")) {
    auto want = onnx_ext::LoadTensorFile(e.path().string());
    ASSERT_TRUE(want.ok());
    Tensor got;
    if (std::find(unreached.begin(), unreached.end(), want->first) != unreached.end()) {
      got = *(*model)->FindValue(want->first)->initializer();  // untouched, as in PyTorch
    } else {
      auto state = (*s)->GetState(want->first);
      ASSERT_TRUE(state.ok()) << state.status();
      got = *state;
    }
    EXPECT_EQ(testing::CompareTensors(got, want->second, 1e-4, 0), "") << want->first;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>((*s)->parameter_names().size() + unreached.size()));
  // The batch norms' running statistics after the 8 steps (the variance in ONNX's form, moved
  // toward each batch's biased variance; models/train_variants/README.md).
  if (!fs::exists(dir + "golden/buffers")) return;
  int buffers = 0;
  for (const auto& e : fs::directory_iterator(dir + "golden/buffers")) {
    auto want = onnx_ext::LoadTensorFile(e.path().string());
    ASSERT_TRUE(want.ok());
    auto got = (*s)->GetState(want->first);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(testing::CompareTensors(*got, want->second, 1e-5, 1e-5), "") << want->first;
    ++buffers;
  }
  EXPECT_GT(buffers, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, VariantTrajectory,
                         ::testing::Values("gpt_untied", "gpt_deep", "llama", "bert_mse", "bert_cls", "cnn",
                                           "decoder"));

// Training-mode BatchNormalization (models/train_variants/cnn): its running statistics are
// buffers, not parameters; each TrainStep moves them, evaluation normalises by them (so an
// image's eval loss does not depend on the rest of its batch), and checkpoints and the exported
// model carry them.
TEST(TrainingSession, BatchNormRunningStatisticsAreBuffers) {
  const testing::ScopedTempDir tmp("training_test_bn");
  const std::string& dir = tmp.path();
  const testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, "cnn");
  auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  auto a = BuildTrainingArtifacts(**model, golden.spec);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::string> buffers = {"bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                                            "bn2.running_var"};
  EXPECT_EQ(a->buffers, buffers);
  for (const std::string& b : buffers) {
    EXPECT_EQ(std::count(a->params.begin(), a->params.end(), b), 0) << b;
    ASSERT_NE(a->training->FindValue(b), nullptr);
    EXPECT_TRUE(a->training->FindValue(b)->is_graph_input()) << b;
    EXPECT_TRUE(a->eval->FindValue(b)->is_graph_input()) << b;
  }
  const auto& outs = a->training->outputs();
  ASSERT_GE(outs.size(), buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i)
    EXPECT_EQ(outs[outs.size() - buffers.size() + i]->name(), Updated(buffers[i]));
  for (const auto& n : a->eval->nodes()) {
    if (n->op_type() == "BatchNormalization") {
      EXPECT_EQ(n->AttrInt("training_mode", 1), 0) << n->Describe();
    }
  }
  // The artifacts, with their ai.cleave pool and BatchNormalization gradients, pass ONNX's checker.
  ASSERT_TRUE(SaveArtifacts(*a, dir + "/artifacts").ok());
  for (const char* f : {"training_model.onnx", "eval_model.onnx"}) {
    auto g = onnx_ext::LoadModel(dir + "/artifacts/" + f);
    ASSERT_TRUE(g.ok()) << f << ": " << g.status();
    EXPECT_TRUE(onnx_ext::CheckModel(**g).ok()) << f << ": " << onnx_ext::CheckModel(**g);
  }
  int pool_grads = 0;
  for (const auto& n : a->training->nodes())
    pool_grads += n->op_type() == "MaxPoolGrad" || n->op_type() == "AveragePoolGrad" ||
                  n->op_type() == "BatchNormalizationGrad";
  EXPECT_EQ(pool_grads, 5);  // MaxPool, AveragePool, GlobalAveragePool, two BatchNormalizations

  const Feeds feeds = testing::InOrder(golden.feeds, a->data_inputs);
  auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  const Tensor mean0 = *(*s)->GetState("bn1.running_mean");
  ASSERT_TRUE((*s)->TrainStep(feeds).ok());
  ASSERT_TRUE((*s)->OptimizerStep().ok());
  // bn1 normalises the first Conv's output; its running mean moved by a tenth of the way.
  EXPECT_NE(testing::CompareTensors(*(*s)->GetState("bn1.running_mean"), mean0, 1e-6, 0), "");

  // Eval: the mean of the two images' own losses is the pair's (each image's loss taken from a
  // batch of it twice).
  auto image = [&](int64_t i) {
    Feeds f;
    for (const auto& [name, t] : feeds) {
      Tensor twice = t.Clone();
      const size_t row = t.nbytes() / 2;
      std::memcpy(static_cast<char*>(twice.raw()) + (1 - i) * row, static_cast<const char*>(t.raw()) + i * row, row);
      f.emplace_back(name, std::move(twice));
    }
    return f;
  };
  auto both = (*s)->EvalStep(feeds), first = (*s)->EvalStep(image(0)), second = (*s)->EvalStep(image(1));
  ASSERT_TRUE(both.ok() && first.ok() && second.ok()) << both.status() << first.status() << second.status();
  EXPECT_NEAR(*both, (*first + *second) / 2, 1e-5);

  // A checkpoint restores the statistics; the exported model holds them.
  ASSERT_TRUE((*s)->SaveCheckpoint(dir + "/bn.ckpt").ok());
  const Tensor saved = *(*s)->GetState("bn2.running_var");
  ASSERT_TRUE((*s)->TrainStep(feeds).ok());
  EXPECT_NE(testing::CompareTensors(*(*s)->GetState("bn2.running_var"), saved, 1e-7, 0), "");
  ASSERT_TRUE((*s)->LoadCheckpoint(dir + "/bn.ckpt").ok());
  EXPECT_EQ(testing::CompareTensors(*(*s)->GetState("bn2.running_var"), saved, 0, 0), "");
  ASSERT_TRUE((*s)->ExportModelForInferencing(dir + "/bn.onnx").ok());
  auto exported = onnx_ext::LoadModel(dir + "/bn.onnx");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(testing::CompareTensors(*(*exported)->FindValue("bn2.running_var")->initializer(), saved, 0, 0), "");
}

// Training-mode Dropout draws its masks from (seed, step, micro-batch, node): the same seed
// reproduces a run, another seed changes it, and the eval graph runs Dropout as the identity.
TEST(TrainingSession, DropoutIsSeededPerStepAndOffInEval) {
  const char* text = R"(
    input x: float32[4,8]
    init w: float32[8,8] = fill 0.25
    init p: float32[] = 0.5
    init t: bool[] = 1
    h = MatMul(x, w)
    y, m = Dropout(h, p, t)
    output y
  )";
  auto make = [&](uint64_t seed) {
    auto g = graph::ParseGraph(text);
    EXPECT_TRUE(g.ok()) << g.status();
    TrainingSpec spec;
    spec.loss.kind = LossKind::kMse;
    auto a = BuildTrainingArtifacts(**g, spec);
    EXPECT_TRUE(a.ok()) << a.status();
    auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1, .seed = seed});
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  };
  Tensor x(DataType::kFloat32, {4, 8}), labels(DataType::kFloat32, {4, 8});
  for (int i = 0; i < 32; ++i) x.data<float>()[i] = 0.1f * (i % 7) - 0.2f;
  const Feeds feeds = {{"x", x}, {"labels", labels}};
  auto losses = [&](uint64_t seed) {
    auto s = make(seed);
    std::vector<float> out;
    for (int step = 0; step < 3; ++step) {
      s->LazyResetGrad();
      out.push_back(*s->TrainStep(feeds));
      EXPECT_TRUE(s->OptimizerStep().ok());
    }
    return out;
  };
  EXPECT_EQ(losses(1), losses(1));
  EXPECT_NE(losses(1), losses(2));
  // Eval: no dropout, so the loss is mean((x w)^2) with w = 0.25 everywhere.
  double want = 0;
  for (int r = 0; r < 4; ++r) {
    double row = 0;
    for (int k = 0; k < 8; ++k) row += 0.25 * x.data<float>()[r * 8 + k];
    want += 8 * row * row;
  }
  auto s = make(1);
  auto eval = s->EvalStep(feeds);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(*eval, want / 32, 1e-6);
  auto train = s->TrainStep(feeds);
  ASSERT_TRUE(train.ok());
  EXPECT_NE(*train, *eval);  // half of the products were dropped, the rest doubled
}

// ---- the training loop ---------------------------------------------------------------------

TrainConfig GoldenConfig() {
  TrainConfig c;
  c.model = Src("models/tiny_gpt/model.onnx");
  c.data = Src("models/tiny_gpt/corpus.txt");
  c.batch = 4;
  c.seq = 64;
  c.steps = 20;
  c.lr = 1e-3;
  c.min_lr = 1e-4;
  c.warmup = 5;
  c.schedule = LrSchedule::Kind::kCosine;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.max_grad_norm = 1.0f;
  c.shuffle = false;
  c.val_fraction = 0;
  c.threads = 2;
  c.plot = "none";
  return c;
}

TEST(TrainLoop, ReproducesThePyTorchAdamWTrajectoryOfTheTinyGpt) {
  const std::string golden = Src("models/tiny_gpt/train_golden/");
  const std::string traj = ReadFile(golden + "trajectory.json");
  const std::vector<double> losses = JsonNumbers(traj, "loss"), norms = JsonNumbers(traj, "grad_norm");
  ASSERT_EQ(losses.size(), 20u);
  const testing::ScopedTempDir tmp("training_test_golden");
  const std::string& dir = tmp.path();
  TrainConfig c = GoldenConfig();
  c.save_model = dir + "/trained.onnx";
  std::ostringstream log;
  auto r = RunTraining(c, log);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->losses.size(), 20u);
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(r->losses[s], losses[s], 1e-4 * losses[s]) << "step " << s;
    EXPECT_NEAR(r->grad_norms[s], norms[s], 1e-4 * norms[s]) << "step " << s;
  }
  auto g = onnx_ext::LoadModel(c.save_model);
  ASSERT_TRUE(g.ok());
  int checked = 0;
  for (const auto& e : fs::directory_iterator(golden)) {
    if (e.path().extension() != ".pb") continue;
    auto want = onnx_ext::LoadTensorFile(e.path().string());
    ASSERT_TRUE(want.ok());
    const graph::Value* v = (*g)->FindValue(want->first);
    ASSERT_TRUE(v && v->initializer()) << want->first;
    EXPECT_EQ(testing::CompareTensors(*v->initializer(), want->second, 1e-4, 0), "") << want->first;
    ++checked;
  }
  EXPECT_EQ(checked, 28);
  EXPECT_NE(log.str().find("step 20/20 | loss "), std::string::npos) << log.str();
}

Checkpoint ReadOk(const std::string& path) {
  auto c = ReadCheckpoint(path);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : Checkpoint();
}

TEST(TrainLoop, ResumeIsBitExact) {
  TrainConfig c = GoldenConfig();
  c.steps = 6;
  c.shuffle = true;
  c.seed = 7;
  c.grad_accum = 2;
  c.val_fraction = 0.2;
  c.checkpoint_every = 2;
  std::ostringstream log;
  const testing::ScopedTempDir straight_dir("training_test_straight");
  c.checkpoint_dir = straight_dir.path();
  auto straight = RunTraining(c, log);
  ASSERT_TRUE(straight.ok()) << straight.status();
  EXPECT_EQ(ListCheckpoints(c.checkpoint_dir).size(), 3u);  // steps 2, 4, 6 (keep 3)

  TrainConfig first = c;
  const testing::ScopedTempDir split_dir("training_test_split");
  first.checkpoint_dir = split_dir.path();
  first.exit_at = 3;
  auto a = RunTraining(first, log);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->losses.size(), 3u);
  TrainConfig second = first;
  second.exit_at = 0;
  second.resume = true;
  auto b = RunTraining(second, log);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->first_step, 3);
  ASSERT_EQ(b->losses.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(a->losses[s], straight->losses[s]) << s;
    EXPECT_EQ(b->losses[s], straight->losses[s + 3]) << s + 3;
  }
  EXPECT_EQ(b->val_loss, straight->val_loss);
  Checkpoint x = ReadOk(CheckpointPath(c.checkpoint_dir, 6)), y = ReadOk(CheckpointPath(first.checkpoint_dir, 6));
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (size_t i = 0; i < x.tensors.size(); ++i)
    EXPECT_EQ(testing::CompareTensors(x.tensors[i].second, y.tensors[i].second, 0, 0), "") << x.tensors[i].first;
  // A resume with different run settings is refused.
  TrainConfig changed = second;
  changed.seed = 8;
  auto refused = RunTraining(changed, log);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("seed=7"), std::string::npos) << refused.status();
}

TEST(TrainLoop, GradientAccumulationMatchesTheFullBatch) {
  TrainConfig c = GoldenConfig();
  c.steps = 3;
  c.optimizer.kind = OptimizerConfig::Kind::kSgd;  // linear in the gradient, so the parameters compare closely
  c.optimizer.momentum = 0.9f;
  c.lr = 0.05;
  std::ostringstream log;
  const testing::ScopedTempDir tmp("training_test_accum");
  const std::string& dir = tmp.path();
  c.save_model = dir + "/full.onnx";
  auto full = RunTraining(c, log);
  ASSERT_TRUE(full.ok()) << full.status();
  c.grad_accum = 4;
  c.save_model = dir + "/accum.onnx";
  auto accum = RunTraining(c, log);
  ASSERT_TRUE(accum.ok()) << accum.status();
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(accum->losses[s], full->losses[s], 1e-5 * full->losses[s]);
    EXPECT_NEAR(accum->grad_norms[s], full->grad_norms[s], 1e-4 * full->grad_norms[s]);
  }
  auto g1 = onnx_ext::LoadModel(dir + "/full.onnx"), g2 = onnx_ext::LoadModel(dir + "/accum.onnx");
  ASSERT_TRUE(g1.ok() && g2.ok());
  for (const graph::Value* v : (*g1)->Initializers())
    EXPECT_EQ(testing::CompareTensors(*v->initializer(), *(*g2)->FindValue(v->name())->initializer(), 1e-5, 0), "")
        << v->name();
}

TEST(TrainLoop, BadDataIsReportedWithWhereAndWhat) {
  const testing::ScopedTempDir tmp("training_test_baddata");
  const std::string& dir = tmp.path();
  std::ostringstream log;
  TrainConfig c = GoldenConfig();
  c.steps = 1;
  WriteFile(dir + "/short.txt", "just a few bytes of text");
  c.data = dir + "/short.txt";
  auto r = RunTraining(c, log);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("shorter than one training window of 66 tokens"), std::string::npos)
      << r.status();
  // uint16 tokens: 300 is outside the tiny GPT's 256-token vocabulary.
  std::string bin;
  for (int i = 0; i < 1000; ++i) {
    const uint16_t t = i == 777 ? 300 : static_cast<uint16_t>(i % 200);
    bin.push_back(static_cast<char>(t & 0xff));
    bin.push_back(static_cast<char>(t >> 8));
  }
  WriteFile(dir + "/tokens.bin", bin);
  c.data = dir + "/tokens.bin";
  r = RunTraining(c, log);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 300 at position 777"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("vocabulary of 256"), std::string::npos) << r.status();
  WriteFile(dir + "/odd.bin", "abc");
  c.data = dir + "/odd.bin";
  EXPECT_FALSE(RunTraining(c, log).ok());
  c.data = dir + "/nope.txt";
  r = RunTraining(c, log);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot open data file"), std::string::npos);
  c = GoldenConfig();
  c.grad_accum = 3;  // 4 rows do not split into 3 micro-batches
  EXPECT_FALSE(RunTraining(c, log).ok());
}

TEST(TrainLoop, DivergenceStopsWithTheStepAndTheFirstNonFiniteTensor) {
  const testing::ScopedTempDir tmp("training_test_diverge");
  const std::string& dir = tmp.path();
  TrainConfig c = GoldenConfig();
  c.steps = 5;
  c.optimizer.kind = OptimizerConfig::Kind::kSgd;
  c.optimizer.max_grad_norm = 0;
  c.schedule = LrSchedule::Kind::kConstant;
  c.warmup = 0;
  c.lr = 1e30;  // the first update overflows the weights
  c.checkpoint_dir = dir;
  std::ostringstream log;
  auto r = RunTraining(c, log);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step 2: the loss is"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("first non-finite tensor: '"), std::string::npos) << r.status();
  EXPECT_TRUE(ListCheckpoints(dir).empty()) << r.status();  // nothing diverged was saved
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::trainer {
namespace {

// Recompute changes what the step keeps, never what it computes: the same loss and gradients,
// fewer saved bytes (selective drops the attention scores, full keeps only layer inputs), and
// recomputed nodes run in the backward.
TEST(Recompute, SameStepWithLessSavedActivations) {
  auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/train_variants/llama/model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  const Feeds batch = testing::TokenBatch(16, 64);
  std::vector<int64_t> saved;
  std::vector<float> losses;
  std::vector<std::map<std::string, Tensor>> grads;
  for (RecomputeMode mode : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    TrainingSpec spec;
    spec.dims = {{"batch", 2}, {"seq", 16}};
    spec.recompute = mode;
    auto a = BuildTrainingArtifacts(**model, spec);
    ASSERT_TRUE(a.ok()) << a.status();
    int recomputed = 0;
    for (const auto& n : a->training->nodes()) recomputed += n->metadata().count("recompute") > 0;
    EXPECT_EQ(recomputed > 0, mode != RecomputeMode::kNone);
    saved.push_back(SavedActivationBytes(*a->training));
    std::vector<std::string> params = a->params;
    auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
    ASSERT_TRUE(s.ok()) << s.status();
    auto loss = (*s)->TrainStep(batch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    grads.emplace_back();
    for (const std::string& p : params) grads.back()[p] = *(*s)->GetGradient(p);
  }
  EXPECT_LT(saved[1], saved[0]);
  EXPECT_LT(saved[2], saved[1]);
  for (int m = 1; m < 3; ++m) {
    EXPECT_EQ(losses[m], losses[0]) << "mode " << m;
    for (const auto& [p, g] : grads[0])
      EXPECT_EQ(testing::CompareTensors(grads[m].at(p), g, 1e-7, 1e-6), "") << "mode " << m << " " << p;
  }
  EXPECT_FALSE(ParseRecomputeMode("sometimes").ok());
}

// Fused attention changes how the step computes attention, not what: the tiny GPT's graph (a
// masked_fill mask) and the LLaMA-style one (an added mask, rotary q and k) get one Attention
// and one AttentionGrad per layer, the [T, T] probabilities are no longer
// saved for the backward (at T = 64 they outweigh the head dim of 16), and 5 AdamW steps
// follow the unfused trajectory.
TEST(FusedAttention, TrainsAsUnfused) {
  for (const char* dir : {"tiny_gpt", "train_variants/llama"}) {
    SCOPED_TRACE(dir);
    const int64_t seq = std::string(dir) == "tiny_gpt" ? 64 : 32;  // the LLaMA variant's rotary table has 32 rows
    auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/" + dir + "/model.onnx");
    ASSERT_TRUE(model.ok()) << model.status();
    const Feeds batch = testing::TokenBatch(seq, 64);
    std::vector<float> losses[2];
    int64_t saved[2];
    for (int fused = 0; fused < 2; ++fused) {
      TrainingSpec spec;
      spec.dims = {{"batch", 2}, {"seq", seq}};
      spec.fuse_attention = fused;
      spec.optimizer.max_grad_norm = 1.0f;
      auto a = BuildTrainingArtifacts(**model, spec);
      ASSERT_TRUE(a.ok()) << a.status();
      int attention = 0, attention_grad = 0, softmax = 0;
      for (const auto& n : a->training->nodes()) {
        attention += n->op_type() == "Attention";
        attention_grad += n->op_type() == "AttentionGrad";
        softmax += n->op_type() == "Softmax";
      }
      EXPECT_EQ(attention, fused ? 2 : 0);
      EXPECT_EQ(attention_grad, fused ? 2 : 0);
      EXPECT_EQ(softmax, fused ? 0 : 2);
      saved[fused] = SavedActivationBytes(*a->training);
      auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 1});
      ASSERT_TRUE(s.ok()) << s.status();
      for (int step = 0; step < 5; ++step) {
        auto loss = (*s)->TrainStep(batch);
        ASSERT_TRUE(loss.ok()) << loss.status();
        ASSERT_TRUE((*s)->OptimizerStep().ok());
        losses[fused].push_back(*loss);
      }
    }
    EXPECT_LT(saved[1], saved[0]);
    for (int step = 0; step < 5; ++step)
      EXPECT_NEAR(losses[1][step], losses[0][step], 1e-5 * losses[0][step]) << "step " << step;
    EXPECT_LT(losses[1].back(), losses[1].front());
  }
}

// BERT's padding mask (models/train_variants, row 1 padded) becomes the bias of a fused
// Attention and its AttentionGrad (which forms no scores' gradient for it), and 8 AdamW steps
// still follow PyTorch's trajectory.
TEST(FusedAttention, BertsPaddingMaskIsTheBiasAndFollowsPyTorch) {
  for (const char* variant : {"bert_mse", "bert_cls"}) {
    SCOPED_TRACE(variant);
    testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, variant);
    auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
    ASSERT_TRUE(model.ok()) << model.status();
    golden.spec.fuse_attention = true;
    auto a = BuildTrainingArtifacts(**model, golden.spec);
    ASSERT_TRUE(a.ok()) << a.status();
    int biased = 0, biased_grads = 0, softmax = 0;
    for (const auto& n : a->training->nodes()) {
      biased += n->op_type() == "Attention" && n->num_inputs() == 4 && n->input(3);
      // The mask, computed from the integer mask, needs no gradient: no [T, S] one is formed.
      biased_grads += n->op_type() == "AttentionGrad" && n->num_inputs() == 7 && n->input(6) && n->num_outputs() == 3;
      softmax += n->op_type() == "Softmax";
    }
    EXPECT_EQ(biased, 2);
    EXPECT_EQ(biased_grads, 2);
    EXPECT_EQ(softmax, 0);
    const Feeds ordered = testing::InOrder(golden.feeds, a->data_inputs);
    auto s = TrainingSession::Create(std::move(*a), {.intra_op_threads = 2});
    ASSERT_TRUE(s.ok()) << s.status();
    FollowGolden(**s, ordered, golden);
    if (HasFatalFailure()) return;
  }
}

// A learned bias (a parameter, [H, T, S] like T5's relative position bias) gets its gradient
// through AttentionGrad's scores gradient summed over the batch, and the fused step's
// gradients equal the unfused graph's.
TEST(FusedAttention, ALearnedBiasGetsTheUnfusedGradient) {
  constexpr char kText[] = R"(
    input q: float32[2,2,5,4]
    input k: float32[2,2,5,4]
    input v: float32[2,2,5,4]
    init pos: float32[2,5,5] = 0 1 2 3 4 5 6 7 8 9 -1 -2 -3 -4 -5 1 1 1 1 1 0 0 0 0 2 2 1 0 -1 -2 3 3 3 3 3 0 1 0 1 0 -2 -1 0 1 2 1 2 3 2 1
    init half: float32[] = 0.5
    kt = Transpose(k) {perm = [0, 1, 3, 2]}
    s = MatMul(q, kt)
    ss = Mul(s, half)
    a = Add(ss, pos)
    p = Softmax(a) {axis = -1}
    y = MatMul(p, v)
    output y
  )";
  std::map<std::string, Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    auto g = graph::ParseGraph(kText);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(graph::InferShapes(**g).ok());
    if (fused) {
      graph::AttentionFusion fusion;
      ASSERT_TRUE(*graph::RunPass(fusion, g->get()));
    }
    graph::Value* y = (*g)->FindValue("y");
    graph::Value* w = (*g)->AddInitializer("w", graph::Random({2, 2, 5, 4}, 9));
    graph::Value* yw = (*g)->GetOrCreateValue("yw");
    graph::Value* loss = (*g)->GetOrCreateValue("loss");
    (*g)->AddNode("Mul", {y, w}, {yw}, "weigh");
    graph::Node* sum = (*g)->AddNode("ReduceSum", {yw}, {loss}, "sum");
    sum->SetAttr("keepdims", graph::Attribute::Int(0));
    (*g)->SetOutputs({loss});
    ASSERT_TRUE(graph::InferShapes(**g).ok());
    const std::vector<graph::Value*> wrt = {(*g)->FindValue("q"), (*g)->FindValue("pos")};
    auto built = BuildBackward(**g, loss, wrt);
    ASSERT_TRUE(built.ok()) << built.status();
    int dbias = 0;
    for (const auto& n : (*g)->nodes()) dbias += n->op_type() == "AttentionGrad" && n->num_outputs() == 4;
    EXPECT_EQ(dbias, fused ? 1 : 0);
    std::vector<graph::Value*> outs = {loss};
    for (graph::Value* x : wrt) outs.push_back(built->at(x->name()));
    (*g)->SetOutputs(outs);
    SessionOptions plain;
    plain.optimize = false;
    auto s = InferenceSession::FromGraph(std::move(*g), plain);
    ASSERT_TRUE(s.ok()) << s.status();
    auto out = (*s)->Run({{"q", graph::Random({2, 2, 5, 4}, 1)},
                          {"k", graph::Random({2, 2, 5, 4}, 2)},
                          {"v", graph::Random({2, 2, 5, 4}, 3)}});
    ASSERT_TRUE(out.ok()) << out.status();
    grads[fused]["q"] = (*out)[1];
    grads[fused]["pos"] = (*out)[2];
  }
  for (const char* x : {"q", "pos"})
    EXPECT_EQ(testing::CompareTensors(grads[1][x], grads[0][x], 1e-5, 1e-5), "") << x;
}

}  // namespace
}  // namespace cleave::trainer
