// The communication queue (runtime/): work on a communicator taken off the caller's path and
// run in the order it was submitted. Over a host communicator (MPI, the simulated world) one
// worker thread runs it while the caller computes; over a device communicator (NCCL) the work
// is queued at once on the communicator's own stream, deferred, and a wait orders the compute
// stream after it. The gradient reducer and the executor's asynchronous collectives each run
// on one, over their own duplicate of the rank's communicator.
//
// Order is the invariant: every rank submits the same operations in the same order, and they
// reach the communicator in that order, so the ranks of a group always meet.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "providers/communicator.h"

namespace cleave::runtime {

// A collective of a graph that runs on a queue: launched at step `launch` of its run, waited
// for before step `wait` (the number of steps: at the end of the run).
struct AsyncCollective {
  std::string node, op;
  int launch = 0, wait = 0;
};

class CommQueue {
 public:
  // `comm`: a communicator no one else uses (a Duplicate of the rank's); owned. A device
  // communicator is switched to deferred mode.
  explicit CommQueue(std::unique_ptr<Communicator> comm);
  // Drops host work not yet started; the one running finishes (or times out) first.
  ~CommQueue();

  Communicator* comm() const { return comm_.get(); }
  bool device() const { return device_; }

  // Queues `work` (which calls comm()) behind everything submitted before it and returns its
  // ticket (1, 2, ...). After a failure, later host work is skipped: it would only wait out
  // its timeout against peers that have stopped.
  using Ticket = int64_t;
  Ticket Submit(std::function<absl::Status()> work);
  // Blocks until work `ticket` and everything before it has finished (host), or orders the
  // compute stream after the operations it queued (device: the host does not wait). Returns
  // the first error of any work so far, once.
  absl::Status Wait(Ticket ticket);
  // Everything submitted so far. On a device the host also waits for the communicator's
  // stream, with its timeout, so that a dead peer is an error rather than a stuck stream.
  absl::Status WaitAll();

  // Seconds the worker ran work (host; device work is queued, not timed) and callers were
  // blocked in Wait/WaitAll: the difference is communication hidden behind compute.
  struct Time {
    double busy = 0, waited = 0;
  };
  Time time_spent() const;

 private:
  void Work();

  std::unique_ptr<Communicator> comm_;
  bool device_ = false;
  Ticket submitted_ = 0;
  // Device: the communicator's operation count after each ticket's work, and how many tickets
  // the compute stream has been ordered after.
  std::deque<std::pair<Ticket, int64_t>> device_marks_;
  Ticket joined_ = 0;
  absl::Status device_error_;

  // Host: the worker and its queue.
  std::thread worker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Ticket, std::function<absl::Status()>>> queue_;
  Ticket finished_ = 0;  // every ticket up to this one has run (under mu_)
  bool stop_ = false;
  absl::Status error_;
  Time time_;
};

}  // namespace cleave::runtime
