// The intra-op thread pool (base/). Kernels split loops with ParallelFor; the calling
// thread takes a share of the work, so a pool of N threads keeps N+1 cores busy only
// when asked for N+1. Work is split into contiguous blocks so results do not depend on
// scheduling: every index is computed by exactly one thread with the same arithmetic.
// Idle workers, and a caller waiting for them, spin for a few tens of microseconds before
// they sleep: a model's nodes post their loops microseconds apart, and waking a sleeping
// thread costs more than a small node's whole loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "base/function_ref.h"

namespace cleave {

// A loop body over [begin, end).
using RangeFn = FunctionRef<void(int64_t, int64_t)>;

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means run everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into at most num_threads blocks, each of at
  // least `grain` iterations. Blocks until all are done. The pool runs one loop at a time: a
  // call made while another is running (from another thread, such as a second session's
  // executor, or from inside a block) runs its loop on its own thread, in the same blocks.
  void ParallelFor(int64_t n, int64_t grain, RangeFn fn);

  // A process-wide pool sized by CLEAVE_NUM_THREADS or the hardware concurrency.
  static ThreadPool* Default();

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  // The task's fields and `generation_`'s increments are written under `mu_`; the atomics
  // let waiters spin on them without it.
  std::mutex mu_;
  // Held by the caller whose loop the workers are running.
  std::mutex busy_;
  std::condition_variable work_cv_, done_cv_;
  const RangeFn* task_ = nullptr;
  int64_t task_n_ = 0;
  int task_blocks_ = 0;
  std::atomic<int64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// ParallelFor on a possibly-null pool (null runs inline).
inline void ParallelFor(ThreadPool* pool, int64_t n, int64_t grain,
                        RangeFn fn) {
  if (pool == nullptr || n <= grain) {
    if (n > 0) fn(0, n);
    return;
  }
  pool->ParallelFor(n, grain, fn);
}

}  // namespace cleave
