// The NCCL communicator (runtime/): see nccl_communicator.h.
#include "runtime/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "runtime/comm_watchdog.h"

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

namespace {

// A stream the communicator queues NCCL work on, and the numbers of the operations queued there
// lately (the marks of those still in the ring).
struct Lane {
  cudaStream_t stream = nullptr;
  cudaEvent_t after = nullptr;  // the compute stream's join of everything queued on it
  int64_t count = 0;            // operations queued on it
  std::deque<int64_t> recent;   // the latest of their numbers, ascending
  // This rank's sends to another: the compute stream never waits for them (they send staged
  // copies), since a stage whose compute waited for its sends to be received could not go on
  // to the receive its peer's send waits for.
  bool sends = false;
};

// A copy of a message being sent (device memory of the communicator's), free again once its
// send has finished.
struct Staged {
  void* data = nullptr;
  size_t bytes = 0;
  cudaEvent_t sent = nullptr;
};

// What a rank's communicator and every duplicate of it share: the message channels, and the
// numbering of the collective communicators over each set of ranks. The
// messages from one rank to another go through their own NCCL communicator (the pair, the
// sender first) and stream, whichever duplicate sends them, so the two ends match them in the
// order each issued them, and a stage's sends wait for their receives without holding up its
// receives from the other direction (one stream for both would deadlock a 1F1B schedule: stage
// 0's second forward send waits on stage 1, whose backward send waits on the receive stage 0
// queued behind it).
struct Channels {
  struct Channel {
    ncclComm_t comm = nullptr;  // null once aborted
    cudaStream_t stream = nullptr;
  };
  std::mutex mu;  // held around each launch on, and the abort of, a channel's communicator
  std::map<std::pair<int, int>, Channel> by_ends;  // (sender, receiver)
  bool failed = false;  // a rank's communicator ended with work unfinished: abort, not destroy
  // Collective communicators made so far over each set of ranks, by any of the rank's
  // communicators: the next one's number there (its unique id's bootstrap tag). Ranks that
  // share a set run the same collectives over it in the same order, whichever of their
  // communicators runs them, so the numbers agree.
  std::map<std::vector<int>, uint64_t> made_over;
  ~Channels() {
    for (auto& [ends, c] : by_ends) {
      if (c.comm) failed ? ncclCommAbort(c.comm) : ncclCommDestroy(c.comm);
      if (c.stream) cudaStreamDestroy(c.stream);
    }
  }
};

// The bootstrap tags of the unique ids: above the tags a plan's messages use (OpenMPI allows
// tags up to 2^31 - 1).
int BootstrapTag(uint64_t number, const std::vector<int>& members) {
  uint64_t h = 1469598103934665603ull ^ (number * 0x9e3779b97f4a7c15ull);
  for (int m : members) h = (h ^ static_cast<uint64_t>(m)) * 1099511628211ull;
  return (1 << 24) + static_cast<int>(h & 0xfffff);
}
constexpr uint64_t kChannelNumber = ~uint64_t{0};  // the rank's message channels

}  // namespace

struct NcclCommunicator::State {
  Communicator* bootstrap = nullptr;  // shares the unique ids (MPI in a launched job)
  int rank = 0, world = 1, device = 0;
  std::chrono::milliseconds timeout{60000};
  StuckHandler on_stuck;
  cudaStream_t compute = nullptr;
  Lane collectives;  // the collectives' stream (its own, shared by every group)
  cudaEvent_t before = nullptr;
  // Deferred: operations leave the compute stream alone until JoinCompute().
  bool deferred = false;
  // Deferred operations counted, and an event recorded on each one's stream after it in a
  // ring, so that the compute stream can join the first k operations without the later ones.
  static constexpr int64_t kMarks = 64;
  int64_t ops = 0;
  std::vector<cudaEvent_t> marks;
  // Held by the owner's thread from the failure check through an operation's launch; the
  // watchdog aborts only while it is free, so no call ever uses an aborted communicator.
  std::mutex call_mu;
  // The communicators by group (the watchdog polls their asynchronous errors).
  std::mutex comms_mu;
  std::map<std::vector<int>, ncclComm_t> comms;
  // The rank's message channels, and this communicator's lanes on those it has used.
  std::shared_ptr<Channels> channels;
  std::map<std::pair<int, int>, Lane> message_lanes;
  // The staged copies of messages: in flight (or done, not yet reclaimed) and free.
  std::vector<Staged> staged_busy, staged_free;

  // A staged buffer of at least `bytes`, reclaiming those whose sends have finished; new device
  // memory only when none fits (a pipeline's steady state reuses its first steps' buffers).
  absl::StatusOr<Staged> Stage(size_t bytes, int peer) {
    for (size_t i = 0; i < staged_busy.size();) {
      if (cudaEventQuery(staged_busy[i].sent) == cudaSuccess) {
        staged_free.push_back(staged_busy[i]);
        staged_busy.erase(staged_busy.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    auto best = staged_free.end();
    for (auto it = staged_free.begin(); it != staged_free.end(); ++it)
      if (it->bytes >= bytes && (best == staged_free.end() || it->bytes < best->bytes)) best = it;
    if (best != staged_free.end()) {
      Staged st = *best;
      staged_free.erase(best);
      return st;
    }
    Staged st;
    st.bytes = (bytes + 255) / 256 * 256;
    if (cudaMalloc(&st.data, st.bytes) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("rank ", rank, ": no device memory for the staged copy of a ",
                                                       bytes, "-byte message to rank ", peer));
    }
    RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&st.sent, cudaEventDisableTiming), "cudaEventCreate"));
    return st;
  }
  // Timing (set_timing): each operation's start and end events, read against `reference`,
  // recorded on the idle `clock` stream at `reference_host`.
  struct Timed {
    std::string what;
    cudaEvent_t start = nullptr, end = nullptr;
  };
  bool timing = false;
  cudaStream_t clock = nullptr;
  cudaEvent_t reference = nullptr;
  std::chrono::steady_clock::time_point reference_host;
  std::vector<Timed> timed;
  std::vector<cudaEvent_t> timing_pool, timing_events;

  absl::StatusOr<cudaEvent_t> TimingEvent() {
    if (!timing_pool.empty()) {
      cudaEvent_t e = timing_pool.back();
      timing_pool.pop_back();
      return e;
    }
    cudaEvent_t e;
    RETURN_IF_ERROR(Cuda(cudaEventCreate(&e), "cudaEventCreate (timing)"));
    timing_events.push_back(e);
    return e;
  }
  absl::Status Anchor() {
    RETURN_IF_ERROR(Cuda(cudaEventRecord(reference, clock), "cudaEventRecord (timing)"));
    RETURN_IF_ERROR(Cuda(cudaEventSynchronize(reference), "cudaEventSynchronize (timing)"));
    reference_host = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }

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

  static absl::Status AsyncError(ncclComm_t comm, const std::string& what) {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) return absl::OkStatus();
    return async == ncclSuccess || async == ncclInProgress ? absl::OkStatus() : Nccl(async, what);
  }
  // The watchdog's view: NCCL's asynchronous errors, and an abort of every communicator.
  absl::Status Health() {
    std::lock_guard<std::mutex> lock(comms_mu);
    for (auto& [group, comm] : comms)
      if (absl::Status s = AsyncError(comm, Describe("communication", group)); !s.ok()) return s;
    std::lock_guard<std::mutex> channel_lock(channels->mu);
    for (auto& [ends, lane] : message_lanes)
      if (ncclComm_t comm = channels->by_ends[ends].comm)
        if (absl::Status s = AsyncError(comm, absl::StrCat("messages from rank ", ends.first, " to rank ", ends.second));
            !s.ok())
          return s;
    return absl::OkStatus();
  }
  bool Abort() {
    std::unique_lock<std::mutex> call(call_mu, std::try_to_lock);
    if (!call.owns_lock()) return false;
    cudaSetDevice(device);
    std::lock_guard<std::mutex> lock(comms_mu);
    for (auto& [group, comm] : comms) ncclCommAbort(comm);
    comms.clear();
    std::lock_guard<std::mutex> channel_lock(channels->mu);
    for (auto& [ends, lane] : message_lanes) {
      Channels::Channel& c = channels->by_ends[ends];
      if (c.comm) ncclCommAbort(c.comm);
      c.comm = nullptr;  // its stream stays until the last duplicate is gone
    }
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
    uint64_t number;
    {
      std::lock_guard<std::mutex> lock(channels->mu);
      number = channels->made_over[group]++;
    }
    ASSIGN_OR_RETURN(ncclComm_t comm, Init(group, number, op, absl::StrCat("ranks [", absl::StrJoin(group, ","), "]")));
    std::lock_guard<std::mutex> lock(comms_mu);
    comms[group] = comm;
    return comm;
  }

  // A communicator over `members` (in their NCCL order): the first makes the unique id and
  // sends it to the others over the bootstrap, tagged with the members and `number` (which
  // communicator over them it is, kChannelNumber for a message channel), so that ranks which
  // make their communicators in different orders (a pipeline's stages meet their tied
  // embedding's reduction and their messages at different points) still pair each id with its
  // communicator.
  absl::StatusOr<ncclComm_t> Init(const std::vector<int>& members, uint64_t number, const char* op,
                                  const std::string& what) {
    if (!bootstrap && members.size() > 1)  // a world of one process (no bootstrap) has no peers
      return InvalidArgument("rank ", rank, ": ", op, " over ", what, " without a bootstrap communicator");
    ncclUniqueId id;
    if (members.front() == rank) RETURN_IF_ERROR(Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    const int64_t dims[1] = {static_cast<int64_t>(sizeof(id))};
    const TensorView view(&id, DataType::kUInt8, dims);
    if (members.size() > 1) {
      const int tag = BootstrapTag(number, members);
      if (members.front() == rank) {
        for (int m : members)
          if (m != rank) RETURN_IF_ERROR(bootstrap->Send(view, m, tag));
      } else {
        RETURN_IF_ERROR(bootstrap->Recv(view, members.front(), tag));
      }
    }
    // The initialisation waits for every member; the watchdog times it like an operation.
    const std::string init = absl::StrCat("ncclCommInitRank for ", what);
    auto initialised = std::make_shared<std::atomic<bool>>(false);
    watchdog->Track(init, [initialised] { return initialised->load(); });
    ncclComm_t comm;
    const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    const ncclResult_t r = ncclCommInitRank(&comm, static_cast<int>(members.size()), id, me);
    *initialised = true;
    RETURN_IF_ERROR(Nccl(r, absl::StrCat("rank ", rank, ": ", init)));
    return comm;
  }

  // Takes `call`, fails if the watchdog has, and finds or makes this communicator's lane on the
  // channel of the messages from `from` to `to`. A pair's two channels are made together, the
  // lower rank's first, at the pair's first message either way, so that both ranks make them in
  // the same order.
  absl::StatusOr<Lane*> EnterChannel(std::unique_lock<std::mutex>& call, int from, int to, const char* op) {
    call = std::unique_lock<std::mutex>(call_mu);
    RETURN_IF_ERROR(Failed());
    const int peer = from == rank ? to : from;
    if (peer < 0 || peer >= world)
      return InvalidArgument("rank ", rank, ": ", op, " with rank ", peer, " of a world of ", world);
    if (auto it = message_lanes.find({from, to}); it != message_lanes.end()) return &it->second;
    const int lo = std::min(rank, peer), hi = std::max(rank, peer);
    std::vector<std::pair<int, int>> pair = {{lo, hi}};
    if (lo != hi) pair.emplace_back(hi, lo);  // messages to itself have one channel
    bool made;
    {
      std::lock_guard<std::mutex> lock(channels->mu);
      made = channels->by_ends.count({from, to}) > 0;
    }
    if (!made) {
      for (auto [a, b] : pair) {
        Channels::Channel c;
        RETURN_IF_ERROR(Cuda(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
        const std::vector<int> members = a == b ? std::vector<int>{a} : std::vector<int>{a, b};
        absl::StatusOr<ncclComm_t> comm =
            Init(members, kChannelNumber, op, absl::StrCat("messages from rank ", a, " to rank ", b));
        if (comm.ok()) c.comm = *comm;
        {
          std::lock_guard<std::mutex> lock(channels->mu);
          channels->by_ends[{a, b}] = c;  // the stream is the channels' to destroy from here
        }
        RETURN_IF_ERROR(comm.status());
      }
    }
    for (auto [a, b] : pair) {
      Lane lane;
      {
        std::lock_guard<std::mutex> lock(channels->mu);
        const Channels::Channel& c = channels->by_ends[{a, b}];
        if (!c.comm)
          return absl::FailedPreconditionError(absl::StrCat("rank ", rank, ": ", op, ": the communicator of messages from rank ",
                                                            a, " to rank ", b, " was not made or was aborted"));
        lane.stream = c.stream;
      }
      lane.sends = a == rank && b != rank;
      RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&lane.after, cudaEventDisableTiming), "cudaEventCreate"));
      std::lock_guard<std::mutex> lock(comms_mu);
      message_lanes[{a, b}] = lane;
    }
    return &message_lanes.at({from, to});
  }
  // Launches `fn(comm)` on the channel's communicator (under the channels' lock: another
  // duplicate's watchdog may abort it).
  template <typename Fn>
  ncclResult_t OnChannel(int from, int to, Fn fn) {
    std::lock_guard<std::mutex> lock(channels->mu);
    ncclComm_t comm = channels->by_ends[{from, to}].comm;
    return comm ? fn(comm) : ncclInvalidUsage;
  }

  // Orders `launch` (which enqueues NCCL work on `lane`'s stream) after the compute stream's
  // queued work, and the compute stream's later work after it; the watchdog times it to its
  // end event.
  template <typename Fn>
  absl::Status Ordered(Lane& lane, const std::string& what, Fn launch) {
    ASSIGN_OR_RETURN(cudaEvent_t end, TakeEvent());  // before the launch: nothing to undo after it
    RETURN_IF_ERROR(Cuda(cudaEventRecord(before, compute), "cudaEventRecord"));
    RETURN_IF_ERROR(Cuda(cudaStreamWaitEvent(lane.stream, before, 0), "cudaStreamWaitEvent"));
    Timed t;
    if (timing) {
      ASSIGN_OR_RETURN(t.start, TimingEvent());
      ASSIGN_OR_RETURN(t.end, TimingEvent());
      RETURN_IF_ERROR(Cuda(cudaEventRecord(t.start, lane.stream), "cudaEventRecord (timing)"));
    }
    absl::Status launched = Nccl(launch(lane.stream), absl::StrCat("rank ", rank, ": ", what));
    if (!launched.ok()) {
      GiveEvent(end);
      if (timing) timing_pool.insert(timing_pool.end(), {t.start, t.end});
      return launched;
    }
    if (timing) {
      RETURN_IF_ERROR(Cuda(cudaEventRecord(t.end, lane.stream), "cudaEventRecord (timing)"));
      t.what = what;
      timed.push_back(std::move(t));
    }
    ++ops;
    ++lane.count;
    lane.recent.push_back(ops);
    if (static_cast<int64_t>(lane.recent.size()) > kMarks) lane.recent.pop_front();
    RETURN_IF_ERROR(Cuda(cudaEventRecord(end, lane.stream), "cudaEventRecord"));
    watchdog->Track(
        what, [end] { return cudaEventQuery(end) != cudaErrorNotReady; }, [this, end] { GiveEvent(end); });
    if (deferred) return Cuda(cudaEventRecord(marks[ops % kMarks], lane.stream), "cudaEventRecord");
    return lane.sends ? absl::OkStatus() : JoinLane(lane);
  }
  // Every lane: the collectives' and each channel's.
  template <typename Fn>
  absl::Status ForEachLane(Fn fn) {
    RETURN_IF_ERROR(fn(collectives));
    std::lock_guard<std::mutex> lock(comms_mu);
    for (auto& [ends, lane] : message_lanes) RETURN_IF_ERROR(fn(lane));
    return absl::OkStatus();
  }
  // The compute stream waits for the first `count` operations (sends aside): on each lane, for
  // the last of them queued there (its mark; everything on the lane once the ring has moved
  // past it).
  absl::Status JoinThrough(int64_t count) {
    if (count <= 0) return absl::OkStatus();
    if (count > ops) return Join();
    return ForEachLane([&](Lane& lane) -> absl::Status {
      if (lane.sends) return absl::OkStatus();
      auto it = std::upper_bound(lane.recent.begin(), lane.recent.end(), count);
      if (it == lane.recent.begin()) {  // none of the recent ones: perhaps older ones
        return lane.count > static_cast<int64_t>(lane.recent.size()) ? JoinLane(lane) : absl::OkStatus();
      }
      const int64_t last = *std::prev(it);
      if (ops - last >= kMarks) return JoinLane(lane);
      return Cuda(cudaStreamWaitEvent(compute, marks[last % kMarks], 0), "cudaStreamWaitEvent");
    });
  }
  // The compute stream's later work waits for everything queued so far (sends aside).
  absl::Status Join() {
    return ForEachLane([&](Lane& lane) { return lane.count > 0 && !lane.sends ? JoinLane(lane) : absl::OkStatus(); });
  }
  absl::Status JoinLane(Lane& lane) {
    RETURN_IF_ERROR(Cuda(cudaEventRecord(lane.after, lane.stream), "cudaEventRecord"));
    return Cuda(cudaStreamWaitEvent(compute, lane.after, 0), "cudaStreamWaitEvent");
  }

  std::string Describe(const char* op, std::span<const int> group) const {
    return absl::StrCat(op, " over ranks [", absl::StrJoin(group, ","), "]");
  }
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<State> s) : s_(std::move(s)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(Communicator* bootstrap, int device,
                                                                           void* compute_stream,
                                                                           std::chrono::milliseconds timeout,
                                                                           StuckHandler on_stuck) {
  auto s = std::make_unique<State>();
  s->bootstrap = bootstrap;
  s->channels = std::make_shared<Channels>();
  s->on_stuck = std::move(on_stuck);
  s->rank = bootstrap ? bootstrap->rank() : 0;
  s->world = bootstrap ? bootstrap->world_size() : 1;
  s->device = device;
  s->timeout = timeout;
  s->compute = static_cast<cudaStream_t>(compute_stream);
  RETURN_IF_ERROR(Cuda(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")").c_str()));
  RETURN_IF_ERROR(
      Cuda(cudaStreamCreateWithFlags(&s->collectives.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&s->before, cudaEventDisableTiming), "cudaEventCreate"));
  RETURN_IF_ERROR(Cuda(cudaEventCreateWithFlags(&s->collectives.after, cudaEventDisableTiming), "cudaEventCreate"));
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
  auto release = [](Lane& lane) {
    if (lane.after) cudaEventDestroy(lane.after);
    if (lane.stream) cudaStreamDestroy(lane.stream);
  };
  for (auto& [ends, lane] : s_->message_lanes) cudaEventDestroy(lane.after);  // the channels own the streams
  for (auto* staged : {&s_->staged_busy, &s_->staged_free})
    for (Staged& st : *staged) {
      if (finished) cudaFree(st.data);  // an unfinished send may still read it: left
      cudaEventDestroy(st.sent);
    }
  if (!finished) {
    std::lock_guard<std::mutex> channel_lock(s_->channels->mu);
    s_->channels->failed = true;
  }
  release(s_->collectives);
  for (cudaEvent_t e : s_->timing_events) cudaEventDestroy(e);
  if (s_->reference) cudaEventDestroy(s_->reference);
  if (s_->clock) cudaStreamDestroy(s_->clock);
  if (s_->before) cudaEventDestroy(s_->before);
  for (cudaEvent_t e : s_->marks)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : s_->events) cudaEventDestroy(e);
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Duplicate() {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> dup,
                   Create(s_->bootstrap, s_->device, s_->compute, s_->timeout, s_->on_stuck));
  dup->s_->channels = s_->channels;  // the rank's messages share their channels
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
  // Polls at 5 us at first, doubling to 200 us: the optimizer step waits here for the last
  // gradient reduction, and a fixed 200 us nap would add up to that to every step.
  auto nap = std::chrono::microseconds(5);
  while (true) {
    RETURN_IF_ERROR(s_->Failed());
    cudaError_t q = cudaSuccess;
    (void)s_->ForEachLane([&](Lane& lane) {
      if (q == cudaSuccess) q = cudaStreamQuery(lane.stream);
      return absl::OkStatus();
    });
    if (q == cudaSuccess) {
      RETURN_IF_ERROR(s_->Failed());
      // An error NCCL raised that the watchdog has not polled yet.
      if (absl::Status h = s_->Health(); !h.ok())
        return absl::Status(h.code(), absl::StrCat("rank ", s_->rank, ": ", h.message()));
      return absl::OkStatus();
    }
    if (q != cudaErrorNotReady) return Cuda(q, "the NCCL streams");
    if (const size_t now_pending = s_->watchdog->pending(); now_pending < pending) {
      pending = now_pending;
      deadline = std::chrono::steady_clock::now() + backstop;
    }
    if (std::chrono::steady_clock::now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat("rank ", s_->rank, ": NCCL work did not complete within ",
                                                      s_->timeout.count() / 1000.0,
                                                      " s (--comm-timeout): a peer has died or hangs"));
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(200));
  }
}

absl::Status NcclCommunicator::Prepare(std::span<const std::vector<int>> groups) {
  std::vector<std::vector<int>> mine;
  for (const std::vector<int>& g : groups)
    if (std::find(g.begin(), g.end(), s_->rank) != g.end()) mine.push_back(g);
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  for (const std::vector<int>& g : mine) {
    std::unique_lock<std::mutex> call;
    RETURN_IF_ERROR(s_->Enter(call, g, "Prepare").status());
  }
  return absl::OkStatus();
}

void NcclCommunicator::set_timing(bool on) {
  std::lock_guard<std::mutex> call(s_->call_mu);
  if (on && !s_->reference) {
    if (!Cuda(cudaStreamCreateWithFlags(&s_->clock, cudaStreamNonBlocking), "cudaStreamCreate").ok() ||
        !Cuda(cudaEventCreate(&s_->reference), "cudaEventCreate (timing)").ok() || !s_->Anchor().ok()) {
      std::fprintf(stderr, "cleave: warning: rank %d: NCCL operations cannot be timed on the device\n", s_->rank);
      return;
    }
  }
  s_->timing = on && s_->reference;
}

absl::StatusOr<std::vector<Communicator::TimedOperation>> NcclCommunicator::TakeTimedOperations() {
  RETURN_IF_ERROR(Synchronize());  // with the watchdog's timeout: a dead peer is an error here
  std::lock_guard<std::mutex> call(s_->call_mu);
  std::vector<TimedOperation> out;
  auto at = [&](cudaEvent_t e) -> absl::StatusOr<std::chrono::steady_clock::time_point> {
    float ms = 0;
    RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, s_->reference, e), "cudaEventElapsedTime (timing)"));
    return s_->reference_host + std::chrono::microseconds(static_cast<int64_t>(1000.0 * ms));
  };
  for (State::Timed& t : s_->timed) {
    TimedOperation op;
    op.what = std::move(t.what);
    ASSIGN_OR_RETURN(op.start, at(t.start));
    ASSIGN_OR_RETURN(op.end, at(t.end));
    out.push_back(std::move(op));
    s_->timing_pool.insert(s_->timing_pool.end(), {t.start, t.end});
  }
  s_->timed.clear();
  if (s_->reference) RETURN_IF_ERROR(s_->Anchor());  // a near reference keeps float milliseconds exact
  return out;
}

absl::Status NcclCommunicator::AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                                         std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllReduce"));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(in.dtype));
  return s_->Ordered(s_->collectives, s_->Describe("AllReduce", group), [&](cudaStream_t stream) {
    return ncclAllReduce(in.data, out.data, static_cast<size_t>(in.numel()), t, op == ReduceOp::kSum ? ncclSum : ncclMax,
                         comm, stream);
  });
}

absl::Status NcclCommunicator::AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllGather"));
  return s_->Ordered(s_->collectives, s_->Describe("AllGather", group), [&](cudaStream_t stream) {
    return ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, comm, stream);
  });
}

absl::Status NcclCommunicator::ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                                             std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "ReduceScatter"));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(in.dtype));
  return s_->Ordered(s_->collectives, s_->Describe("ReduceScatter", group), [&](cudaStream_t stream) {
    return ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), t,
                             op == ReduceOp::kSum ? ncclSum : ncclMax, comm, stream);
  });
}

absl::Status NcclCommunicator::AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(ncclComm_t comm, s_->Enter(call, group, "AllToAll"));
  const size_t chunk = in.nbytes() / group.size();
  return s_->Ordered(s_->collectives, s_->Describe("AllToAll", group), [&](cudaStream_t stream) -> ncclResult_t {
    ncclResult_t r = ncclGroupStart();
    for (size_t j = 0; j < group.size() && r == ncclSuccess; ++j) {
      r = ncclSend(static_cast<const char*>(in.data) + j * chunk, chunk, ncclUint8, static_cast<int>(j), comm,
                   stream);
      if (r == ncclSuccess)
        r = ncclRecv(static_cast<char*>(out.data) + j * chunk, chunk, ncclUint8, static_cast<int>(j), comm,
                     stream);
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
  return s_->Ordered(s_->collectives, s_->Describe("Broadcast", group), [&](cudaStream_t stream) {
    return ncclBroadcast(buf.data, buf.data, buf.nbytes(), ncclUint8, static_cast<int>(it - group.begin()), comm,
                         stream);
  });
}

absl::Status NcclCommunicator::Barrier(std::span<const int> group) {
  RETURN_IF_ERROR(Synchronize());
  return s_->bootstrap ? s_->bootstrap->Barrier(group) : absl::OkStatus();
}

// The message is copied on the compute stream, in its order, and the copy sent: the compute
// stream may reuse the tensor's memory at once, and never waits for the send.
absl::Status NcclCommunicator::Send(const TensorView& t, int peer, int tag) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(Lane * lane, s_->EnterChannel(call, s_->rank, peer, "Send"));
  const int to = peer == s_->rank ? 0 : 1;  // the receiver's place in the channel
  const size_t bytes = t.nbytes();
  Staged st;
  if (lane->sends && bytes > 0) {
    ASSIGN_OR_RETURN(st, s_->Stage(bytes, peer));
    absl::Status copied = Cuda(cudaMemcpyAsync(st.data, t.data, bytes, cudaMemcpyDeviceToDevice, s_->compute),
                               "cudaMemcpyAsync (a message's staged copy)");
    if (!copied.ok()) {
      s_->staged_free.push_back(st);
      return copied;
    }
  }
  const void* data = st.data ? st.data : t.data;
  absl::Status sent = s_->Ordered(*lane, absl::StrCat("Send to rank ", peer, " (tag ", tag, ")"), [&](cudaStream_t stream) {
    const ncclResult_t r =
        s_->OnChannel(s_->rank, peer, [&](ncclComm_t comm) { return ncclSend(data, bytes, ncclUint8, to, comm, stream); });
    if (r == ncclSuccess && st.data && cudaEventRecord(st.sent, stream) != cudaSuccess) return ncclUnhandledCudaError;
    return r;
  });
  if (st.data) (sent.ok() ? s_->staged_busy : s_->staged_free).push_back(st);
  return sent;
}

absl::Status NcclCommunicator::Recv(const TensorView& t, int peer, int tag) {
  std::unique_lock<std::mutex> call;
  ASSIGN_OR_RETURN(Lane * lane, s_->EnterChannel(call, peer, s_->rank, "Recv"));
  return s_->Ordered(*lane, absl::StrCat("Recv from rank ", peer, " (tag ", tag, ")"), [&](cudaStream_t stream) {
    return s_->OnChannel(peer, s_->rank, [&](ncclComm_t comm) {
      return ncclRecv(t.data, t.nbytes(), ncclUint8, /*the sender's place*/ 0, comm, stream);
    });
  });
}

}  // namespace cleave::runtime
