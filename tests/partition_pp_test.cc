// Pipeline parallelism end to end: stage cuts found by structure, per-stage forward and
// backward parts with Send/Recv, the schedules run on a simulated world (one thread per rank,
// real message ordering), and one full training step against the single-rank step.
#include <cmath>
#include <fstream>
#include <set>
#include <thread>

#include "base/status.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "graph/op_table.h"
#include "partition/lower.h"
#include "partition/pipeline.h"
#include "partition/propagation.h"
#include "runtime/inference_session.h"
#include "runtime/simulated_communicator.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave::trainer {
namespace {

using testing::Rows;

constexpr int64_t kSeq = 16;

struct PipeCase {
  const char* model;  // under models/
  const char* mesh;
  const char* schedule;
  int microbatches;
  int virtual_stages = 1;
  int zero = 0;
  const char* cuts = "auto";
  bool sp = false;
  int64_t batch = 4;
};

void PrintTo(const PipeCase& pc, std::ostream* os) {
  *os << pc.model << " " << pc.mesh << " " << pc.schedule << " m=" << pc.microbatches << " v=" << pc.virtual_stages
      << " zero=" << pc.zero;
}

PlanConfig Config(const PipeCase& pc) {
  PlanConfig c;
  c.model = std::string(CLEAVE_SOURCE_DIR) + "/models/" + pc.model + "/model.onnx";
  c.mesh = pc.mesh;
  c.batch = pc.batch;
  c.seq = kSeq;
  c.zero = pc.zero;
  c.sp = pc.sp;
  c.microbatches = pc.microbatches;
  c.schedule = pc.schedule;
  c.virtual_stages = pc.virtual_stages;
  c.pp_cuts = pc.cuts;
  c.bucket_bytes = 0;
  // SGD with momentum: the update is linear in the gradient, so parameters compare as tightly
  // as gradients do (see partition_tp_test.cc).
  c.spec.optimizer.kind = OptimizerConfig::Kind::kSgd;
  c.spec.optimizer.momentum = 0.9f;
  c.spec.optimizer.max_grad_norm = 0.5f;
  c.spec.optimizer.weight_decay = 0.1f;
  return c;
}

class Pipeline : public ::testing::TestWithParam<PipeCase> {};

TEST_P(Pipeline, TrainingStepEqualsSingleRank) {
  const PipeCase& pc = GetParam();
  const PlanConfig config = Config(pc);
  const int64_t batch = pc.batch;
  Tensor ids(DataType::kInt64, {batch, kSeq}), labels(DataType::kInt64, {batch, kSeq});
  for (int64_t i = 0; i < batch * kSeq; ++i) {
    ids.data<int64_t>()[i] = (i * 37 + 5) % 64;
    labels.data<int64_t>()[i] = (i * 11 + 3) % 64;
  }
  // The single-rank step on the whole batch.
  TrainingSpec spec = config.spec;
  TrainingArtifacts a = testing::BuildArtifacts(pc.model, batch, kSeq, spec);
  auto single = TrainingSession::Create(testing::CopyArtifacts(a), {.intra_op_threads = 1});
  ASSERT_TRUE(single.ok()) << single.status();
  auto want_loss = (*single)->TrainStep({{"input_ids", ids}, {"labels", labels}});
  ASSERT_TRUE(want_loss.ok()) << want_loss.status();
  auto want_norm = (*single)->OptimizerStep();
  ASSERT_TRUE(want_norm.ok()) << want_norm.status();
  Checkpoint whole;  // the single-rank parameters, each its own whole block
  for (const std::string& p : a.params) {
    Tensor t = *(*single)->GetState(p);
    Block b;
    b.global = t.dims();
    b.offset.assign(t.dims().size(), 0);
    whole.properties["block:" + p] = BlockString(b);
    whole.tensors.emplace_back(p, t);
  }

  auto plan = BuildPlan(config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const partition::Mesh& mesh = plan->mesh;
  const int world = mesh.world_size(), dp = mesh.size("dp"), pp = mesh.size("pp");
  const int64_t micro_rows = batch / pc.microbatches / dp;
  // The residual stream [rows, seq, hidden] in fp32, split over tp along the sequence under sp.
  const std::string model = pc.model;
  const int64_t hidden = model == "tiny_gpt" ? 64 : 32;
  const int64_t stream_bytes = micro_rows * kSeq * hidden * 4 / (pc.sp ? mesh.size("tp") : 1);

  // Structure: one Send/Recv per crossing value per boundary and direction, matched in
  // pairs with the same tag; every parameter is held by some rank.
  std::map<std::tuple<int, int, int>, int> sends, recvs;  // (from, to, tag) -> count
  std::set<std::string> held;
  const int stages = pp * pc.virtual_stages;
  for (const RankPlan& rp : plan->ranks) {
    // Only the residual stream crosses a boundary: one value forward, its gradient backward.
    int fwd_sends = 0, bwd_sends = 0, want_fwd = 0, want_bwd = 0;
    for (const PipelineStage& st : rp.artifacts.stages) {
      want_fwd += st.stage + 1 < stages;
      want_bwd += st.stage > 0;
    }
    for (const partition::P2PRecord& m : rp.p2p) {
      EXPECT_EQ(m.bytes, stream_bytes) << "rank " << rp.rank << " " << m.kind << " " << m.value;
      if (m.kind == "Send") {
        ++sends[{rp.rank, m.peer, m.tag}];
        ++(m.backward ? bwd_sends : fwd_sends);
      } else {
        ++recvs[{m.peer, rp.rank, m.tag}];
      }
    }
    EXPECT_EQ(fwd_sends, want_fwd) << "rank " << rp.rank;
    EXPECT_EQ(bwd_sends, want_bwd) << "rank " << rp.rank;
    // ZeRO-2: each rank accumulates only its dp shard of the gradients it holds.
    if (pc.zero == 2) {
      EXPECT_LE(rp.memory.gradients * dp, rp.memory.parameters * 101 / 100) << "rank " << rp.rank;
    }
    held.insert(rp.artifacts.params.begin(), rp.artifacts.params.end());
    EXPECT_EQ(static_cast<int>(rp.artifacts.stages.size()), pp > 1 ? pc.virtual_stages : 0);
  }
  EXPECT_EQ(sends, recvs);
  EXPECT_EQ(sends.empty(), pp == 1);
  // Every parameter of the model is held, itself or as the parts of a fused weight.
  std::set<std::string> covered;
  for (const std::string& h : held)
    covered.insert(plan->weight_parts.count(h) ? plan->weight_parts.at(h).source : h);
  EXPECT_EQ(covered, std::set<std::string>(a.params.begin(), a.params.end()));

  runtime::SimulatedWorld sim(world, std::chrono::seconds(60));
  std::vector<absl::Status> status(world);
  std::vector<float> loss(world, NAN), norm(world, NAN);
  std::vector<std::map<std::string, Tensor>> params(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto run = [&]() -> absl::Status {
        TrainingArtifacts mine = std::move(plan->ranks[r].artifacts);
        ASSIGN_OR_RETURN(auto s, TrainingSession::Create(std::move(mine),
                                                         {.intra_op_threads = 1, .communicator = sim.rank(r)}));
        std::vector<Feeds> micro;
        for (int m = 0; m < pc.microbatches; ++m) {
          const int64_t row0 = (m * dp + mesh.Coord(r, "dp")) * micro_rows;
          micro.push_back({{"input_ids", Rows(ids, row0, micro_rows)}, {"labels", Rows(labels, row0, micro_rows)}});
        }
        if (s->pipelined()) {
          ASSIGN_OR_RETURN(loss[r], s->PipelineStep(PipelineWorkFor(*plan, r), micro));
        } else {
          ASSIGN_OR_RETURN(loss[r], s->TrainStep(micro[0]));
        }
        ASSIGN_OR_RETURN(norm[r], s->OptimizerStep());
        // Under dp every gradient reduction started during the backward (in a pipeline, after
        // the last backward of the chunks writing its gradients), none after it. (ZeRO-2
        // reduce-scatters each micro-batch's gradients inside the training graph instead.)
        const GradientReducer* red = s->gradient_reducer();
        if (dp > 1 && pc.zero != 2 && (!red || red->reductions().empty()))
          return absl::InternalError("no overlapped gradient reductions");
        if (red) {
          if (red->launched_in_backward() != static_cast<int>(red->reductions().size()) ||
              red->launched_after_backward() != 0)
            return absl::InternalError(absl::StrCat(red->launched_in_backward(), " of ", red->reductions().size(),
                                                    " reductions started in the backward, ",
                                                    red->launched_after_backward(), " after it"));
        }
        for (const std::string& p : s->parameter_names()) {
          ASSIGN_OR_RETURN(params[r][p], s->GetState(p));
        }
        return absl::OkStatus();
      };
      status[r] = run();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    const bool last = mesh.Coord(r, "pp") == pp - 1;  // every rank without a pipeline
    if (last) EXPECT_NEAR(loss[r], *want_loss, 1e-5 * *want_loss) << "rank " << r;
    else EXPECT_TRUE(std::isnan(loss[r])) << "rank " << r << " does not hold the loss";
    EXPECT_NEAR(norm[r], *want_norm, 1e-5 * *want_norm) << "rank " << r;
    // This rank's blocks of the single-rank parameters (a part of a fused weight is a block of
    // that weight).
    std::map<std::string, Tensor> want;
    for (const auto& [p, got] : params[r]) want[p] = Tensor(got.dtype(), got.dims());
    ASSERT_TRUE(ReshardInto({whole}, plan->ranks[r].blocks, want).ok()) << "rank " << r;
    for (const auto& [p, got] : params[r])
      EXPECT_EQ(testing::CompareTensors(got, want.at(p), 1e-6, 1e-5), "") << "rank " << r << " " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, Pipeline,
    ::testing::Values(PipeCase{"train_variants/gpt_deep", "pp=2", "1f1b", 4},
                      PipeCase{"train_variants/gpt_deep", "pp=4", "1f1b", 4},
                      PipeCase{"train_variants/gpt_deep", "pp=2", "gpipe", 2, 1, 0, "3"},
                      PipeCase{"train_variants/gpt_deep", "pp=2", "interleaved", 4, 2},
                      PipeCase{"train_variants/llama", "pp=2", "1f1b", 2},
                      PipeCase{"tiny_gpt", "pp=2", "1f1b", 2},
                      PipeCase{"train_variants/gpt_deep", "dp=2,pp=2", "1f1b", 2, 1, 1},
                      PipeCase{"train_variants/llama", "dp=2,pp=2,tp=2", "1f1b", 2, 1, 1},
                      PipeCase{"train_variants/gpt_deep", "dp=2,pp=2,tp=2", "interleaved", 2, 2, 1},
                      // ZeRO-2, tp=4 and sequence parallelism through the same plan builder.
                      PipeCase{"tiny_gpt", "dp=2", "1f1b", 1, 1, 2},
                      PipeCase{"train_variants/gpt_deep", "dp=2,tp=2", "1f1b", 1, 1, 2},
                      PipeCase{"train_variants/gpt_deep", "dp=2,pp=2", "1f1b", 2, 1, 2},
                      PipeCase{"train_variants/gpt_deep", "tp=4", "1f1b", 1},
                      PipeCase{"train_variants/llama", "tp=2", "1f1b", 1, 1, 0, "auto", true},
                      PipeCase{"train_variants/llama", "pp=2,tp=2", "1f1b", 2, 1, 0, "auto", true},
                      PipeCase{"tiny_gpt", "dp=2,tp=2", "1f1b", 1, 1, 1, "auto", true},
                      PipeCase{"tiny_gpt", "dp=2,pp=2,tp=2", "1f1b", 2, 1, 1, "auto", true}),
    [](const auto& info) {
      std::string name = info.param.model;
      name = name.substr(name.rfind('/') + 1) + "_" + info.param.mesh + "_" + info.param.schedule + "_m" +
             std::to_string(info.param.microbatches) + "_v" + std::to_string(info.param.virtual_stages) + "_zero" +
             std::to_string(info.param.zero) + (info.param.sp ? "_sp" : "");
      for (char& c : name)
        if (c == '=' || c == ',') c = '_';
      return name;
    });

TEST(Pipeline, LayersAreFoundByStructureAndAutoCutsBalance) {
  TrainingArtifacts a = testing::BuildArtifacts("train_variants/gpt_deep", 2, kSeq, {});
  auto starts = partition::FindLayerStarts(*a.training, a.params);
  ASSERT_TRUE(starts.ok()) << starts.status();
  EXPECT_EQ(starts->size(), 4u);
  auto four = partition::AssignStages(*a.training, a.params, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->first_layer, (std::vector<int>{0, 1, 2, 3}));
  // The tied embedding is read by the first stage (lookup) and the last (LM head).
  EXPECT_EQ(four->param_stages.at("wte.weight"), (std::set<int>{0, 3}));
  auto two = partition::AssignStages(*a.training, a.params, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->first_layer, (std::vector<int>{0, 2}));
  // Every forward node has a stage, and stages never decrease along a forward edge.
  for (const auto& n : a.training->nodes()) {
    if (n->metadata().count("role") && n->metadata().at("role") != "fwd") continue;
    ASSERT_TRUE(two->node_stage.count(n->name())) << n->Describe();
    for (const graph::Value* in : n->inputs())
      if (in && in->producer() && two->node_stage.count(in->producer()->name())) {
        EXPECT_LE(two->node_stage.at(in->producer()->name()), two->node_stage.at(n->name())) << n->Describe();
      }
  }
}

TEST(Pipeline, BadCutsAndMeshesAreRejectedBeforeAnythingIsWritten) {
  auto expect_error = [](PipeCase pc, const std::string& text) {
    auto plan = BuildPlan(Config(pc));
    ASSERT_FALSE(plan.ok()) << pc.mesh << " " << pc.cuts;
    EXPECT_NE(plan.status().message().find(text), std::string::npos) << plan.status();
  };
  expect_error({"train_variants/llama", "pp=4", "1f1b", 4}, "4 stages for a model of 2 layers");
  expect_error({"train_variants/gpt_deep", "pp=2", "1f1b", 2, 1, 0, "0"}, "cut 0 is outside");
  expect_error({"train_variants/gpt_deep", "pp=3", "1f1b", 2, 1, 0, "2,2"}, "leaves stage 1 empty");
  expect_error({"train_variants/gpt_deep", "pp=2", "1f1b", 2, 1, 0, "1,2"}, "lists 2 cut(s) for 2 stages");
  expect_error({"train_variants/gpt_deep", "pp=2", "1f1b", 3}, "not divisible by dp=1 x microbatches=3");
  expect_error({"train_variants/gpt_deep", "pp=2", "interleaved", 2, 3}, "6 stages for a model of 4 layers");
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::trainer {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// An explicit shard plan (names and regexes) reproduces what --tp megatron finds by structure,
// and its mistakes are reported by entry and tensor before anything is built.
TEST(ShardPlan, ReproducesMegatronByNameAndRegexAndReportsMistakes) {
  PlanConfig c = Config({"train_variants/llama", "tp=2", "1f1b", 1});
  auto megatron = BuildPlan(c);
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  c.shard_plan = WriteFile("llama_tp.json", R"({"shardings": {
      "layers\\.\\d+\\.(q|k|v|gate|up)\\.weight": "[tp,-]",
      "layers\\.\\d+\\.(o|down)\\.weight": "[-,tp]",
      "lm_head.weight": "[tp, -]"}})");
  auto explicit_plan = BuildPlan(c);
  ASSERT_TRUE(explicit_plan.ok()) << explicit_plan.status();
  EXPECT_EQ(explicit_plan->param_shardings, megatron->param_shardings);
  EXPECT_EQ(explicit_plan->ranks[0].collectives.size(), megatron->ranks[0].collectives.size());

  auto expect_error = [&](const std::string& json, const std::string& text) {
    PlanConfig bad = c;
    bad.shard_plan = WriteFile("bad.json", json);
    auto plan = BuildPlan(bad);
    ASSERT_FALSE(plan.ok()) << json;
    EXPECT_NE(plan.status().message().find(text), std::string::npos) << plan.status();
  };
  expect_error(R"({"shardings": {"no.such.weight": "[tp,-]"}})", "entry 'no.such.weight' matches no tensor");
  expect_error(R"({"lm_head.weight": "[tp,-,-]"})", "has 3 dims, the tensor [64,32] has 2");
  expect_error(R"({"lm_head.weight": "[xp,-]"})", "uses axis 'xp'");
  expect_error(R"({"layers.0.q.weight": "[tp,-]", "layers\\.0\\.q\\..*": "[-,tp]"})",
               "tensor 'layers.0.q.weight' is [tp,-] by entry 'layers.0.q.weight' and [-,tp]");
  expect_error(R"({"lm_head.weight": [1, 2]})", "expected a sharding string");
  expect_error("{not json", "is not valid JSON");
  PlanConfig odd = Config({"train_variants/llama", "tp=3", "1f1b", 1, 1, 0, "auto", false, 3});
  odd.shard_plan = WriteFile("odd.json", R"({"lm_head.weight": "[tp,-]"})");
  auto plan = BuildPlan(odd);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("lm_head.weight"), std::string::npos) << plan.status();
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::trainer {
namespace {

// Megatron on the GPTs (fused c_attn split into q, k and v by structure): 2 AllReduce per layer
// forward (after the attention and MLP output projections) and 2 backward (the input gradients
// of the q/k/v and fc groups), and the attention weights split by heads.
TEST(Megatron, GptLayersNeedTwoAllReducesEachWay) {
  for (const char* model : {"tiny_gpt", "train_variants/gpt_deep"}) {
    PlanConfig c = Config({model, "tp=2", "1f1b", 1});
    auto plan = BuildPlan(c);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int layers = std::string(model) == "tiny_gpt" ? 2 : 4;
    int fwd = 0, bwd = 0;
    std::string all;
    for (const auto& n : plan->ranks[0].artifacts.training->nodes()) {
      if (n->op_type() != "AllReduce" || n->AttrString("mesh_axis", "") != "tp") continue;
      const bool backward = n->metadata().count("role") && n->metadata().at("role") == "bwd";
      ++(backward ? bwd : fwd);
      all += n->name() + (backward ? " (bwd)\n" : " (fwd)\n");
    }
    // Plus, outside the layers, the vocabulary-parallel embedding lookup's partial rows forward
    // and the tied LM head's input gradient backward.
    EXPECT_EQ(fwd, 2 * layers + 1) << model << "\n" << all;
    EXPECT_EQ(bwd, 2 * layers + 1) << model << "\n" << all;
    for (const auto& [p, s] : plan->param_shardings)
      if (p.find("attn.qkv.weight.part") != std::string::npos) {
        EXPECT_EQ(s.ToString(), "[tp,-]") << p;
      } else if (p.find("attn.proj.weight") != std::string::npos) {
        EXPECT_EQ(s.ToString(), "[-,tp]") << p;
      }
    EXPECT_EQ(plan->weight_parts.count("blocks.0.attn.qkv.weight.part1"), 1u);
  }
}

}  // namespace
}  // namespace cleave::trainer

namespace cleave::partition {
namespace {

// A shard moving between dims is one AllToAll (1/n of the data per peer), not a gather and a
// slice: x split over tp by rows, transposed, meets a Softmax over its last axis whose output
// is wanted split by rows, so the shard must move from the columns to the rows.
TEST(Lowering, ShardMovingBetweenDimsIsOneAllToAll) {
  for (const auto& dims : std::vector<std::vector<int64_t>>{{4, 6}, {2, 4, 6}}) {
    auto g = std::make_unique<graph::Graph>();
    g->opset_imports()[""] = 17;
    g->opset_imports()[graph::kCleaveDomain] = 1;
    const int r = static_cast<int>(dims.size());
    graph::Value* x = g->AddInput("x", DataType::kFloat32, Shape::FromDims(dims));
    graph::Value* t = g->GetOrCreateValue("t");
    graph::Value* y = g->GetOrCreateValue("y");
    std::vector<int64_t> perm(r);
    for (int i = 0; i < r; ++i) perm[i] = i;
    std::swap(perm[r - 1], perm[r - 2]);
    g->AddNode("Transpose", {x}, {t}, "tr")->SetAttr("perm", graph::Attribute::Ints(perm));
    g->AddNode("Softmax", {t}, {y}, "sm")->SetAttr("axis", graph::Attribute::Int(-1));
    g->AddOutput(y);
    ASSERT_TRUE(graph::InferShapes(*g).ok());
    auto mesh = *Mesh::Parse("tp=2");
    Sharding xs = Sharding::Replicated(r), ys = Sharding::Replicated(r);
    xs.dims[r - 2] = {"tp"};
    ys.dims[r - 2] = {"tp"};
    auto p = Propagate(*g, mesh, {{"x", xs}, {"y", ys}});
    ASSERT_TRUE(p.ok()) << p.status();
    Tensor tx(DataType::kFloat32, dims);
    for (int64_t i = 0; i < tx.numel(); ++i) tx.data<float>()[i] = static_cast<float>(i % 7) * 0.25f - 1;
    SessionOptions plain;
    plain.intra_op_threads = 1;
    auto whole = InferenceSession::FromGraph(g->Clone(), plain);
    ASSERT_TRUE(whole.ok()) << whole.status();
    auto want_all = (*whole)->Run({{"x", tx}});
    ASSERT_TRUE(want_all.ok()) << want_all.status();
    runtime::SimulatedWorld sim(2);
    std::vector<absl::Status> status(2);
    std::vector<Tensor> got(2);
    std::vector<std::string> ops(2);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank)
      threads.emplace_back([&, rank] {
        auto run = [&]() -> absl::Status {
          ASSIGN_OR_RETURN(LoweredGraph lg, LowerForRank(*g, mesh, *p, rank));
          for (const auto& n : lg.graph->nodes()) ops[rank] += n->op_type() + " ";
          SessionOptions so;
          so.intra_op_threads = 1;
          so.communicator = sim.rank(rank);
          ASSIGN_OR_RETURN(auto s, InferenceSession::FromGraph(std::move(lg.graph), so));
          ASSIGN_OR_RETURN(Tensor shard, ShardTensor(tx, mesh, xs, rank, "x"));
          ASSIGN_OR_RETURN(auto out, s->Run({{"x", shard}}));
          got[rank] = out[0];
          return absl::OkStatus();
        };
        status[rank] = run();
      });
    for (auto& th : threads) th.join();
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_NE(ops[rank].find("AllToAll"), std::string::npos) << ops[rank];
      EXPECT_EQ(ops[rank].find("AllGather"), std::string::npos) << ops[rank];
      auto want = ShardTensor((*want_all)[0], mesh, ys, rank, "y");
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(testing::CompareTensors(got[rank], *want, 0, 0), "") << DimsToString(dims) << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace cleave::partition
