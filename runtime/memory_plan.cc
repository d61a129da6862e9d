// Greedy-by-size interval placement (runtime/).
#include "runtime/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace cleave::runtime {

namespace {
constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

MemoryPlan PlanMemory(const std::vector<BufferRequest>& requests) {
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].bytes > requests[b].bytes;
  });
  std::vector<size_t> placed;
  for (size_t idx : order) {
    const BufferRequest& r = requests[idx];
    int64_t size = AlignUp(std::max<int64_t>(r.bytes, 1));
    // Occupied ranges of overlapping-lifetime buffers, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t p : placed) {
      const BufferRequest& q = requests[p];
      if (q.last_step < r.first_step || r.last_step < q.first_step) continue;
      busy.push_back({plan.offsets[p], plan.offsets[p] + AlignUp(std::max<int64_t>(q.bytes, 1))});
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    plan.offsets[idx] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + size);
    placed.push_back(idx);
  }
  return plan;
}

}  // namespace cleave::runtime
