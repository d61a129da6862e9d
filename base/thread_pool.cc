// A small fork-join pool (base/): one task at a time, blocks of contiguous indices; a second
// caller meanwhile runs its own blocks.
#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cleave {

namespace {

// How long an idle worker, or a caller waiting for its workers, polls before it sleeps.
constexpr std::chrono::microseconds kSpin{50};

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` for up to kSpin; whether it held.
template <typename Done>
bool SpinUntil(Done done) {
  if (done()) return true;  // often so: then the clock is not read
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    CpuRelax();
    if (done()) return true;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void RunBlock(RangeFn fn, int64_t n, int blocks, int b) {
  int64_t begin = n * b / blocks, end = n * (b + 1) / blocks;
  if (begin < end) fn(begin, end);
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int blocks = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (blocks <= 1) {
    fn(0, n);
    return;
  }
  // One loop at a time: the workers' task fields are the pool's. A caller that finds them taken
  // runs its blocks itself, in order (the same split, so the same results).
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock()) {
    for (int b = 0; b < blocks; ++b) RunBlock(fn, n, blocks, b);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    task_n_ = n;
    task_blocks_ = blocks;
    pending_.store(blocks - 1);
    generation_.fetch_add(1);
  }
  work_cv_.notify_all();  // no system call when every worker is still spinning
  RunBlock(fn, n, blocks, 0);
  auto done = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!SpinUntil(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, done);
  }
}

void ThreadPool::WorkerLoop(int index) {
  int64_t seen = 0;
  for (;;) {
    const RangeFn* task;
    int64_t n;
    int blocks;
    auto posted = [&] { return stop_.load(std::memory_order_relaxed) || generation_.load() != seen; };
    SpinUntil(posted);
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, posted);  // returns at once when the spin saw the task
      if (stop_) return;
      seen = generation_.load();
      task = task_;
      n = task_n_;
      blocks = task_blocks_;
    }
    if (index < blocks) {
      RunBlock(*task, n, blocks, index);
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.fetch_sub(1) == 1) done_cv_.notify_one();
    }
  }
}

ThreadPool* ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("CLEAVE_NUM_THREADS")) n = std::atoi(env);
    return new ThreadPool(std::max(1, n));
  }();
  return pool;
}

}  // namespace cleave
