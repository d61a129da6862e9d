// Tensor parallelism end to end: Megatron seeds found by structure in the LLaMA-style
// training variant, sharding propagation, per-rank lowering, and one training step (forward,
// backward, clipped AdamW) on a simulated tp=2 world against the single-rank step.
#include <cstring>
#include <set>
#include <thread>

#include "base/status.h"
#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "onnx_ext/onnx_io.h"
#include "partition/lower.h"
#include "partition/megatron.h"
#include "runtime/simulated_communicator.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/autodiff.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave::partition {
namespace {

constexpr int64_t kBatch = 2, kSeq = 16;

trainer::TrainingArtifacts Artifacts(const std::string& model_dir, bool fuse_attention = false) {
  trainer::TrainingSpec spec;
  spec.fuse_attention = fuse_attention;
  spec.optimizer.max_grad_norm = 0.5f;
  spec.optimizer.weight_decay = 0.1f;
  // SGD: the update is linear in the gradient, so parameters compare as tightly as gradients
  // (AdamW's m / sqrt(v) turns rounding-level differences of near-zero gradients into
  // lr-sized ones; the data-parallel test covers AdamW).
  spec.optimizer.kind = trainer::OptimizerConfig::Kind::kSgd;
  spec.optimizer.momentum = 0.9f;
  return testing::BuildArtifacts(model_dir, kBatch, kSeq, spec);
}

using testing::Rows;
using testing::CopyArtifacts;

struct MeshCase {
  const char* model;
  const char* mesh;
  int zero;
  bool sp = false;
  bool vocab_parallel = false;  // --vocab-parallel-loss
  bool fused_attention = false;  // ai.cleave.Attention, sharded by heads
};

class Megatron : public ::testing::TestWithParam<MeshCase> {};

TEST_P(Megatron, TrainingStepEqualsSingleRank) {
  trainer::TrainingArtifacts a = Artifacts(GetParam().model, GetParam().fused_attention);
  if (GetParam().fused_attention) {
    int fused = 0;
    for (const auto& n : a.training->nodes()) fused += n->op_type() == "Attention";
    EXPECT_EQ(fused, 2);
  }
  Tensor ids(DataType::kInt64, {kBatch, kSeq}), labels(DataType::kInt64, {kBatch, kSeq});
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    ids.data<int64_t>()[i] = (i * 37 + 5) % 64;
    // Two positions per row are ignore_index (-100): they must count for nothing, sharded or
    // not. (Every row has as many, so each dp rank's mean has the same divisor: under dp the
    // loss is the mean of the ranks' means, as with PyTorch DDP.)
    labels.data<int64_t>()[i] = i % kSeq == 3 || i % kSeq == 10 ? -100 : (i * 11 + 3) % 64;
  }
  const Feeds feeds = {{"input_ids", ids}, {"labels", labels}};
  auto single = trainer::TrainingSession::Create(CopyArtifacts(a), testing::OneThread());
  ASSERT_TRUE(single.ok()) << single.status();
  auto want_loss = (*single)->TrainStep(feeds);
  ASSERT_TRUE(want_loss.ok()) << want_loss.status();
  std::map<std::string, Tensor> want_grads;
  for (const std::string& p : a.params) want_grads[p] = *(*single)->GetGradient(p);
  auto want_norm = (*single)->OptimizerStep();
  ASSERT_TRUE(want_norm.ok());

  auto mesh = *Mesh::Parse(GetParam().mesh);
  const int world = mesh.world_size(), dp = mesh.size("dp");
  if (GetParam().vocab_parallel) {
    // The loss and its gradient (two nodes) may keep the class dim sharded.
    EXPECT_EQ(MarkVocabParallelLoss(*a.training), 2);
  }
  const bool llama = std::string(GetParam().model).find("llama") != std::string::npos;
  auto seeds = FindMegatronSeeds(*a.training, a.params, mesh);
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  // LLaMA, per layer: q, k, v, gate and up, plus the LM head (column-parallel over the
  // vocabulary). GPT: the fused qkv and fc per layer, plus the tied head (the embedding table).
  EXPECT_EQ(seeds->size(), llama ? 2u * 5 + 1 : 2u * 2 + 1);
  std::map<std::string, Sharding> train_seeds = SeedShardings(*a.training, *seeds);
  if (dp > 1) {
    Sharding batch = Sharding::Replicated(2);
    batch.dims[0] = {"dp"};
    train_seeds["input_ids"] = batch;
    train_seeds["labels"] = batch;
  }
  if (GetParam().sp) {
    // The data stays whole along the sequence; the residual stream is split.
    for (const char* d : {"input_ids", "labels"})
      if (!train_seeds.count(d)) train_seeds[d] = Sharding::Replicated(2);
    auto sp = FindSequenceParallelSeed(*a.training, a.params, mesh);
    ASSERT_TRUE(sp.ok()) << sp.status();
    train_seeds[sp->first] = sp->second;
  }
  auto train_p = PropagateTraining(*a.training, a.params, mesh, train_seeds);
  ASSERT_TRUE(train_p.ok()) << train_p.status();
  std::map<std::string, Sharding> param_sharding, grad_sharding, output_wants;
  for (const std::string& p : a.params) {
    param_sharding[p] = train_p->sharding.at(a.training->FindValue(p));
    // Gradients leave the training graph sharded like their weight, Partial over dp.
    grad_sharding[p] = train_p->sharding.at(a.training->FindValue(trainer::AccumulationOut(p)));
    Sharding want = param_sharding[p];
    if (dp > 1) want.partial = {"dp"};
    EXPECT_EQ(grad_sharding[p].ToString(), want.ToString()) << p;
  }
  auto opt_seeds = PrepareOptimizer(*a.optimizer, a.params, a.state_suffixes, mesh, param_sharding, grad_sharding,
                                    GetParam().zero, &output_wants);
  ASSERT_TRUE(opt_seeds.ok()) << opt_seeds.status();
  if (llama && !GetParam().sp) {
    // The row-parallel layers were found by propagation: o and down split on their input dim.
    EXPECT_EQ(param_sharding.at("layers.0.o.weight").ToString(), "[-,tp]");
    EXPECT_EQ(param_sharding.at("layers.1.down.weight").ToString(), "[-,tp]");
    EXPECT_EQ(param_sharding.at("layers.0.q.weight").ToString(), "[tp,-]");
    EXPECT_TRUE(param_sharding.at("layers.0.attn_norm.weight").IsReplicated());
  } else if (!llama) {
    EXPECT_EQ(param_sharding.at("blocks.0.mlp.proj.weight").ToString(), "[-,tp]");
    EXPECT_EQ(param_sharding.at("wte.weight").ToString(), "[tp,-]");  // vocab-parallel, tied
  }
  auto opt_p = Propagate(*a.optimizer, mesh, *opt_seeds);
  ASSERT_TRUE(opt_p.ok()) << opt_p.status();

  // Collectives: 2 AllReduce per layer forward (after o and down) and 2 backward (the input
  // gradients of the column-parallel groups), plus the LM head's input gradient; the
  // vocab-sharded logits are gathered once for the loss (and their gradient sliced back,
  // which moves nothing).
  int all_reduce_fwd = 0, all_reduce_bwd = 0, gathers = 0;
  std::string all;
  std::set<std::pair<const graph::Value*, std::string>> seen;  // one collective per value and target
  for (const Reshard& r : Reshards(*a.training, mesh, *train_p)) {
    if (!seen.insert({r.value, r.to.ToString()}).second) continue;
    all += std::string(ReshardName(r.kind)) + " " + r.value->name() + " " + r.from.ToString() + " -> " +
           r.to.ToString() + " at " + r.node->Describe() + "\n";
    const bool bwd = r.node->metadata().count("role") && r.node->metadata().at("role") == "bwd";
    if (r.kind == ReshardKind::kAllReduce) ++(bwd ? all_reduce_bwd : all_reduce_fwd);
    else if (r.kind == ReshardKind::kAllGather) ++gathers;
    else if (r.kind != ReshardKind::kSlice && !(GetParam().sp && (r.kind == ReshardKind::kReduceScatter ||
                                                                 r.kind == ReshardKind::kAllToAll)))
      ADD_FAILURE() << ReshardName(r.kind) << " of " << r.value->name() << " for " << r.node->Describe();
  }
  if (llama && !GetParam().sp) {
    EXPECT_EQ(all_reduce_fwd, 2 * 2) << all;
    EXPECT_EQ(all_reduce_bwd, 2 * 2 + 1) << all;
    // The logits are gathered for the loss unless the loss is vocabulary-parallel.
    EXPECT_EQ(gathers, GetParam().vocab_parallel ? 0 : 1) << all;
  }
  if (GetParam().vocab_parallel) {
    // The logits' class dim stays sharded into the loss, and so does its gradient.
    for (const auto& n : a.training->nodes()) {
      if (n->op_type() != "SoftmaxCrossEntropyLoss" && n->op_type() != "SoftmaxCrossEntropyLossGrad") continue;
      const graph::Value* scores = n->input(n->op_type() == "SoftmaxCrossEntropyLoss" ? 0 : 1);
      EXPECT_EQ(train_p->sharding.at(scores).dims[1], std::vector<std::string>{"tp"}) << n->Describe();
      EXPECT_EQ(train_p->sharding.at(n->output(n->op_type() == "SoftmaxCrossEntropyLoss" ? 1 : 0)).dims[1],
                std::vector<std::string>{"tp"})
          << n->Describe();
    }
  }

  std::string sce_name;
  for (const auto& n : a.training->nodes())
    if (n->op_type() == "SoftmaxCrossEntropyLoss") sce_name = n->name();
  runtime::SimulatedWorld sim(world);
  std::vector<absl::Status> status(world);
  std::vector<float> loss(world), norm(world);
  std::vector<std::map<std::string, Tensor>> params(world), grads(world);
  std::vector<int64_t> state_elements(world, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      auto run = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(LoweredGraph train, LowerForRank(*a.training, mesh, *train_p, r, "loss"));
        if (GetParam().vocab_parallel) {
          // Three AllReduces over tp of one value per row (max, sum of exponentials, target):
          // nothing of the vocabulary's size crosses ranks for the loss.
          int loss_reduces = 0;
          for (const CollectiveRecord& c : train.collectives)
            if (c.reader == sce_name) {
              ++loss_reduces;
              if (c.kind != "AllReduce" || c.bytes != 4 * kBatch / dp * kSeq)
                return absl::InternalError(absl::StrCat("loss collective ", c.kind, " of ", c.bytes, " bytes"));
            }
          if (loss_reduces != 3) return absl::InternalError(absl::StrCat(loss_reduces, " loss collectives, expected 3"));
        }
        ASSIGN_OR_RETURN(LoweredGraph opt, LowerForRank(*a.optimizer, mesh, *opt_p, r, "", output_wants));
        trainer::TrainingArtifacts mine = CopyArtifacts(a);
        mine.training = std::move(train.graph);
        mine.optimizer = std::move(opt.graph);
        mine.eval = mine.training->Clone();
        mine.eval->SetOutputs({mine.eval->FindValue("loss")});
        for (const std::string& p : a.params) {
          ASSIGN_OR_RETURN(mine.initial[p], ShardTensor(a.initial.at(p), mesh, param_sharding.at(p), r, p));
        }
        ASSIGN_OR_RETURN(auto s, trainer::TrainingSession::Create(std::move(mine),
                                                                  testing::OneThread(sim.rank(r))));
        const int64_t rows = kBatch / dp, row0 = mesh.Coord(r, "dp") * rows;
        ASSIGN_OR_RETURN(loss[r], s->TrainStep({{"input_ids", Rows(feeds[0].second, row0, rows)},
                                               {"labels", Rows(feeds[1].second, row0, rows)}}));
        for (const std::string& p : a.params) {
          ASSIGN_OR_RETURN(grads[r][p], s->GetGradient(p));
        }
        ASSIGN_OR_RETURN(norm[r], s->OptimizerStep());
        for (const std::string& p : a.params) {
          ASSIGN_OR_RETURN(params[r][p], s->GetState(p));
          for (const std::string& suf : a.state_suffixes) {
            ASSIGN_OR_RETURN(Tensor st, s->GetState(p + suf));
            state_elements[r] += st.numel();
          }
        }
        return absl::OkStatus();
      };
      status[r] = run();
    });
  for (auto& t : ranks) t.join();
  int64_t psi = 0;
  for (const auto& [p, t] : a.initial) psi += t.numel();
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_NEAR(loss[r], *want_loss, 1e-5 * *want_loss) << "rank " << r;
    EXPECT_NEAR(norm[r], *want_norm, 1e-5 * *want_norm) << "rank " << r;
    for (const std::string& p : a.params) {
      auto want = ShardTensor(*(*single)->GetState(p), mesh, param_sharding.at(p), r, p);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(testing::CompareTensors(params[r].at(p), *want, 1e-6, 1e-5), "") << "rank " << r << " " << p;
      // Under dp the accumulated gradient is this rank's partial sum; only tp-only meshes
      // hold the full gradient shard.
      if (dp == 1) {
        auto want_grad = ShardTensor(want_grads.at(p), mesh, param_sharding.at(p), r, p);
        ASSERT_TRUE(want_grad.ok());
        EXPECT_EQ(testing::CompareTensors(grads[r].at(p), *want_grad, 1e-7, 1e-5), "") << "rank " << r << " " << p;
      }
    }
    // SGD with momentum keeps one buffer per parameter; ZeRO-1 keeps 1/dp of this rank's share.
    EXPECT_LE(state_elements[r], psi / (GetParam().zero ? dp : 1)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, Megatron,
                         ::testing::Values(MeshCase{"train_variants/llama", "tp=2", 0},
                                           MeshCase{"train_variants/llama", "dp=2,tp=2", 0},
                                           MeshCase{"train_variants/llama", "dp=2,tp=2", 1},
                                           MeshCase{"tiny_gpt", "tp=2", 0}, MeshCase{"tiny_gpt", "dp=2,tp=2", 1},
                                           // Sequence parallelism.
                                           MeshCase{"train_variants/llama", "tp=2", 0, true},
                                           MeshCase{"train_variants/llama", "dp=2,tp=2", 1, true},
                                           MeshCase{"tiny_gpt", "tp=2", 0, true},
                                           // Vocabulary-parallel cross-entropy.
                                           MeshCase{"train_variants/llama", "tp=2", 0, false, true},
                                           MeshCase{"train_variants/llama", "dp=2,tp=2", 1, false, true},
                                           MeshCase{"tiny_gpt", "dp=2,tp=2", 0, true, true},
                                           MeshCase{"tiny_gpt", "dp=2,tp=2", 0, true, false},
                                           // Fused attention, split by heads.
                                           MeshCase{"tiny_gpt", "dp=2,tp=2", 1, false, false, true}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.model).find("llama") != std::string::npos
                                                  ? "llama_" : "tiny_gpt_";
                           name += info.param.mesh;
                           for (char& c : name)
                             if (c == '=' || c == ',') c = '_';
                           return name + "_zero" + std::to_string(info.param.zero) + (info.param.sp ? "_sp" : "") +
                                  (info.param.vocab_parallel ? "_vocab_parallel" : "") +
                                  (info.param.fused_attention ? "_fused_attention" : "");
                         });

TEST(PartitionedTraining, MegatronRejectsATpThatDoesNotDivide) {
  trainer::TrainingArtifacts a = Artifacts("train_variants/llama");
  auto mesh = *Mesh::Parse("tp=3");
  auto seeds = FindMegatronSeeds(*a.training, a.params, mesh);
  ASSERT_FALSE(seeds.ok());
  EXPECT_NE(seeds.status().message().find("tp=3 does not divide dim 0 of weight"), std::string::npos) << seeds.status();
}

}  // namespace
}  // namespace cleave::partition

namespace cleave::trainer {
namespace {

// Every per-rank graph of a plan passes the ONNX checker with the ai.cleave schemas, and the
// memory it reports follows the shardings.
TEST(PartitionPlan, RankGraphsPassTheOnnxCheckerAndMemoryFollowsTheShardings) {
  PlanConfig c;
  c.model = std::string(CLEAVE_SOURCE_DIR) + "/models/train_variants/llama/model.onnx";
  c.mesh = "dp=2,tp=2";
  c.batch = 4;
  c.seq = 16;
  c.zero = 1;
  c.spec.optimizer.max_grad_norm = 1.0f;
  auto plan = BuildPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->ranks.size(), 4u);
  for (const RankPlan& r : plan->ranks) {
    for (const graph::Graph* g : {r.artifacts.training.get(), r.artifacts.eval.get(), r.artifacts.optimizer.get()})
      EXPECT_TRUE(onnx_ext::CheckModel(*g).ok()) << "rank " << r.rank << ": " << onnx_ext::CheckModel(*g);
    // tp halves the split weights; the norm weights stay whole: a bit over half each.
    EXPECT_GT(r.memory.parameters, plan->unpartitioned.parameters / 2);
    EXPECT_LT(r.memory.parameters, plan->unpartitioned.parameters * 6 / 10);
    // ZeRO-1 splits that share again over dp.
    EXPECT_LT(r.memory.optimizer_state, plan->unpartitioned.optimizer_state * 3 / 10);
  }
}

}  // namespace
}  // namespace cleave::trainer
