// The simulated world (runtime/): see simulated_communicator.h.
#include "runtime/simulated_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cleave::runtime {

namespace {

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kBarrier };

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllReduce: return "AllReduce";
    case Kind::kAllGather: return "AllGather";
    case Kind::kReduceScatter: return "ReduceScatter";
    case Kind::kAllToAll: return "AllToAll";
    case Kind::kBroadcast: return "Broadcast";
    case Kind::kBarrier: return "Barrier";
  }
  return "?";
}

// One collective in flight: every member's input, then every member's result.
struct Slot {
  Kind kind;
  DataType dtype;
  int64_t numel;
  int root = -1;
  std::vector<const void*> inputs;
  std::vector<char> arrived;
  int arrivals = 0, computed = 0, departures = 0;
  std::string error;
};

template <typename T>
void Reduce(ReduceOp op, const std::vector<const void*>& in, int64_t offset, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    T acc = static_cast<const T*>(in[0])[offset + i];
    for (size_t r = 1; r < in.size(); ++r) {
      const T v = static_cast<const T*>(in[r])[offset + i];
      acc = op == ReduceOp::kSum ? acc + v : std::max(acc, v);
    }
    out[i] = acc;
  }
}

void ReduceAny(DataType t, ReduceOp op, const std::vector<const void*>& in, int64_t offset, int64_t n, void* out) {
  switch (t) {
    case DataType::kFloat32: return Reduce(op, in, offset, n, static_cast<float*>(out));
    case DataType::kFloat64: return Reduce(op, in, offset, n, static_cast<double*>(out));
    case DataType::kInt64: return Reduce(op, in, offset, n, static_cast<int64_t*>(out));
    case DataType::kInt32: return Reduce(op, in, offset, n, static_cast<int32_t*>(out));
    default: CLEAVE_CHECK(false);
  }
}

bool Reducible(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kInt64 || t == DataType::kInt32;
}

}  // namespace

struct SimulatedWorld::State {
  int world;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  // (channel, group, sequence number on that group) -> slot. Channel 0 is the world's own
  // communicators; a duplicate of a rank's communicator gets the next channel of that rank.
  std::map<std::tuple<int, std::vector<int>, int64_t>, Slot> slots;
  std::vector<std::map<std::pair<int, std::vector<int>>, int64_t>> sequence;  // per rank, per (channel, group)
  std::map<std::tuple<int, int, int, int>, std::deque<std::vector<char>>> mailboxes;  // (channel, src, dst, tag)
  std::vector<int> duplicates;  // per rank: channels made so far
  std::vector<int64_t> bytes_sent;
  std::vector<std::unique_ptr<Communicator>> comms;
};

namespace {

class SimComm : public Communicator {
 public:
  SimComm(SimulatedWorld::State& s, int rank, int channel = 0) : s_(s), rank_(rank), channel_(channel) {}
  int rank() const override { return rank_; }
  absl::StatusOr<std::unique_ptr<Communicator>> Duplicate() override {
    std::lock_guard<std::mutex> lock(s_.mu);
    return std::unique_ptr<Communicator>(new SimComm(s_, rank_, ++s_.duplicates[rank_]));
  }
  int world_size() const override { return s_.world; }

  absl::Status AllReduce(const TensorView& in, const TensorView& out, ReduceOp op,
                         std::span<const int> group) override {
    if (in.numel() != out.numel() || in.dtype != out.dtype)
      return InvalidArgument("AllReduce: output ", DataTypeName(out.dtype), "[", out.numel(), "] does not match input ",
                             DataTypeName(in.dtype), "[", in.numel(), "]");
    return Collective(Kind::kAllReduce, in, out, group, -1, [&](const Slot& sl, int, void* dst) {
      ReduceAny(in.dtype, op, sl.inputs, 0, in.numel(), dst);
    });
  }
  absl::Status AllGather(const TensorView& in, const TensorView& out, std::span<const int> group) override {
    const int64_t n = static_cast<int64_t>(group.size());
    if (out.numel() != n * in.numel() || in.dtype != out.dtype)
      return InvalidArgument("AllGather: output of ", out.numel(), " elements, expected ", n, " x ", in.numel());
    return Collective(Kind::kAllGather, in, out, group, -1, [&](const Slot& sl, int, void* dst) {
      const size_t bytes = in.nbytes();
      for (int64_t r = 0; r < n; ++r) std::memcpy(static_cast<char*>(dst) + r * bytes, sl.inputs[r], bytes);
    });
  }
  absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op,
                             std::span<const int> group) override {
    const int64_t n = static_cast<int64_t>(group.size());
    if (in.numel() != n * out.numel() || in.dtype != out.dtype)
      return InvalidArgument("ReduceScatter: input of ", in.numel(), " elements, expected ", n, " x ", out.numel());
    return Collective(Kind::kReduceScatter, in, out, group, -1, [&](const Slot& sl, int me, void* dst) {
      ReduceAny(in.dtype, op, sl.inputs, me * out.numel(), out.numel(), dst);
    });
  }
  absl::Status AllToAll(const TensorView& in, const TensorView& out, std::span<const int> group) override {
    const int64_t n = static_cast<int64_t>(group.size());
    if (in.numel() != out.numel() || in.numel() % n != 0 || in.dtype != out.dtype)
      return InvalidArgument("AllToAll: input and output must hold the same multiple of ", n, " elements");
    return Collective(Kind::kAllToAll, in, out, group, -1, [&](const Slot& sl, int me, void* dst) {
      const size_t chunk = in.nbytes() / n;
      for (int64_t r = 0; r < n; ++r)
        std::memcpy(static_cast<char*>(dst) + r * chunk, static_cast<const char*>(sl.inputs[r]) + me * chunk, chunk);
    });
  }
  absl::Status Broadcast(const TensorView& buf, int root, std::span<const int> group) override {
    const auto it = std::find(group.begin(), group.end(), root);
    if (it == group.end()) return InvalidArgument("Broadcast: root ", root, " is not in the group");
    const int root_index = static_cast<int>(it - group.begin());
    return Collective(Kind::kBroadcast, buf, buf, group, root, [&](const Slot& sl, int, void* dst) {
      std::memcpy(dst, sl.inputs[root_index], buf.nbytes());
    });
  }
  absl::Status Barrier(std::span<const int> group) override {
    TensorView none;
    none.dtype = DataType::kFloat32;
    return Collective(Kind::kBarrier, none, none, group, -1, [](const Slot&, int, void*) {});
  }

  absl::Status Send(const TensorView& t, int peer, int tag) override {
    if (peer < 0 || peer >= s_.world || peer == rank_)
      return InvalidArgument("rank ", rank_, ": Send to invalid peer ", peer);
    std::lock_guard<std::mutex> lock(s_.mu);
    const char* p = static_cast<const char*>(t.data);
    s_.mailboxes[{channel_, rank_, peer, tag}].emplace_back(p, p + t.nbytes());
    s_.bytes_sent[rank_] += static_cast<int64_t>(t.nbytes());
    s_.cv.notify_all();
    return absl::OkStatus();
  }
  absl::Status Recv(const TensorView& t, int peer, int tag) override {
    if (peer < 0 || peer >= s_.world || peer == rank_)
      return InvalidArgument("rank ", rank_, ": Recv from invalid peer ", peer);
    std::unique_lock<std::mutex> lock(s_.mu);
    auto& box = s_.mailboxes[{channel_, peer, rank_, tag}];
    if (!s_.cv.wait_for(lock, s_.timeout, [&] { return !box.empty(); }))
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": Recv from rank ", peer, " tag ", tag,
                                                      ": nothing arrived within ", s_.timeout.count(), " ms"));
    std::vector<char> msg = std::move(box.front());
    box.pop_front();
    if (msg.size() != t.nbytes())
      return InvalidArgument("rank ", rank_, ": Recv from rank ", peer, " tag ", tag, ": message of ", msg.size(),
                             " bytes, the buffer holds ", t.nbytes());
    std::memcpy(t.data, msg.data(), msg.size());
    return absl::OkStatus();
  }

 private:
  template <typename Fn>
  absl::Status Collective(Kind kind, const TensorView& in, const TensorView& out, std::span<const int> group_span,
                          int root, Fn compute) {
    std::vector<int> group(group_span.begin(), group_span.end());
    const auto me_it = std::find(group.begin(), group.end(), rank_);
    if (me_it == group.end())
      return InvalidArgument("rank ", rank_, " calls ", KindName(kind), " on group [", absl::StrJoin(group, ","),
                             "] it is not in");
    if (kind != Kind::kBarrier && !Reducible(in.dtype) &&
        (kind == Kind::kAllReduce || kind == Kind::kReduceScatter))
      return InvalidArgument(KindName(kind), " of ", DataTypeName(in.dtype), " is not supported");
    const int me = static_cast<int>(me_it - group.begin());
    const int n = static_cast<int>(group.size());
    const std::string what = absl::StrCat(KindName(kind), " over ranks [", absl::StrJoin(group, ","), "]");
    std::unique_lock<std::mutex> lock(s_.mu);
    const int64_t seq = s_.sequence[rank_][{channel_, group}]++;
    auto key = std::make_tuple(channel_, group, seq);
    auto [it, fresh] = s_.slots.try_emplace(key);
    Slot& sl = it->second;
    if (fresh) {
      sl.kind = kind;
      sl.dtype = in.dtype;
      sl.numel = in.numel();
      sl.root = root;
      sl.inputs.assign(n, nullptr);
      sl.arrived.assign(n, 0);
    } else if (sl.kind != kind || sl.dtype != in.dtype || sl.numel != in.numel() || sl.root != root) {
      sl.error = absl::StrCat(what, ": rank ", rank_, " called ", KindName(kind), " with ", DataTypeName(in.dtype), "[",
                              in.numel(), "] where another member called ", KindName(sl.kind), " with ",
                              DataTypeName(sl.dtype), "[", sl.numel, "]");
    }
    sl.inputs[me] = in.data;
    sl.arrived[me] = 1;
    ++sl.arrivals;
    s_.bytes_sent[rank_] += static_cast<int64_t>(in.nbytes());
    s_.cv.notify_all();
    auto wait = [&](auto pred, const char* phase) -> absl::Status {
      if (s_.cv.wait_for(lock, s_.timeout, pred)) return absl::OkStatus();
      std::vector<int> missing;
      for (int r = 0; r < n; ++r)
        if (!sl.arrived[r]) missing.push_back(group[r]);
      return absl::DeadlineExceededError(absl::StrCat("rank ", rank_, ": ", what, " timed out after ",
                                                      s_.timeout.count(), " ms ", phase, "; missing rank(s) [",
                                                      absl::StrJoin(missing, ","), "]"));
    };
    RETURN_IF_ERROR(wait([&] { return sl.arrivals == n || !sl.error.empty(); }, "waiting for every member"));
    if (!sl.error.empty()) return absl::InvalidArgumentError(sl.error);
    // Every input is in place and stays valid until every member has computed. Results go
    // to a private buffer first: an in-place AllReduce must not overwrite its input while
    // other members still read it.
    lock.unlock();
    std::vector<char> result(out.data ? out.nbytes() : 0);
    compute(sl, me, result.data());
    lock.lock();
    ++sl.computed;
    s_.cv.notify_all();
    RETURN_IF_ERROR(wait([&] { return sl.computed == n; }, "waiting for every member to finish"));
    if (++sl.departures == n) s_.slots.erase(it);
    lock.unlock();
    if (!result.empty()) std::memcpy(out.data, result.data(), result.size());
    return absl::OkStatus();
  }

  SimulatedWorld::State& s_;
  int rank_;
  int channel_;
};

}  // namespace

SimulatedWorld::SimulatedWorld(int world_size, std::chrono::milliseconds timeout) : state_(new State) {
  state_->world = world_size;
  state_->timeout = timeout;
  state_->sequence.resize(world_size);
  state_->bytes_sent.assign(world_size, 0);
  state_->duplicates.assign(world_size, 0);
  for (int r = 0; r < world_size; ++r) state_->comms.push_back(std::make_unique<SimComm>(*state_, r));
}

SimulatedWorld::~SimulatedWorld() = default;
int SimulatedWorld::world_size() const { return state_->world; }
Communicator* SimulatedWorld::rank(int r) { return state_->comms.at(r).get(); }
int64_t SimulatedWorld::bytes_sent(int r) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bytes_sent.at(r);
}

}  // namespace cleave::runtime
