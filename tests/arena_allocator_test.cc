// The caching arena allocator over a host backend that counts its calls and can run out of
// memory: reuse without device calls in steady state, best fit, splitting and coalescing,
// alignment, out-of-memory messages, and giving cached regions back.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "providers/arena_allocator.h"

namespace cleave::providers {
namespace {

// A pretend device of `capacity` bytes on the host heap.
struct CountingDevice {
  int64_t capacity;
  int64_t used = 0;
  int allocs = 0, releases = 0;
  std::map<void*, size_t> live = {};

  ArenaBackend Backend() {
    ArenaBackend b;
    b.device_name = "test:0";
    b.kind = DeviceKind::kCuda;
    b.allocate = [this](size_t bytes) -> void* {
      if (used + static_cast<int64_t>(bytes) > capacity) return nullptr;
      void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      used += static_cast<int64_t>(bytes);
      live[p] = bytes;
      ++allocs;
      return p;
    };
    b.release = [this](void* p) {
      used -= static_cast<int64_t>(live.at(p));
      live.erase(p);
      ++releases;
      std::free(p);
    };
    b.free_bytes = [this] { return capacity - used; };
    return b;
  }
};

TEST(ArenaAllocator, SteadyStateStepsNeverCallTheDevice) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 1 << 20});
  // A "training step": activations of varied sizes allocated, then freed in reverse order,
  // and a few long-lived buffers freed out of order.
  const std::vector<size_t> sizes = {4096, 1 << 18, 1000, 3 << 16, 77, 1 << 20, 12345};
  int allocs_after_first = -1;
  for (int step = 0; step < 50; ++step) {
    std::vector<void*> live;
    for (size_t s : sizes) live.push_back(arena.Allocate(s));
    for (void* p : live) ASSERT_NE(p, nullptr);
    std::swap(live[1], live[4]);
    for (auto it = live.rbegin(); it != live.rend(); ++it) arena.Free(*it);
    if (step == 0) allocs_after_first = dev.allocs;
  }
  EXPECT_GT(allocs_after_first, 0);
  EXPECT_EQ(dev.allocs, allocs_after_first) << "later steps reached the device";
  const ArenaStats st = arena.stats();
  EXPECT_EQ(st.allocations, 50 * static_cast<int64_t>(sizes.size()));
  EXPECT_EQ(st.in_use_bytes, 0);
  EXPECT_GE(st.peak_in_use_bytes, static_cast<int64_t>((1 << 20) + (1 << 18) + (3 << 16)));
}

TEST(ArenaAllocator, ReusesTheSmallestFreeChunkThatFits) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 8 << 20});
  void* big = arena.Allocate(4 << 20);
  void* fence1 = arena.Allocate(256);
  void* small = arena.Allocate(1 << 20);
  void* fence2 = arena.Allocate(256);
  arena.Free(big);
  arena.Free(small);
  // 900 KiB fits both free chunks; the 1 MiB one is the better fit.
  void* p = arena.Allocate(900 << 10);
  EXPECT_EQ(p, small);
  void* q = arena.Allocate(3 << 20);
  EXPECT_EQ(q, big);
  EXPECT_EQ(dev.allocs, 1);
  for (void* x : {p, q, fence1, fence2}) arena.Free(x);
}

TEST(ArenaAllocator, FreedNeighboursCoalesceIntoOneChunk) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 4 << 20});
  std::vector<void*> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(arena.Allocate(1 << 20));
  ASSERT_EQ(dev.allocs, 1);  // all four carved from the first region
  // Free in an order that needs both left and right merges.
  arena.Free(parts[1]);
  arena.Free(parts[3]);
  arena.Free(parts[2]);
  arena.Free(parts[0]);
  // The whole region is one chunk again: a 4 MiB request fits without a new region.
  void* whole = arena.Allocate(4 << 20);
  EXPECT_EQ(whole, parts[0]);
  EXPECT_EQ(dev.allocs, 1);
  arena.Free(whole);
}

TEST(ArenaAllocator, ChunksAreAlignedAndDisjoint) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 1 << 20});
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> size(0, 100000);
  std::vector<std::pair<char*, size_t>> live;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      arena.Free(live[k].first);
      live.erase(live.begin() + static_cast<long>(k));
      continue;
    }
    const size_t n = size(rng);
    char* p = static_cast<char*>(arena.Allocate(n));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    EXPECT_TRUE(arena.Owns(p));
    std::fill(p, p + n, static_cast<char>(i));  // ASan would see an overrun
    live.emplace_back(p, n);
  }
  std::sort(live.begin(), live.end());
  for (size_t k = 1; k < live.size(); ++k)
    EXPECT_LE(live[k - 1].first + live[k - 1].second, live[k].first) << "chunks overlap";
  for (auto& [p, n] : live) arena.Free(p);
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  EXPECT_FALSE(arena.Owns(live.empty() ? nullptr : live[0].first));
}

TEST(ArenaAllocator, OutOfMemoryNamesRequestedAndFreeBytes) {
  CountingDevice dev{16 << 20};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 4 << 20});
  void* a = arena.Allocate(10 << 20);
  ASSERT_NE(a, nullptr);
  auto b = arena.TryAllocate(8 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(b.status().message());
  EXPECT_NE(m.find("out of memory on test:0: requested 8388608 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("of which 10485760 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("the device has 6291456 bytes"), std::string::npos) << m;
  EXPECT_EQ(arena.Allocate(8 << 20), nullptr);
  EXPECT_EQ(arena.last_error(), m);
  EXPECT_EQ(arena.stats().failures, 2);
  // What was allocated stays valid and usable; a request that fits still succeeds.
  std::fill(static_cast<char*>(a), static_cast<char*>(a) + (10 << 20), 1);
  void* c = arena.Allocate(5 << 20);
  EXPECT_NE(c, nullptr);
  arena.Free(a);
  arena.Free(c);
}

TEST(ArenaAllocator, CachedRegionsAreReturnedWhenTheDeviceRunsOut) {
  CountingDevice dev{24 << 20};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 1 << 20});
  // Fill the device with cached (freed) regions of 6 MiB each...
  std::vector<void*> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(arena.Allocate(6 << 20));
  for (void* p : ps) arena.Free(p);
  // ...then ask for more than any of them: the arena gives the free regions back and retries.
  void* big = arena.Allocate(20 << 20);
  ASSERT_NE(big, nullptr) << arena.last_error();
  EXPECT_GE(dev.releases, 1);
  arena.Free(big);
  EXPECT_GT(arena.ReleaseFreeRegions(), 0);
  EXPECT_EQ(arena.stats().regions, 0);
  EXPECT_EQ(dev.used, 0);
}

TEST(ArenaAllocator, LimitCapsWhatTheArenaTakes) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 1 << 20, .limit_bytes = 3 << 20});
  void* a = arena.Allocate(2 << 20);
  ASSERT_NE(a, nullptr);
  auto b = arena.TryAllocate(2 << 20);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(std::string(b.status().message()).find("arena limit 3145728 bytes"), std::string::npos) << b.status();
  void* c = arena.Allocate(1 << 20);  // what is left under the limit
  EXPECT_NE(c, nullptr) << arena.last_error();
  arena.Free(a);
  arena.Free(c);
}

TEST(ArenaAllocator, ThreadsShareOneArena) {
  CountingDevice dev{int64_t{1} << 30};
  ArenaAllocator arena(dev.Backend(), {.min_region_bytes = 1 << 20});
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        char* p = static_cast<char*>(arena.Allocate(1024 * (1 + (i + t) % 7)));
        if (!p) {
          ++bad;
          continue;
        }
        p[0] = static_cast<char>(t);
        if (p[0] != static_cast<char>(t)) ++bad;
        arena.Free(p);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  EXPECT_EQ(arena.stats().allocations, 2000);
}

TEST(ArenaAllocatorDeathTest, FreeingAForeignPointerAborts) {
  ArenaAllocator arena(HostArenaBackend());
  int x = 0;
  EXPECT_DEATH(arena.Free(&x), "");
}

}  // namespace
}  // namespace cleave::providers
