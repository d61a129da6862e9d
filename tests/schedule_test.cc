// Pipeline schedules (partition/schedule.h): the per-rank lists GPipe, 1F1B and interleaved 1F1B
// produce, and the simulator that times them and rejects broken lists. Expected bubbles are the
// closed forms from the GPipe and Megatron papers, (p-1)/(m+p-1) and (p-1)/(v m + p-1); the
// expected lists are written out by hand from each schedule's definition.
#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "partition/schedule.h"

namespace cleave {
namespace {

using partition::Action;
using partition::ActionKind;
using partition::BuildSchedule;
using partition::FormatActions;
using partition::Schedule;
using partition::ScheduleKind;
using partition::ScheduleStats;
using partition::SimOptions;
using partition::SimulateSchedule;

Schedule Build(ScheduleKind kind, int p, int m, int v = 1) {
  auto s = BuildSchedule(kind, p, m, v);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

ScheduleStats Simulate(const Schedule& s, const SimOptions& o = {}) {
  auto stats = SimulateSchedule(s, o);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? *stats : ScheduleStats{};
}

// The compute actions of one rank, "F0 F1 B0 ...".
std::string ComputeOrder(const std::vector<Action>& actions, bool with_chunk) {
  std::vector<Action> compute;
  for (const Action& a : actions)
    if (a.IsCompute()) compute.push_back(a);
  return FormatActions(compute, with_chunk);
}

// Index of the action printed as `name` in `actions`; -1 when absent.
int Find(const std::vector<Action>& actions, const std::string& name, bool with_chunk = false) {
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].ToString(with_chunk) == name) return static_cast<int>(i);
  return -1;
}

void ExpectErrorContains(const absl::Status& s, const std::vector<std::string>& needles) {
  ASSERT_FALSE(s.ok());
  for (const std::string& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << n << " in: " << s;
}

TEST(ScheduleKind, ParsesTheThreeNamesAndRejectsOthers) {
  EXPECT_EQ(*partition::ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*partition::ParseScheduleKind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_EQ(*partition::ParseScheduleKind("interleaved"), ScheduleKind::kInterleaved1F1B);
  EXPECT_STREQ(partition::ScheduleKindName(ScheduleKind::kInterleaved1F1B), "interleaved");
  ExpectErrorContains(partition::ParseScheduleKind("zb-h1").status(),
                      {"unknown pipeline schedule 'zb-h1'", "expected gpipe, 1f1b or interleaved"});
}

TEST(ScheduleAction, PrintsKindMicroBatchAndChunk) {
  EXPECT_EQ((Action{ActionKind::kForward, 3, 0, -1}).ToString(), "F3");
  EXPECT_EQ((Action{ActionKind::kBackward, 3, 0, -1}).ToString(), "B3");
  EXPECT_EQ((Action{ActionKind::kSendActivation, 3, 0, 1}).ToString(), "SEND_F3");
  EXPECT_EQ((Action{ActionKind::kRecvGrad, 3, 0, 1}).ToString(), "RECV_B3");
  EXPECT_EQ((Action{ActionKind::kForward, 3, 1, -1}).ToString(true), "F3.1");
  EXPECT_EQ((Action{ActionKind::kSendGrad, 2, 1, 0}).ToString(true), "SEND_B2.1");
}

TEST(ScheduleBuild, GPipeRunsAllForwardsThenBackwardsInTheSameOrder) {
  Schedule s = Build(ScheduleKind::kGPipe, 2, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(FormatActions(s[0]), "F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1");
  EXPECT_EQ(FormatActions(s[1]), "RECV_F0 F0 RECV_F1 F1 B0 SEND_B0 B1 SEND_B1");
  EXPECT_EQ(s[0][1].peer, 1);
  EXPECT_EQ(s[1][5].peer, 0);
}

TEST(ScheduleBuild, OneFOneBHasWarmupSteadyAndCooldown) {
  // p=3, m=4: rank r warms up with p-r-1 forwards.
  Schedule s = Build(ScheduleKind::k1F1B, 3, 4);
  EXPECT_EQ(ComputeOrder(s[0], false), "F0 F1 F2 B0 F3 B1 B2 B3");
  EXPECT_EQ(ComputeOrder(s[1], false), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(ComputeOrder(s[2], false), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(FormatActions(s[1]),
            "RECV_F0 F0 SEND_F0 RECV_F1 F1 SEND_F1 RECV_B0 B0 SEND_B0 RECV_F2 F2 SEND_F2 RECV_B1 B1 "
            "SEND_B1 RECV_F3 F3 SEND_F3 RECV_B2 B2 SEND_B2 RECV_B3 B3 SEND_B3");
  // Fewer micro-batches than the warmup wants: rank 0 runs all of them first.
  Schedule few = Build(ScheduleKind::k1F1B, 4, 2);
  EXPECT_EQ(ComputeOrder(few[0], false), "F0 F1 B0 B1");
}

TEST(ScheduleBuild, InterleavedFollowsMegatronsGroupsOfPMicroBatches) {
  // p=2, m=4, v=2. Forward k runs micro-batch (k/4)*2 + k%2 on chunk (k%4)/2; backwards the same
  // with chunks reversed. Warmup: 2(p-r-1) + (v-1)p = 4 on rank 0 and 2 on rank 1.
  Schedule s = Build(ScheduleKind::kInterleaved1F1B, 2, 4, 2);
  EXPECT_EQ(ComputeOrder(s[0], true),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(ComputeOrder(s[1], true),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Rank 0's chunk 1 is virtual stage 2: it receives from rank 1 (stage 1) and sends to rank 1
  // (stage 3), while rank 1's chunk 1 is the last stage and starts the backward.
  const int recv = Find(s[0], "RECV_F0.1", true);
  ASSERT_GE(recv, 0);
  EXPECT_EQ(s[0][recv].peer, 1);
  EXPECT_EQ(s[0][recv + 1].ToString(true), "F0.1");
  EXPECT_EQ(s[0][recv + 2].ToString(true), "SEND_F0.1");
  EXPECT_EQ(Find(s[1], "SEND_F0.1", true), -1);
  EXPECT_EQ(Find(s[1], "RECV_B0.1", true), -1);
  // With m == p Megatron runs every forward first.
  Schedule square = Build(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
  EXPECT_EQ(ComputeOrder(square[1], true), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST(ScheduleBuild, EndStagesHaveNoOutwardTransfers) {
  for (auto [kind, v] : {std::pair{ScheduleKind::kGPipe, 1}, {ScheduleKind::k1F1B, 1},
                         {ScheduleKind::kInterleaved1F1B, 2}}) {
    Schedule s = Build(kind, 4, 8, v);
    for (const Action& a : s[0]) {
      if (a.chunk != 0) continue;  // rank 0's later chunks are interior virtual stages
      EXPECT_NE(a.kind, ActionKind::kRecvActivation) << a.ToString(true);
      EXPECT_NE(a.kind, ActionKind::kSendGrad) << a.ToString(true);
    }
    for (const Action& a : s[3]) {
      if (a.chunk != v - 1) continue;
      EXPECT_NE(a.kind, ActionKind::kSendActivation) << a.ToString(true);
      EXPECT_NE(a.kind, ActionKind::kRecvGrad) << a.ToString(true);
    }
  }
}

TEST(ScheduleSimulation, BubbleMatchesTheClosedForms) {
  for (double ratio : {1.0, 2.0}) {
    for (int p : {2, 4}) {
      for (int m : {4, 8}) {
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " backward/forward=" << ratio);
        const SimOptions o{1.0, ratio};
        const double flat = static_cast<double>(p - 1) / (m + p - 1);
        for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
          ScheduleStats st = Simulate(Build(kind, p, m), o);
          EXPECT_NEAR(st.bubble, flat, 1e-12) << partition::ScheduleKindName(kind);
          EXPECT_NEAR(st.makespan, (m + p - 1) * (1 + ratio), 1e-12);
          for (double b : st.busy) EXPECT_NEAR(b, m * (1 + ratio), 1e-12);
        }
        // A chunk holds half a rank's layers, so its F and B cost half as much.
        const int v = 2;
        ScheduleStats st = Simulate(Build(ScheduleKind::kInterleaved1F1B, p, m, v), o);
        EXPECT_NEAR(st.bubble, static_cast<double>(p - 1) / (v * m + p - 1), 1e-12);
        EXPECT_NEAR(st.makespan, (m + (p - 1.0) / v) * (1 + ratio), 1e-12);
        for (double b : st.busy) EXPECT_NEAR(b, m * (1 + ratio), 1e-12);
      }
    }
  }
}

TEST(ScheduleSimulation, OneFOneBHoldsPActivationsWhereGPipeHoldsM) {
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m);
      ScheduleStats onef = Simulate(Build(ScheduleKind::k1F1B, p, m));
      ScheduleStats gpipe = Simulate(Build(ScheduleKind::kGPipe, p, m));
      EXPECT_EQ(onef.peak_in_flight[0], p);
      EXPECT_EQ(gpipe.peak_in_flight[0], m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(onef.peak_in_flight[r], p - r);
        EXPECT_EQ(gpipe.peak_in_flight[r], m);
      }
      // Interleaved rank 0 holds its warmup plus one chunk activations (each 1/v of a stage's),
      // all v*m of them when m == p.
      const int v = 2;
      ScheduleStats inter = Simulate(Build(ScheduleKind::kInterleaved1F1B, p, m, v));
      const int warmup = m == p ? v * m : std::min(2 * (p - 1) + (v - 1) * p, v * m);
      EXPECT_EQ(inter.peak_in_flight[0], std::min(warmup + 1, v * m));
    }
  }
}

TEST(ScheduleSimulation, InterleavingMultipliesPointToPointMessages) {
  // Each micro-batch crosses every boundary between consecutive virtual stages twice.
  for (int p : {2, 4}) {
    for (int m : {4, 8}) {
      EXPECT_EQ(Simulate(Build(ScheduleKind::k1F1B, p, m)).p2p_messages, 2 * m * (p - 1));
      EXPECT_EQ(Simulate(Build(ScheduleKind::kInterleaved1F1B, p, m, 2)).p2p_messages, 2 * m * (2 * p - 1));
    }
  }
}

TEST(ScheduleSimulation, EveryBuiltListRunsWithoutDeadlock) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 10; ++m) {
      for (int v = 1; v <= 3; ++v) {
        for (ScheduleKind kind :
             {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B}) {
          const bool interleaved = kind == ScheduleKind::kInterleaved1F1B;
          if (interleaved != (v > 1) || (interleaved && (p < 2 || m % p != 0))) continue;
          SCOPED_TRACE(testing::Message() << partition::ScheduleKindName(kind) << " p=" << p << " m=" << m
                                          << " v=" << v);
          ScheduleStats st = Simulate(Build(kind, p, m, v), SimOptions{1.0, 2.0});
          ASSERT_EQ(st.busy.size(), static_cast<size_t>(p));
          for (double b : st.busy) EXPECT_NEAR(b, 3.0 * m, 1e-9);
          EXPECT_GE(st.bubble, 0.0);
        }
      }
    }
  }
}

TEST(ScheduleSimulation, GridShowsEachRankPerTimeStep) {
  // GPipe p=2, m=2, unit costs: rank 1 starts a step late, and rank 0's backwards wait for
  // rank 1's gradients.
  ScheduleStats st = Simulate(Build(ScheduleKind::kGPipe, 2, 2));
  EXPECT_EQ(st.grid,
            "t | rank0 rank1\n"
            "0 | F0    .\n"
            "1 | F1    F0\n"
            "2 | .     F1\n"
            "3 | .     B0\n"
            "4 | B0    B1\n"
            "5 | B1    .\n");
  // Interleaved chunks cost 1/v, so rows are half steps and labels carry the chunk.
  ScheduleStats inter = Simulate(Build(ScheduleKind::kInterleaved1F1B, 2, 2, 2));
  EXPECT_EQ(inter.grid.substr(0, inter.grid.find('\n', inter.grid.find('\n') + 1) + 1),
            "t   | rank0 rank1\n"
            "0   | F0.0  .\n");
  EXPECT_NE(inter.grid.find("0.5 | F1.0  F0.0\n"), std::string::npos) << inter.grid;
}

// Removes the action printed as `name` from `list`.
void Drop(std::vector<Action>& list, const std::string& name) {
  const int i = Find(list, name);
  ASSERT_GE(i, 0) << name;
  list.erase(list.begin() + i);
}

TEST(ScheduleSimulation, DroppedSendOrRecvIsReportedWithItsRank) {
  Schedule no_send = Build(ScheduleKind::k1F1B, 2, 4);
  Drop(no_send[0], "SEND_F1");
  ExpectErrorContains(SimulateSchedule(no_send).status(),
                      {"rank 1 action", "(RECV_F1) would wait forever", "rank 0 never sends it"});
  Schedule no_recv = Build(ScheduleKind::k1F1B, 2, 4);
  Drop(no_recv[0], "RECV_B1");
  ExpectErrorContains(SimulateSchedule(no_recv).status(),
                      {"rank 1 action", "(SEND_B1) is never received: rank 0 has no RECV_B1"});
}

TEST(ScheduleSimulation, RecvAheadOfTheSendItDependsOnDeadlocks) {
  // Rank 0 waits for B0's gradient before sending F0's activation, which rank 1 needs to
  // produce that gradient.
  Schedule s = Build(ScheduleKind::k1F1B, 2, 4);
  std::vector<Action>& r0 = s[0];
  const int recv = Find(r0, "RECV_B0");
  ASSERT_EQ(FormatActions({r0.begin() + recv, r0.begin() + recv + 2}), "RECV_B0 B0");
  std::vector<Action> moved(r0.begin() + recv, r0.begin() + recv + 2);
  r0.erase(r0.begin() + recv, r0.begin() + recv + 2);
  r0.insert(r0.begin() + Find(r0, "SEND_F0"), moved.begin(), moved.end());
  ASSERT_EQ(FormatActions({r0.begin(), r0.begin() + 4}), "F0 RECV_B0 B0 SEND_F0");
  ExpectErrorContains(SimulateSchedule(s).status(),
                      {"deadlocks", "rank 0 is stuck at t=1 on action 1 (RECV_B0)",
                       "which rank 1 sends only at its action",
                       "rank 1 is stuck at t=0 on action 0 (RECV_F0), which rank 0 sends only at its action 3"});

  // Three ranks: the middle one waits for a gradient before forwarding; rank 0 then waits too.
  Schedule three = Build(ScheduleKind::k1F1B, 3, 3);
  std::vector<Action>& r1 = three[1];
  const int send = Find(r1, "SEND_F0");
  const Action recv_b0 = r1[Find(r1, "RECV_B0")];
  r1.erase(r1.begin() + Find(r1, "RECV_B0"));
  r1.insert(r1.begin() + send, recv_b0);
  ExpectErrorContains(SimulateSchedule(three).status(),
                      {"deadlocks", "rank 0 is stuck", "(RECV_B0)", "rank 1 is stuck", "rank 2 is stuck",
                       "(RECV_F0)"});
}

TEST(ScheduleSimulation, LocalOrderErrorsNameTheRankAndActions) {
  Schedule dup = Build(ScheduleKind::kGPipe, 2, 4);
  dup[1].push_back(dup[1][Find(dup[1], "F2")]);
  ExpectErrorContains(SimulateSchedule(dup).status(), {"rank 1 runs F2 twice"});

  Schedule swapped = Build(ScheduleKind::kGPipe, 2, 2);  // rank 1: RECV_F0 F0 RECV_F1 F1 B0 ...
  std::swap(swapped[1][1], swapped[1][4]);
  ExpectErrorContains(SimulateSchedule(swapped).status(),
                      {"rank 1 runs B0 (action 1) before F0 (action 4)"});

  Schedule no_b = Build(ScheduleKind::k1F1B, 2, 4);
  Drop(no_b[0], "B3");
  ExpectErrorContains(SimulateSchedule(no_b).status(), {"rank 0 never runs B3"});

  Schedule early = Build(ScheduleKind::k1F1B, 2, 4);  // rank 1 computes F1 before receiving it
  const int f1 = Find(early[1], "F1");
  std::swap(early[1][f1 - 1], early[1][f1]);
  ExpectErrorContains(SimulateSchedule(early).status(),
                      {"rank 1 runs F1", "without its input: expected RECV_F1 from rank 0 before it"});

  Schedule wrong_peer = Build(ScheduleKind::k1F1B, 3, 3);
  wrong_peer[0][Find(wrong_peer[0], "SEND_F0")].peer = 2;
  ExpectErrorContains(SimulateSchedule(wrong_peer).status(),
                      {"rank 0 action 1 (SEND_F0): expected peer rank 1 (virtual stage 1), got 2"});

  Schedule past_end = Build(ScheduleKind::kGPipe, 2, 2);
  past_end[1].push_back(Action{ActionKind::kSendActivation, 0, 0, 0});
  ExpectErrorContains(SimulateSchedule(past_end).status(), {"virtual stage 1 is the last of 2"});
}

TEST(ScheduleSimulation, RejectsBadCostsAndEmptyLists) {
  Schedule s = Build(ScheduleKind::kGPipe, 2, 2);
  ExpectErrorContains(SimulateSchedule(s, SimOptions{1.0, 0.0}).status(), {"positive finite costs"});
  ExpectErrorContains(SimulateSchedule(Schedule{}).status(), {"no ranks"});
  ExpectErrorContains(SimulateSchedule(Schedule(2)).status(), {"no actions"});
  ExpectErrorContains(SimulateSchedule(Schedule{{Action{ActionKind::kForward, -1, 0, -1}}}).status(),
                      {"rank 0 action 0: micro-batch -1 and chunk 0 must lie in"});
  ExpectErrorContains(SimulateSchedule(Schedule{{Action{ActionKind::kForward, 1 << 20, 100, -1}}}).status(),
                      {"1 ranks x 1048577 micro-batches x 101 chunks exceeds the limit"});
}

TEST(ScheduleBuild, BadParametersAreErrors) {
  auto expect = [](ScheduleKind k, int p, int m, int v, const std::string& needle) {
    ExpectErrorContains(BuildSchedule(k, p, m, v).status(), {needle});
  };
  expect(ScheduleKind::kGPipe, 0, 4, 1, "expected at least 1 stage, got p=0");
  expect(ScheduleKind::k1F1B, 2, 0, 1, "expected at least 1 micro-batch, got m=0");
  expect(ScheduleKind::k1F1B, 2, 4, 0, "expected at least 1 model chunk per stage, got v=0");
  expect(ScheduleKind::kGPipe, 2, 4, 2, "schedule gpipe runs one model chunk per stage: expected v=1, got v=2");
  expect(ScheduleKind::k1F1B, 2, 4, 3, "expected v=1, got v=3");
  expect(ScheduleKind::kInterleaved1F1B, 2, 4, 1, "expected v >= 2 model chunks per stage, got v=1");
  expect(ScheduleKind::kInterleaved1F1B, 1, 4, 2, "expected at least 2 stages, got p=1");
  expect(ScheduleKind::kInterleaved1F1B, 4, 6, 2, "must be a multiple of the stage count");
  expect(ScheduleKind::k1F1B, 1 << 12, 1 << 12, 1, "exceeds the limit");
}

}  // namespace
}  // namespace cleave
