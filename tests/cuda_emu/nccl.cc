// NCCL over the emulated device (include/nccl.h): the cliques of one process, their
// collectives met on the ranks' streams, and their messages.
#include "nccl.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

// One rank's side of a collective.
struct Call {
  enum Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast } kind = kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements each rank sends (all-gather), receives (reduce-scatter), or reduces
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  bool Matches(const Call& o) const {
    return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
  }
};

struct Message {
  const void* data;
  size_t bytes;
  bool taken = false;
};

struct Clique {
  explicit Clique(int size) : n(size), comms(static_cast<size_t>(size), nullptr) {}
  const int n;
  std::mutex mu;
  std::condition_variable cv;  // a rank joined, a collective completed, a message moved, an abort
  int joined = 0;
  std::vector<ncclComm*> comms;
  bool broken = false;  // a member aborted: the others' waiting work ends
  struct Collective {
    std::vector<Call> calls;
    int arrived = 0, left = 0;
    bool done = false;
  };
  std::map<uint64_t, Collective> collectives;            // by number
  std::map<std::pair<int, int>, std::deque<Message*>> mailboxes;  // (from, to), in send order
};

}  // namespace

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank = 0;
  uint64_t collectives = 0;  // queued so far: the next one's number (the host thread's)
  bool aborted = false;      // under the clique's lock
  std::atomic<ncclResult_t> async{ncclSuccess};
};

namespace {

// The clique's work ends for `comm`: its own abort, or a remote error when another rank's.
bool Stopped(const ncclComm* comm) { return comm->aborted || comm->clique->broken; }
void EndStopped(ncclComm* comm) {
  if (!comm->aborted) comm->async = ncclRemoteError;
}

template <typename T>
double Load(const void* p, size_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}
double LoadAny(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return Load<int8_t>(p, i);
    case ncclUint8: return Load<uint8_t>(p, i);
    case ncclInt32: return Load<int32_t>(p, i);
    case ncclUint32: return Load<uint32_t>(p, i);
    case ncclInt64: return Load<int64_t>(p, i);
    case ncclUint64: return Load<uint64_t>(p, i);
    case ncclFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case ncclFloat32: return Load<float>(p, i);
    case ncclFloat64: return Load<double>(p, i);
  }
  return 0;
}
void StoreAny(ncclDataType_t t, void* p, size_t i, double v) {
  switch (t) {
    case ncclInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); return;
    case ncclUint8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
    case ncclInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case ncclUint32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v); return;
    case ncclInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case ncclUint64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v); return;
    case ncclFloat16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); return;
    case ncclBfloat16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); return;
    case ncclFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case ncclFloat64: static_cast<double*>(p)[i] = v; return;
  }
}

// `elements` of every rank's `inputs` reduced (element by element, in rank order; 64-bit
// integers beyond 2^53 are not exact here) into `out`.
void Reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<const void*>& inputs, size_t offset, size_t elements,
            void* out) {
  for (size_t i = 0; i < elements; ++i) {
    double acc = LoadAny(t, inputs[0], offset + i);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const double v = LoadAny(t, inputs[r], offset + i);
      switch (op) {
        case ncclSum:
        case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::isnan(acc) || std::isnan(v) ? acc + v : std::max(acc, v); break;  // NaN wins
        case ncclMin: acc = std::isnan(acc) || std::isnan(v) ? acc + v : std::min(acc, v); break;
      }
    }
    if (op == ncclAvg) acc /= static_cast<double>(inputs.size());
    StoreAny(t, out, i, acc);
  }
}

// Every rank's result of a collective all have called: the inputs are read in full before any
// output is written (an output may be its rank's input).
void Run(Clique& c, Clique::Collective& k) {
  for (const Call& call : k.calls)
    if (!call.Matches(k.calls[0])) {
      for (ncclComm* comm : c.comms)
        if (comm) comm->async = ncclInvalidUsage;
      return;
    }
  const Call& first = k.calls[0];
  const size_t es = TypeBytes(first.type), n = static_cast<size_t>(c.n), bytes = first.count * es;
  std::vector<const void*> inputs;
  for (const Call& call : k.calls) inputs.push_back(call.send);
  std::vector<char> result;
  switch (first.kind) {
    case Call::kAllReduce:
      result.resize(bytes);
      Reduce(first.type, first.op, inputs, 0, first.count, result.data());
      for (const Call& call : k.calls) std::memcpy(call.recv, result.data(), bytes);
      return;
    case Call::kAllGather:
      result.resize(bytes * n);
      for (size_t r = 0; r < n; ++r) std::memcpy(result.data() + r * bytes, inputs[r], bytes);
      for (const Call& call : k.calls) std::memcpy(call.recv, result.data(), bytes * n);
      return;
    case Call::kReduceScatter:
      result.resize(bytes * n);
      Reduce(first.type, first.op, inputs, 0, first.count * n, result.data());
      for (size_t r = 0; r < n; ++r) std::memcpy(k.calls[r].recv, result.data() + r * bytes, bytes);
      return;
    case Call::kBroadcast:
      result.assign(static_cast<const char*>(inputs[static_cast<size_t>(first.root)]),
                    static_cast<const char*>(inputs[static_cast<size_t>(first.root)]) + bytes);
      for (const Call& call : k.calls) std::memcpy(call.recv, result.data(), bytes);
      return;
  }
}

// On the rank's stream: arrives at collective `number` and waits for the others.
void Meet(ncclComm* comm, uint64_t number, const Call& call) {
  Clique& c = *comm->clique;
  std::unique_lock<std::mutex> lock(c.mu);
  if (Stopped(comm)) return EndStopped(comm);
  Clique::Collective& k = c.collectives[number];
  if (k.calls.empty()) k.calls.resize(static_cast<size_t>(c.n));
  k.calls[static_cast<size_t>(comm->rank)] = call;
  if (++k.arrived == c.n) {
    Run(c, k);
    k.done = true;
    c.cv.notify_all();
  } else {
    c.cv.wait(lock, [&] { return k.done || Stopped(comm); });
  }
  if (!k.done) return EndStopped(comm);
  if (++k.left == c.n) c.collectives.erase(number);
}

// Posts a message to `peer` (on the sender's stream); the receive takes it.
Message* Post(ncclComm* comm, int peer, const void* data, size_t bytes) {
  Clique& c = *comm->clique;
  std::lock_guard<std::mutex> lock(c.mu);
  auto* m = new Message{data, bytes};
  c.mailboxes[{comm->rank, peer}].push_back(m);
  c.cv.notify_all();
  return m;
}
void AwaitTaken(ncclComm* comm, int peer, Message* m) {
  Clique& c = *comm->clique;
  std::unique_lock<std::mutex> lock(c.mu);
  c.cv.wait(lock, [&] { return m->taken || Stopped(comm); });
  if (!m->taken) {
    auto& box = c.mailboxes[{comm->rank, peer}];
    box.erase(std::remove(box.begin(), box.end(), m), box.end());
    EndStopped(comm);
  }
  delete m;
}
void Receive(ncclComm* comm, int peer, void* data, size_t bytes) {
  Clique& c = *comm->clique;
  std::unique_lock<std::mutex> lock(c.mu);
  auto& box = c.mailboxes[{peer, comm->rank}];
  c.cv.wait(lock, [&] { return !box.empty() || Stopped(comm); });
  if (box.empty()) return EndStopped(comm);
  Message* m = box.front();
  box.pop_front();
  if (m->bytes != bytes)
    comm->async = ncclInvalidUsage;  // NCCL requires the sizes to match
  else
    std::memcpy(data, m->data, bytes);
  m->taken = true;
  c.cv.notify_all();
}

struct P2p {
  bool send;
  ncclComm* comm;
  int peer;
  const void* send_data;
  void* recv_data;
  size_t bytes;
};

// The calling thread's open group (ncclGroupStart): its messages, queued together at the end
// on one stream (sends posted first, so that a rank's sends and receives with the others in
// one group cannot wait on each other).
struct Group {
  int depth = 0;
  cudaStream_t stream = nullptr;
  bool mixed_streams = false;
  std::vector<P2p> ops;
};
thread_local Group g_group;

ncclResult_t QueueP2p(const P2p& p, cudaStream_t stream) {
  if (!p.comm) return ncclInvalidArgument;
  if (p.peer < 0 || p.peer >= p.comm->clique->n) return ncclInvalidArgument;
  if (g_group.depth > 0) {
    if (!g_group.ops.empty() && g_group.stream != stream) g_group.mixed_streams = true;
    g_group.stream = stream;
    g_group.ops.push_back(p);
    return ncclSuccess;
  }
  cleave::cuda_emu::Enqueue(stream, [p] {
    if (p.send)
      AwaitTaken(p.comm, p.peer, Post(p.comm, p.peer, p.send_data, p.bytes));
    else
      Receive(p.comm, p.peer, p.recv_data, p.bytes);
  });
  return ncclSuccess;
}

ncclResult_t QueueCollective(ncclComm* comm, const Call& call, cudaStream_t stream) {
  if (!comm) return ncclInvalidArgument;
  if (TypeBytes(call.type) == 0 || call.root < 0 || call.root >= comm->clique->n) return ncclInvalidArgument;
  const uint64_t number = comm->collectives++;
  cleave::cuda_emu::Enqueue(stream, [comm, number, call] { Meet(comm, number, call); });
  return ncclSuccess;
}

constexpr std::chrono::seconds kJoinTimeout{30};

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Clique>> forming;  // by unique id, until every rank joined
  uint64_t next_id = 1;
};
Registry& Cliques() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

// The process and a number: an id made by another process names no clique here.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  std::memset(id, 0, sizeof *id);
  const int64_t pid = getpid();
  uint64_t number;
  {
    Registry& r = Cliques();
    std::lock_guard<std::mutex> lock(r.mu);
    number = r.next_id++;
  }
  std::memcpy(id->internal, &pid, sizeof pid);
  std::memcpy(id->internal + sizeof pid, &number, sizeof number);
  return ncclSuccess;
}

// Blocks until all `nranks` have joined, as NCCL's does (kJoinTimeout at most).
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int64_t pid;
  std::memcpy(&pid, id.internal, sizeof pid);
  if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (pid != getpid()) return ncclInvalidUsage;  // the emulation joins the ranks of one process only
  std::shared_ptr<Clique> clique;
  auto* made = new ncclComm;
  made->rank = rank;
  {
    Registry& r = Cliques();
    std::lock_guard<std::mutex> lock(r.mu);
    std::shared_ptr<Clique>& slot = r.forming[std::string(id.internal, sizeof id.internal)];
    if (!slot) slot = std::make_shared<Clique>(nranks);
    clique = slot;
    std::lock_guard<std::mutex> clique_lock(clique->mu);
    if (clique->n != nranks || clique->comms[static_cast<size_t>(rank)]) {
      delete made;
      return ncclInvalidUsage;
    }
    made->clique = clique;
    clique->comms[static_cast<size_t>(rank)] = made;
    if (++clique->joined == nranks) r.forming.erase(std::string(id.internal, sizeof id.internal));
    clique->cv.notify_all();
  }
  // A rank that never comes (its process died) ends the wait with an error, as NCCL's
  // bootstrap gives up on a peer that does not connect.
  std::unique_lock<std::mutex> lock(clique->mu);
  if (!clique->cv.wait_for(lock, kJoinTimeout, [&] { return clique->joined == clique->n; })) {
    clique->comms[static_cast<size_t>(rank)] = nullptr;
    clique->broken = true;
    delete made;
    return ncclRemoteError;
  }
  *comm = made;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lock(comm->clique->mu);
    comm->clique->comms[static_cast<size_t>(comm->rank)] = nullptr;
  }
  delete comm;
  return ncclSuccess;
}

// The rank's waiting work ends; the other ranks' ends with ncclRemoteError, as when a peer
// dies.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  std::shared_ptr<Clique> clique = comm->clique;
  {
    std::lock_guard<std::mutex> lock(clique->mu);
    comm->aborted = true;
    clique->broken = true;
    clique->cv.notify_all();
  }
  // Work already queued on a stream may still name it: it is kept (aborted) rather than freed.
  std::lock_guard<std::mutex> lock(clique->mu);
  clique->comms[static_cast<size_t>(comm->rank)] = nullptr;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!comm || !async_error) return ncclInvalidArgument;
  *async_error = comm->async.load();
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return QueueCollective(comm, Call{Call::kAllReduce, send, recv, count, type, op, 0}, stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return QueueCollective(comm, Call{Call::kAllGather, send, recv, send_count, type, ncclSum, 0}, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return QueueCollective(comm, Call{Call::kReduceScatter, send, recv, recv_count, type, op, 0}, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return QueueCollective(comm, Call{Call::kBroadcast, send, recv, count, type, ncclSum, root}, stream);
}
ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return QueueP2p(P2p{true, comm, peer, send, nullptr, count * TypeBytes(type)}, stream);
}
ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return QueueP2p(P2p{false, comm, peer, nullptr, recv, count * TypeBytes(type)}, stream);
}

ncclResult_t ncclGroupStart() {
  ++g_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group.depth == 0) return ncclInvalidUsage;
  if (--g_group.depth > 0) return ncclSuccess;
  std::vector<P2p> ops = std::move(g_group.ops);
  g_group.ops.clear();
  const bool mixed = g_group.mixed_streams;
  g_group.mixed_streams = false;
  if (mixed) return ncclInvalidUsage;  // one stream per group here
  if (ops.empty()) return ncclSuccess;
  cleave::cuda_emu::Enqueue(g_group.stream, [ops] {
    std::vector<std::pair<const P2p*, Message*>> posted;
    for (const P2p& p : ops)
      if (p.send) posted.emplace_back(&p, Post(p.comm, p.peer, p.send_data, p.bytes));
    for (const P2p& p : ops)
      if (!p.send) Receive(p.comm, p.peer, p.recv_data, p.bytes);
    for (auto& [p, m] : posted) AwaitTaken(p->comm, p->peer, m);
  });
  return ncclSuccess;
}
