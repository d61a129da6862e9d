// The scheduler behind cuda_emu.h: every thread of a block is a fiber with its own stack,
// resumed in the chosen order until it reaches a barrier (__syncthreads or a warp shuffle) or
// returns. A pass over the block resumes each runnable fiber once; a pass in which none can
// run while some have not returned is a deadlock, reported as the launch's fault.
#include "cuda_emu.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cleave::cuda_emu {

ThreadCoords g_coords;

namespace {

constexpr size_t kStackBytes = size_t{256} << 10;
constexpr size_t kGuardBytes = size_t{64} << 10;  // below each stack: an overflow faults
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxDynamicShared = size_t{227} << 10;  // Hopper's opt-in limit per block

// ---- Context switch -----------------------------------------------------------------------
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save, loads
// `load` and pops the registers saved there (System V ABI: rbx, rbp, r12-r15).
extern "C" void cleave_emu_switch(void** save, void* load);
asm(R"(
  .text
  .globl cleave_emu_switch
  .type cleave_emu_switch, @function
cleave_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cleave_emu_switch, .-cleave_emu_switch
)");

struct Context {
  void* sp = nullptr;
};
void Switch(Context* from, Context* to) { cleave_emu_switch(&from->sp, to->sp); }
// A context whose first switch enters `entry` on the stack ending at `top`: six zero registers,
// then entry as the return address, as if entry had been called (rsp = 8 mod 16 on entry).
void Prepare(Context* c, char* top, void (*entry)()) {
  auto* sp = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(top) & ~uintptr_t{15});
  *--sp = 0;  // entry's own return address: entry never returns
  *--sp = reinterpret_cast<uintptr_t>(entry);
  for (int r = 0; r < 6; ++r) *--sp = 0;
  c->sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
void Prepare(Context* c, char* top, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = top - kStackBytes;
  c->uc.uc_stack.ss_size = kStackBytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

// ---- State of the running launch ----------------------------------------------------------
struct Barrier {
  int expected = 0, arrived = 0;
  uint64_t generation = 0;
};

struct Fiber {
  Context ctx;
  uint3 tid{0, 0, 0};
  unsigned linear = 0;
  bool done = false;
  Barrier* waiting = nullptr;
  uint64_t wait_generation = 0;
};

// A shuffle's values go to the half of `slot` its barrier generation picks: a lane can be one
// shuffle ahead of another (writing the other half) but not two, so one barrier suffices.
struct Warp {
  Barrier in;
  uint64_t slot[2][32] = {};
  int lanes = 0, live = 0;
};

struct State {
  const char* kernel = "";
  void (*run)(void*) = nullptr;
  void* body = nullptr;
  std::vector<char*> stacks;  // tops, kept between launches
  std::vector<Fiber> fibers;
  std::vector<unsigned> order;
  std::vector<Warp> warps;
  std::vector<unsigned char> shared;
  Barrier block_barrier;
  Context scheduler;
  Fiber* current = nullptr;
  int live = 0, exited = 0;
  bool aborted = false;
  std::string fault;  // the first fault since ClearFault
  std::atomic<cudaError_t> last_error{cudaSuccess};
  Order order_kind = Order::kAscending;
  uint64_t seed = 0;
};

State* const g_state = new State;  // never destroyed: fibers may still point into it at exit
inline State& S() { return *g_state; }

char* NewStack() {
  void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
    std::abort();
  }
  mprotect(p, kGuardBytes, PROT_NONE);
  return static_cast<char*>(p) + kGuardBytes + kStackBytes;
}

std::string BlockText() {
  const uint3& b = g_coords.block_idx;
  return "block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) + ")";
}

// Ends the launch from inside a fiber: the fiber is abandoned and the scheduler stops.
[[noreturn]] void FaultInKernel(const std::string& what) {
  State& s = S();
  if (!s.aborted && s.fault.empty())
    s.fault = std::string("kernel ") + s.kernel + ", " + BlockText() + ", thread " +
              std::to_string(s.current->linear) + ": " + what;
  s.aborted = true;
  Switch(&s.current->ctx, &s.scheduler);
  __builtin_unreachable();
}

// Arrives at b and yields; resumed once every expected thread has arrived.
void Wait(Barrier* b) {
  State& s = S();
  Fiber* f = s.current;
  f->waiting = b;
  f->wait_generation = b->generation;
  if (++b->arrived >= b->expected) {
    b->arrived = 0;
    ++b->generation;
  }
  Switch(&f->ctx, &s.scheduler);
  f->waiting = nullptr;
}

[[noreturn]] void SyncFault(int exited) {
  FaultInKernel("a __syncthreads not every thread reaches: " + std::to_string(exited) +
                " threads of the block returned (undefined on the device)");
}
[[noreturn]] void ShuffleFault(const Warp& w) {
  FaultInKernel("a full-mask shuffle not every lane reaches: " + std::to_string(w.lanes - w.live) +
                " lanes of the warp returned");
}

bool Runnable(const Fiber& f) { return !f.done && (!f.waiting || f.waiting->generation != f.wait_generation); }

[[noreturn]] void FiberMain() {
  State& s = S();
  s.run(s.body);
  Fiber* f = s.current;
  Warp& w = s.warps[f->linear / 32];
  f->done = true;
  --s.live;
  ++s.exited;
  --w.live;
  if (s.block_barrier.arrived > 0) SyncFault(s.exited);
  if (w.in.arrived > 0) ShuffleFault(w);
  Switch(&f->ctx, &s.scheduler);
  __builtin_unreachable();
}

void MakeOrder(State& s, unsigned n) {
  s.order.resize(n);
  std::iota(s.order.begin(), s.order.end(), 0u);
  if (s.order_kind == Order::kDescending) std::reverse(s.order.begin(), s.order.end());
  if (s.order_kind == Order::kWarpsAhead) {  // the last warp first, its lanes in order
    s.order.clear();
    for (unsigned w = (n + 31) / 32; w-- > 0;)
      for (unsigned t = 32 * w; t < std::min(n, 32 * w + 32); ++t) s.order.push_back(t);
  }
  if (s.order_kind == Order::kShuffled) {
    uint64_t z = s.seed;
    for (unsigned i = n; i > 1; --i) {  // Fisher-Yates over SplitMix64
      z += 0x9e3779b97f4a7c15ull;
      uint64_t r = z;
      r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
      r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
      r ^= r >> 31;
      std::swap(s.order[i - 1], s.order[r % i]);
    }
  }
}

std::string DeadlockText(const State& s) {
  int at_sync = 0, at_shuffle = 0;
  for (const Fiber& f : s.fibers) {
    if (f.done) continue;
    if (f.waiting == &s.block_barrier) ++at_sync;
    else ++at_shuffle;
  }
  return "deadlock: " + std::to_string(at_sync) + " threads wait at __syncthreads, " + std::to_string(at_shuffle) +
         " at a warp shuffle, " + std::to_string(s.exited) + " have returned";
}

// The block at blockIdx: returns false when the launch faulted.
bool RunBlock(State& s, unsigned threads, const dim3& block) {
  s.live = static_cast<int>(threads);
  s.exited = 0;
  s.block_barrier = Barrier{static_cast<int>(threads), 0, 0};
  for (unsigned w = 0; w < s.warps.size(); ++w) {
    Warp& warp = s.warps[w];
    const int lanes = static_cast<int>(std::min(32u, threads - 32 * w));
    warp = Warp{};
    warp.lanes = warp.live = lanes;
    warp.in.expected = lanes;
  }
  std::fill(s.shared.begin(), s.shared.end(), 0xff);  // NaN floats: uninitialised reads show
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    f = Fiber{};
    f.linear = t;
    f.tid = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    // Tops staggered by cache lines: stacks a multiple of the page size apart would all put
    // their hot lines in the same cache sets.
    Prepare(&f.ctx, s.stacks[t] - (t % 61) * 64, FiberMain);
  }
  // A pass resumes each runnable fiber once; with warps running ahead, each warp in turn is
  // resumed until none of its fibers can run.
  const bool ahead = s.order_kind == Order::kWarpsAhead;
  const size_t group = ahead ? 32 : s.order.size();
  while (s.live > 0) {
    bool ran = false;
    for (size_t g0 = 0; g0 < s.order.size(); g0 += group) {
      const size_t g1 = std::min(s.order.size(), g0 + group);
      for (bool again = true; again;) {
        again = false;
        for (size_t i = g0; i < g1; ++i) {
          Fiber& f = s.fibers[s.order[i]];
          if (!Runnable(f)) continue;
          s.current = &f;
          g_coords.thread_idx = f.tid;
          Switch(&s.scheduler, &f.ctx);
          ran = again = true;
          if (s.aborted) return false;
        }
        again = again && ahead;
      }
    }
    if (!ran) {
      if (s.fault.empty()) s.fault = std::string("kernel ") + s.kernel + ", " + BlockText() + ": " + DeadlockText(s);
      s.aborted = true;
      return false;
    }
  }
  return true;
}

void OnSegv(int sig) {
  const State& s = S();
  char text[512];
  const int n = std::snprintf(text, sizeof text,
                              "cuda_emu: memory fault in kernel %s, block (%u, %u, %u), thread (%u, %u, %u): an "
                              "out-of-bounds access?\n",
                              s.current ? s.kernel : "(none)", g_coords.block_idx.x, g_coords.block_idx.y,
                              g_coords.block_idx.z, g_coords.thread_idx.x, g_coords.thread_idx.y, g_coords.thread_idx.z);
  if (n > 0) (void)!write(2, text, static_cast<size_t>(std::min(n, 511)));
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallFaultReport() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  static std::vector<char> alt(size_t{256} << 10);  // the handler's stack: a fiber's may be the one that overflowed
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_handler = OnSegv;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

cudaError_t Refuse(State& s, cudaError_t e, const std::string& what) {
  if (s.fault.empty()) s.fault = std::string("kernel ") + s.kernel + ": " + what;
  return e;
}

// One launch at a time, whichever thread runs it (the device has one queue here).
std::mutex& LaunchMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

// What the device refuses in a launch configuration (`what` says why), or cudaSuccess.
cudaError_t ConfigError(const dim3& grid, const dim3& block, size_t shared_bytes, std::string* what) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) {
    *what = "a launch of no blocks";
    return cudaErrorInvalidConfiguration;
  }
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.z > 64) {
    *what = "a block of " + std::to_string(threads) + " threads (at most 1024, z at most 64)";
    return cudaErrorInvalidConfiguration;
  }
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    *what = "a grid of (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " + std::to_string(grid.z) +
            ") blocks (y and z at most 65535)";
    return cudaErrorInvalidConfiguration;
  }
  if (shared_bytes > kMaxDynamicShared) {
    *what = std::to_string(shared_bytes) + " bytes of dynamic shared memory (at most 232448)";
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t CheckConfig(State& s, const dim3& grid, const dim3& block, size_t shared_bytes) {
  std::string what;
  const cudaError_t e = ConfigError(grid, block, shared_bytes, &what);
  return e == cudaSuccess ? e : Refuse(s, e, what);
}

}  // namespace

void SyncThreads() {
  State& s = S();
  if (s.exited > 0) SyncFault(s.exited);
  Wait(&s.block_barrier);
}

int LaneId() { return static_cast<int>(S().current->linear % 32); }

uint64_t WarpExchange(unsigned mask, uint64_t value, int src_lane) {
  State& s = S();
  Fiber* f = s.current;
  Warp& w = s.warps[f->linear / 32];
  if (mask != 0xffffffffu) FaultInKernel("a shuffle with a partial mask (only full warps are emulated)");
  if (w.lanes != 32) FaultInKernel("a full-mask shuffle in a warp of " + std::to_string(w.lanes) + " threads");
  if (w.live != 32) ShuffleFault(w);
  const int half = static_cast<int>(w.in.generation & 1);
  w.slot[half][f->linear % 32] = value;
  Wait(&w.in);
  return w.slot[half][src_lane];
}

void* DynamicSharedMemory() { return S().shared.data(); }

void SetOrder(Order order, uint64_t seed) {
  S().order_kind = order;
  S().seed = seed;
}

void LaunchErased(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, void (*run)(void*), void* body) {
  State& s = S();
  thread_local bool launching = false;
  if (launching) {
    std::fprintf(stderr, "cuda_emu: a launch inside kernel %s\n", s.kernel);
    std::abort();
  }
  std::lock_guard<std::mutex> lock(LaunchMutex());
  launching = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{launching};
  InstallFaultReport();
  s.kernel = kernel;
  s.aborted = false;
  if (cudaError_t e = CheckConfig(s, grid, block, shared_bytes); e != cudaSuccess) {
    SetLastError(e);
    return;
  }
  const unsigned threads = block.x * block.y * block.z;
  while (s.stacks.size() < threads) s.stacks.push_back(NewStack());
  s.fibers.resize(threads);
  s.warps.resize((threads + 31) / 32);
  s.shared.assign((shared_bytes + 15) / 16 * 16, 0);
  s.run = run;
  s.body = body;
  MakeOrder(s, threads);
  g_coords.grid_dim = grid;
  g_coords.block_dim = block;
  bool ok = true;
  for (unsigned z = 0; ok && z < grid.z; ++z)
    for (unsigned y = 0; ok && y < grid.y; ++y)
      for (unsigned x = 0; ok && x < grid.x; ++x) {
        g_coords.block_idx = {x, y, z};
        ok = RunBlock(s, threads, block);
      }
  s.current = nullptr;
  if (!ok) SetLastError(cudaErrorLaunchFailure);
}

cudaError_t CheckLaunch(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  std::string what;
  const cudaError_t e = ConfigError(grid, block, shared_bytes, &what);
  if (e == cudaSuccess) return e;  // without the launch lock: the host runs ahead of the streams
  std::lock_guard<std::mutex> lock(LaunchMutex());
  State& s = S();
  s.kernel = kernel;
  Refuse(s, e, what);
  SetLastError(e);
  return e;
}

const char* LastKernel() { return S().kernel; }
void SetLastError(cudaError_t e) { S().last_error = e; }
const char* LastFault() { return S().fault.c_str(); }
void ClearFault() { S().fault.clear(); }

}  // namespace cleave::cuda_emu

cudaError_t cudaGetLastError() {
  return cleave::cuda_emu::S().last_error.exchange(cudaSuccess);
}
