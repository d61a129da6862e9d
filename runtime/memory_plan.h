// Liveness-based activation memory plan (runtime/).
// Given, for each buffer, its size and the step interval during which it is live, places
// all buffers in one arena so that two buffers share bytes only when their intervals do
// not overlap. Greedy by size (largest first), each placed at the lowest offset that fits
// between already-placed buffers whose lifetimes overlap it; offsets are 64-byte aligned.
#pragma once

#include <cstdint>
#include <vector>

namespace cleave::runtime {

struct BufferRequest {
  int64_t bytes = 0;
  int first_step = 0;  // step that writes it
  int last_step = 0;   // last step that reads it (inclusive)
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // one per request
  int64_t arena_bytes = 0;
};

MemoryPlan PlanMemory(const std::vector<BufferRequest>& requests);

}  // namespace cleave::runtime
