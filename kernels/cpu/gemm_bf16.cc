// bf16 matrix products through oneDNN (kernels/cpu/): see gemm_bf16.h.
#include "kernels/cpu/gemm_bf16.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/gemm.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace cleave::kernels::cpu {

namespace {

// (batch, b_batched, M, N, K, trans_a, trans_b, lda, ldb, ldc)
using Key = std::tuple<int64_t, bool, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t>;

struct Cache {
  std::mutex mu;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::map<Key, dnnl::matmul> primitives;
  std::map<Key, dnnl::matmul::primitive_desc> descs;
};

Cache& GetCache() {
  static Cache* cache = new Cache();
  return *cache;
}

// oneDNN's OpenMP runtime, confined to the calling thread: each of the intra-op pool's threads
// runs its share of a product as a one-thread oneDNN call. Otherwise OpenMP's own workers, which
// spin after every product waiting for the next, would contend with the pool's threads for the
// same cores (on 2 cores that slowed a bf16 training step by half). The OpenMP runtime is the
// one oneDNN was built with, found in the process (none where oneDNN threads otherwise).
void OneOpenMpThread() {
  using SetThreads = void (*)(int);
  static const SetThreads set_threads =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  thread_local bool set = false;
  if (!set && set_threads) set_threads(1);
  set = true;
}

// One oneDNN call over rows of lda, ldb and ldc elements.
absl::Status GemmOne(const GemmBf16Params& p, int64_t lda, int64_t ldb, int64_t ldc, const uint16_t* A,
                     const uint16_t* B, float* C) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  OneOpenMpThread();
  Cache& cache = GetCache();
  const Key key{p.batch, p.b_batched, p.M, p.N, p.K, p.trans_a, p.trans_b, lda, ldb, ldc};
  dnnl::matmul prim;
  dnnl::matmul::primitive_desc pd;
  try {
    std::unique_lock<std::mutex> lock(cache.mu);
    auto it = cache.primitives.find(key);
    if (it == cache.primitives.end()) {
      const int64_t bb = p.b_batched ? p.batch : 1;
      // Strides describe the stored layout; a transposed operand swaps its last two strides.
      const int64_t a_rows = p.trans_a ? p.K : p.M;  // A's stored rows of `lda` elements
      const int64_t b_rows = p.trans_b ? p.N : p.K;
      const dnnl::memory::desc a_md(dims{p.batch, p.M, p.K}, dt::bf16,
                                    p.trans_a ? dims{a_rows * lda, 1, lda} : dims{a_rows * lda, lda, 1});
      const dnnl::memory::desc b_md(dims{bb, p.K, p.N}, dt::bf16,
                                    p.trans_b ? dims{b_rows * ldb, 1, ldb} : dims{b_rows * ldb, ldb, 1});
      const dnnl::memory::desc c_md(dims{p.batch, p.M, p.N}, dt::f32, dims{p.M * ldc, ldc, 1});
      const dnnl::matmul::desc d(a_md, b_md, c_md);
      // A scratchpad per call (the library's own is shared, and the pool's threads run
      // primitives concurrently).
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      pd = dnnl::matmul::primitive_desc(d, attr, cache.engine);
      prim = dnnl::matmul(pd);
      cache.primitives.emplace(key, prim);
      cache.descs.emplace(key, pd);
    } else {
      prim = it->second;
      pd = cache.descs.at(key);
    }
    lock.unlock();  // primitives are immutable and may run concurrently
    dnnl::memory a_mem(pd.src_desc(), cache.engine, const_cast<uint16_t*>(A));
    dnnl::memory b_mem(pd.weights_desc(), cache.engine, const_cast<uint16_t*>(B));
    dnnl::memory c_mem(pd.dst_desc(), cache.engine, C);
    // Kept between calls (no page faults per product), 64-byte aligned as oneDNN's own is.
    thread_local std::vector<uint8_t> scratch;
    const dnnl::memory::desc scratch_md = pd.scratchpad_desc();
    if (scratch.size() < scratch_md.get_size() + 64) scratch.resize(scratch_md.get_size() + 64);
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
    dnnl::memory scratch_mem(scratch_md, cache.engine, reinterpret_cast<void*>((base + 63) & ~uintptr_t{63}));
    dnnl::stream stream(cache.engine);
    prim.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem},
                          {DNNL_ARG_SCRATCHPAD, scratch_mem}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN bf16 matmul [", p.batch, " x ", p.M, " x ", p.K, "] @ [", p.K, " x ",
                                            p.N, "]: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmBf16(const GemmBf16Params& p, const uint16_t* A, const uint16_t* B, float* C, ThreadPool* pool) {
  const int64_t lda = p.lda > 0 ? p.lda : p.trans_a ? p.M : p.K;
  if (lda < (p.trans_a ? p.M : p.K))
    return absl::InvalidArgumentError(absl::StrCat("oneDNN bf16 matmul: A's row length ", lda, " is under ",
                                                   p.trans_a ? "M " : "K ", p.trans_a ? p.M : p.K));
  const int64_t ldb = p.trans_b ? p.K : p.N, ldc = p.N;
  if (p.batch == 0 || p.M == 0 || p.N == 0) return absl::OkStatus();
  const int threads = pool ? pool->num_threads() : 1;
  const double flops = 2.0 * p.batch * p.M * p.N * p.K;
  if (threads <= 1 || flops < 2e6) return GemmOne(p, lda, ldb, ldc, A, B, C);
  std::mutex mu;
  absl::Status status;
  auto keep = [&](absl::Status s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = std::move(s);
  };
  const int64_t a_step = (p.trans_a ? p.K : p.M) * lda, b_step = p.b_batched ? p.K * p.N : 0, c_step = p.M * p.N;
  if (p.batch >= threads) {
    // Whole products to each thread.
    pool->ParallelFor(p.batch, 1, [&](int64_t b0, int64_t b1) {
      GemmBf16Params q = p;
      q.batch = b1 - b0;
      keep(GemmOne(q, lda, ldb, ldc, A + b0 * a_step, B + b0 * b_step, C + b0 * c_step));
    });
    return status;
  }
  // Each product in panels of rows when there are enough, else of columns, as Sgemm splits.
  const GemmPanels split = SplitIntoPanels(p.M, p.N, threads);
  const bool by_rows = split.by_rows;
  const int64_t extent = split.extent, panel = split.panel, panels = split.panels;
  for (int64_t b = 0; b < p.batch && status.ok(); ++b) {
    const uint16_t* a = A + b * a_step;
    const uint16_t* w = B + b * b_step;
    float* c = C + b * c_step;
    pool->ParallelFor(panels, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t lo = i * panel, n = std::min(panel, extent - lo);
        GemmBf16Params q = p;
        q.batch = 1;
        q.b_batched = false;
        if (by_rows) {
          q.M = n;
          keep(GemmOne(q, lda, ldb, ldc, a + (p.trans_a ? lo : lo * lda), w, c + lo * ldc));
        } else {
          q.N = n;
          keep(GemmOne(q, lda, ldb, ldc, a, w + (p.trans_b ? lo * ldb : lo), c + lo));
        }
      }
    });
  }
  return status;
}

}  // namespace cleave::kernels::cpu
