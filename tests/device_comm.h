// DeviceComm (tests/): a simulated rank's communicator seen as a device one (NCCL-like), for
// devices whose memory is host memory underneath (the CPU stand-in device), so that the
// simulated world moves it. As NCCL's work runs on a stream of its own, its operations run in
// order on a worker thread while the host goes on; the joins wait for them. It counts what the
// trainer asks of a device communicator.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "providers/communicator.h"

namespace cleave::testing {

class DeviceComm : public Communicator {
 public:
  struct Counts {
    std::atomic<int> deferred{0}, joins{0}, partial_joins{0}, syncs{0}, duplicates{0};
  };
  DeviceComm(Communicator* inner, std::shared_ptr<Counts> counts, std::unique_ptr<Communicator> owned = nullptr)
      : inner_(inner), owned_(std::move(owned)), counts_(std::move(counts)), worker_([this] { Work(); }) {}
  ~DeviceComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status AllReduce(const TensorView& in, const TensorView& out, ReduceOp op, std::span<const int> g) override {
    return Queue([=, this, g = Group(g)] { return inner_->AllReduce(in, out, op, g); });
  }
  absl::Status AllGather(const TensorView& in, const TensorView& out, std::span<const int> g) override {
    return Queue([=, this, g = Group(g)] { return inner_->AllGather(in, out, g); });
  }
  absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                             std::span<const int> g) override {
    return Queue([=, this, g = Group(g)] { return inner_->ReduceScatter(in, out, op, g); });
  }
  absl::Status AllToAll(const TensorView& in, const TensorView& out, std::span<const int> g) override {
    return Queue([=, this, g = Group(g)] { return inner_->AllToAll(in, out, g); });
  }
  absl::Status Broadcast(const TensorView& buf, int root, std::span<const int> g) override {
    return Queue([=, this, g = Group(g)] { return inner_->Broadcast(buf, root, g); });
  }
  absl::Status Barrier(std::span<const int> g) override {
    RETURN_IF_ERROR(WaitFor(ops_));
    return inner_->Barrier(g);
  }
  // As the NCCL communicator's: a copy taken in compute order is sent, so that the tensor's
  // memory is free again at once.
  absl::Status Send(const TensorView& t, int peer, int tag) override {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(t.data),
                                                      static_cast<const char*>(t.data) + t.nbytes());
    std::vector<int64_t> dims(t.dims, t.dims + t.rank);
    const DataType dtype = t.dtype;
    return Queue([=, this] { return inner_->Send(TensorView(staged->data(), dtype, dims), peer, tag); });
  }
  absl::Status Recv(const TensorView& t, int peer, int tag) override {
    return Queue([=, this] { return inner_->Recv(t, peer, tag); });
  }
  bool device_memory() const override { return true; }
  absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() override {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> dup, inner_->Duplicate());
    ++counts_->duplicates;
    Communicator* raw = dup.get();
    return std::unique_ptr<Communicator>(new DeviceComm(raw, counts_, std::move(dup)));
  }
  void set_deferred(bool d) override {
    deferred_ = d;
    counts_->deferred += d;
  }
  absl::Status JoinCompute() override {
    ++counts_->joins;
    return WaitFor(ops_);
  }
  int64_t queued_operations() const override { return ops_; }
  absl::Status JoinComputeThrough(int64_t count) override {
    if (count < 0 || count > ops_) return absl::InternalError(absl::StrCat("joined through ", count, " of ", ops_));
    ++counts_->partial_joins;
    return WaitFor(count);
  }
  absl::Status Synchronize() override {
    ++counts_->syncs;
    return WaitFor(ops_);
  }

 private:
  static std::vector<int> Group(std::span<const int> g) { return std::vector<int>(g.begin(), g.end()); }
  // The operation runs after those queued before it, on the worker (a device communicator's
  // stream: the host goes on); not deferred, the caller then waits for it.
  absl::Status Queue(std::function<absl::Status()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
      cv_.notify_all();
    }
    ++ops_;
    return deferred_ ? absl::OkStatus() : WaitFor(ops_);
  }
  // Waits until the first `count` operations have run; the first failure among them.
  absl::Status WaitFor(int64_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= count; });
    return failure_;
  }
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<absl::Status()> op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      absl::Status s = failure_.ok() ? op() : failure_;
      lock.lock();
      if (failure_.ok()) failure_ = s;
      ++done_;
      cv_.notify_all();
    }
  }

  Communicator* inner_;
  std::unique_ptr<Communicator> owned_;
  std::shared_ptr<Counts> counts_;
  int64_t ops_ = 0;  // collectives and messages queued on this communicator
  bool deferred_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<absl::Status()>> queue_;
  int64_t done_ = 0;
  absl::Status failure_;
  bool stop_ = false;
  std::thread worker_;  // last: it starts once the rest is made
};

}  // namespace cleave::testing
