// The communication watchdog (runtime/): a thread that times the operations a device
// communicator has queued, so that a dead or hung peer ends in an error naming the rank and the
// operation instead of a stream that never drains and a host that waits on it forever.
//
// Operations complete in the order they were queued (one stream), so only the oldest is timed,
// from when it was queued or when the one before it was seen to finish, whichever is later. On
// a timeout or a backend error the watchdog records the failure, which every later call of the
// owner returns, and aborts the backend's work (NCCL: ncclCommAbort), which lets the streams
// waiting on it drain. If the work cannot be aborted, or the aborted work does not drain,
// within the grace period, the process is stuck for good: the watchdog hands the failure to
// `stuck`, the owner's last resort (the trainer stops the process; a library caller decides).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace cleave::runtime {

struct CommWatchdogOptions {
  std::chrono::milliseconds timeout{60000};  // how long one operation may take
  std::chrono::milliseconds grace{30000};    // from a failure to `stuck`, unless aborted and drained
  std::chrono::milliseconds period{20};      // how often the thread looks
};

struct CommWatchdogHooks {
  // The backend's asynchronous error (OK when there is none), polled each period.
  std::function<absl::Status()> health;
  // Aborts the backend's queued work; false when it cannot be done now (the owner is inside a
  // backend call), and it is tried again each period.
  std::function<bool()> abort;
  // The last resort, called at most once from the watchdog's thread (null: the failure is
  // printed and nothing else happens).
  std::function<void(const absl::Status&)> stuck;
  // Called first on the watchdog's thread (the device a CUDA backend's events live on).
  std::function<void()> on_thread_start;
};

class CommWatchdog {
 public:
  // `who` prefixes every message ("rank 3").
  CommWatchdog(std::string who, CommWatchdogOptions options, CommWatchdogHooks hooks);
  // Stops the thread (operations still pending are no longer timed) and waits up to `wait` for
  // an abort under way. False when that abort is still running: its hook may still use what it
  // was given, which the owner must then keep (the process is stuck in it regardless).
  bool Stop(std::chrono::milliseconds wait);
  ~CommWatchdog();  // Stop(grace) unless stopped
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Times operation `what` (named in errors) until `done` (polled from the watchdog's thread)
  // returns true; `retire` (optional) runs on that thread once it has, or when the watchdog
  // stops.
  void Track(std::string what, std::function<bool()> done, std::function<void()> retire = nullptr);
  // The failure (OK while there is none): DeadlineExceeded naming the operation that timed out,
  // or the backend's error. It stays: every call returns it.
  absl::Status failure() const;
  // Operations not yet seen to finish.
  size_t pending() const;

 private:
  struct Op {
    std::string what;
    std::function<bool()> done;
    std::function<void()> retire;
    std::chrono::steady_clock::time_point queued;
  };
  void Run();
  // Pops finished operations from the front; the first one pending past the timeout, if any.
  const Op* Retire(std::chrono::steady_clock::time_point now);
  void Fail(absl::Status s);

  const std::string who_;
  const CommWatchdogOptions options_;
  const CommWatchdogHooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> ops_;
  // When the front operation began to be timed (its queueing or its predecessor's end).
  std::chrono::steady_clock::time_point front_since_;
  absl::Status failure_;
  bool stop_ = false;
  std::thread thread_;
  // The abort in flight (its own thread: ncclCommAbort itself can hang).
  struct AbortCall;
  std::shared_ptr<AbortCall> abort_;
  std::thread abort_thread_;
  bool stopped_ = false;
};

}  // namespace cleave::runtime
