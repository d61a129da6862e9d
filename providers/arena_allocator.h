// A caching arena allocator over a device's raw allocation calls (providers/), in the manner
// of TensorFlow's BFC ("best fit with coalescing") allocator and PyTorch's CUDA caching
// allocator.
//
// Memory is taken from the device in regions (each at least `min_region_bytes`, growing as
// the arena grows) and carved into chunks. A freed chunk merges with free neighbours of its
// region and goes back to a size-class bin (powers of two from 256 bytes); an allocation takes
// the smallest free chunk that fits from the first bin that has one, splitting off the rest.
// A training step that allocates and frees the same sizes every step therefore reuses the
// same chunks and calls the device allocator only while the arena is warming up.
//
// When the device refuses a new region the arena first returns its wholly free regions and
// retries; if that still fails, the allocation fails with the requested bytes, what the arena
// holds and uses, and the device's free bytes. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "providers/execution_provider.h"

namespace cleave::providers {

struct ArenaBackend {
  std::string device_name;  // "cuda:0", for messages
  DeviceKind kind = DeviceKind::kCpu;
  // Returns nullptr when the device cannot provide `bytes`.
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* p)> release;
  // The device's free bytes now, for out-of-memory messages (-1 when unknown).
  std::function<int64_t()> free_bytes;
};

struct ArenaOptions {
  size_t min_region_bytes = size_t{2} << 20;  // the first region; later ones double
  size_t max_region_bytes = size_t{1} << 30;  // growth stops doubling here
  size_t alignment = 256;                      // every chunk starts on this boundary
  // The arena never holds more than this from the device (0: no limit but the device's).
  size_t limit_bytes = 0;
};

struct ArenaStats {
  int64_t regions = 0;            // regions held now
  int64_t reserved_bytes = 0;     // bytes of those regions
  int64_t in_use_bytes = 0;       // bytes of chunks handed out (rounded to the alignment)
  int64_t peak_in_use_bytes = 0;
  int64_t allocations = 0;        // successful Allocate calls
  int64_t device_allocations = 0; // regions ever taken from the device
  int64_t device_releases = 0;    // regions ever given back
  int64_t failures = 0;           // allocations that failed
};

class ArenaAllocator : public Allocator {
 public:
  explicit ArenaAllocator(ArenaBackend backend, ArenaOptions options = {});
  ~ArenaAllocator() override;
  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // A chunk of at least `bytes` (a zero-byte request gets a minimal chunk), or an
  // out-of-memory error naming the device, the requested bytes, the arena's reserved and
  // in-use bytes and the device's free bytes.
  absl::StatusOr<void*> TryAllocate(size_t bytes);
  // Allocator: nullptr on failure (the message is in last_error()).
  void* Allocate(size_t bytes) override;
  // p must come from this arena and not be freed yet (checked: a foreign pointer aborts).
  void Free(void* p) override;
  DeviceKind device() const override { return backend_.kind; }

  // Gives wholly free regions back to the device; returns the bytes released.
  int64_t ReleaseFreeRegions();
  // Whether p points into a chunk this arena handed out and has not got back.
  bool Owns(const void* p) const override;
  ArenaStats stats() const;
  std::string last_error() const override;

 private:
  struct Chunk;
  struct BySize {
    bool operator()(const Chunk* a, const Chunk* b) const;
  };
  static constexpr int kBins = 40;
  static int BinFor(size_t bytes);
  Chunk* FindFree(size_t bytes);
  Chunk* NewChunk();  // a fresh chunk record (a spare one when there is one)
  bool Grow(size_t bytes);
  void InsertFree(Chunk* c);
  void EraseFree(Chunk* c);
  int64_t ReleaseFreeRegionsLocked();

  ArenaBackend backend_;
  ArenaOptions options_;
  mutable std::mutex mu_;
  std::vector<std::set<Chunk*, BySize>> bins_;
  std::unordered_map<const void*, Chunk*> in_use_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // every chunk record (reused through `spare_`)
  std::vector<Chunk*> spare_;
  std::map<const char*, Chunk*> regions_;  // region base -> its first chunk
  size_t next_region_bytes_;
  ArenaStats stats_;
  std::string last_error_;
};

// An arena over the host heap (64-byte aligned); for hosts and for tests of the arena.
ArenaBackend HostArenaBackend();

}  // namespace cleave::providers
