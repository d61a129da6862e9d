// The caching arena allocator (providers/): regions, chunks, size-class bins.
#include "providers/arena_allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cleave::providers {

struct ArenaAllocator::Chunk {
  char* ptr = nullptr;
  size_t size = 0;
  bool in_use = false;
  Chunk* prev = nullptr;  // neighbours within the region, by address
  Chunk* next = nullptr;
  char* region = nullptr;
  size_t region_bytes = 0;
};

bool ArenaAllocator::BySize::operator()(const Chunk* a, const Chunk* b) const {
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

namespace {
std::string Bytes(int64_t b) {
  if (b < 0) return "unknown";
  if (b >= (int64_t{1} << 30)) return absl::StrCat(b, " bytes (", b >> 20, " MiB)");
  if (b >= (int64_t{1} << 20)) return absl::StrCat(b, " bytes (", b >> 10, " KiB)");
  return absl::StrCat(b, " bytes");
}
}  // namespace

ArenaAllocator::ArenaAllocator(ArenaBackend backend, ArenaOptions options)
    : backend_(std::move(backend)), options_(options), bins_(kBins) {
  CLEAVE_CHECK(options_.alignment > 0 && std::has_single_bit(options_.alignment));
  next_region_bytes_ = std::max(options_.min_region_bytes, options_.alignment);
}

ArenaAllocator::~ArenaAllocator() {
  // Whatever is still handed out dies with the arena (its regions go back to the device).
  for (auto& [base, first] : regions_) backend_.release(const_cast<char*>(base));
}

int ArenaAllocator::BinFor(size_t bytes) {
  // Bin b holds chunks of [256 * 2^b, 256 * 2^(b+1)) bytes; the last bin everything larger.
  const size_t units = std::max<size_t>(1, bytes >> 8);
  const int b = static_cast<int>(std::bit_width(units)) - 1;
  return std::min(b, kBins - 1);
}

ArenaAllocator::Chunk* ArenaAllocator::NewChunk() {
  if (spare_.empty()) {
    chunks_.push_back(std::make_unique<Chunk>());
    return chunks_.back().get();
  }
  Chunk* c = spare_.back();
  spare_.pop_back();
  *c = Chunk{};
  return c;
}

void ArenaAllocator::InsertFree(Chunk* c) { bins_[BinFor(c->size)].insert(c); }
void ArenaAllocator::EraseFree(Chunk* c) { bins_[BinFor(c->size)].erase(c); }

ArenaAllocator::Chunk* ArenaAllocator::FindFree(size_t bytes) {
  for (int b = BinFor(bytes); b < kBins; ++b) {
    auto& bin = bins_[b];
    Chunk key;
    key.size = bytes;
    key.ptr = nullptr;
    auto it = bin.lower_bound(&key);  // the smallest chunk of this bin that fits
    if (it != bin.end()) return *it;
  }
  return nullptr;
}

bool ArenaAllocator::Grow(size_t bytes) {
  size_t want = std::max(next_region_bytes_, bytes);
  want = (want + options_.alignment - 1) / options_.alignment * options_.alignment;
  if (options_.limit_bytes && static_cast<size_t>(stats_.reserved_bytes) + want > options_.limit_bytes) {
    // Within the limit, a region of just what is needed may still fit.
    if (static_cast<size_t>(stats_.reserved_bytes) + bytes > options_.limit_bytes) return false;
    want = bytes;
  }
  char* base = static_cast<char*>(backend_.allocate(want));
  if (!base && want > bytes) {
    want = bytes;  // the doubling was too greedy: ask for exactly the request
    base = static_cast<char*>(backend_.allocate(want));
  }
  if (!base) return false;
  Chunk* c = NewChunk();
  c->ptr = base;
  c->size = want;
  c->region = base;
  c->region_bytes = want;
  regions_[base] = c;
  InsertFree(c);
  ++stats_.regions;
  ++stats_.device_allocations;
  stats_.reserved_bytes += static_cast<int64_t>(want);
  next_region_bytes_ = std::min(options_.max_region_bytes, std::max(next_region_bytes_, want) * 2);
  return true;
}

absl::StatusOr<void*> ArenaAllocator::TryAllocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t a = options_.alignment;
  const size_t size = std::max(a, (bytes + a - 1) / a * a);
  Chunk* c = FindFree(size);
  if (!c) {
    bool grown = Grow(size);
    // Refused: return the cached free regions to the device and try once more.
    if (!grown && ReleaseFreeRegionsLocked() > 0) grown = Grow(size);
    if (grown) c = FindFree(size);
  }
  if (!c) {
    ++stats_.failures;
    const int64_t device_free = backend_.free_bytes ? backend_.free_bytes() : -1;
    last_error_ = absl::StrCat("out of memory on ", backend_.device_name, ": requested ", Bytes(static_cast<int64_t>(bytes)),
                               "; the arena holds ", Bytes(stats_.reserved_bytes), " of which ",
                               Bytes(stats_.in_use_bytes), " in use; the device has ", Bytes(device_free), " free",
                               options_.limit_bytes ? absl::StrCat(" (arena limit ", Bytes(static_cast<int64_t>(options_.limit_bytes)), ")") : "");
    return absl::ResourceExhaustedError(last_error_);
  }
  EraseFree(c);
  if (c->size - size >= a) {
    // Split: the tail stays free.
    Chunk* rest = NewChunk();
    rest->ptr = c->ptr + size;
    rest->size = c->size - size;
    rest->region = c->region;
    rest->region_bytes = c->region_bytes;
    rest->prev = c;
    rest->next = c->next;
    if (c->next) c->next->prev = rest;
    c->next = rest;
    c->size = size;
    InsertFree(rest);
  }
  c->in_use = true;
  in_use_[c->ptr] = c;
  ++stats_.allocations;
  stats_.in_use_bytes += static_cast<int64_t>(c->size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return static_cast<void*>(c->ptr);
}

void* ArenaAllocator::Allocate(size_t bytes) {
  auto p = TryAllocate(bytes);
  return p.ok() ? *p : nullptr;
}

void ArenaAllocator::Free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  CLEAVE_CHECK(it != in_use_.end());  // not from this arena, or freed twice
  Chunk* c = it->second;
  in_use_.erase(it);
  c->in_use = false;
  stats_.in_use_bytes -= static_cast<int64_t>(c->size);
  // Coalesce with free neighbours.
  auto absorb = [&](Chunk* left, Chunk* right) {  // right merges into left
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    spare_.push_back(right);
  };
  if (c->next && !c->next->in_use) {
    EraseFree(c->next);
    absorb(c, c->next);
  }
  if (c->prev && !c->prev->in_use) {
    Chunk* left = c->prev;
    EraseFree(left);
    absorb(left, c);
    c = left;
  }
  InsertFree(c);
}

int64_t ArenaAllocator::ReleaseFreeRegionsLocked() {
  int64_t released = 0;
  for (auto it = regions_.begin(); it != regions_.end();) {
    Chunk* c = it->second;
    if (c->in_use || c->size != c->region_bytes) {
      ++it;
      continue;
    }
    EraseFree(c);
    backend_.release(c->ptr);
    released += static_cast<int64_t>(c->size);
    stats_.reserved_bytes -= static_cast<int64_t>(c->size);
    --stats_.regions;
    ++stats_.device_releases;
    spare_.push_back(c);
    it = regions_.erase(it);
  }
  if (released > 0) next_region_bytes_ = std::max(options_.min_region_bytes, options_.alignment);
  return released;
}

int64_t ArenaAllocator::ReleaseFreeRegions() {
  std::lock_guard<std::mutex> lock(mu_);
  return ReleaseFreeRegionsLocked();
}

bool ArenaAllocator::Owns(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_use_.count(p)) return true;  // a chunk's start: the common case
  if (regions_.empty()) return false;
  auto it = regions_.upper_bound(static_cast<const char*>(p));
  if (it == regions_.begin()) return false;
  --it;
  const char* base = it->first;
  const Chunk* c = it->second;
  if (static_cast<const char*>(p) >= base + c->region_bytes) return false;
  for (; c; c = c->next)
    if (static_cast<const char*>(p) >= c->ptr && static_cast<const char*>(p) < c->ptr + c->size) return c->in_use;
  return false;
}

ArenaStats ArenaAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string ArenaAllocator::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

ArenaBackend HostArenaBackend() {
  ArenaBackend b;
  b.device_name = "host";
  b.kind = DeviceKind::kCpu;
  b.allocate = [](size_t bytes) -> void* { return std::aligned_alloc(256, (bytes + 255) / 256 * 256); };
  b.release = [](void* p) { std::free(p); };
  b.free_bytes = [] { return int64_t{-1}; };
  return b;
}

}  // namespace cleave::providers
