// The MPI communicator (runtime/): collectives and point-to-point messages between the
// processes of an MPI job (OpenMPI, launched by mpirun or srun), for CPU tensors.
//
// Groups become MPI sub-communicators, made on first use and cached (MPI_Comm_create_group,
// so only the group's members take part). Every operation is nonblocking underneath and
// waited for with a deadline: one that does not complete within the timeout fails with a
// DeadlineExceeded status naming this rank, the operation, the group and the peer, so a dead
// or hung rank ends the job instead of hanging it. Sends copy their data and return at once
// (the action lists of a pipeline schedule assume buffered sends); the copies are released as
// the sends complete.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "providers/communicator.h"

namespace cleave::runtime {

class MpiCommunicator : public Communicator {
 public:
  // Initialises MPI (once per process; argc/argv may be null) and wraps MPI_COMM_WORLD.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(int* argc, char*** argv,
                                                                 std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;  // waits for pending sends, then MPI_Finalize

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
  CommTime time_spent() const override;
  // Over a duplicate of MPI_COMM_WORLD (needs MPI_THREAD_MULTIPLE, which Create asks for).
  absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() override;

  // Ends every process of the job (MPI_Abort) with `code`: for an error that the other ranks
  // cannot see, so none of them waits for this one.
  [[noreturn]] void Abort(int code);

  struct State;

 private:
  explicit MpiCommunicator(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace cleave::runtime
