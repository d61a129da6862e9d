// Pipeline schedules and their simulation (partition/): see schedule.h.
// The simulator runs the lists as a dataflow: each rank advances through its own list as far
// as its recvs allow, and a recv finishes at the later of its rank's clock and the send's time.
// So the timings do not depend on the order in which ranks are visited, and a full pass in
// which no rank moves while some still have actions left is a deadlock.
#include "partition/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cleave::partition {

absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "interleaved") return ScheduleKind::kInterleaved1F1B;
  return InvalidArgument("unknown pipeline schedule '", name,
                         "' (expected gpipe, 1f1b or interleaved)");
}

const char* ScheduleKindName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved";
  }
  return "unknown";
}

std::string Action::ToString(bool with_chunk) const {
  const char* prefix = "";
  switch (kind) {
    case ActionKind::kForward: prefix = "F"; break;
    case ActionKind::kBackward: prefix = "B"; break;
    case ActionKind::kSendActivation: prefix = "SEND_F"; break;
    case ActionKind::kRecvActivation: prefix = "RECV_F"; break;
    case ActionKind::kSendGrad: prefix = "SEND_B"; break;
    case ActionKind::kRecvGrad: prefix = "RECV_B"; break;
  }
  std::string s = absl::StrCat(prefix, microbatch);
  if (with_chunk) absl::StrAppend(&s, ".", chunk);
  return s;
}

std::string FormatActions(const std::vector<Action>& actions, bool with_chunk) {
  std::string s;
  for (const Action& a : actions) {
    if (!s.empty()) s += ' ';
    s += a.ToString(with_chunk);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------------------------

namespace {

// Appends one rank's F or B of (micro-batch, chunk) with the transfers around it.
class RankBuilder {
 public:
  RankBuilder(int rank, int p, int v) : rank_(rank), p_(p), last_(p * v - 1) {}

  void Forward(int mb, int chunk) {
    const int vs = chunk * p_ + rank_;
    if (vs > 0) Push(ActionKind::kRecvActivation, mb, chunk, (rank_ + p_ - 1) % p_);
    Push(ActionKind::kForward, mb, chunk, -1);
    if (vs < last_) Push(ActionKind::kSendActivation, mb, chunk, (rank_ + 1) % p_);
  }
  void Backward(int mb, int chunk) {
    const int vs = chunk * p_ + rank_;
    if (vs < last_) Push(ActionKind::kRecvGrad, mb, chunk, (rank_ + 1) % p_);
    Push(ActionKind::kBackward, mb, chunk, -1);
    if (vs > 0) Push(ActionKind::kSendGrad, mb, chunk, (rank_ + p_ - 1) % p_);
  }
  std::vector<Action> Take() { return std::move(actions_); }

 private:
  void Push(ActionKind kind, int mb, int chunk, int peer) {
    actions_.push_back(Action{kind, mb, chunk, peer});
  }
  int rank_, p_, last_;
  std::vector<Action> actions_;
};

absl::Status CheckScheduleParams(ScheduleKind kind, int p, int m, int v) {
  const char* name = ScheduleKindName(kind);
  if (p < 1) return InvalidArgument("schedule ", name, ": expected at least 1 stage, got p=", p);
  if (m < 1) return InvalidArgument("schedule ", name, ": expected at least 1 micro-batch, got m=", m);
  if (v < 1)
    return InvalidArgument("schedule ", name, ": expected at least 1 model chunk per stage, got v=", v);
  // Bounds the lists (about 6 actions per F/B pair) well below what a real run could use.
  if (static_cast<int64_t>(p) * m * v > (int64_t{1} << 22))
    return InvalidArgument("schedule ", name, ": p*m*v = ", static_cast<int64_t>(p) * m * v,
                           " (p=", p, ", m=", m, ", v=", v, ") exceeds the limit of 2^22");
  if (kind != ScheduleKind::kInterleaved1F1B) {
    if (v != 1)
      return InvalidArgument("schedule ", name, " runs one model chunk per stage: expected v=1, got v=",
                             v, " (use interleaved for virtual stages)");
    return absl::OkStatus();
  }
  if (v < 2)
    return InvalidArgument("schedule interleaved: expected v >= 2 model chunks per stage, got v=", v,
                           " (use 1f1b)");
  if (p < 2)
    return InvalidArgument("schedule interleaved: expected at least 2 stages, got p=", p);
  if (m % p != 0)
    return InvalidArgument("schedule interleaved: the micro-batch count must be a multiple of the stage "
                           "count (micro-batches go through each chunk in groups of p), got m=",
                           m, " and p=", p);
  return absl::OkStatus();
}

std::vector<Action> GPipeRank(int rank, int p, int m) {
  RankBuilder b(rank, p, 1);
  for (int i = 0; i < m; ++i) b.Forward(i, 0);
  // Backward in forward order: the gradient of micro-batch 0 is the first to reach rank 0.
  for (int i = 0; i < m; ++i) b.Backward(i, 0);
  return b.Take();
}

std::vector<Action> OneFOneBRank(int rank, int p, int m) {
  RankBuilder b(rank, p, 1);
  // Rank r keeps p - r micro-batches in flight: enough that the last stage never waits for a
  // forward once the pipe is full, and no more, which bounds activation memory by p.
  const int warmup = std::min(p - rank - 1, m);
  const int steady = m - warmup;
  for (int i = 0; i < warmup; ++i) b.Forward(i, 0);
  for (int i = 0; i < steady; ++i) {
    b.Forward(warmup + i, 0);
    b.Backward(i, 0);
  }
  for (int i = steady; i < m; ++i) b.Backward(i, 0);
  return b.Take();
}

// Megatron's virtual pipeline. The k-th forward of a rank (k < v*m) runs micro-batch
// (k / (p v)) * p + k % p on chunk (k % (p v)) / p: p micro-batches through chunk 0, the same p
// through chunk 1, and so on, then the next group of p. Backwards walk the same sequence with
// the chunks reversed. Groups of exactly p make the first micro-batch come back to rank 0 for
// chunk c+1 just as rank 0 finishes the group on chunk c.
std::vector<Action> InterleavedRank(int rank, int p, int m, int v) {
  RankBuilder b(rank, p, v);
  const int total = v * m;
  const int group = p * v;
  auto mb_of = [&](int k) { return (k / group) * p + k % p; };
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % group) / p;
    return forward ? c : v - 1 - c;
  };
  // Megatron runs every forward first when m == p: the steady phase would have nothing to
  // overlap, and the all-forward order already reaches the same bubble.
  const int warmup =
      m == p ? total : std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) b.Forward(mb_of(k), chunk_of(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    b.Forward(mb_of(warmup + k), chunk_of(warmup + k, true));
    b.Backward(mb_of(k), chunk_of(k, false));
  }
  for (int k = total - warmup; k < total; ++k) b.Backward(mb_of(k), chunk_of(k, false));
  return b.Take();
}

}  // namespace

absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int stages, int microbatches,
                                       int virtual_stages) {
  RETURN_IF_ERROR(CheckScheduleParams(kind, stages, microbatches, virtual_stages));
  Schedule s(stages);
  for (int r = 0; r < stages; ++r) {
    switch (kind) {
      case ScheduleKind::kGPipe: s[r] = GPipeRank(r, stages, microbatches); break;
      case ScheduleKind::k1F1B: s[r] = OneFOneBRank(r, stages, microbatches); break;
      case ScheduleKind::kInterleaved1F1B:
        s[r] = InterleavedRank(r, stages, microbatches, virtual_stages);
        break;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Checking
// ---------------------------------------------------------------------------------------------

namespace {

// A message is named by its direction, micro-batch and the virtual stage that sends it; the
// receiver is the next (activation) or previous (gradient) virtual stage.
struct MessageKey {
  bool grad = false;
  int microbatch = 0;
  int from = 0;
  auto operator<=>(const MessageKey&) const = default;
};

struct Place {
  int rank = 0;
  int index = 0;
};

// What the lists imply: p ranks, v chunks per rank, m micro-batches.
struct Layout {
  int p = 0, v = 0, m = 0;
  int last() const { return p * v - 1; }
};

// The positions of one (micro-batch, chunk)'s actions in its rank's list; -1 when absent.
struct Slots {
  int f = -1, b = -1, recv_f = -1, send_f = -1, recv_b = -1, send_b = -1;
};

// Everything the simulator needs from the checks.
struct Checked {
  Layout layout;
  std::vector<std::vector<MessageKey>> keys;  // per rank and action; meaningful for send/recv
  std::map<MessageKey, Place> sends, recvs;
};

std::string Where(const Schedule& s, const Layout& l, int rank, int index) {
  return absl::StrCat("rank ", rank, " action ", index, " (", s[rank][index].ToString(l.v > 1), ")");
}

absl::StatusOr<Layout> InferLayout(const Schedule& s) {
  if (s.empty()) return InvalidArgument("pipeline schedule has no ranks");
  Layout l;
  l.p = static_cast<int>(s.size());
  for (int r = 0; r < l.p; ++r) {
    for (size_t i = 0; i < s[r].size(); ++i) {
      const Action& a = s[r][i];
      if (a.microbatch < 0 || a.chunk < 0 || a.microbatch >= (1 << 22) || a.chunk >= (1 << 12))
        return InvalidArgument("rank ", r, " action ", i, ": micro-batch ", a.microbatch, " and chunk ",
                               a.chunk, " must lie in [0, 2^22) and [0, 2^12)");
      l.m = std::max(l.m, a.microbatch + 1);
      l.v = std::max(l.v, a.chunk + 1);
    }
  }
  if (l.m == 0) return InvalidArgument("pipeline schedule has no actions on any of its ", l.p, " ranks");
  // The checks index every (rank, micro-batch, chunk); the same bound as BuildSchedule's.
  if (static_cast<int64_t>(l.p) * l.m * l.v > (int64_t{1} << 22))
    return InvalidArgument("pipeline schedule: ", l.p, " ranks x ", l.m, " micro-batches x ", l.v,
                           " chunks exceeds the limit of 2^22");
  return l;
}

// The message a send/recv names, after checking that its peer is the adjacent virtual stage.
absl::StatusOr<MessageKey> KeyOf(const Schedule& s, const Layout& l, int rank, int index) {
  const Action& a = s[rank][index];
  const int vs = a.chunk * l.p + rank;
  const bool grad = a.kind == ActionKind::kSendGrad || a.kind == ActionKind::kRecvGrad;
  // Activations go to vs + 1 and come from vs - 1; gradients the other way.
  const bool toward_next = (a.kind == ActionKind::kSendActivation) || (a.kind == ActionKind::kRecvGrad);
  const int other = toward_next ? vs + 1 : vs - 1;
  if (other < 0 || other > l.last())
    return InvalidArgument(Where(s, l, rank, index), ": virtual stage ", vs, " is the ",
                           other < 0 ? "first" : "last", " of ", l.last() + 1, ", so it has no ",
                           other < 0 ? "previous" : "next", " stage to exchange with");
  if (a.peer != other % l.p)
    return InvalidArgument(Where(s, l, rank, index), ": expected peer rank ", other % l.p,
                           " (virtual stage ", other, "), got ", a.peer);
  return MessageKey{grad, a.microbatch, a.IsSend() ? vs : other};
}

int* SlotOf(Slots& slots, ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward: return &slots.f;
    case ActionKind::kBackward: return &slots.b;
    case ActionKind::kRecvActivation: return &slots.recv_f;
    case ActionKind::kSendActivation: return &slots.send_f;
    case ActionKind::kRecvGrad: return &slots.recv_b;
    case ActionKind::kSendGrad: return &slots.send_b;
  }
  return nullptr;
}

// Order inside one rank: the data a compute consumes is received before it, what it produces
// is sent after it, and each virtual stage runs F and then B of every micro-batch.
absl::Status CheckSlotOrder(const Layout& l, int rank, int mb, int chunk, const Slots& s) {
  const int vs = chunk * l.p + rank;
  auto name = [&](const char* what) {
    return absl::StrCat(what, mb, l.v > 1 ? absl::StrCat(".", chunk) : std::string());
  };
  auto at = [](int index) { return absl::StrCat(" (action ", index, ")"); };
  if (s.f < 0) return InvalidArgument("rank ", rank, " never runs ", name("F"));
  if (s.b < 0) return InvalidArgument("rank ", rank, " never runs ", name("B"));
  if (s.b < s.f)
    return InvalidArgument("rank ", rank, " runs ", name("B"), at(s.b), " before ", name("F"), at(s.f));
  if (vs > 0 && (s.recv_f < 0 || s.recv_f > s.f))
    return InvalidArgument("rank ", rank, " runs ", name("F"), at(s.f), " without its input: expected ",
                           name("RECV_F"), " from rank ", (vs - 1) % l.p, " before it");
  if (vs < l.last() && (s.recv_b < 0 || s.recv_b > s.b))
    return InvalidArgument("rank ", rank, " runs ", name("B"), at(s.b), " without its input: expected ",
                           name("RECV_B"), " from rank ", (vs + 1) % l.p, " before it");
  if (s.send_f >= 0 && s.send_f < s.f)
    return InvalidArgument("rank ", rank, " sends ", name("SEND_F"), at(s.send_f), " before computing ",
                           name("F"), at(s.f));
  if (s.send_b >= 0 && s.send_b < s.b)
    return InvalidArgument("rank ", rank, " sends ", name("SEND_B"), at(s.send_b), " before computing ",
                           name("B"), at(s.b));
  return absl::OkStatus();
}

// Indexes one rank's list: fields, peers and no action twice. Returns where each
// (micro-batch, chunk)'s actions sit, and records its messages in `c`.
absl::StatusOr<std::vector<Slots>> IndexRank(const Schedule& s, int rank, Checked& c) {
  const Layout& l = c.layout;
  std::vector<Slots> slots(static_cast<size_t>(l.m) * l.v);
  c.keys[rank].resize(s[rank].size());
  for (int i = 0; i < static_cast<int>(s[rank].size()); ++i) {
    const Action& a = s[rank][i];
    int* slot = SlotOf(slots[static_cast<size_t>(a.microbatch) * l.v + a.chunk], a.kind);
    if (*slot >= 0)
      return InvalidArgument("rank ", rank, " runs ", a.ToString(l.v > 1), " twice (actions ", *slot,
                             " and ", i, ")");
    *slot = i;
    if (a.IsCompute()) continue;
    ASSIGN_OR_RETURN(c.keys[rank][i], KeyOf(s, l, rank, i));
    (a.IsSend() ? c.sends : c.recvs)[c.keys[rank][i]] = Place{rank, i};
  }
  return slots;
}

// Every send has exactly one recv and every recv one send. Keys are unique per list, and a key
// belongs to one sending and one receiving rank, so uniqueness across ranks follows.
absl::Status CheckMatching(const Schedule& s, const Checked& c) {
  const Layout& l = c.layout;
  for (const auto& [key, at] : c.sends) {
    if (c.recvs.count(key)) continue;
    const int to = key.grad ? key.from - 1 : key.from + 1;
    const Action recv{key.grad ? ActionKind::kRecvGrad : ActionKind::kRecvActivation, key.microbatch,
                      to / l.p, -1};
    return InvalidArgument(Where(s, l, at.rank, at.index), " is never received: rank ", to % l.p,
                           " has no ", recv.ToString(l.v > 1));
  }
  for (const auto& [key, at] : c.recvs) {
    if (c.sends.count(key)) continue;
    return InvalidArgument(Where(s, l, at.rank, at.index), " would wait forever: rank ",
                           s[at.rank][at.index].peer, " never sends it");
  }
  return absl::OkStatus();
}

absl::StatusOr<Checked> CheckSchedule(const Schedule& s) {
  Checked c;
  ASSIGN_OR_RETURN(c.layout, InferLayout(s));
  const Layout& l = c.layout;
  c.keys.resize(s.size());
  std::vector<std::vector<Slots>> slots(s.size());
  for (int r = 0; r < l.p; ++r) {
    ASSIGN_OR_RETURN(slots[r], IndexRank(s, r, c));
  }
  // Matching comes before each rank's order so that a dropped recv is reported as the send it
  // leaves unmatched, not only as the compute that lacks its input.
  RETURN_IF_ERROR(CheckMatching(s, c));
  for (int r = 0; r < l.p; ++r)
    for (int mb = 0; mb < l.m; ++mb)
      for (int chunk = 0; chunk < l.v; ++chunk)
        RETURN_IF_ERROR(CheckSlotOrder(l, r, mb, chunk, slots[r][static_cast<size_t>(mb) * l.v + chunk]));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------------------------

// One compute action as it ran.
struct Interval {
  double start = 0, end = 0;
  Action action;
};

struct Run {
  std::vector<std::vector<Interval>> intervals;  // per rank, in time order
  std::vector<int> peak_in_flight;
  double makespan = 0;
};

// Every blocked rank waits on a recv whose send exists (CheckMatching) but sits further down
// its sender's list, behind that rank's own blocked recv: a cycle of waits.
absl::Status DeadlockError(const Schedule& s, const Checked& c, const std::vector<size_t>& pc,
                           const std::vector<double>& clock) {
  const Layout& l = c.layout;
  std::string msg = "pipeline schedule deadlocks:";
  const char* sep = " ";
  for (int r = 0; r < l.p; ++r) {
    if (pc[r] == s[r].size()) continue;
    const int i = static_cast<int>(pc[r]);
    const Place from = c.sends.at(c.keys[r][i]);
    absl::StrAppend(&msg, sep, "rank ", r, " is stuck at t=", clock[r], " on action ", i, " (",
                    s[r][i].ToString(l.v > 1), "), which rank ", from.rank, " sends only at its action ",
                    from.index, " but that rank is stuck at action ", pc[from.rank]);
    sep = "; ";
  }
  return InvalidArgument(msg);
}

// Runs one compute action of rank r at its clock and records it.
void RunCompute(const Layout& l, int r, const Action& a, double cost, double& clock,
                std::vector<double>& f_end, std::vector<double>& b_end, int& in_flight, Run& run) {
  const int vs = a.chunk * l.p + r;
  const size_t at = static_cast<size_t>(vs) * l.m + a.microbatch;  // (virtual stage, micro-batch)
  const double start = clock;
  clock += cost;
  // The recv in front of this compute waited for the send, which followed the producer's
  // compute, so the producer has finished by now (exactly: all times are sums of the same costs).
  if (a.kind == ActionKind::kForward) {
    if (vs > 0) CLEAVE_CHECK(f_end[at - l.m] <= start);
    f_end[at] = clock;
    ++in_flight;  // activations are held from the F until its B
  } else {
    if (vs < l.last()) CLEAVE_CHECK(b_end[at + l.m] <= start);
    b_end[at] = clock;
    --in_flight;
  }
  run.peak_in_flight[r] = std::max(run.peak_in_flight[r], in_flight);
  run.intervals[r].push_back(Interval{start, clock, a});
}

absl::StatusOr<Run> Execute(const Schedule& s, const Checked& c, const SimOptions& o) {
  const Layout& l = c.layout;
  const double forward = o.forward_cost / l.v, backward = o.backward_cost / l.v;
  const size_t cells = static_cast<size_t>(l.last() + 1) * l.m;
  std::vector<double> f_end(cells, std::numeric_limits<double>::infinity()), b_end = f_end;
  std::map<MessageKey, double> sent;  // the time of each send so far
  std::vector<size_t> pc(l.p, 0);
  std::vector<double> clock(l.p, 0.0);
  std::vector<int> in_flight(l.p, 0);
  Run run;
  run.intervals.resize(l.p);
  run.peak_in_flight.assign(l.p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < l.p; ++r) {
      while (pc[r] < s[r].size()) {
        const Action& a = s[r][pc[r]];
        const MessageKey& key = c.keys[r][pc[r]];
        if (a.IsSend()) {
          sent[key] = clock[r];  // buffered: the sender does not wait
        } else if (a.IsRecv()) {
          auto it = sent.find(key);
          if (it == sent.end()) break;
          clock[r] = std::max(clock[r], it->second);
        } else {
          RunCompute(l, r, a, a.kind == ActionKind::kForward ? forward : backward, clock[r], f_end, b_end,
                     in_flight[r], run);
        }
        ++pc[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < l.p; ++r)
    if (pc[r] < s[r].size()) return DeadlockError(s, c, pc, clock);
  run.makespan = *std::max_element(clock.begin(), clock.end());
  return run;
}

// The largest time step that divides both costs, so that every start and end (sums of costs)
// falls on a grid line. Costs without a small common measure are rounded to 1/16 of the smaller.
double GridQuantum(double forward, double backward) {
  const double base = std::min(forward, backward);
  for (int k = 1; k <= 16; ++k) {
    const double q = base / k;
    auto whole = [q](double x) { return std::fabs(x / q - std::round(x / q)) < 1e-6; };
    if (whole(forward) && whole(backward)) return q;
  }
  return base / 16;
}

std::string FormatTime(double t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", t);
  return buf;
}

// "t | rank0 rank1 ..." then one row per time step with the compute label or '.' when idle.
std::string RenderGrid(const Run& run, int p, double q, bool with_chunk) {
  const int64_t rows = static_cast<int64_t>(std::llround(run.makespan / q));
  if (rows > 100000) return absl::StrCat("(grid omitted: ", rows, " time steps)\n");
  std::vector<std::vector<std::string>> cells(rows, std::vector<std::string>(p, "."));
  size_t width = absl::StrCat("rank", p - 1).size();
  for (int r = 0; r < p; ++r) {
    for (const Interval& iv : run.intervals[r]) {
      const std::string label = iv.action.ToString(with_chunk);
      width = std::max(width, label.size());
      const int64_t begin = static_cast<int64_t>(std::llround(iv.start / q));
      const int64_t end = std::min(rows, std::max<int64_t>(begin + 1, std::llround(iv.end / q)));
      for (int64_t t = begin; t < end; ++t) cells[t][r] = label;
    }
  }
  std::vector<std::string> times(rows);
  size_t time_width = 1;
  for (int64_t t = 0; t < rows; ++t) {
    times[t] = FormatTime(t * q);
    time_width = std::max(time_width, times[t].size());
  }
  auto line = [&](const std::string& t, const std::vector<std::string>& cols) {
    std::string s = t + std::string(time_width - t.size(), ' ') + " |";
    for (const std::string& col : cols) s += " " + col + std::string(width - col.size(), ' ');
    s.erase(s.find_last_not_of(' ') + 1);
    return s + "\n";
  };
  std::vector<std::string> header(p);
  for (int r = 0; r < p; ++r) header[r] = absl::StrCat("rank", r);
  std::string grid = line("t", header);
  for (int64_t t = 0; t < rows; ++t) grid += line(times[t], cells[t]);
  return grid;
}

}  // namespace

absl::StatusOr<ScheduleStats> SimulateSchedule(const Schedule& per_rank, const SimOptions& options) {
  if (!(options.forward_cost > 0) || !(options.backward_cost > 0) || !std::isfinite(options.forward_cost) ||
      !std::isfinite(options.backward_cost))
    return InvalidArgument("schedule simulation: expected positive finite costs, got forward_cost=",
                           options.forward_cost, " and backward_cost=", options.backward_cost);
  ASSIGN_OR_RETURN(Checked checked, CheckSchedule(per_rank));
  ASSIGN_OR_RETURN(Run run, Execute(per_rank, checked, options));
  const Layout& l = checked.layout;
  ScheduleStats stats;
  stats.makespan = run.makespan;
  stats.busy.assign(l.p, 0.0);
  double total_busy = 0;
  for (int r = 0; r < l.p; ++r) {
    for (const Interval& iv : run.intervals[r]) stats.busy[r] += iv.end - iv.start;
    total_busy += stats.busy[r];
  }
  stats.bubble = 1.0 - total_busy / (l.p * run.makespan);
  stats.peak_in_flight = run.peak_in_flight;
  stats.p2p_messages = static_cast<int>(checked.sends.size());
  const double q = GridQuantum(options.forward_cost / l.v, options.backward_cost / l.v);
  stats.grid = RenderGrid(run, l.p, q, l.v > 1);
  return stats;
}

}  // namespace cleave::partition
