// Memory plan: overlapping lifetimes never share bytes; disjoint ones reuse them.
#include "runtime/memory_plan.h"

#include <random>

#include "gtest/gtest.h"

namespace cleave::runtime {
namespace {

bool Overlap(const BufferRequest& a, int64_t oa, const BufferRequest& b, int64_t ob) {
  bool live = !(a.last_step < b.first_step || b.last_step < a.first_step);
  bool bytes = oa < ob + b.bytes && ob < oa + a.bytes;
  return live && bytes;
}

TEST(MemoryPlan, ChainReusesMemory) {
  // a -> b -> c -> d: each buffer dies when the next is made, so two slots suffice.
  std::vector<BufferRequest> r = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 4}};
  MemoryPlan p = PlanMemory(r);
  EXPECT_LE(p.arena_bytes, 2 * 1024);
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = i + 1; j < r.size(); ++j) EXPECT_FALSE(Overlap(r[i], p.offsets[i], r[j], p.offsets[j]));
}

TEST(MemoryPlan, RandomIntervalsNeverCollide) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BufferRequest> r;
    int64_t total = 0;
    for (int i = 0; i < 40; ++i) {
      int a = static_cast<int>(rng() % 30), len = static_cast<int>(rng() % 10);
      r.push_back({static_cast<int64_t>(1 + rng() % 5000), a, a + len});
      total += (r.back().bytes + 63) / 64 * 64;
    }
    MemoryPlan p = PlanMemory(r);
    EXPECT_LE(p.arena_bytes, total);
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(p.offsets[i] % 64, 0);
      for (size_t j = i + 1; j < r.size(); ++j)
        ASSERT_FALSE(Overlap(r[i], p.offsets[i], r[j], p.offsets[j])) << i << " vs " << j;
    }
  }
}

}  // namespace
}  // namespace cleave::runtime
