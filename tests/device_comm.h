// DeviceComm (tests/): a simulated rank's communicator seen as a device one (NCCL-like), for
// devices whose memory is host memory underneath (the CPU stand-in device, the emulated CUDA
// device), so that the simulated world moves it. It counts what the trainer asks of a device
// communicator.
#pragma once

#include <atomic>
#include <memory>
#include <span>

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
      : inner_(inner), owned_(std::move(owned)), counts_(std::move(counts)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status AllReduce(const TensorView& in, const TensorView& out, ReduceOp op, std::span<const int> g) override {
    ++ops_;
    return inner_->AllReduce(in, out, op, g);
  }
  absl::Status AllGather(const TensorView& in, const TensorView& out, std::span<const int> g) override {
    ++ops_;
    return inner_->AllGather(in, out, g);
  }
  absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                             std::span<const int> g) override {
    ++ops_;
    return inner_->ReduceScatter(in, out, op, g);
  }
  absl::Status AllToAll(const TensorView& in, const TensorView& out, std::span<const int> g) override {
    ++ops_;
    return inner_->AllToAll(in, out, g);
  }
  absl::Status Broadcast(const TensorView& buf, int root, std::span<const int> g) override {
    return inner_->Broadcast(buf, root, g);
  }
  absl::Status Barrier(std::span<const int> g) override { return inner_->Barrier(g); }
  absl::Status Send(const TensorView& t, int peer, int tag) override { return inner_->Send(t, peer, tag); }
  absl::Status Recv(const TensorView& t, int peer, int tag) override { return inner_->Recv(t, peer, tag); }
  bool device_memory() const override { return true; }
  absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() override {
    ASSIGN_OR_RETURN(std::unique_ptr<Communicator> dup, inner_->Duplicate());
    ++counts_->duplicates;
    Communicator* raw = dup.get();
    return std::unique_ptr<Communicator>(new DeviceComm(raw, counts_, std::move(dup)));
  }
  void set_deferred(bool d) override { counts_->deferred += d; }
  absl::Status JoinCompute() override {
    ++counts_->joins;
    return absl::OkStatus();
  }
  int64_t queued_operations() const override { return ops_; }
  absl::Status JoinComputeThrough(int64_t count) override {
    if (count < 0 || count > ops_) return absl::InternalError(absl::StrCat("joined through ", count, " of ", ops_));
    ++counts_->partial_joins;
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    ++counts_->syncs;
    return absl::OkStatus();
  }

 private:
  Communicator* inner_;
  std::unique_ptr<Communicator> owned_;
  std::shared_ptr<Counts> counts_;
  int64_t ops_ = 0;  // collectives queued on this communicator
};

}  // namespace cleave::testing
