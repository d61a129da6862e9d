// A small fork-join pool (base/): one task at a time, blocks of contiguous indices.
#include "base/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace cleave {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    task_n_ = n;
    task_blocks_ = blocks;
    pending_ = blocks - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  RunBlock(fn, n, blocks, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  int64_t seen = 0;
  for (;;) {
    const RangeFn* task;
    int64_t n;
    int blocks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
      n = task_n_;
      blocks = task_blocks_;
    }
    if (index < blocks) {
      RunBlock(*task, n, blocks, index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
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
