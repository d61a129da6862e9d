// The run order for asynchronous collectives (runtime/): see async_schedule.h.
#include "runtime/async_schedule.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <set>
#include <unordered_set>

#include "base/status.h"

namespace cleave::runtime {

using graph::Node;
using graph::Value;

AsyncSchedule ScheduleAsync(const graph::Graph& g, const std::vector<Node*>& order,
                            const std::function<bool(const Node*)>& is_async,
                            const std::function<bool(const Node*)>& in_line,
                            const std::function<bool(const Node*)>& pinned, AsyncScheduleOptions options) {
  const int n = static_cast<int>(order.size());
  std::unordered_map<const Node*, int> pos;
  for (int i = 0; i < n; ++i) pos[order[i]] = i;
  const std::unordered_set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  std::vector<int> deps(n, 0);
  std::vector<std::vector<int>> users(n), reads_async(n);
  std::vector<char> async(n), line(n), pin(n), sink(n);
  std::vector<int> async_chain, line_chain;  // positions of each kind, in order
  for (int i = 0; i < n; ++i) {
    const Node* node = order[i];
    async[i] = is_async(node);
    line[i] = !async[i] && in_line(node);
    pin[i] = pinned(node);
    bool s = node->num_outputs() > 0;
    for (const Value* o : node->outputs()) s = s && o && outputs.count(o) && o->consumers().empty();
    sink[i] = s;
    std::set<int> producers;
    for (const Value* v : node->inputs())
      if (v && v->producer())
        if (auto it = pos.find(v->producer()); it != pos.end()) producers.insert(it->second);
    deps[i] = static_cast<int>(producers.size());
    for (int p : producers) {
      users[p].push_back(i);
      if (async[p]) reads_async[i].push_back(p);
    }
    if (async[i]) async_chain.push_back(i);
    if (line[i]) line_chain.push_back(i);
  }

  AsyncSchedule out;
  out.order.reserve(n);
  std::set<int> ready;
  for (int i = 0; i < n; ++i)
    if (deps[i] == 0) ready.insert(i);
  std::vector<char> done(n, 0), pending(n, 0);
  std::deque<int> in_flight;  // launched and not yet waited for, in launch order
  size_t next_async = 0, next_line = 0;
  int lowest = 0;  // the first position not yet scheduled
  // The unscheduled ancestors of the next collective to launch (and it): run before other
  // ready work, so that it starts as early as it can and that work overlaps it (Megatron's
  // dX product before the dW product).
  std::vector<char> toward_next(n, 0);
  std::vector<int> stack;
  auto mark_next = [&] {
    std::fill(toward_next.begin(), toward_next.end(), 0);
    if (next_async >= async_chain.size()) return;
    stack.assign(1, async_chain[next_async]);
    toward_next[stack[0]] = 1;
    while (!stack.empty()) {
      const Node* node = order[stack.back()];
      stack.pop_back();
      for (const Value* v : node->inputs()) {
        if (!v || !v->producer()) continue;
        const auto it = pos.find(v->producer());
        if (it == pos.end() || done[it->second] || toward_next[it->second]) continue;
        toward_next[it->second] = 1;
        stack.push_back(it->second);
      }
    }
  };
  mark_next();
  auto allowed = [&](int i) {
    if (async[i]) return async_chain[next_async] == i;
    if (line[i]) return line_chain[next_line] == i;
    return true;
  };
  auto blocked = [&](int i) {
    return std::any_of(reads_async[i].begin(), reads_async[i].end(), [&](int p) { return pending[p] != 0; });
  };
  // Waiting for one collective completes every one launched before it (the queue runs in order).
  auto wait_through = [&](int p, int at) {
    while (!in_flight.empty()) {
      const int q = in_flight.front();
      in_flight.pop_front();
      pending[q] = 0;
      out.wait_before[order[q]] = at;
      if (q == p) break;
    }
  };
  while (static_cast<int>(out.order.size()) < n) {
    // The first ready node (in the original order) that needs no pending result, one on the
    // way to the next collective first; ahead of a node that needs a pending result (other
    // than an output-only one), only nodes within its lookahead, and never a message; never a
    // pinned node ahead of anything.
    int pick = -1, first = -1;
    int64_t limit = INT64_MAX;
    bool behind_blocked = false;
    const bool more = next_async < async_chain.size();
    for (int i : ready) {
      if (!allowed(i)) continue;
      if (first < 0) first = i;
      if (i >= limit) break;
      if (blocked(i)) {
        // An output-only reader holds nothing up; any other bounds what may pass it.
        if (!sink[i]) {
          limit = std::min<int64_t>(limit, int64_t{i} + options.lookahead);
          behind_blocked = true;
        }
        continue;
      }
      if ((pin[i] && i != lowest) || (line[i] && behind_blocked)) continue;
      if (pick < 0) pick = i;
      if (!more) break;
      if (toward_next[i]) {
        pick = i;
        break;
      }
    }
    // Nothing can go ahead: the first node waits. It is always the lowest unscheduled one,
    // whose producers and predecessors in either chain all come before it.
    CLEAVE_CHECK(first >= 0);
    if (pick < 0) pick = first;
    const int at = static_cast<int>(out.order.size());
    for (int p : reads_async[pick])
      if (pending[p]) wait_through(p, at);
    if (async[pick]) {
      if (static_cast<int>(in_flight.size()) >= std::max(1, options.max_in_flight)) wait_through(in_flight.front(), at);
      in_flight.push_back(pick);
      pending[pick] = 1;
      ++next_async;
      done[pick] = 1;
      mark_next();
    } else if (line[pick]) {
      ++next_line;
    }
    out.order.push_back(order[pick]);
    done[pick] = 1;
    ready.erase(pick);
    while (lowest < n && done[lowest]) ++lowest;
    for (int u : users[pick])
      if (--deps[u] == 0) ready.insert(u);
  }
  for (int q : in_flight) out.wait_before[order[q]] = n;
  return out;
}

}  // namespace cleave::runtime
