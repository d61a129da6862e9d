// The intra-op pool: every index runs once, in the same contiguous blocks whatever the timing,
// whether the workers are spinning or asleep when a loop is posted and whether the caller
// finishes its block before or after them.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"

namespace cleave {
namespace {

using std::chrono::milliseconds;

// Many loops back to back, as a model's nodes post them: sizes below, at and above the
// thread count, so that some loops leave workers out.
TEST(ThreadPool, BackToBackLoopsRunEveryIndexOnce) {
  ThreadPool pool(4);
  std::vector<int> hits(5000);
  for (int loop = 0; loop < 3000; ++loop) {
    const int64_t n = 1 + (loop * 37) % static_cast<int64_t>(hits.size());
    const int64_t grain = 1 + loop % 7;
    std::fill(hits.begin(), hits.begin() + n, 0);
    pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++hits[i];
    });
    ASSERT_EQ(std::count(hits.begin(), hits.begin() + n, 1), n) << "loop " << loop << ", n " << n;
  }
}

// Two threads posting loops to one pool at once (two sessions' executors, as the simulated ranks
// of one process run), and a loop posted from inside a block: every index of every loop runs
// exactly once, and nothing waits forever.
TEST(ThreadPool, ConcurrentAndNestedCallersEachRunTheirWholeLoop) {
  ThreadPool pool(3);
  auto caller = [&pool](int seed, int* failures) {
    std::vector<int> hits(3000);
    for (int loop = 0; loop < 2000; ++loop) {
      const int64_t n = 100 + (loop * 31 + seed) % 2900;
      std::fill(hits.begin(), hits.begin() + n, 0);
      pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++hits[i];
      });
      if (std::count(hits.begin(), hits.begin() + n, 1) != n) ++*failures;
    }
  };
  int failures[2] = {0, 0};
  std::thread a(caller, 1, &failures[0]), b(caller, 2, &failures[1]);
  a.join();
  b.join();
  EXPECT_EQ(failures[0], 0);
  EXPECT_EQ(failures[1], 0);
  std::vector<int> hits(64 * 50, 0);
  pool.ParallelFor(64, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      pool.ParallelFor(50, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t c = b0; c < b1; ++c) ++hits[r * 50 + c];
      });
  });
  EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), 64 * 50);
}

TEST(ThreadPool, BlocksAreTheContiguousSplitOfTheRange) {
  ThreadPool pool(3);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  pool.ParallelFor(10, 1, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    blocks.emplace_back(begin, end);
  });
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(blocks, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 10}}));
  blocks.clear();
  pool.ParallelFor(10, 6, [&](int64_t begin, int64_t end) {  // grain 6: two blocks
    std::lock_guard<std::mutex> lock(mu);
    blocks.emplace_back(begin, end);
  });
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(blocks, (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}}));
}

// Workers that have gone to sleep (the pause is far longer than any spin) still take the next
// loop, and a caller whose workers finish long after it does waits for them.
TEST(ThreadPool, SleepingWorkersAndSlowBlocksAreWaitedFor) {
  ThreadPool pool(2);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(milliseconds(20));
    std::atomic<int> done{0};
    pool.ParallelFor(2, 1, [&](int64_t begin, int64_t) {
      if (begin > 0) std::this_thread::sleep_for(milliseconds(10));  // the worker's block
      done.fetch_add(1);
    });
    EXPECT_EQ(done.load(), 2) << "round " << round;
  }
}

// A pool destroyed right after a loop, with its workers still spinning, stops them.
TEST(ThreadPool, DestroyedWhileItsWorkersSpin) {
  for (int k = 0; k < 50; ++k) {
    ThreadPool pool(3);
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(300, 1, [&](int64_t begin, int64_t end) {
      int64_t s = 0;
      for (int64_t i = begin; i < end; ++i) s += i;
      sum.fetch_add(s);
    });
    EXPECT_EQ(sum.load(), 299 * 300 / 2);
  }
}

}  // namespace
}  // namespace cleave
