// The MPI communicator (runtime/): see mpi_communicator.h.
#include "runtime/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::runtime {

namespace {

using Clock = std::chrono::steady_clock;

MPI_Datatype MpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kInt32: return MPI_INT32_T;
    default: return MPI_DATATYPE_NULL;
  }
}

}  // namespace

struct MpiCommunicator::State {
  std::chrono::milliseconds timeout{60000};
  // MPI_COMM_WORLD, or a duplicate of it (Duplicate()), which owns neither MPI nor the world.
  MPI_Comm base = MPI_COMM_WORLD;
  bool owns_mpi = true;
  int rank = 0, world = 1;
  std::map<std::vector<int>, MPI_Comm> comms;
  struct PendingSend {
    MPI_Request request;
    std::vector<char> data;
  };
  std::list<PendingSend> sends;
  CommTime spent;

  // Releases the buffers of sends that have completed.
  void ReapSends() {
    for (auto it = sends.begin(); it != sends.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? sends.erase(it) : std::next(it);
    }
  }

  // Waits for `request` until the deadline, polling with a short sleep so that oversubscribed
  // ranks leave the cores to the ones doing work.
  absl::Status Wait(MPI_Request* request, const std::string& what, double* counter, MPI_Status* status = nullptr) {
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    int done = 0;
    auto nap = std::chrono::microseconds(5);
    while (true) {
      MPI_Test(request, &done, status ? status : MPI_STATUS_IGNORE);
      if (done) break;
      if (Clock::now() > deadline) {
        *counter += std::chrono::duration<double>(Clock::now() - start).count();
        return absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": ", what, " did not complete within ",
                                                        timeout.count() / 1000.0,
                                                        " s (--comm-timeout): a peer has died or hangs"));
      }
      ReapSends();
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    *counter += std::chrono::duration<double>(Clock::now() - start).count();
    return absl::OkStatus();
  }

  absl::StatusOr<MPI_Comm> CommOf(std::span<const int> group_span, const char* op) {
    std::vector<int> group(group_span.begin(), group_span.end());
    if (std::find(group.begin(), group.end(), rank) == group.end())
      return InvalidArgument("rank ", rank, ": ", op, " over ranks [", absl::StrJoin(group, ","), "], which it is not in");
    for (int r : group)
      if (r < 0 || r >= world)
        return InvalidArgument("rank ", rank, ": ", op, " over ranks [", absl::StrJoin(group, ","),
                               "]: the job has ranks 0..", world - 1);
    if (auto it = comms.find(group); it != comms.end()) return it->second;
    std::vector<int> identity(world);
    std::iota(identity.begin(), identity.end(), 0);
    MPI_Comm comm = base;
    if (group != identity) {
      MPI_Group world_group, sub;
      MPI_Comm_group(base, &world_group);
      MPI_Group_incl(world_group, static_cast<int>(group.size()), group.data(), &sub);
      MPI_Comm_create_group(base, sub, 0, &comm);
      MPI_Group_free(&sub);
      MPI_Group_free(&world_group);
    }
    comms[group] = comm;
    return comm;
  }

  std::string Describe(const char* op, std::span<const int> group) const {
    return absl::StrCat(op, " over ranks [", absl::StrJoin(group, ","), "]");
  }
};

MpiCommunicator::MpiCommunicator(std::unique_ptr<State> s) : s_(std::move(s)) {}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(int* argc, char*** argv,
                                                                         std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  // Threads: the gradient reductions that overlap the backward run on a second thread, over a
  // duplicate communicator (Duplicate() checks what the library granted).
  int provided = 0;
  if (!initialized && MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    return absl::UnavailableError("MPI_Init_thread failed");
  auto s = std::make_unique<State>();
  s->timeout = timeout;
  MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s->world);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(s)));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // a duplicate outliving the world communicator: nothing left to free
  // Sends still in flight must reach their peers before MPI goes away.
  for (auto& p : s_->sends) {
    const absl::Status ignored = s_->Wait(&p.request, "a pending send", &s_->spent.recv_wait);
    (void)ignored;
  }
  s_->sends.clear();
  for (auto& [group, comm] : s_->comms)
    if (comm != s_->base && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  if (!s_->owns_mpi) {
    MPI_Comm_free(&s_->base);
    return;
  }
  MPI_Finalize();
}

absl::StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Duplicate() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return absl::UnimplementedError(absl::StrCat("rank ", s_->rank, ": this MPI library grants thread level ", level,
                                                 ", not MPI_THREAD_MULTIPLE; collectives stay on one thread"));
  auto s = std::make_unique<State>();
  s->timeout = s_->timeout;
  s->rank = s_->rank;
  s->world = s_->world;
  s->owns_mpi = false;
  if (MPI_Comm_dup(s_->base, &s->base) != MPI_SUCCESS)
    return absl::UnavailableError(absl::StrCat("rank ", s_->rank, ": MPI_Comm_dup failed"));
  return std::unique_ptr<Communicator>(new MpiCommunicator(std::move(s)));
}

int MpiCommunicator::rank() const { return s_->rank; }
int MpiCommunicator::world_size() const { return s_->world; }
Communicator::CommTime MpiCommunicator::time_spent() const { return s_->spent; }

void MpiCommunicator::Abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // not reached
}

absl::Status MpiCommunicator::AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                                        std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "AllReduce"));
  const MPI_Datatype t = MpiType(in.dtype);
  if (t == MPI_DATATYPE_NULL) return InvalidArgument("AllReduce of ", DataTypeName(in.dtype), " is not supported");
  MPI_Request req;
  MPI_Iallreduce(in.data == out.data ? MPI_IN_PLACE : in.data, out.data, static_cast<int>(in.numel()), t,
                 op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comm, &req);
  return s_->Wait(&req, s_->Describe("AllReduce", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "AllGather"));
  const int bytes = static_cast<int>(in.nbytes());
  MPI_Request req;
  MPI_Iallgather(in.data, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE, comm, &req);
  return s_->Wait(&req, s_->Describe("AllGather", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                                            std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "ReduceScatter"));
  const MPI_Datatype t = MpiType(in.dtype);
  if (t == MPI_DATATYPE_NULL) return InvalidArgument("ReduceScatter of ", DataTypeName(in.dtype), " is not supported");
  MPI_Request req;
  MPI_Ireduce_scatter_block(in.data, out.data, static_cast<int>(out.numel()), t, op == ReduceOp::kSum ? MPI_SUM : MPI_MAX,
                            comm, &req);
  return s_->Wait(&req, s_->Describe("ReduceScatter", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "AllToAll"));
  const int chunk = static_cast<int>(in.nbytes() / group.size());
  MPI_Request req;
  MPI_Ialltoall(in.data, chunk, MPI_BYTE, out.data, chunk, MPI_BYTE, comm, &req);
  return s_->Wait(&req, s_->Describe("AllToAll", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::Broadcast(const TensorView& buf, int root, std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "Broadcast"));
  const auto it = std::find(group.begin(), group.end(), root);
  if (it == group.end()) return InvalidArgument("Broadcast: root ", root, " is not in the group");
  MPI_Request req;
  MPI_Ibcast(buf.data, static_cast<int>(buf.nbytes()), MPI_BYTE, static_cast<int>(it - group.begin()), comm, &req);
  return s_->Wait(&req, s_->Describe("Broadcast", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::Barrier(std::span<const int> group) {
  ASSIGN_OR_RETURN(MPI_Comm comm, s_->CommOf(group, "Barrier"));
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  return s_->Wait(&req, s_->Describe("Barrier", group), &s_->spent.collective);
}

absl::Status MpiCommunicator::Send(const TensorView& t, int peer, int tag) {
  if (peer < 0 || peer >= s_->world || peer == s_->rank)
    return InvalidArgument("rank ", s_->rank, ": Send to invalid peer ", peer);
  s_->ReapSends();
  auto& p = s_->sends.emplace_back();
  p.data.resize(t.nbytes());
  std::memcpy(p.data.data(), t.data, t.nbytes());
  MPI_Isend(p.data.data(), static_cast<int>(p.data.size()), MPI_BYTE, peer, tag, s_->base, &p.request);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::Recv(const TensorView& t, int peer, int tag) {
  if (peer < 0 || peer >= s_->world || peer == s_->rank)
    return InvalidArgument("rank ", s_->rank, ": Recv from invalid peer ", peer);
  MPI_Request req;
  MPI_Status status;
  MPI_Irecv(t.data, static_cast<int>(t.nbytes()), MPI_BYTE, peer, tag, s_->base, &req);
  RETURN_IF_ERROR(s_->Wait(&req, absl::StrCat("Recv from rank ", peer, " (tag ", tag, ")"), &s_->spent.recv_wait,
                           &status));
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (count != static_cast<int>(t.nbytes()))
    return InvalidArgument("rank ", s_->rank, ": Recv from rank ", peer, " tag ", tag, ": message of ", count,
                           " bytes, the buffer holds ", t.nbytes());
  return absl::OkStatus();
}

}  // namespace cleave::runtime
