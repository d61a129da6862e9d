// The run order for asynchronous collectives (runtime/): where the executor launches each
// collective that runs off the compute path, and where it waits for it.
//
// A list schedule over a topological order that keeps it wherever nothing waits: the work on
// the way to the next collective runs first, so that the collective starts as early as it can,
// and work that does not need its result runs before work that does, so that the
// communication overlaps it (the dW product while dX is reduced in a tensor-parallel backward,
// though autodiff wrote dW first; the rest of the backward while ZeRO-2 reduce-scatters a
// gradient). Invariants: the collectives keep their relative order, and so do the messages and
// collectives that stay in line, so every rank of a group still issues the same sequence on
// each communicator (a message passes no waiting node but one that only writes graph
// outputs); a node that only writes graph outputs may wait as long as it likes, any other node
// that needs a pending result lets at most `lookahead` later nodes run ahead of it (bounding
// the activations kept alive meanwhile); at most `max_in_flight` collectives are
// pending at once (bounding the buffers they hold, as DeepSpeed's two reduce buckets do).
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"

namespace cleave::runtime {

struct AsyncScheduleOptions {
  int max_in_flight = 2;
  int lookahead = 64;
};

struct AsyncSchedule {
  std::vector<graph::Node*> order;
  // Per asynchronous node: the position in `order` before which it is waited for
  // (order.size(): at the end of the run).
  std::unordered_map<const graph::Node*, int> wait_before;
};

// `order`: a topological order of `g`'s nodes. `is_async(n)`: n runs asynchronously.
// `in_line(n)`: n communicates on the rank's own communicator (keeps its place among those).
// `pinned(n)`: n may not run ahead of any node before it in `order` (it may write over a graph
// input that others read).
AsyncSchedule ScheduleAsync(const graph::Graph& g, const std::vector<graph::Node*>& order,
                            const std::function<bool(const graph::Node*)>& is_async,
                            const std::function<bool(const graph::Node*)>& in_line,
                            const std::function<bool(const graph::Node*)>& pinned, AsyncScheduleOptions options = {});

}  // namespace cleave::runtime
