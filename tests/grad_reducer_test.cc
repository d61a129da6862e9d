// Gradient reductions that overlap the backward (trainer/grad_reducer.h): taken out of a
// data-parallel optimizer graph, started during the step's last backward on a duplicate of the
// rank's communicator, with results bit-identical to the graph's own collectives; the overlap
// shows in the profile.
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>

#include "graph/op_table.h"
#include "graph/verifier.h"
#include "gtest/gtest.h"
#include "partition/lower.h"
#include "runtime/profiler.h"
#include "runtime/simulated_communicator.h"
#include "tests/partition_test_util.h"
#include "trainer/autodiff.h"
#include "trainer/grad_reducer.h"
#include "trainer/training_session.h"

namespace cleave::trainer {
namespace {

constexpr int64_t kBatch = 4, kSeq = 32;
constexpr int kDp = 2;

TrainingArtifacts Artifacts() {
  TrainingSpec spec;
  spec.optimizer.max_grad_norm = 1.0f;
  spec.optimizer.weight_decay = 0.1f;
  return testing::BuildArtifacts("tiny_gpt", kBatch, kSeq, spec);
}

std::vector<TrainingArtifacts> PerRank(const TrainingArtifacts& a, int zero, int64_t bucket) {
  return testing::DataParallelArtifacts(a, kDp, zero, bucket);
}

Feeds Batch(int rank, int micro, int rows) {
  Tensor ids(DataType::kInt64, {rows, kSeq}), labels(DataType::kInt64, {rows, kSeq});
  for (int64_t i = 0; i < rows * kSeq; ++i) {
    const int64_t k = i + (rank * 7 + micro * 3) * rows * kSeq;
    ids.data<int64_t>()[i] = (k * 37 + 11) % 256;
    labels.data<int64_t>()[i] = (k * 53 + 7) % 256;
  }
  return {{"input_ids", ids}, {"labels", labels}};
}

struct RankRun {
  absl::Status status;
  std::vector<Tensor> params;
  std::vector<std::string> overlapped;
  int in_backward = -1, after = -1;
  int64_t backward_end_us = 0;  // when the last TrainStep of the last step returned
};

// `steps` steps on both ranks of a simulated world; each step runs TrainStep on the
// micro-batches with the `last_microbatch` flags `lasts`, then OptimizerStep.
std::vector<RankRun> Train(int zero, int64_t bucket, bool overlap, int steps, const std::vector<bool>& lasts,
                           std::deque<runtime::Profiler>* profilers = nullptr) {
  TrainingArtifacts a = Artifacts();
  std::vector<TrainingArtifacts> mine = PerRank(a, zero, bucket);
  runtime::SimulatedWorld world(kDp);
  std::vector<RankRun> got(kDp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kDp; ++r)
    ranks.emplace_back([&, r] {
      RankRun& out = got[r];
      TrainingSessionOptions o;
      o.intra_op_threads = 1;
      o.communicator = world.rank(r);
      o.overlap_grad_reduce = overlap;
      auto s = TrainingSession::Create(std::move(mine[r]), o);
      if (!s.ok()) {
        out.status = s.status();
        return;
      }
      TrainingSession& session = **s;
      if (profilers) session.set_profiler(&(*profilers)[r]);
      out.overlapped = session.overlapped_reductions();
      const int rows = static_cast<int>(kBatch / kDp);
      for (int step = 0; step < steps && out.status.ok(); ++step) {
        session.LazyResetGrad();
        for (size_t m = 0; m < lasts.size() && out.status.ok(); ++m)
          out.status = session.TrainStep(Batch(r, static_cast<int>(m) + step * 10, rows), lasts[m]).status();
        out.backward_end_us = runtime::Profiler::Micros(runtime::Profiler::Clock::now());
        if (out.status.ok()) out.status = session.OptimizerStep().status();
      }
      if (const GradientReducer* red = session.gradient_reducer()) {
        out.in_backward = red->launched_in_backward();
        out.after = red->launched_after_backward();
      }
      for (const std::string& p : session.parameter_names()) out.params.push_back(*session.GetState(p));
    });
  for (auto& t : ranks) t.join();
  return got;
}

void ExpectBitIdentical(const std::vector<RankRun>& got, const std::vector<RankRun>& want) {
  for (int r = 0; r < kDp; ++r) {
    ASSERT_TRUE(got[r].status.ok()) << "rank " << r << ": " << got[r].status;
    ASSERT_TRUE(want[r].status.ok()) << "rank " << r << ": " << want[r].status;
    ASSERT_EQ(got[r].params.size(), want[r].params.size());
    for (size_t i = 0; i < got[r].params.size(); ++i) {
      ASSERT_EQ(got[r].params[i].nbytes(), want[r].params[i].nbytes());
      EXPECT_EQ(std::memcmp(got[r].params[i].raw(), want[r].params[i].raw(), got[r].params[i].nbytes()), 0)
          << "rank " << r << " parameter " << i;
    }
  }
}

int Collectives(const graph::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->domain() == graph::kCleaveDomain && node->op_type() == op;
  return n;
}

TEST(GradientReducer, TakesBucketsAndGradientsOutOfTheOptimizerGraph) {
  TrainingArtifacts a = Artifacts();
  std::vector<TrainingArtifacts> mine = PerRank(a, 0, 16 << 10);
  graph::Graph& g = *mine[0].optimizer;
  std::vector<std::string> grads;
  for (const std::string& p : a.params) grads.push_back(GradName(p));
  const int before = Collectives(g, "AllReduce");
  auto red = GradientReducer::Extract(g, grads);
  ASSERT_TRUE(red.ok()) << red.status();
  // Every gradient's AllReduce is gone; what stays is the clipping norm's scalar, if any.
  EXPECT_EQ(Collectives(g, "AllReduce"), before - static_cast<int>(red->size()));
  std::vector<int> seen(a.params.size(), 0);
  int buckets = 0;
  for (const GradientReducer::Reduction& r : *red) {
    EXPECT_EQ(r.op, "AllReduce");
    EXPECT_EQ(r.group, std::vector<int>({0, 1}));
    ASSERT_NE(g.FindValue(r.result), nullptr);
    EXPECT_TRUE(g.FindValue(r.result)->is_graph_input()) << r.result;
    EXPECT_FALSE(g.FindValue(r.result)->consumers().empty()) << r.result;
    int64_t elements = 0;
    for (size_t k = 0; k < r.params.size(); ++k) {
      ++seen[r.params[k]];
      EXPECT_EQ(r.offsets[k], elements);
      elements += a.initial.at(a.params[r.params[k]]).numel();
    }
    EXPECT_EQ(elements, r.input_numel);
    EXPECT_LE(r.params.size() == 1 ? 0 : elements * 4, 16 << 10);
    buckets += r.params.size() > 1;
  }
  EXPECT_GT(buckets, 1);
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << a.params[i];
  EXPECT_TRUE(graph::Verify(g).ok()) << graph::Verify(g);

  // ZeRO-1: one ReduceScatter per gradient, to this rank's half of dim 0.
  std::vector<TrainingArtifacts> zero1 = PerRank(a, 1, 0);
  auto rs = GradientReducer::Extract(*zero1[1].optimizer, grads);
  ASSERT_TRUE(rs.ok()) << rs.status();
  ASSERT_EQ(rs->size(), a.params.size());
  for (const GradientReducer::Reduction& r : *rs) {
    EXPECT_EQ(r.op, "ReduceScatter");
    const Tensor& p = a.initial.at(a.params[r.params[0]]);
    EXPECT_EQ(r.result_dims[0] * kDp, p.dims()[0]) << r.label;
  }
  EXPECT_EQ(Collectives(*zero1[1].optimizer, "ReduceScatter"), 0);
}

class Overlap : public ::testing::TestWithParam<int> {};

// The reductions start during the backward and the updates are bit for bit those of the
// optimizer graph's own collectives: buckets (ZeRO 0) and ReduceScatter (ZeRO-1).
TEST_P(Overlap, StartsInTheBackwardAndMatchesTheGraphsCollectives) {
  const int zero = GetParam();
  const int64_t bucket = zero == 0 ? 16 << 10 : 0;
  std::vector<RankRun> off = Train(zero, bucket, false, 3, {true});
  std::vector<RankRun> on = Train(zero, bucket, true, 3, {true});
  ExpectBitIdentical(on, off);
  for (int r = 0; r < kDp; ++r) {
    EXPECT_TRUE(off[r].overlapped.empty());
    ASSERT_GT(on[r].overlapped.size(), 1u) << "rank " << r;
    EXPECT_EQ(on[r].in_backward, static_cast<int>(on[r].overlapped.size())) << "rank " << r;
    EXPECT_EQ(on[r].after, 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, Overlap, ::testing::Values(0, 1),
                         [](const auto& info) { return "zero" + std::to_string(info.param); });

// Reductions started in a backward that was not the last one are redone on the final
// gradients; a backward flagged as not the last starts nothing.
TEST(GradientReducer, LaterMicroBatchRestartsTheReductions) {
  std::vector<RankRun> off = Train(0, 16 << 10, false, 2, {true, false});
  std::vector<RankRun> on = Train(0, 16 << 10, true, 2, {true, false});
  ExpectBitIdentical(on, off);
  for (int r = 0; r < kDp; ++r) {
    EXPECT_EQ(on[r].in_backward, 0) << "rank " << r;
    EXPECT_EQ(on[r].after, static_cast<int>(on[r].overlapped.size())) << "rank " << r;
  }
  std::vector<RankRun> off2 = Train(0, 16 << 10, false, 2, {false, true});
  std::vector<RankRun> on2 = Train(0, 16 << 10, true, 2, {false, true});
  ExpectBitIdentical(on2, off2);
  for (int r = 0; r < kDp; ++r) EXPECT_EQ(on2[r].after, 0) << "rank " << r;
}

TEST(GradientReducer, OverlapShowsInTheProfile) {
  std::deque<runtime::Profiler> profilers;
  for (int r = 0; r < kDp; ++r) profilers.emplace_back("rank " + std::to_string(r), r);
  std::vector<RankRun> on = Train(0, 16 << 10, true, 1, {true}, &profilers);
  for (int r = 0; r < kDp; ++r) {
    ASSERT_TRUE(on[r].status.ok()) << on[r].status;
    const runtime::Profiler& p = profilers[r];
    const std::vector<std::string> tracks = p.tracks();
    // The third: the training graph's own collective (the loss summed over dp), asynchronous.
    ASSERT_EQ(tracks.size(), 3u);
    EXPECT_EQ(tracks[0], "compute");
    EXPECT_EQ(tracks[1], "gradient reduction");
    EXPECT_EQ(tracks[2], "collectives");
    int reductions = 0, nodes = 0;
    for (const runtime::Profiler::Event& e : p.events()) {
      if (e.track != 1) {
        ++nodes;
        continue;
      }
      ++reductions;
      EXPECT_EQ(e.category, "comm");
      // Every reduction was handed to its thread while the backward still ran (when the
      // thread then gets a core is the scheduler's business; bench/ measures the overlap).
      int64_t queued = -1;
      for (const auto& [k, v] : e.args)
        if (k == "queued_us") queued = std::stoll(v);
      EXPECT_GT(queued, 0) << e.name;
      EXPECT_LT(queued, on[r].backward_end_us) << e.name;
      EXPECT_GE(e.start_us, queued) << e.name;
    }
    EXPECT_EQ(reductions, static_cast<int>(on[r].overlapped.size()));
    EXPECT_GT(nodes, 100);
    const std::string trace = p.ToChromeTrace();
    EXPECT_NE(trace.find("\"thread_name\", \"pid\": " + std::to_string(r) + ", \"tid\": 1, \"args\": {\"name\": "
                         "\"gradient reduction\"}"),
              std::string::npos);
  }
  const std::string path = ::testing::TempDir() + "/reducer_trace.json";
  ASSERT_TRUE(profilers[0].WriteChromeTrace(path).ok());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), profilers[0].ToChromeTrace());
}

}  // namespace
}  // namespace cleave::trainer
