// An in-process world of ranks for tests (runtime/): each rank is a thread holding its own
// Communicator; collectives compute the exact result (reductions in group order, so every
// rank gets identical bits) and Send/Recv go through mailboxes. A rank that does not arrive
// within the timeout turns into a DeadlineExceeded error naming the collective, the group and
// the missing ranks, on every waiting rank: a deadlock fails the test instead of hanging it.
#pragma once

#include <chrono>
#include <memory>

#include "providers/communicator.h"

namespace cleave::runtime {

class SimulatedWorld {
 public:
  explicit SimulatedWorld(int world_size, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~SimulatedWorld();
  int world_size() const;
  // The communicator of `rank`; owned by the world, valid while it lives.
  Communicator* rank(int r);

  // Bytes each rank has sent through collectives and Send (the data it contributed), for
  // traffic checks.
  int64_t bytes_sent(int r) const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace cleave::runtime
