// Asynchronous collectives (runtime/async_schedule.h, runtime/comm_queue.h, the executor): the
// run order launches a collective as soon as its input is ready and runs the work that does
// not need its result before the work that does; results are bit-identical to collectives run
// in line, for a graph on a simulated world and for partitioned training (tensor parallelism,
// ZeRO-2, sequence parallelism); a collective that fails or times out names its node.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/async_schedule.h"
#include "runtime/comm_queue.h"
#include "runtime/inference_session.h"
#include "runtime/profiler.h"
#include "runtime/simulated_communicator.h"
#include "tests/partition_test_util.h"
#include "trainer/partition_plan.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

bool IsAsync(const graph::Node* n) { return n->op_type() == "AllReduce" || n->op_type() == "ReduceScatter"; }
bool InLine(const graph::Node* n) { return n->op_type() == "Send" || n->op_type() == "Recv"; }
bool Never(const graph::Node*) { return false; }

// Node names in schedule order.
std::vector<std::string> Names(const runtime::AsyncSchedule& s) {
  std::vector<std::string> out;
  for (const graph::Node* n : s.order) out.push_back(n->name());
  return out;
}

runtime::AsyncSchedule Schedule(const graph::Graph& g, runtime::AsyncScheduleOptions o = {}) {
  auto order = g.TopologicalOrder();
  EXPECT_TRUE(order.ok()) << order.status();
  return runtime::ScheduleAsync(g, *order, IsAsync, InLine, Never, o);
}

int WaitOf(const graph::Graph& g, const runtime::AsyncSchedule& s, const std::string& node) {
  return s.wait_before.at(g.FindValue(node)->producer());
}

// Three gradients reduced as the backward goes, each only accumulated into an output: the
// accumulations wait, and at most two collectives are pending at a time.
TEST(AsyncSchedule, OutputOnlyReadersWaitAndAtMostTwoArePending) {
  auto g = graph::ParseGraph(R"(
    input a: float32[4]
    input b: float32[4]
    g1 = Relu(a)
    r1 = ai.cleave.AllReduce(g1) {group = [0, 1]}
    o1 = Add(r1, b)
    h1 = Sin(g1)
    g2 = Relu(h1)
    r2 = ai.cleave.AllReduce(g2) {group = [0, 1]}
    o2 = Add(r2, b)
    h2 = Sin(g2)
    g3 = Relu(h2)
    r3 = ai.cleave.AllReduce(g3) {group = [0, 1]}
    o3 = Add(r3, b)
    h3 = Sin(g3)
    output o1
    output o2
    output o3
    output h3
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  const runtime::AsyncSchedule s = Schedule(**g);
  EXPECT_EQ(Names(s), (std::vector<std::string>{"g1", "r1", "h1", "g2", "r2", "h2", "g3", "r3", "o1", "h3", "o2", "o3"}));
  EXPECT_EQ(WaitOf(**g, s, "r1"), 7);   // launching r3 makes three: r1 is waited for first
  EXPECT_EQ(WaitOf(**g, s, "r2"), 10);  // before o2
  EXPECT_EQ(WaitOf(**g, s, "r3"), 11);  // before o3

  // One in flight: each launch waits for the one before.
  const runtime::AsyncSchedule one = Schedule(**g, {.max_in_flight = 1});
  EXPECT_EQ(WaitOf(**g, one, "r1"), 4);  // before r2
  EXPECT_EQ(WaitOf(**g, one, "r2"), 7);  // before r3
}

// A reader on the way to the rest of the graph lets at most `lookahead` nodes run ahead of it;
// a message never runs ahead of it.
TEST(AsyncSchedule, IndependentWorkRunsFirstWithinTheLookahead) {
  auto g = graph::ParseGraph(R"(
    input x: float32[4]
    r = ai.cleave.AllReduce(x) {group = [0, 1]}
    y = Add(r, x)
    a1 = Sin(x)
    done = ai.cleave.Send(a1) {peer = 1, tag = 0}
    a2 = Sin(a1)
    a3 = Sin(a2)
    z = Add(y, a3)
    output z
    output done
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  const runtime::AsyncSchedule wide = Schedule(**g);
  EXPECT_EQ(Names(wide), (std::vector<std::string>{"r", "a1", "a2", "a3", "y", "done", "z"}));
  EXPECT_EQ(WaitOf(**g, wide, "r"), 4);
  const runtime::AsyncSchedule narrow = Schedule(**g, {.lookahead = 2});
  EXPECT_EQ(Names(narrow), (std::vector<std::string>{"r", "a1", "y", "done", "a2", "a3", "z"}));
  EXPECT_EQ(WaitOf(**g, narrow, "r"), 2);
  // Without asynchronous nodes the order is the topological one.
  auto order = (*g)->TopologicalOrder();
  ASSERT_TRUE(order.ok());
  const runtime::AsyncSchedule none = runtime::ScheduleAsync(**g, *order, Never, InLine, Never);
  EXPECT_EQ(none.order, *order);
  EXPECT_TRUE(none.wait_before.empty());
}

// A message waits for nothing that only writes graph outputs (ZeRO-2's accumulation into a
// gradient shard must not hold up a pipeline's Send).
TEST(AsyncSchedule, AMessagePassesAWaitingOutputOnlyReader) {
  auto g = graph::ParseGraph(R"(
    input a: float32[4]
    input b: float32[4]
    g = Relu(a)
    r = ai.cleave.ReduceScatter(g) {group = [0, 1]}
    o = Add(r, b)
    h = Sin(g)
    done = ai.cleave.Send(h) {peer = 1, tag = 0}
    output o
    output done
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  const runtime::AsyncSchedule s = Schedule(**g);
  EXPECT_EQ(Names(s), (std::vector<std::string>{"g", "r", "h", "done", "o"}));
  EXPECT_EQ(WaitOf(**g, s, "r"), 4);
}

// A linear layer's backward as autodiff writes it, dW first: the dX product moves ahead so
// that its reduction starts at once, and the dW product runs while it is in flight.
TEST(AsyncSchedule, WorkTowardTheNextCollectiveRunsFirst) {
  auto g = graph::ParseGraph(R"(
    input dy: float32[4,4]
    input x: float32[4,4]
    input w: float32[4,4]
    dw = MatMul(x, dy)
    acc = Relu(dw)
    dx = MatMul(dy, w)
    r = ai.cleave.AllReduce(dx) {group = [0, 1]}
    next = Sin(r)
    output acc
    output next
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  const runtime::AsyncSchedule s = Schedule(**g);
  EXPECT_EQ(Names(s), (std::vector<std::string>{"dx", "r", "dw", "acc", "next"}));
  EXPECT_EQ(WaitOf(**g, s, "r"), 4);
}

// A dX reduced while the dW product (which does not need it) runs, on two simulated ranks.
constexpr const char* kGraph = R"(
  input x: float32[8,8]
  input w: float32[8,8]
  dx = MatMul(x, w)
  r = ai.cleave.AllReduce(dx) {group = [0, 1]}
  dw = MatMul(w, x)
  dw2 = Relu(dw)
  y = Add(r, x)
  z = MatMul(y, w)
  output z
  output dw2
  output r
)";

struct GraphRun {
  absl::Status status;
  std::vector<Tensor> outputs;
  std::vector<int> ready;  // outputs in the order the run reported them final
  std::vector<runtime::AsyncCollective> async;
};

std::vector<GraphRun> RunOnTwoRanks(bool async, int ranks_running = 2,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  runtime::SimulatedWorld world(2, timeout);
  std::vector<GraphRun> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks_running; ++r)
    threads.emplace_back([&, r] {
      GraphRun& out = got[r];
      std::unique_ptr<runtime::CommQueue> queue;
      if (async) {
        auto dup = world.rank(r)->Duplicate();
        if (!dup.ok()) {
          out.status = dup.status();
          return;
        }
        queue = std::make_unique<runtime::CommQueue>(*std::move(dup));
      }
      auto g = graph::ParseGraph(kGraph);
      if (!g.ok()) {
        out.status = g.status();
        return;
      }
      SessionOptions so;
      so.intra_op_threads = 1;
      so.optimize = false;  // the graph as written
      so.communicator = world.rank(r);
      so.collective_queue = queue.get();
      auto s = InferenceSession::FromGraph(*std::move(g), so);
      if (!s.ok()) {
        out.status = s.status();
        return;
      }
      out.async = (*s)->async_collectives();
      Tensor x(DataType::kFloat32, {8, 8}), w(DataType::kFloat32, {8, 8});
      for (int i = 0; i < 64; ++i) {
        x.data<float>()[i] = 0.01f * static_cast<float>((i * 7 + r * 5) % 23) - 0.1f;
        w.data<float>()[i] = 0.02f * static_cast<float>((i * 3 + 1) % 17) - 0.15f;
      }
      RunOptions ro;
      ro.output_ready = [&](int o) { out.ready.push_back(o); };
      for (int run = 0; run < 2 && out.status.ok(); ++run) {  // the second run uses the memory plan
        out.ready.clear();
        out.outputs.assign(3, Tensor());
        for (Tensor& t : out.outputs) t = Tensor(DataType::kFloat32, {8, 8});
        out.status = (*s)->RunInto({{"x", x}, {"w", w}}, out.outputs, ro);
      }
    });
  for (auto& t : threads) t.join();
  return got;
}

TEST(AsyncCollectives, OverlapIndependentWorkAndMatchTheInLineRun) {
  const std::vector<GraphRun> in_line = RunOnTwoRanks(false), overlapped = RunOnTwoRanks(true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(in_line[r].status.ok()) << in_line[r].status;
    ASSERT_TRUE(overlapped[r].status.ok()) << overlapped[r].status;
    EXPECT_TRUE(in_line[r].async.empty());
    // Launched right after dx; the dW product and its Relu run before the wait.
    ASSERT_EQ(overlapped[r].async.size(), 1u);
    EXPECT_EQ(overlapped[r].async[0].node, "r");
    EXPECT_EQ(overlapped[r].async[0].launch, 1);
    EXPECT_EQ(overlapped[r].async[0].wait, 4);
    // Reported final when waited for: after dw2, where the in-line run reports it first.
    EXPECT_EQ(in_line[r].ready, (std::vector<int>{2, 1, 0}));
    EXPECT_EQ(overlapped[r].ready, (std::vector<int>{1, 2, 0}));
    ASSERT_EQ(overlapped[r].outputs.size(), 3u);
    for (int o = 0; o < 3; ++o)
      EXPECT_EQ(std::memcmp(overlapped[r].outputs[o].raw(), in_line[r].outputs[o].raw(),
                            in_line[r].outputs[o].nbytes()),
                0)
          << "rank " << r << " output " << o;
  }
  // The reduction really happened: both ranks hold the same sum.
  EXPECT_EQ(std::memcmp(overlapped[0].outputs[2].raw(), overlapped[1].outputs[2].raw(),
                        overlapped[0].outputs[2].nbytes()),
            0);
}

TEST(AsyncCollectives, APeerThatNeverComesIsAnErrorNamingTheCollective) {
  const std::vector<GraphRun> got = RunOnTwoRanks(true, /*ranks_running=*/1, std::chrono::milliseconds(300));
  ASSERT_FALSE(got[0].status.ok());
  EXPECT_EQ(got[0].status.code(), absl::StatusCode::kDeadlineExceeded) << got[0].status;
  EXPECT_NE(got[0].status.message().find("AllReduce 'r'"), std::string::npos) << got[0].status;
}

// Partitioned training: the plans' in-graph collectives (tp's AllReduces, ZeRO-2's
// ReduceScatters, sp's gathers and scatters) run asynchronously, and two steps give the same
// parameters bit for bit as with every collective in line.
struct PlanCase {
  const char* mesh;
  int zero;
  bool sp;
};

class AsyncTraining : public ::testing::TestWithParam<PlanCase> {};

TEST_P(AsyncTraining, MatchesInLineCollectivesBitForBit) {
  const PlanCase& pc = GetParam();
  trainer::PlanConfig c;
  c.model = std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx";
  c.mesh = pc.mesh;
  c.batch = 4;
  c.seq = 16;
  c.zero = pc.zero;
  c.sp = pc.sp;
  c.bucket_bytes = 0;
  c.spec.optimizer.max_grad_norm = 1.0f;
  c.spec.optimizer.weight_decay = 0.1f;
  auto built = trainer::BuildPlan(c);
  ASSERT_TRUE(built.ok()) << built.status();
  const int world = built->mesh.world_size(), dp = built->mesh.size("dp");
  std::vector<std::vector<Tensor>> params[2];  // [overlap][rank]
  int with_work_between = 0, launched = 0;
  double busy = 0;
  for (int overlap = 0; overlap < 2; ++overlap) {
    auto plan = trainer::BuildPlan(c);
    ASSERT_TRUE(plan.ok());
    runtime::SimulatedWorld sim(world, std::chrono::seconds(60));
    std::vector<absl::Status> status(world);
    params[overlap].resize(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        auto run = [&]() -> absl::Status {
          trainer::TrainingSessionOptions o;
          o.intra_op_threads = 1;
          o.communicator = sim.rank(r);
          o.overlap_collectives = overlap == 1;
          ASSIGN_OR_RETURN(auto s, trainer::TrainingSession::Create(std::move(plan->ranks[r].artifacts), o));
          const int64_t rows = c.batch / dp;
          for (int step = 0; step < 2; ++step) {
            Tensor ids(DataType::kInt64, {rows, c.seq}), labels(DataType::kInt64, {rows, c.seq});
            const int shard = built->mesh.Coord(r, "dp");
            for (int64_t i = 0; i < rows * c.seq; ++i) {
              ids.data<int64_t>()[i] = (i * 37 + 5 + shard * 13 + step * 3) % 256;
              labels.data<int64_t>()[i] = (i * 11 + 3 + shard * 7 + step) % 256;
            }
            RETURN_IF_ERROR(s->TrainStep({{"input_ids", ids}, {"labels", labels}}).status());
            RETURN_IF_ERROR(s->OptimizerStep().status());
          }
          if (r == 0 && overlap == 1) {
            for (const runtime::AsyncCollective& a : s->async_collectives()) {
              ++launched;
              with_work_between += a.wait > a.launch + 1;
            }
            if (s->collective_queue()) busy = s->collective_queue()->time_spent().busy;
          }
          if (overlap == 0 && s->collective_queue()) return absl::InternalError("a queue without overlap");
          for (const std::string& p : s->parameter_names()) {
            ASSIGN_OR_RETURN(Tensor t, s->GetState(p));
            params[overlap][r].push_back(t);
          }
          return absl::OkStatus();
        };
        status[r] = run();
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  EXPECT_GT(launched, 0);
  EXPECT_GT(with_work_between, 0) << "no collective had work to overlap";
  EXPECT_GT(busy, 0.0);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(params[1][r].size(), params[0][r].size());
    for (size_t i = 0; i < params[0][r].size(); ++i)
      EXPECT_EQ(std::memcmp(params[1][r][i].raw(), params[0][r][i].raw(), params[0][r][i].nbytes()), 0)
          << "rank " << r << " parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, AsyncTraining,
                         ::testing::Values(PlanCase{"tp=2", 0, false}, PlanCase{"dp=2", 2, false},
                                           PlanCase{"dp=2,tp=2", 1, true}),
                         [](const auto& info) {
                           std::string name = std::string(info.param.mesh) + "_zero" +
                                              std::to_string(info.param.zero) + (info.param.sp ? "_sp" : "");
                           for (char& ch : name)
                             if (ch == '=' || ch == ',') ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace cleave
