// The communication watchdog (runtime/comm_watchdog.h) on the host, with operations whose end
// the test controls: finished work never fails; a stuck operation fails naming the rank and the
// operation, is aborted once, and needs no last resort when the abort drains it; the clock of an
// operation queued behind another starts when that one ends; a backend error fails at once; work
// that cannot be aborted, or does not drain once aborted, reaches the last resort.
#include "runtime/comm_watchdog.h"

#include <atomic>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace cleave::runtime {
namespace {

using std::chrono::milliseconds;

CommWatchdogOptions Options(int timeout_ms, int grace_ms) {
  CommWatchdogOptions o;
  o.timeout = milliseconds(timeout_ms);
  o.grace = milliseconds(grace_ms);
  o.period = milliseconds(5);
  return o;
}

// Polls `pred` for up to `ms`.
template <typename Pred>
bool Eventually(Pred pred, int ms = 5000) {
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return pred();
}

struct Probe {
  std::atomic<int> aborts{0}, stuck{0}, retired{0};
  std::atomic<bool> refuse_abort{false}, abort_drains{true};
  std::atomic<bool> done{false};
  absl::Status stuck_with;
  std::mutex mu;

  CommWatchdogHooks Hooks() {
    CommWatchdogHooks h;
    h.abort = [this] {
      if (refuse_abort) return false;
      ++aborts;
      if (abort_drains) done = true;
      return true;
    };
    h.stuck = [this](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      stuck_with = s;
      ++stuck;
    };
    return h;
  }
};

TEST(CommWatchdog, FinishedOperationsNeverFail) {
  Probe p;
  CommWatchdog w("rank 0", Options(200, 100), p.Hooks());
  for (int i = 0; i < 3; ++i) w.Track("AllReduce", [] { return true; }, [&] { ++p.retired; });
  ASSERT_TRUE(Eventually([&] { return w.pending() == 0; }));
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_TRUE(w.failure().ok()) << w.failure();
  EXPECT_EQ(p.retired, 3);
  EXPECT_EQ(p.aborts, 0);
}

TEST(CommWatchdog, StuckOperationFailsNamingItAndIsAborted) {
  Probe p;
  CommWatchdog w("rank 1", Options(100, 300), p.Hooks());
  w.Track("AllReduce over ranks [0,1]", [&] { return p.done.load(); });
  ASSERT_TRUE(Eventually([&] { return !w.failure().ok(); }));
  const absl::Status f = w.failure();
  EXPECT_EQ(f.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(f.message().find("rank 1: AllReduce over ranks [0,1] did not complete within 0.1 s"), std::string::npos)
      << f;
  // The abort drained the work: no last resort, even after the grace period.
  ASSERT_TRUE(Eventually([&] { return w.pending() == 0; }));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(p.aborts, 1);
  EXPECT_EQ(p.stuck, 0);
  EXPECT_EQ(w.failure(), f);  // it stays
}

// B is queued at once behind A, which takes most of the timeout; B then takes most of it too.
// Timed from its own queueing B would fail; timed from A's end it does not.
TEST(CommWatchdog, QueuedOperationIsTimedFromItsPredecessorsEnd) {
  Probe p;
  std::atomic<bool> a{false}, b{false};
  CommWatchdog w("rank 0", Options(600, 100), p.Hooks());
  w.Track("A", [&] { return a.load(); });
  w.Track("B", [&] { return b.load(); });
  std::this_thread::sleep_for(milliseconds(400));
  a = true;
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_TRUE(w.failure().ok()) << w.failure();
  b = true;
  ASSERT_TRUE(Eventually([&] { return w.pending() == 0; }));
  EXPECT_TRUE(w.failure().ok()) << w.failure();
}

TEST(CommWatchdog, BackendErrorFailsAtOnce) {
  Probe p;
  std::atomic<bool> broken{false};
  CommWatchdogHooks h = p.Hooks();
  h.health = [&]() -> absl::Status {
    if (broken) return absl::InternalError("AllGather over ranks [0,1,2,3]: NCCL error remote process exited");
    return absl::OkStatus();
  };
  CommWatchdog w("rank 2", Options(60000, 300), h);
  w.Track("AllGather over ranks [0,1,2,3]", [&] { return p.done.load(); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(w.failure().ok());
  broken = true;
  ASSERT_TRUE(Eventually([&] { return !w.failure().ok(); }, 1000));
  EXPECT_EQ(w.failure().code(), absl::StatusCode::kInternal);
  EXPECT_NE(w.failure().message().find("rank 2: AllGather over ranks [0,1,2,3]: NCCL error remote process exited"),
            std::string::npos)
      << w.failure();
  EXPECT_TRUE(Eventually([&] { return p.aborts == 1; }));
}

// The owner sits inside a backend call (the abort is refused) past the grace period.
TEST(CommWatchdog, WorkThatCannotBeAbortedReachesTheLastResort) {
  Probe p;
  p.refuse_abort = true;
  CommWatchdog w("rank 3", Options(50, 200), p.Hooks());
  w.Track("ncclCommInitRank for ranks [0,3]", [&] { return p.done.load(); });
  ASSERT_TRUE(Eventually([&] { return p.stuck == 1; }));
  std::lock_guard<std::mutex> lock(p.mu);
  EXPECT_NE(p.stuck_with.message().find("rank 3: ncclCommInitRank for ranks [0,3] did not complete"),
            std::string::npos)
      << p.stuck_with;
  EXPECT_EQ(p.aborts, 0);
}

TEST(CommWatchdog, AbortedWorkThatDoesNotDrainReachesTheLastResort) {
  Probe p;
  p.abort_drains = false;
  CommWatchdog w("rank 0", Options(50, 200), p.Hooks());
  w.Track("Recv from rank 1 (tag 7)", [&] { return p.done.load(); });
  ASSERT_TRUE(Eventually([&] { return p.stuck == 1; }));
  EXPECT_EQ(p.aborts, 1);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(p.stuck, 1);  // once
}

// An abort that hangs (ncclCommAbort can): the last resort comes after the grace period, and
// Stop says the abort is still running, so its owner keeps what the abort uses.
TEST(CommWatchdog, AbortThatHangsIsLeftRunningAndSaidSo) {
  Probe p;
  std::atomic<bool> release{false}, returned{false};
  CommWatchdogHooks h = p.Hooks();
  h.abort = [&] {
    while (!release) std::this_thread::sleep_for(milliseconds(2));
    returned = true;
    return true;
  };
  {
    CommWatchdog w("rank 0", Options(50, 150), h);
    w.Track("AllGather over ranks [0,1]", [&] { return p.done.load(); });
    ASSERT_TRUE(Eventually([&] { return p.stuck == 1; }));
    EXPECT_FALSE(w.Stop(milliseconds(50)));
    release = true;  // let the left-behind abort finish before what it captured goes away
    ASSERT_TRUE(Eventually([&] { return returned.load(); }));
  }
  std::this_thread::sleep_for(milliseconds(20));
}

// Stopping with work pending retires it without failing.
TEST(CommWatchdog, StopsPromptlyWithWorkPending) {
  Probe p;
  const auto start = std::chrono::steady_clock::now();
  {
    CommWatchdog w("rank 0", Options(60000, 30000), p.Hooks());
    w.Track("AllReduce", [] { return false; }, [&] { ++p.retired; });
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
  EXPECT_EQ(p.retired, 1);
  EXPECT_EQ(p.aborts, 0);
}

}  // namespace
}  // namespace cleave::runtime
