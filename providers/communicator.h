// The communicator interface (providers/): collectives and point-to-point messages between
// ranks. Collective kernels reach it through their provider; the backends live in runtime/
// (MPI for CPU tensors, NCCL for CUDA tensors, and an in-process simulated world for tests).
//
// Buffers are contiguous and treated as flat arrays; a kernel that gathers or scatters along a
// tensor axis rearranges around the call. `group` lists global ranks in group order (the mesh
// axis coordinate); the calling rank must be in it. Every rank of a group makes the same
// sequence of calls on it with matching sizes and dtypes.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"

namespace cleave {

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // out = reduction of every rank's `in` (same numel); `out` may be `in`.
  virtual absl::Status AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                                 std::span<const int> group) = 0;
  // out = every rank's `in` concatenated in group order (out.numel = n * in.numel).
  virtual absl::Status AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) = 0;
  // `in` is n equal chunks; out = reduction over ranks of chunk[my group index].
  virtual absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                                     std::span<const int> group) = 0;
  // `in` is n equal chunks, chunk j goes to group member j; out's chunk i comes from member i.
  virtual absl::Status AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) = 0;
  // Every member's `buf` becomes the root's (root is a global rank).
  virtual absl::Status Broadcast(const TensorView& buf, int root, std::span<const int> group) = 0;
  virtual absl::Status Barrier(std::span<const int> group) = 0;
  virtual absl::Status Send(const TensorView& t, int peer, int tag) = 0;
  virtual absl::Status Recv(const TensorView& t, int peer, int tag) = 0;

  // Seconds spent so far waiting in collectives and in receives (a pipeline's idle time is
  // mostly the latter), for progress lines; zero where a backend does not count.
  struct CommTime {
    double collective = 0, recv_wait = 0;
  };
  virtual CommTime time_spent() const { return {}; }
  // Whether the buffers are device (CUDA) memory (NCCL) rather than host memory (MPI, the
  // simulated world): the CUDA provider runs collectives itself only over such a communicator.
  virtual bool device_memory() const { return false; }

  // A communicator over the same ranks whose operations are independent of this one's (its
  // own MPI communicator, its own NCCL communicators and stream, or its own simulated
  // channel), so that a second thread or stream can run collectives while this one is in use:
  // the data-parallel gradient reductions that overlap the backward run on one. Every rank
  // makes the call at the same point, as for a collective. Unimplemented where a backend
  // cannot (an MPI library without MPI_THREAD_MULTIPLE).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() {
    return absl::UnimplementedError("this communicator cannot be duplicated");
  }
  // Device communicators only. Deferred: an operation no longer makes the compute stream wait
  // for it; JoinCompute() makes the compute stream wait for everything queued so far (host
  // communicators complete each operation before returning, so both are no-ops there).
  virtual void set_deferred(bool deferred) { (void)deferred; }
  virtual absl::Status JoinCompute() { return absl::OkStatus(); }
  // Device communicators: how many operations have been queued so far, and a join of the
  // compute stream after only the first `count` of them (the later ones stay deferred). Where
  // a backend keeps no per-operation marks this joins everything, which is later than needed
  // but never wrong.
  virtual int64_t queued_operations() const { return 0; }
  virtual absl::Status JoinComputeThrough(int64_t count) {
    (void)count;
    return JoinCompute();
  }
  // Blocks the host until every operation queued so far has finished, or fails naming the
  // rank and the operation once the timeout passes (a dead peer must not hang the caller).
  virtual absl::Status Synchronize() { return absl::OkStatus(); }

  // Makes now whatever the collectives over `groups` will need (NCCL: their communicators),
  // rather than at each group's first collective, where the host of a rank would wait for
  // peers that reach that collective at another point of their step (a pipeline's stages meet
  // their tied embedding's reduction at opposite ends of the backward). Every member of a
  // group prepares it, at start-up; groups this rank is not in are skipped.
  virtual absl::Status Prepare(std::span<const std::vector<int>> groups) {
    (void)groups;
    return absl::OkStatus();
  }

  // Device communicators, for profiles: with timing on, each operation is timed where it runs
  // (events on its stream); TakeTimedOperations waits for the ones timed so far and returns
  // them in the order they were queued, each with its start and end on the host's steady clock.
  // Host communicators time nothing: their callers' clocks see the work.
  struct TimedOperation {
    std::string what;
    std::chrono::steady_clock::time_point start, end;
  };
  virtual void set_timing(bool on) { (void)on; }
  virtual absl::StatusOr<std::vector<TimedOperation>> TakeTimedOperations() {
    return std::vector<TimedOperation>{};
  }
};

}  // namespace cleave
