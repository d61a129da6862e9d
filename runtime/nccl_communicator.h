// The NCCL communicator (runtime/): collectives and point-to-point messages between GPU ranks
// for CUDA tensors, bootstrapped over a host communicator (the unique id of each group travels
// through it, tagged by the group: MPI in a launched job). Built whenever the CUDA toolkit with
// NCCL is found (and over the emulated device's NCCL for the tests); it needs a device to run.
//
// The collectives run on the communicator's own stream: each first waits for the work queued
// so far on the compute stream (an event), and the compute stream waits for its completion
// event before its next kernel (deferred: only where it joins), so a gradient's reduce-scatter
// overlaps whatever the host queued on other streams meanwhile. Messages from one rank to
// another run on a channel of their own (an NCCL communicator and a stream per direction,
// shared by the rank's duplicates); a send sends a copy taken in compute order, and the compute
// stream never waits for it, so a stage's receives are never held up behind its sends. A
// watchdog thread times every operation (and each communicator's initialisation): a dead peer
// ends in a DeadlineExceeded status naming the rank and the operation, and the aborted
// communicators let the streams waiting on them drain, so neither Synchronize() nor a host
// wait on the compute stream hangs.
// NCCL orders the messages of a channel by their stream order, which the plan's schedule fixes
// on both ends; the tags only name the messages in errors.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "providers/communicator.h"

namespace cleave::runtime {

class NcclCommunicator : public Communicator {
 public:
  // `bootstrap` shares the NCCL unique ids and is this world's ranks (the MPI communicator of
  // a launched job; null: a world of this one process); `device` is this rank's GPU; `compute_stream` the CUDA stream (a cudaStream_t) the
  // provider runs kernels on (null: the default stream).
  // `timeout` bounds each operation (runtime/comm_watchdog.h times them on a thread of its
  // own, and aborts the communicators when one passes it or NCCL reports an error; every later
  // call returns that failure). `on_stuck` is told when the aborted work does not drain either,
  // and the process cannot go on (null: the failure is printed).
  using StuckHandler = std::function<void(const absl::Status&)>;
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(Communicator* bootstrap, int device,
                                                                  void* compute_stream,
                                                                  std::chrono::milliseconds timeout,
                                                                  StuckHandler on_stuck = nullptr);
  ~NcclCommunicator() override;

  int rank() const override;
  int world_size() const override;
  absl::Status AllReduce(const TensorView& in, const TensorView& out, ReduceOp op, std::span<const int> group) override;
  absl::Status AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) override;
  absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                             std::span<const int> group) override;
  absl::Status AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) override;
  absl::Status Broadcast(const TensorView& buf, int root, std::span<const int> group) override;
  absl::Status Barrier(std::span<const int> group) override;
  absl::Status Send(const TensorView& t, int peer, int tag) override;
  absl::Status Recv(const TensorView& t, int peer, int tag) override;

  bool device_memory() const override { return true; }
  // Its own stream and NCCL communicators (made on first use of each group), on the same
  // device and compute stream.
  absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() override;
  void set_deferred(bool deferred) override;
  absl::Status JoinCompute() override;
  int64_t queued_operations() const override;
  absl::Status JoinComputeThrough(int64_t count) override;

  // The groups' communicators, in one order on every rank (the groups sorted), so that ranks
  // preparing overlapping sets never wait on each other in a cycle.
  absl::Status Prepare(std::span<const std::vector<int>> groups) override;

  // Blocks until every queued operation has finished (or the timeout passes).
  absl::Status Synchronize() override;

  // Each operation between a timing event where its stream starts it and one after it; their
  // times are read against a reference event recorded on an idle stream of the communicator's
  // own at a known host time (set again at each take).
  void set_timing(bool on) override;
  absl::StatusOr<std::vector<TimedOperation>> TakeTimedOperations() override;

  struct State;

 private:
  explicit NcclCommunicator(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace cleave::runtime
