// The NCCL communicator (runtime/): see nccl_communicator.h.
#include "runtime/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "runtime/comm_watchdog.h"
#include "runtime/mpi_communicator.h"

namespace cleave::runtime {

namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorString(e)));
}

absl::Status Nccl(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": NCCL error ", ncclGetErrorString(r)));
}

absl::StatusOr<ncclDataType_t> NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt64: return ncclInt64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUInt8:
    case DataType::kBool: return ncclUint8;
    default: return InvalidArgument("NCCL cannot move ", DataTypeName(t), " tensors");
  }
}

}  // namespace

struct NcclCommunicator::State {
  MpiCommunicator* mpi = nullptr;
  int rank = 0, world = 1, device = 0;
  std::chrono::milliseconds timeout{60000};
  StuckHandler on_stuck;
  cudaStream_t compute = nullptr, comm_stream = nullptr;
  cudaEvent_t before = nullptr, after = nullptr;
  // Deferred: operations leave the compute stream alone until JoinCompute().
  bool deferred = false;
  // Deferred operations counted, and an event recorded on comm_stream after each in a ring,
  // so that the compute stream can join the first k operations without the later ones.
  static constexpr int64_t kMarks = 64;
  int64_t ops = 0;
  std::vector<cudaEvent_t> marks;
  // Held by the owner's thread from the failure check through an operation's launch; the
  // watchdog aborts only while it is free, so no call ever uses an aborted communicator.
  std::mutex call_mu;
  // The communicators by group (the watchdog polls their asynchronous errors).
  std::mutex comms_mu;
  std::map<std::vector<int>, ncclComm_t> comms;
  // Events that mark each operation's end for the watchdog, reused once it has seen them.
  std::mutex pool_mu;
  std::vector<cudaEvent_t> pool, events;
  std::unique_ptr<CommWatchdog> watchdog;

  absl::Status Failed() const { return watchdog->failure(); }

  absl::StatusOr<cudaEvent_t> TakeEvent() {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e;
    RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
    events.push_back(e);
    return e;
  }
  void GiveEvent(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(pool_mu);
    pool.push_back(e);
  }

  // The watchdog's view: NCCL's asynchronous errors, and an abort of every communicator.
  absl::Status Health() {
    std::lock_guard<std::mutex> lock(comms_mu);
    for (auto& [group, comm] : comms) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) continue;
      if (async != ncclSuccess && async != ncclInProgress)
        return Nccl(async, Describe("communication", group));
    }
    return absl::OkStatus();
  }
  bool Abort() {
    std::unique_lock<std::mutex> call(call_mu, std::try_to_lock);
    if (!call.owns_lock()) return false;
    cudaSetDevice(device);
    std::lock_guard<std::mutex> lock(comms_mu);
    for (auto& [group, comm] : comms) ncclCommAbort(comm);
    comms.clear();
    return true;
  }
  CommWatchdogHooks Hooks() {
    CommWatchdogHooks h;
    h.health = [this] { return Health(); };
    h.abort = [this] { return Abort(); };
    h.stuck = on_stuck;
    h.on_thread_start = [d = device] { cudaSetDevice(d); };
    return h;
  }

  // Takes `call` (the owner's side of call_mu), fails if the watchdog has, and finds or makes
  // the group's communicator.
  absl::StatusOr<ncclComm_t> Enter(std::unique_lock<std::mutex>& call, std::span<const int> group, const char* op) {
    call = std::unique_lock<std::mutex>(call_mu);
    RETURN_IF_ERROR(Failed());
    return CommOf(group, op);
  }

  absl::StatusOr<ncclComm_t> CommOf(std::span<const int> group_span, const char* op) {
    std::vector<int> group(group_span.begin(), group_span.end());
    const auto me = std::find(group.begin(), group.end(), rank);
    if (me == group.end())
      return InvalidArgument("rank ", rank, ": ", op, " over ranks [", absl::StrJoin(group, ","), "], which it is not in");
    {
      std::lock_guard<std::mutex> lock(comms_mu);
      if (auto it = comms.find(group); it != comms.end()) return it->second;
    }
    if (!mpi && group.size() > 1)  // a world of one process (no bootstrap) has no peers
      return InvalidArgument("rank ", rank, ": ", op, " over ranks [", absl::StrJoin(group, ","),
                             "] without an MPI bootstrap");
    // The group's first member makes the unique id and the MPI bootstrap shares it.
    ncclUniqueId id;
    if (group.front() == rank) RETURN_IF_ERROR(Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    const int64_t dims[1] = {static_cast<int64_t>(sizeof(id))};
    if (mpi) RETURN_IF_ERROR(mpi->Broadcast(TensorView(&id, DataType::kUInt8, dims), group.front(), group));
    // The initialisation waits for every member; the watchdog times it like an operation.
    const std::string what = absl::StrCat("ncclCommInitRank for ranks [", absl::StrJoin(group, ","), "]");
    auto initialised = std::make_shared<std::atomic<bool>>(false);
    watchdog->Track(what, [initialised] { return initialised->load(); });
    ncclComm_t comm;
    const ncclResult_t r = ncclCommInitRank(&comm, static_cast<int>(group.size()), id, static_cast<int>(me - group.begin()));
    *initialised = true;
    RETURN_IF_ERROR(Nccl(r, absl::StrCat("rank ", rank, ": ", what)));
    std::lock_guard<std::mutex> lock(comms_mu);
    comms[group] = comm;
    return comm;
  }

  // Orders `launch` (which enqueues NCCL work on comm_stream) after the compute stream's queued
  // work, and the compute stream's later work after it; the watchdog times it to its end event.
  template <typename Fn>
  absl::Status Ordered(const std::string& what, Fn launch) {
    ASSIGN_OR_RETURN(cudaEvent_t end, TakeEvent());  // before the launch: nothing to undo after it
    RETURN_IF_ERROR(Cuda(cudaEventRecord(before, compute), "cudaEventRecord"));
    RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(comm_stream, before, 0), "cudaStreamWaitEvent"));
    absl::Status launched = Nccl(launch(), absl::StrCat("rank ", rank, ": ", what));
    if (!launched.ok()) {
      GiveEvent(end);
      return launched;
    }
    ++ops;
    RETURN_IF_ERROR(Cuda(cudaEventRecord(end, comm_stream), "cudaEventRecord"));
    watchdog->Track(
        what, [end] { return cudaEventQuery(end) != cudaErrorNotReady; }, [this, end] { GiveEvent(end); });
    if (deferred) return Cuda(cudaEventRecord(marks[ops % kMarks], comm_stream), "cudaEventRecord");
    return Join();
  }
  // The compute stream waits for the first `count` operations; all of them once the ring has
  // moved past that one's event.
  absl::Status JoinThrough(int64_t count) {
    if (count <= 0) return absl::OkStatus();
    if (count > ops || ops - count >= kMarks) return Join();
    return Cuda(cudaStreamWaitEvent(compute, marks[count % kMarks], 0), "cudaStreamWaitEvent");
  }
  // The compute stream's later work waits for everything queued on comm_stream so far.
  absl::Status Join() {
    RETURN_IF_ERROR(Cuda(cudaEventRecord(after, comm_stream), "cudaEventRecord"));
    return Cuda(cudaStreamWaitEvent(compute, after, 0), "cudaStreamWaitEvent");
  }

  std::string Describe(const char* op, std::span<const int> group) const {
    return absl::StrCat(op, " over ranks [", absl::StrJoin(group, ","), "]");
  }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<State> s) : s_(std::move(s)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(MpiCommunicator* bootstrap, int device,
                                                                           void* compute_stream,
                                                                           std::chrono::milliseconds timeout,
                                                                           StuckHandler on_stuck) {
  auto s = std::make_unique<State>();
  s->mpi = bootstrap;
  s->on_stuck = std::move(on_stuck);
  s->rank = bootstrap ? bootstrap->rank() : 0;
  s->world = bootstrap ? bootstrap->world_size() : 1;
  s->device = device;
  s->timeout = timeout;
  s->compute = static_cast<cudaStream_t>(compute_stream);
  RETURN_IF_ERROR(Cuda(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")").c_str()));
  RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&s->comm_stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&s->before, cudaEventDisableTiming), "cudaEventCreate"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&s->after, cudaEventDisableTiming), "cudaEventCreate"));
  s->marks.assign(State::kMarks, nullptr);
  for (cudaEvent_t& e : s->marks)
    RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
  CommWatchdogOptions wo;
  wo.timeout = timeout;
  wo.grace = std::clamp(timeout / 2, std::chrono::milliseconds(5000), std::chrono::milliseconds(30000));
  s->watchdog = std::make_unique<CommWatchdog>(absl::StrCat("rank ", s->rank), wo, s->Hooks());
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(s)));
}

NcclCommunicator::~NcclCommunicator() {
  // Work that failed or never finishes is aborted: destroying its communicator would wait for it.
  const bool finished = s_->watchdog && Synchronize().ok();
  if (s_->watchdog && !s_->watchdog->Stop(std::chrono::seconds(30))) {
    // The watchdog's abort is stuck inside NCCL and still uses this state: it is left to it.
    (void)s_.release();
    return;
  }
  s_->watchdog.reset();
  std::lock_guard<std::mutex> call(s_->call_mu);
  std::lock_guard<std::mutex> lock(s_->comms_mu);
  for (auto& [group, comm] : s_->comms) finished ? ncclCommDestroy(comm) : ncclCommAbort(comm);
  if (s_->before) cudaEventDestroy(s_->before);
  if (s_->after) cudaEventDestroy(s_->after);
  for (cudaEvent_t e : s_->marks)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : s_->events) cudaEventDestroy(e);
  if (s_->comm_stream) cudaStreamDestroy(s_->comm_stream);
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Duplicate() {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> dup,
                   Create(s_->mpi, s_->device, s_->compute, s_->timeout, s_->on_stuck));
  return std::unique_ptr<Communicator>(std::move(dup));
}

void NcclCommunicator::set_deferred(bool deferred) { s_->deferred = deferred; }
absl::Status NcclCommunicator::JoinCompute() { return s_->Join(); }
int64_t NcclCommunicator::queued_operations() const { return s_->ops; }
absl::Status NcclCommunicator::JoinComputeThrough(int64_t count) { return s_->JoinThrough(count); }

int NcclCommunicator::rank() const { return s_->rank; }
int NcclCommunicator::world_size() const { return s_->world; }

absl::Status NcclCommunicator::Synchronize() {
  // The watchdog times each operation and aborts on a timeout or an NCCL error, after which the
  // stream drains; the deadline here is only a backstop (one timeout and the longest grace since
  // the last operation the watchdog saw finish).
  const auto backstop = s_->timeout + std::chrono::seconds(30);
  auto deadline = std::chrono::steady_clock::now() + backstop;
  size_t pending = s_->watchdog->pending();
  while (true) {
    RETURN_IF_ERROR(s_->Failed());
    const cudaError_t q = cudaStreamQuery(s_->comm_stream);
    if (q == cudaSuccess) {
      RETURN_IF_ERROR(s_->Failed());
      // An error NCCL raised that the watchdog has not polled yet.
      if (absl::Status h = s_->Health(); !h.ok())
        return absl::Status(h.code(), absl::StrCat("rank ", s_->rank, ": ", h.message()));
      return absl::OkStatus();
    }
    if (q != cudaErrorNotReady) return Cuda(q, "the NCCL stream");
    if (const size_t now_pending = s_->watchdog->pending(); now_pending < pending) {
      pending = now_pending;
      deadline = std::chrono::steady_clock::now() + backstop;
    }
    if (std::chrono::steady_clock::now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat("rank ", s_->rank, ": NCCL work did not complete within ",
                                                      s_->timeout.count() / 1000.0,
                                                      " s (--comm-timeout): a peer has died or hangs"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

absl::Status NcclCommunicator::AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                                         std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllReduce"));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(in.dtype));
  return s_->Ordered(s_->Describe("AllReduce", group), [&] {
    return ncclAllReduce(in.data, out.data, static_cast<size_t>(in.numel()), t, op == ReduceOp::kSum ? ncclSum : ncclMax,
                         comm, s_->comm_stream);
  });
}

absl::Status NcclCommunicator::AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllGather"));
  return s_->Ordered(s_->Describe("AllGather", group), [&] {
    return ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, comm, s_->comm_stream);
  });
}

absl::Status NcclCommunicator::ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                                             std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "ReduceScatter"));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(in.dtype));
  return s_->Ordered(s_->Describe("ReduceScatter", group), [&] {
    return ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), t,
                             op == ReduceOp::kSum ? ncclSum : ncclMax, comm, s_->comm_stream);
  });
}

absl::Status NcclCommunicator::AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllToAll"));
  const size_t chunk = in.nbytes() / group.size();
  return s_->Ordered(s_->Describe("AllToAll", group), [&]() -> ncclResult_t {
    ncclResult_t r = ncclGroupStart();
    for (size_t j = 0; j < group.size() && r == ncclSuccess; ++j) {
      r = ncclSend(static_cast<const char*>(in.data) + j * chunk, chunk, ncclUint8, static_cast<int>(j), comm,
                   s_->comm_stream);
      if (r == ncclSuccess)
        r = ncclRecv(static_cast<char*>(out.data) + j * chunk, chunk, ncclUint8, static_cast<int>(j), comm,
                     s_->comm_stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
}

absl::Status NcclCommunicator::Broadcast(const TensorView& buf, int root, std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "Broadcast"));
  const auto it = std::find(group.begin(), group.end(), root);
  if (it == group.end()) return InvalidArgument("Broadcast: root ", root, " is not in the group");
  return s_->Ordered(s_->Describe("Broadcast", group), [&] {
    return ncclBroadcast(buf.data, buf.data, buf.nbytes(), ncclUint8, static_cast<int>(it - group.begin()), comm,
                         s_->comm_stream);
  });
}

absl::Status NcclCommunicator::Barrier(std::span<const int> group) {
  RETURN_IF_ERROR(Synchronize());
  return s_->mpi ? s_->mpi->Barrier(group) : absl::OkStatus();
}

absl::Status NcclCommunicator::Send(const TensorView& t, int peer, int tag) {
  std::vector<int> all(s_->world);
  std::iota(all.begin(), all.end(), 0);
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, all, "Send"));
  return s_->Ordered(absl::StrCat("Send to rank ", peer, " (tag ", tag, ")"),
                     [&] { return ncclSend(t.data, t.nbytes(), ncclUint8, peer, comm, s_->comm_stream); });
}

absl::Status NcclCommunicator::Recv(const TensorView& t, int peer, int tag) {
  std::vector<int> all(s_->world);
  std::iota(all.begin(), all.end(), 0);
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, all, "Recv"));
  return s_->Ordered(absl::StrCat("Recv from rank ", peer, " (tag ", tag, ")"),
                     [&] { return ncclRecv(t.data, t.nbytes(), ncclUint8, peer, comm, s_->comm_stream); });
}

}  // namespace cleave::runtime
