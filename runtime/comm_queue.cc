// The communication queue (runtime/): see comm_queue.h.
#include "runtime/comm_queue.h"

#include <chrono>
#include <utility>

namespace cleave::runtime {

namespace {
double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

CommQueue::CommQueue(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {
  device_ = comm_->device_memory();
  if (device_) comm_->set_deferred(true);
}

CommQueue::~CommQueue() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  worker_.join();
}

CommQueue::Ticket CommQueue::Submit(std::function<absl::Status()> work) {
  const Ticket t = ++submitted_;
  if (device_) {
    // Queued on the communicator's stream behind the compute stream's work so far.
    absl::Status s = work();
    if (!s.ok() && device_error_.ok()) device_error_ = std::move(s);
    device_marks_.emplace_back(t, comm_->queued_operations());
    return t;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_.joinable()) worker_ = std::thread([this] { Work(); });  // started on first use
    queue_.emplace_back(t, std::move(work));
  }
  cv_.notify_all();
  return t;
}

void CommQueue::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto [ticket, work] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.ok();
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = skip ? absl::OkStatus() : work();
    const double seconds = Since(start);
    lock.lock();
    time_.busy += seconds;
    finished_ = ticket;
    if (!s.ok() && error_.ok()) error_ = std::move(s);
    cv_.notify_all();
  }
}

absl::Status CommQueue::Wait(Ticket ticket) {
  if (device_) {
    if (ticket > joined_) {
      int64_t through = -1;
      while (!device_marks_.empty() && device_marks_.front().first <= ticket) {
        through = device_marks_.front().second;
        device_marks_.pop_front();
      }
      if (through >= 0) {
        absl::Status s = comm_->JoinComputeThrough(through);
        if (!s.ok() && device_error_.ok()) device_error_ = std::move(s);
      }
      joined_ = ticket;
    }
    return std::exchange(device_error_, absl::OkStatus());
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ >= ticket; });
  time_.waited += Since(start);
  return std::exchange(error_, absl::OkStatus());
}

absl::Status CommQueue::WaitAll() {
  if (!device_) return Wait(submitted_);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = comm_->Synchronize();
  {
    std::lock_guard<std::mutex> lock(mu_);
    time_.waited += Since(start);
  }
  absl::Status joined = Wait(submitted_);
  return s.ok() ? joined : s;
}

CommQueue::Time CommQueue::time_spent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return time_;
}

}  // namespace cleave::runtime
