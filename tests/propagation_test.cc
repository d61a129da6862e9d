// Sharding propagation: data parallelism over the tiny GPT's training and optimizer graphs,
// and Megatron's tensor parallelism over an MLP block, checked by the shardings every value
// gets and by the collectives the reshards need.
#include <random>
#include <thread>

#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "partition/propagation.h"
#include "tests/partition_test_util.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
#include "runtime/inference_session.h"
#include "runtime/simulated_communicator.h"
#include "partition/lower.h"
#include "tests/op_tester.h"
#include "trainer/autodiff.h"
#include "trainer/training_graph.h"

namespace cleave::partition {
namespace {

trainer::TrainingArtifacts TinyArtifacts() {
  trainer::TrainingSpec spec;
  spec.optimizer.max_grad_norm = 1.0f;
  return testing::BuildArtifacts("tiny_gpt", 4, 64, spec);
}

Sharding Batch(int rank) {
  Sharding s = Sharding::Replicated(rank);
  s.dims[0] = {"dp"};
  return s;
}

TEST(Propagation, DataParallelTrainingGraphNeedsNoCollectiveAndLeavesGradientsPartial) {
  auto a = TinyArtifacts();
  auto mesh = *Mesh::Parse("dp=2");
  auto p = Propagate(*a.training, mesh, {{"input_ids", Batch(2)}, {"labels", Batch(2)}});
  ASSERT_TRUE(p.ok()) << p.status();
  const graph::Graph& g = *a.training;
  EXPECT_EQ(p->sharding.at(g.FindValue("logits")).ToString(), "[dp,-,-]");
  EXPECT_EQ(p->sharding.at(g.FindValue("loss")).ToString(), "[]+avg(dp)");
  for (const std::string& name : a.params) {
    EXPECT_TRUE(p->sharding.at(g.FindValue(name)).IsReplicated()) << name;
    EXPECT_EQ(p->sharding.at(g.FindValue(trainer::AccumulationOut(name))).partial, std::set<std::string>{"dp"})
        << name << " " << p->sharding.at(g.FindValue(trainer::AccumulationOut(name))).ToString();
  }
  const auto reshards = Reshards(g, mesh, *p);
  for (const Reshard& r : reshards)
    ADD_FAILURE() << ReshardName(r.kind) << " of " << r.value->name() << " " << r.from.ToString() << " -> "
                  << r.to.ToString() << " for " << r.node->Describe();
}

TEST(Propagation, DataParallelOptimizerAllReducesEachGradientOnce) {
  auto a = TinyArtifacts();
  auto mesh = *Mesh::Parse("dp=4");
  std::map<std::string, Sharding> seeds;
  int64_t psi = 0;
  for (const std::string& name : a.params) {
    const graph::Value* gv = a.optimizer->FindValue(trainer::GradName(name));
    Sharding s = Sharding::Replicated(gv->shape().rank());
    s.partial = {"dp"};
    seeds[trainer::GradName(name)] = s;
    psi += gv->shape().NumElements();
  }
  auto p = Propagate(*a.optimizer, mesh, seeds);
  ASSERT_TRUE(p.ok()) << p.status();
  std::set<const graph::Value*> reduced;
  int64_t bytes = 0;
  for (const Reshard& r : Reshards(*a.optimizer, mesh, *p)) {
    EXPECT_EQ(r.kind, ReshardKind::kAllReduce) << r.value->name();
    EXPECT_EQ(r.axes, std::vector<std::string>{"dp"});
    if (reduced.insert(r.value).second) bytes += r.bytes;
  }
  EXPECT_EQ(reduced.size(), a.params.size());
  EXPECT_EQ(bytes, psi * 4);  // every fp32 gradient once: Psi elements
}

// A pre-LN transformer MLP block with a residual: y = x + proj(gelu(fc(ln(x)))).
constexpr const char* kMlpBlock = R"(
    input x: float32[4,8,16]
    init ln_w: float32[16] = fill 1
    init ln_b: float32[16] = fill 0
    init w1: float32[16,64] = fill 0.01
    init b1: float32[64] = fill 0
    init w2: float32[64,16] = fill 0.01
    init b2: float32[16] = fill 0
    h = LayerNormalization(x, ln_w, ln_b) {axis = -1}
    u = MatMul(h, w1)
    ub = Add(u, b1)
    a = Gelu(ub)
    d = MatMul(a, w2)
    db = Add(d, b2)
    y = Add(x, db)
)";

// A Megatron MLP: column-parallel fc (the seed), row-parallel proj found by propagation, one
// AllReduce before the bias and residual.
TEST(Propagation, MegatronMlpNeedsOneAllReduce) {
  auto g = graph::ParseGraph(std::string(kMlpBlock) + "output y\nopset 20\n");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  auto mesh = *Mesh::Parse("tp=2");
  Sharding col = Sharding::Replicated(2);
  col.dims[1] = {"tp"};
  auto p = Propagate(**g, mesh, {{"w1", col}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sharding.at((*g)->FindValue("b1")).ToString(), "[tp]");
  EXPECT_EQ(p->sharding.at((*g)->FindValue("a")).ToString(), "[-,-,tp]");
  EXPECT_EQ(p->sharding.at((*g)->FindValue("w2")).ToString(), "[tp,-]");
  EXPECT_EQ(p->sharding.at((*g)->FindValue("d")).ToString(), "[-,-,-]+partial(tp)");
  auto reshards = Reshards(**g, mesh, *p);
  for (const Reshard& r : reshards)
    SCOPED_TRACE(std::string(ReshardName(r.kind)) + " " + r.value->name() + " " + r.from.ToString() + " -> " +
                 r.to.ToString() + " at " + r.node->Describe());
  std::string all;
  for (const Reshard& r : reshards)
    all += std::string(ReshardName(r.kind)) + " " + r.value->name() + " " + r.from.ToString() + " -> " +
           r.to.ToString() + " at " + r.node->Describe() + "\n";
  ASSERT_EQ(reshards.size(), 1u) << all;
  EXPECT_EQ(reshards[0].kind, ReshardKind::kAllReduce);
  EXPECT_EQ(reshards[0].value->name(), "d");
  EXPECT_EQ(reshards[0].bytes, 4 * 8 * 16 * 4);  // b*s*h fp32
}

// The same block with its backward: Megatron's conjugate operator adds exactly one AllReduce
// (the input gradient of the column-parallel layer), and every weight gradient comes out
// sharded like its weight, with no collective.
TEST(Propagation, MegatronMlpBackwardNeedsOneMoreAllReduce) {
  auto g = graph::ParseGraph(std::string(kMlpBlock) + "l = ReduceSum(y) {keepdims = 0}\noutput l\nopset 20\n");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  std::vector<graph::Value*> wrt;
  for (const char* n : {"x", "ln_w", "ln_b", "w1", "b1", "w2", "b2"}) wrt.push_back((*g)->FindValue(n));
  auto grads = trainer::BuildBackward(**g, (*g)->FindValue("l"), wrt);
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<graph::Value*> outs = {(*g)->FindValue("l")};
  for (auto& [name, v] : *grads) outs.push_back(v);
  (*g)->SetOutputs(outs);
  providers::CpuExecutionProvider cpu(1);
  graph::ConstantFolding fold(runtime::MakeConstantEvaluator(**g, cpu),
                              [&](const graph::Value* v) { return std::find(wrt.begin(), wrt.end(), v) != wrt.end(); });
  graph::DeadCodeElimination dce;
  ASSERT_TRUE(graph::RunToFixedPoint({&fold, &dce}, g->get()).ok());
  auto mesh = *Mesh::Parse("tp=2");
  Sharding col = Sharding::Replicated(2);
  col.dims[1] = {"tp"};
  auto p = Propagate(**g, mesh, {{"w1", col}});
  ASSERT_TRUE(p.ok()) << p.status();
  std::string all;
  int all_reduce = 0;
  for (const Reshard& r : Reshards(**g, mesh, *p)) {
    all += std::string(ReshardName(r.kind)) + " " + r.value->name() + " " + r.from.ToString() + " -> " +
           r.to.ToString() + " at " + r.node->Describe() + "\n";
    all_reduce += r.kind == ReshardKind::kAllReduce;
  }
  EXPECT_EQ(all_reduce, 2) << all;
  EXPECT_EQ(p->sharding.at(grads->at("w1")).ToString(), "[-,tp]") << all;
  EXPECT_EQ(p->sharding.at(grads->at("w2")).ToString(), "[tp,-]") << all;
  EXPECT_EQ(p->sharding.at(grads->at("b1")).ToString(), "[tp]") << all;
  EXPECT_TRUE(p->sharding.at(grads->at("ln_w")).IsReplicated()) << all;
}

// A reflect-padded activation of a parameter trained data-parallel: Pad's gradient
// (ai.cleave.PadGrad) keeps the batch sharded, and the parameter's gradient comes out Partial.
TEST(Propagation, DataParallelReflectPadGradientKeepsTheBatch) {
  auto g = graph::ParseGraph(R"(
    opset 18
    input x: float32[4,3,8,8]
    input t: float32[4,3,11,11]
    input scale: float32[1,3,1,1]
    init pads: int64[8] = 0 0 2 1 0 0 1 2
    h = Mul(x, scale)
    p = Pad(h, pads) {mode = "reflect"}
    q = Mul(p, t)
    loss = ReduceSum(q) {keepdims = 0}
    output loss
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  graph::Graph& graph = **g;
  auto grads = trainer::BuildBackward(graph, graph.FindValue("loss"), {graph.FindValue("scale")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  int pad_grads = 0;
  for (const auto& node : graph.nodes()) pad_grads += node->op_type() == "PadGrad";
  EXPECT_EQ(pad_grads, 1);
  auto mesh = *Mesh::Parse("dp=2");
  auto p = Propagate(graph, mesh, {{"x", Batch(4)}, {"t", Batch(4)}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sharding.at(graph.FindValue("p")).ToString(), "[dp,-,-,-]");
  EXPECT_EQ(p->sharding.at(grads->at("scale")).partial, std::set<std::string>{"dp"})
      << p->sharding.at(grads->at("scale")).ToString();
  for (const Reshard& r : Reshards(graph, mesh, *p))
    ADD_FAILURE() << ReshardName(r.kind) << " of " << r.value->name() << " " << r.from.ToString() << " -> "
                  << r.to.ToString() << " for " << r.node->Describe();
}

// A small convolutional classifier (padding, a strided Conv, BatchNormalization with its
// running statistics, LeakyRelu, a ConvTranspose back up, a bilinear Resize down, MaxPool, a padded AveragePool, GlobalAveragePool, a
// log-softmax and the negative log-likelihood) trained
// data-parallel: every activation and
// activation gradient keeps the batch sharded with no collective, and the weights' gradients
// come out Partial over dp (the one all-reduce the optimizer needs).
// TopK along the features, GatherND of each sequence's own row (batch_dims 1) and ScatterND
// into whole rows of a batch-minor tensor keep the batch sharded: no reshard.
TEST(Propagation, TopKAndNdIndexingKeepTheBatchSharded) {
  auto g = graph::ParseGraph(R"(
    opset 16
    input x: float32[4,6]
    input w: float32[6,5]
    input last: int64[4,1]
    init k: int64[1] = 2
    init rows: int64[2,1] = 3 0
    h = MatMul(x, w)
    v, i = TopK(h, k)
    gn = GatherND(h, last) {batch_dims = 1}
    ht = Transpose(h) {perm = [1, 0]}
    vt = Transpose(v) {perm = [1, 0]}
    sn = ScatterND(ht, rows, vt)
    output v
    output i
    output gn
    output sn
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  graph::Graph& graph = **g;
  auto mesh = *Mesh::Parse("dp=2");
  auto p = Propagate(graph, mesh, {{"x", Batch(2)}, {"last", Batch(2)}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sharding.at(graph.FindValue("v")).ToString(), "[dp,-]");
  EXPECT_EQ(p->sharding.at(graph.FindValue("i")).ToString(), "[dp,-]");
  EXPECT_EQ(p->sharding.at(graph.FindValue("gn")).ToString(), "[dp]");
  EXPECT_EQ(p->sharding.at(graph.FindValue("sn")).ToString(), "[-,dp]");
  for (const Reshard& r : Reshards(graph, mesh, *p))
    ADD_FAILURE() << ReshardName(r.kind) << " of " << r.value->name() << " " << r.from.ToString() << " -> "
                  << r.to.ToString() << " for " << r.node->Describe();
}

TEST(Propagation, DataParallelConvolutionalClassifierNeedsNoCollective) {
  auto g = graph::ParseGraph(R"(
    opset 18
    input x: float32[4,3,8,8]
    input labels: int64[4]
    input w: float32[6,3,3,3]
    input b: float32[6]
    input wt: float32[6,4,3,3]
    input head: float32[4,5]
    input gamma: float32[6]
    input beta: float32[6]
    input gr: float32[4,4,4,2]
    init pads: int64[8] = 0 0 1 1 0 0 1 1
    init mu: float32[6] = 0.1 -0.2 0.3 0 0.5 -1
    init va: float32[6] = 1 2 0.5 1.5 0.25 3
    init half: float32[4] = 1 1 0.5 0.5
    p = Pad(x, pads)
    c = Conv(p, w, b) {strides = [2, 2]}
    bn = BatchNormalization(c, gamma, beta, mu, va) {epsilon = 0.001}
    a = LeakyRelu(bn) {alpha = 0.1}
    up = ConvTranspose(a, wt) {strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]}
    rz = Resize(up, _, half) {mode = "linear"}
    gs = GridSample(rz, gr) {mode = "bilinear", padding_mode = "border"}
    mp = MaxPool(gs) {kernel_shape = [2, 2], pads = [0, 0, 1, 1]}
    ap = AveragePool(mp) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1}
    gp = GlobalAveragePool(ap)
    m = Flatten(gp)
    s = MatMul(m, head)
    lp = LogSoftmax(s) {axis = 1}
    loss = NegativeLogLikelihoodLoss(lp, labels)
    output loss
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  graph::Graph& graph = **g;
  std::vector<graph::Value*> wrt;
  for (const char* v : {"w", "b", "wt", "head", "gamma", "beta"}) wrt.push_back(graph.FindValue(v));
  auto grads = trainer::BuildBackward(graph, graph.FindValue("loss"), wrt);
  ASSERT_TRUE(grads.ok()) << grads.status();
  int conv_grads = 0, pool_grads = 0;
  for (const auto& node : graph.nodes()) {
    conv_grads += node->op_type() == "ConvGrad" || node->op_type() == "ConvTransposeGrad";
    pool_grads += node->op_type() == "MaxPoolGrad" || node->op_type() == "AveragePoolGrad" ||
                  node->op_type() == "ResizeGrad" || node->op_type() == "GridSampleGrad";
  }
  EXPECT_EQ(conv_grads, 2);
  EXPECT_EQ(pool_grads, 5);
  auto mesh = *Mesh::Parse("dp=2");
  auto p = Propagate(graph, mesh, {{"x", Batch(4)}, {"labels", Batch(1)}, {"gr", Batch(4)}});
  ASSERT_TRUE(p.ok()) << p.status();
  for (const char* v : {"c", "bn", "up", "rz", "gs", "mp", "ap", "gp"})
    EXPECT_EQ(p->sharding.at(graph.FindValue(v)).ToString(), "[dp,-,-,-]") << v;
  for (const auto& [name, grad] : *grads)
    EXPECT_EQ(p->sharding.at(grad).partial, std::set<std::string>{"dp"}) << name << " " << p->sharding.at(grad).ToString();
  for (const Reshard& r : Reshards(graph, mesh, *p))
    ADD_FAILURE() << ReshardName(r.kind) << " of " << r.value->name() << " " << r.from.ToString() << " -> "
                  << r.to.ToString() << " for " << r.node->Describe();

  // Lowered for each rank and run on a simulated world, each rank feeding its half of the
  // batch: the loss equals the whole batch's, and the ranks' partial gradients sum to its
  // gradients (the sum the optimizer's all-reduce forms).
  std::vector<graph::Value*> outs = {graph.FindValue("loss")};
  for (const auto& [name, grad] : *grads) outs.push_back(grad);
  graph.SetOutputs(outs);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto random = [&](std::vector<int64_t> dims) {
    Tensor t(DataType::kFloat32, dims);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    return t;
  };
  const Tensor x = random({4, 3, 8, 8}), w = random({6, 3, 3, 3}), b = random({6}), head = random({4, 5});
  const Tensor wt = random({6, 4, 3, 3});
  const Tensor gamma = random({6}), beta = random({6}), gr = random({4, 4, 4, 2});
  const Tensor labels = Tensor::FromVector<int64_t>({1, 4, 0, 2}, {4});
  SessionOptions plain;
  plain.optimize = false;
  auto whole = InferenceSession::FromGraph(graph.Clone(), plain);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto want = (*whole)->Run(
      {{"x", x}, {"labels", labels}, {"w", w}, {"b", b}, {"wt", wt}, {"head", head}, {"gamma", gamma}, {"beta", beta},
       {"gr", gr}});
  ASSERT_TRUE(want.ok()) << want.status();
  runtime::SimulatedWorld world(2);
  std::vector<absl::StatusOr<std::vector<Tensor>>> got(2, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      auto lowered = LowerForRank(graph, mesh, *p, r, "loss");
      if (!lowered.ok()) {
        got[r] = lowered.status();
        return;
      }
      SessionOptions o = plain;
      o.communicator = world.rank(r);
      auto s = InferenceSession::FromGraph(std::move(lowered->graph), o);
      if (!s.ok()) {
        got[r] = s.status();
        return;
      }
      got[r] = (*s)->Run({{"x", testing::Rows(x, 2 * r, 2)}, {"labels", testing::Rows(labels, 2 * r, 2)},
                          {"w", w}, {"b", b}, {"wt", wt}, {"head", head}, {"gamma", gamma}, {"beta", beta},
                          {"gr", testing::Rows(gr, 2 * r, 2)}});
    });
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    ASSERT_EQ(got[r]->size(), want->size());
    EXPECT_EQ(testing::CompareTensors((*got[r])[0], (*want)[0], 1e-6, 1e-5), "") << "rank " << r << " loss";
  }
  for (size_t i = 1; i < want->size(); ++i) {
    Tensor sum = (*got[0])[i].Clone();
    for (int64_t k = 0; k < sum.numel(); ++k) sum.data<float>()[k] += (*got[1])[i].data<float>()[k];
    EXPECT_EQ(testing::CompareTensors(sum, (*want)[i], 1e-6, 1e-5), "") << outs[i]->name();
  }
}

// GridSample with X's channels sharded: Y keeps them sharded, X's gradient too, and the grid's
// gradient (a sum over the channels) is Partial; output points sharded through the grid shard Y
// along them and leave X's gradient Partial.
TEST(Propagation, GridSampleShardsChannelsAndOutputPoints) {
  auto g = graph::ParseGraph(R"(
    opset 20
    input x: float32[2,4,3,3]
    input gr: float32[2,6,2,2]
    y = GridSample(x, gr)
    y2 = Mul(y, y)
    loss = ReduceSum(y2) {keepdims = 0}
    output loss
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  graph::Graph& graph = **g;
  auto grads = trainer::BuildBackward(graph, graph.FindValue("loss"), {graph.FindValue("x"), graph.FindValue("gr")});
  ASSERT_TRUE(grads.ok()) << grads.status();
  auto mesh = *Mesh::Parse("tp=2");
  Sharding channels = Sharding::Replicated(4), points = Sharding::Replicated(4);
  channels.dims[1] = {"tp"};
  points.dims[1] = {"tp"};
  auto p = Propagate(graph, mesh, {{"x", channels}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sharding.at(graph.FindValue("y")).ToString(), "[-,tp,-,-]");
  EXPECT_EQ(p->sharding.at(grads->at("x")).ToString(), "[-,tp,-,-]");
  EXPECT_EQ(p->sharding.at(grads->at("gr")).partial, std::set<std::string>{"tp"})
      << p->sharding.at(grads->at("gr")).ToString();
  p = Propagate(graph, mesh, {{"gr", points}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->sharding.at(graph.FindValue("y")).ToString(), "[-,-,tp,-]");
  EXPECT_EQ(p->sharding.at(grads->at("gr")).ToString(), "[-,tp,-,-]");
  EXPECT_EQ(p->sharding.at(grads->at("x")).partial, std::set<std::string>{"tp"})
      << p->sharding.at(grads->at("x")).ToString();
}

TEST(Propagation, BadSeedsAndOpsWithoutRulesAreListed) {
  auto g = graph::ParseGraph(R"(
    input x: float32[6,8]
    y = Relu(x)
    output y
  )");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  auto mesh = *Mesh::Parse("dp=4");
  auto p = Propagate(**g, mesh, {{"x", Batch(2)}, {"nope", Batch(1)}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("dim 0 of size 6"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("'nope' names a tensor the graph does not have"), std::string::npos);
}

}  // namespace
}  // namespace cleave::partition
