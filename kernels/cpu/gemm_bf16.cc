// bf16 matrix products through oneDNN (kernels/cpu/): see gemm_bf16.h.
#include "kernels/cpu/gemm_bf16.h"

#include <map>
#include <mutex>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace cleave::kernels::cpu {

namespace {

using Key = std::tuple<int64_t, bool, int64_t, int64_t, int64_t, bool, bool, int64_t>;

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

}  // namespace

absl::Status GemmBf16(const GemmBf16Params& p, const uint16_t* A, const uint16_t* B, float* C) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  Cache& cache = GetCache();
  const int64_t lda = p.lda > 0 ? p.lda : p.trans_a ? p.M : p.K;
  if (lda < (p.trans_a ? p.M : p.K))
    return absl::InvalidArgumentError(absl::StrCat("oneDNN bf16 matmul: A's row length ", lda, " is under ",
                                                   p.trans_a ? "M " : "K ", p.trans_a ? p.M : p.K));
  const Key key{p.batch, p.b_batched, p.M, p.N, p.K, p.trans_a, p.trans_b, lda};
  dnnl::matmul prim;
  dnnl::matmul::primitive_desc pd;
  try {
    std::unique_lock<std::mutex> lock(cache.mu);
    auto it = cache.primitives.find(key);
    if (it == cache.primitives.end()) {
      const int64_t bb = p.b_batched ? p.batch : 1;
      // Strides describe the stored layout; a transposed operand swaps its last two strides.
      const int64_t a_rows = p.trans_a ? p.K : p.M;  // A's stored rows of `lda` elements
      const dnnl::memory::desc a_md(dims{p.batch, p.M, p.K}, dt::bf16,
                                    p.trans_a ? dims{a_rows * lda, 1, lda} : dims{a_rows * lda, lda, 1});
      const dnnl::memory::desc b_md(dims{bb, p.K, p.N}, dt::bf16,
                                    p.trans_b ? dims{p.K * p.N, 1, p.K} : dims{p.K * p.N, p.N, 1});
      const dnnl::memory::desc c_md(dims{p.batch, p.M, p.N}, dt::f32, dims{p.M * p.N, p.N, 1});
      const dnnl::matmul::desc d(a_md, b_md, c_md);
      pd = dnnl::matmul::primitive_desc(d, cache.engine);
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
    dnnl::stream stream(cache.engine);
    prim.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN bf16 matmul [", p.batch, " x ", p.M, " x ", p.K, "] @ [", p.K, " x ",
                                            p.N, "]: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace cleave::kernels::cpu
