// Pipeline schedules as per-rank action lists, and the simulator that checks them (partition/).
//
// A schedule says, for each pipeline rank, what it does in order: forward (F) and backward (B)
// of one micro-batch on one model chunk, and the point-to-point transfers around them. With v
// chunks per rank (interleaved 1F1B), chunk c of rank s is virtual stage c*p + s: activations
// flow s -> s+1 inside a chunk and from rank p-1 back to rank 0 between chunks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::partition {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B };

// "gpipe", "1f1b" or "interleaved".
absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name);
const char* ScheduleKindName(ScheduleKind kind);

enum class ActionKind {
  kForward,
  kBackward,
  kSendActivation,  // to the next virtual stage, after F
  kRecvActivation,  // from the previous virtual stage, before F
  kSendGrad,        // to the previous virtual stage, after B
  kRecvGrad,        // from the next virtual stage, before B
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;
  int chunk = 0;  // model chunk on this rank; its virtual stage is chunk * p + rank
  int peer = -1;  // the rank at the other end of a send/recv; -1 for compute

  bool IsCompute() const { return kind == ActionKind::kForward || kind == ActionKind::kBackward; }
  bool IsSend() const { return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGrad; }
  bool IsRecv() const { return kind == ActionKind::kRecvActivation || kind == ActionKind::kRecvGrad; }
  // "F3", "B3", "SEND_F3" (activation of micro-batch 3), "RECV_B3" (its gradient); with_chunk
  // appends the chunk: "F3.1".
  std::string ToString(bool with_chunk = false) const;
  bool operator==(const Action& o) const = default;
};

// One action list per pipeline rank (rank = stage index).
using Schedule = std::vector<std::vector<Action>>;

// Builds the per-rank lists for p stages, m micro-batches and v model chunks per rank. Every
// F is wrapped as [RECV_F] F [SEND_F] and every B as [RECV_B] B [SEND_B], the bracketed parts
// present unless the virtual stage is the first (no RECV_F, no SEND_B) or last (no SEND_F, no
// RECV_B).
//   gpipe: all m forwards, then all m backwards in the same order (micro-batch 0 first).
//   1f1b: PipeDream-flush as in Megatron: min(p - rank - 1, m) warmup forwards, then one
//     forward and one backward alternately, then the remaining backwards.
//   interleaved: Megatron's virtual pipeline. Needs v >= 2, p >= 2 and m % p == 0; walks
//     (micro-batch, chunk) in groups of p micro-batches per chunk, warmup
//     min(2 (p - rank - 1) + (v - 1) p, v m), or every forward first when m == p.
// v must be 1 for gpipe and 1f1b.
absl::StatusOr<Schedule> BuildSchedule(ScheduleKind kind, int stages, int microbatches,
                                       int virtual_stages = 1);

// One rank's list as "F0 SEND_F0 F1 ...".
std::string FormatActions(const std::vector<Action>& actions, bool with_chunk = false);

struct SimOptions {
  // Time of one forward / backward through a rank's whole share of the model. A rank holding
  // v chunks runs 1/v of its layers per chunk, so a chunk's F costs forward_cost / v. The
  // ratio backward_cost / forward_cost is typically 2 (two matmuls per forward matmul).
  double forward_cost = 1.0;
  double backward_cost = 1.0;
};

struct ScheduleStats {
  double makespan = 0;               // time at which the last rank finishes
  std::vector<double> busy;          // per rank, time spent in F and B
  double bubble = 0;                 // 1 - sum(busy) / (p * makespan)
  std::vector<int> peak_in_flight;   // per rank, most (micro-batch, chunk) pairs with F done
                                     // and B not yet done: activations held at once
  int p2p_messages = 0;              // matched send/recv pairs
  std::string grid;                  // "t | rank0 rank1 ..." rows of F/B labels, '.' when idle
};

// Runs the lists: F and B take their cost, sends are buffered and take no time, and a recv
// waits until the matching send has happened. Before running, checks each rank's list on its
// own (peers adjacent in virtual-stage order, nothing duplicated, F before B, each recv before
// the compute that consumes it and each send after the compute that produces it, every virtual
// stage runs F and B of every micro-batch) and that every send has exactly one matching recv
// (same micro-batch, chunk and direction). Errors name the rank and the action; a deadlock
// names every blocked rank and the recv it waits on.
absl::StatusOr<ScheduleStats> SimulateSchedule(const Schedule& per_rank,
                                               const SimOptions& options = {});

}  // namespace cleave::partition
