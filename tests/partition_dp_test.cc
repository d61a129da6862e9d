// A partitioned training step equals the unpartitioned one: the tiny GPT's training and
// optimizer graphs (and BERT's, its padding mask the fused attention's bias) propagated over a
// data-parallel mesh, lowered to one graph per rank, and run on every rank of a simulated world,
// against a single-rank step on the whole batch.
#include <functional>
#include <thread>

#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "partition/lower.h"
#include "runtime/simulated_communicator.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "tests/variant_goldens.h"
#include "trainer/autodiff.h"
#include "trainer/training_session.h"

namespace cleave::partition {
namespace {

constexpr int64_t kBatch = 4, kSeq = 32;

trainer::TrainingArtifacts Artifacts() {
  trainer::TrainingSpec spec;
  spec.optimizer.max_grad_norm = 1.0f;
  spec.optimizer.weight_decay = 0.1f;
  return testing::BuildArtifacts("tiny_gpt", kBatch, kSeq, spec);
}

using testing::CopyArtifacts;
using testing::Rows;

struct StepResult {
  float loss = 0, norm = 0;
  std::map<std::string, Tensor> params;
  absl::Status status;
};

StepResult Step(trainer::TrainingSession& s, const Feeds& feeds) {
  StepResult r;
  s.LazyResetGrad();
  auto loss = s.TrainStep(feeds);
  if (!loss.ok()) return {0, 0, {}, loss.status()};
  auto norm = s.OptimizerStep();
  if (!norm.ok()) return {0, 0, {}, norm.status()};
  r.loss = *loss;
  r.norm = *norm;
  for (const std::string& p : s.parameter_names()) r.params[p] = *s.GetState(p);
  return r;
}

// Every parameter's gradient is a partial sum over dp (stage 0: all-reduced in the optimizer).
std::map<std::string, Sharding> PartialGradSeeds(const trainer::TrainingArtifacts& a) {
  std::map<std::string, Sharding> seeds;
  for (const std::string& p : a.params) {
    Sharding s = Sharding::Replicated(a.optimizer->FindValue(p)->shape().rank());
    s.partial = {"dp"};
    seeds[trainer::GradName(p)] = s;
  }
  return seeds;
}

// What one rank of a data-parallel run lowered and did.
struct RankRun {
  StepResult step;
  size_t train_collectives = 0;
  std::vector<CollectiveRecord> opt_collectives;
  int64_t state_elements = 0;
};

// Lowers the training and optimizer graphs for every rank of `mesh`'s dp ranks, runs one step
// of each on its own thread of a simulated world on feeds_of(rank), and returns what each saw.
std::vector<RankRun> RunRanks(const trainer::TrainingArtifacts& a, const Mesh& mesh, const Propagation& train_p,
                              const Propagation& opt_p, const std::function<Feeds(int)>& feeds_of,
                              const std::map<std::string, Sharding>& output_wants = {}, int64_t bucket = 0) {
  const int dp = mesh.world_size();
  runtime::SimulatedWorld world(dp);
  std::vector<RankRun> got(dp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < dp; ++r)
    ranks.emplace_back([&, r] {
      auto train = LowerForRank(*a.training, mesh, train_p, r, "loss");
      auto opt = LowerForRank(*a.optimizer, mesh, opt_p, r, "", output_wants, bucket);
      if (!train.ok() || !opt.ok()) {
        got[r].step.status = train.ok() ? opt.status() : train.status();
        return;
      }
      got[r].train_collectives = train->collectives.size();
      got[r].opt_collectives = opt->collectives;
      trainer::TrainingArtifacts mine = CopyArtifacts(a);
      mine.training = std::move(train->graph);
      mine.optimizer = std::move(opt->graph);
      mine.eval = mine.training->Clone();  // unused here
      mine.eval->SetOutputs({mine.eval->FindValue("loss")});
      auto s = trainer::TrainingSession::Create(std::move(mine), testing::OneThread(world.rank(r)));
      if (!s.ok()) {
        got[r].step.status = s.status();
        return;
      }
      for (const std::string& p : a.params)
        for (const std::string& suf : a.state_suffixes) got[r].state_elements += (*s)->GetState(p + suf)->numel();
      got[r].step = Step(**s, feeds_of(r));
    });
  for (auto& t : ranks) t.join();
  return got;
}

class DataParallel : public ::testing::TestWithParam<int> {};

TEST_P(DataParallel, StepEqualsSingleRank) {
  const int dp = 2;
  // 0, 1: ZeRO stage; 2: stage 0 with the gradients all-reduced in 64 KiB buckets.
  const int zero = GetParam() == 1 ? 1 : 0;
  const int64_t bucket = GetParam() == 2 ? 64 << 10 : 0;
  trainer::TrainingArtifacts a = Artifacts();
  Tensor ids(DataType::kInt64, {kBatch, kSeq}), labels(DataType::kInt64, {kBatch, kSeq});
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    ids.data<int64_t>()[i] = (i * 37 + 11) % 256;
    labels.data<int64_t>()[i] = (i * 53 + 7) % 256;
  }
  // The reference: one rank, the whole batch.
  auto single = trainer::TrainingSession::Create(CopyArtifacts(a), testing::OneThread());
  ASSERT_TRUE(single.ok()) << single.status();
  StepResult want = Step(**single, {{"input_ids", ids}, {"labels", labels}});
  ASSERT_TRUE(want.status.ok()) << want.status;

  auto mesh = *Mesh::Parse("dp=2");
  Sharding batch = Sharding::Replicated(2);
  batch.dims[0] = {"dp"};
  auto train_p = Propagate(*a.training, mesh, {{"input_ids", batch}, {"labels", batch}});
  ASSERT_TRUE(train_p.ok()) << train_p.status();
  std::map<std::string, Sharding> grad_seeds, output_wants;
  if (zero == 1) {
    auto seeds = PrepareZero1(*a.optimizer, a.params, a.state_suffixes, mesh, &output_wants);
    ASSERT_TRUE(seeds.ok()) << seeds.status();
    grad_seeds = *seeds;
  } else {
    grad_seeds = PartialGradSeeds(a);
  }
  auto opt_p = Propagate(*a.optimizer, mesh, grad_seeds);
  ASSERT_TRUE(opt_p.ok()) << opt_p.status();

  const int64_t rows = kBatch / dp;
  const std::vector<RankRun> got = RunRanks(
      a, mesh, *train_p, *opt_p,
      [&](int r) { return Feeds{{"input_ids", Rows(ids, r * rows, rows)}, {"labels", Rows(labels, r * rows, rows)}}; },
      output_wants, bucket);
  // Per rank: every gradient all-reduced once in the optimizer, nothing in training but the loss
  // report. ZeRO-1: a ReduceScatter and an AllGather per parameter, and the norm's scalar.
  size_t want_opt = zero == 1 ? 2 * a.params.size() + 1 : a.params.size();
  if (bucket) {
    // Greedy buckets in reverse input order (the first capped at 1 MiB), a lone tensor keeping
    // its own AllReduce.
    std::vector<int64_t> sizes;
    for (const graph::Value* v : a.optimizer->inputs())
      if (v->name().size() >= 5 && v->name().substr(v->name().size() - 5) == "_grad")
        sizes.insert(sizes.begin(), v->shape().NumElements() * 4);
    want_opt = 0;
    int64_t bytes = 0, cap = 0;
    bool open = false;
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (open && bytes + sizes[k] <= cap) {
        bytes += sizes[k];
      } else {
        ++want_opt;
        open = true;
        bytes = sizes[k];
        cap = k == 0 ? std::min<int64_t>(bucket, 1 << 20) : bucket;
      }
    }
  }
  for (int r = 0; r < dp; ++r) {
    const StepResult& step = got[r].step;
    ASSERT_TRUE(step.status.ok()) << "rank " << r << ": " << step.status;
    std::string list;
    for (const auto& c : got[r].opt_collectives) list += c.kind + " " + c.value + " @" + c.reader + "; ";
    EXPECT_EQ(got[r].train_collectives, 1u) << "rank " << r;
    EXPECT_EQ(got[r].opt_collectives.size(), want_opt) << "rank " << r << ": " << list;
    EXPECT_NEAR(step.loss, want.loss, 1e-5 * want.loss) << "rank " << r;
    EXPECT_NEAR(step.norm, want.norm, 1e-5 * want.norm) << "rank " << r;
    // AdamW's first step moves each element by lr g / (|g| + eps): lr (1e-3) times its gradient's
    // sign, except where |g| is so small that its rounding shows in the step. Two ranks' sums
    // round such a gradient differently from one rank's (one element of blocks.0.attn.proj.weight
    // stepped 3e-6 apart on an AMD EPYC's OpenBLAS); so within 1e-5, a hundredth of a step, which
    // a flipped sign (2e-3) or a missed update (1e-3) still exceeds. The loss and the global norm
    // above check the gradients themselves.
    for (const auto& [name, t] : want.params)
      EXPECT_EQ(testing::CompareTensors(step.params.at(name), t, 1e-5, 1e-5), "") << "rank " << r << " " << name;
    // Optimizer state: all of it per rank without ZeRO, 1/dp of it with ZeRO-1.
    int64_t psi = 0;
    for (const auto& [name, t] : want.params) psi += t.numel();
    EXPECT_EQ(got[r].state_elements, 2 * psi / (zero == 1 ? dp : 1)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, DataParallel, ::testing::Values(0, 1, 2), [](const auto& info) {
  return info.param == 2 ? std::string("zero0_bucketed") : "zero" + std::to_string(info.param);
});

// BERT (models/train_variants/bert_mse) with its padding mask fused into Attention's bias: the
// bias [B, 1, 1, S] shards with the batch, and a dp=2 step (one row a rank, the second row
// padded) equals the single-rank step on both rows.
TEST(DataParallel, FusedAttentionBiasShardsWithTheBatch) {
  testing::VariantGolden golden = testing::LoadVariantGolden(CLEAVE_SOURCE_DIR, "bert_mse");
  golden.spec.fuse_attention = true;
  auto model = onnx_ext::LoadModel(golden.dir + "model.onnx");
  ASSERT_TRUE(model.ok()) << model.status();
  auto built = trainer::BuildTrainingArtifacts(**model, golden.spec);
  ASSERT_TRUE(built.ok()) << built.status();
  trainer::TrainingArtifacts a = std::move(*built);
  int biased = 0;
  for (const auto& n : a.training->nodes()) biased += n->op_type() == "Attention" && n->num_inputs() == 4;
  ASSERT_EQ(biased, 2);
  const Feeds feeds = testing::InOrder(golden.feeds, a.data_inputs);
  auto single = trainer::TrainingSession::Create(CopyArtifacts(a), testing::OneThread());
  ASSERT_TRUE(single.ok()) << single.status();
  StepResult want = Step(**single, feeds);
  ASSERT_TRUE(want.status.ok()) << want.status;

  const int dp = 2;
  auto mesh = *Mesh::Parse("dp=2");
  std::map<std::string, Sharding> seeds;
  for (const auto& [name, t] : feeds) {
    Sharding batch = Sharding::Replicated(static_cast<int>(t.dims().size()));
    batch.dims[0] = {"dp"};
    seeds[name] = batch;
  }
  auto train_p = Propagate(*a.training, mesh, seeds);
  ASSERT_TRUE(train_p.ok()) << train_p.status();
  auto opt_p = Propagate(*a.optimizer, mesh, PartialGradSeeds(a));
  ASSERT_TRUE(opt_p.ok()) << opt_p.status();
  const std::vector<RankRun> got = RunRanks(a, mesh, *train_p, *opt_p, [&](int r) {
    Feeds mine;
    for (const auto& [name, t] : feeds) mine.emplace_back(name, Rows(t, r, 1));
    return mine;
  });
  for (int r = 0; r < dp; ++r) {
    const StepResult& step = got[r].step;
    ASSERT_TRUE(step.status.ok()) << "rank " << r << ": " << step.status;
    EXPECT_NEAR(step.loss, want.loss, 1e-5 * want.loss) << "rank " << r;
    EXPECT_NEAR(step.norm, want.norm, 1e-5 * want.norm) << "rank " << r;
  }
}

}  // namespace
}  // namespace cleave::partition
