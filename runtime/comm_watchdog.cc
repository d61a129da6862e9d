// The communication watchdog (runtime/): see comm_watchdog.h.
#include "runtime/comm_watchdog.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cleave::runtime {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// An abort runs on a thread of its own: ncclCommAbort itself can hang, and the watchdog must
// still be able to give up.
struct CommWatchdog::AbortCall {
  enum State { kRunning, kDone, kRefused };
  std::atomic<int> state{kRunning};
};

CommWatchdog::CommWatchdog(std::string who, CommWatchdogOptions options, CommWatchdogHooks hooks)
    : who_(std::move(who)), options_(options), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { Run(); });
}

bool CommWatchdog::Stop(std::chrono::milliseconds wait) {
  if (!stopped_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    stopped_ = true;
  }
  if (!abort_thread_.joinable()) return true;
  const auto deadline = Clock::now() + wait;
  while (abort_->state == AbortCall::kRunning && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (abort_->state == AbortCall::kRunning) {
    abort_thread_.detach();  // stuck in the backend: left behind with what it holds
    return false;
  }
  abort_thread_.join();
  return true;
}

CommWatchdog::~CommWatchdog() { Stop(options_.grace); }

void CommWatchdog::Track(std::string what, std::function<bool()> done, std::function<void()> retire) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.push_back(Op{std::move(what), std::move(done), std::move(retire), Clock::now()});
}

absl::Status CommWatchdog::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

size_t CommWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

const CommWatchdog::Op* CommWatchdog::Retire(Clock::time_point now) {
  while (!ops_.empty() && ops_.front().done()) {
    if (ops_.front().retire) ops_.front().retire();
    ops_.pop_front();
    front_since_ = now;
  }
  if (ops_.empty()) return nullptr;
  if (front_since_ < ops_.front().queued) front_since_ = ops_.front().queued;
  return now - front_since_ > options_.timeout ? &ops_.front() : nullptr;
}

void CommWatchdog::Fail(absl::Status s) {
  failure_ = std::move(s);
  std::fprintf(stderr, "cleave: %s; aborting this rank's communication\n", failure_.ToString().c_str());
}

void CommWatchdog::Run() {
  if (hooks_.on_thread_start) hooks_.on_thread_start();
  std::shared_ptr<AbortCall>& abort = abort_;
  std::thread& abort_thread = abort_thread_;
  Clock::time_point failed_at;
  bool gave_up = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, options_.period, [&] { return stop_; });
    if (stop_) break;
    const Clock::time_point now = Clock::now();
    const Op* late = Retire(now);
    if (failure_.ok()) {
      const std::string late_what = late ? late->what : std::string();
      lock.unlock();
      absl::Status health = hooks_.health ? hooks_.health() : absl::OkStatus();
      lock.lock();
      if (!health.ok()) {
        Fail(absl::Status(health.code(), absl::StrCat(who_, ": ", health.message())));
      } else if (late) {
        Fail(absl::DeadlineExceededError(absl::StrCat(who_, ": ", late_what, " did not complete within ",
                                                      options_.timeout.count() / 1000.0,
                                                      " s (--comm-timeout): a peer has died or hangs")));
      }
      if (failure_.ok()) continue;
      failed_at = now;
    }
    if (gave_up) continue;
    // Failed: abort (again, while the owner is inside a call), then wait for the work to drain.
    if (!abort || abort->state == AbortCall::kRefused) {
      if (abort_thread.joinable()) abort_thread.join();
      abort = std::make_shared<AbortCall>();
      std::function<bool()> fn = hooks_.abort;
      abort_thread = std::thread([abort, fn] { abort->state = (!fn || fn()) ? AbortCall::kDone : AbortCall::kRefused; });
    }
    if (abort->state == AbortCall::kDone && ops_.empty()) continue;  // recovered: the owner reports it
    if (now - failed_at > options_.grace) {
      gave_up = true;
      const absl::Status failure = failure_;
      lock.unlock();
      if (hooks_.stuck) {
        hooks_.stuck(failure);
      } else {
        std::fprintf(stderr, "cleave: %s; the work could not be aborted and this process is stuck\n",
                     failure.ToString().c_str());
      }
      lock.lock();
    }
  }
  for (Op& op : ops_)
    if (op.retire) op.retire();
  ops_.clear();
  // An abort still under way is Stop's to wait for.
}

}  // namespace cleave::runtime
