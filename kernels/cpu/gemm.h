// fp32 GEMM on the CPU through OpenBLAS (kernels/cpu/), or cleave's own AVX-512 kernel where
// OpenBLAS runs narrower ones (UseAvx512Gemm).
// Row-major throughout: C[M,N] = alpha * op(A) * op(B) + beta * C.
// OpenBLAS runs single-threaded; the intra-op pool does the threading: a large product is
// split into row (or column) panels, one sgemm call per pool thread, and a batch of small
// products is spread across the pool one product per thread. (OpenBLAS's own threads spin
// between calls and would compete with the pool for the same cores.)
#pragma once

#include <cstdint>
#include <type_traits>

#include "base/tensor.h"
#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

struct GemmParams {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 0.f;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: densely packed
};

// Selects the OpenBLAS core and makes OpenBLAS single-threaded; `n` is the pool's size.
void SetGemmThreads(int n);
// The OpenBLAS core whose kernels sgemm runs ("SkylakeX", "Haswell", ...), for logs.
const char* GemmBackendName();
// Whether OpenBLAS runs 512-bit kernels (its SkylakeX, Cooperlake or SapphireRapids cores). A
// build for one core, a core the user names in OPENBLAS_CORETYPE, or an older library on a
// newer CPU may run the 256-bit ones on a CPU that has AVX-512.
bool GemmBackendIsAvx512();
// Whether Sgemm runs product p on cleave's own AVX-512 kernel (GemmAvx512) instead of
// OpenBLAS: on a CPU with AVX-512F where OpenBLAS runs 256-bit kernels, for alpha 1 and beta 0
// or 1. CLEAVE_FP32_GEMM=openblas or =avx512 decides instead (constant weights of up to 512
// rows take the packed kernel either way: PackedGemmPreferred).
bool UseAvx512Gemm(const GemmParams& p);
// With a pool of more than one thread, products over ~2 MFLOP are split across it. Each
// element of C is still computed by one sgemm (or one thread of GemmAvx512) over the whole K,
// in one order, so the split does not change the result.
void Sgemm(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool = nullptr);
// The same through OpenBLAS whatever UseAvx512Gemm says (the benchmark's anchor).
void SgemmOpenBlas(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool = nullptr);

// How a pool of `threads` splits one [M, N] product (Sgemm, and the bf16 products of
// gemm_bf16.h): into `panels` panels of `panel` rows when there are enough rows (by_rows), else
// of columns, each a multiple of 16 (the micro-kernels' full tiles) but the last.
struct GemmPanels {
  bool by_rows = true;
  int64_t extent = 0, panel = 0, panels = 0;  // extent: M by rows, else N
};
GemmPanels SplitIntoPanels(int64_t M, int64_t N, int threads);

// The batch of a batched GEMM, possibly multi-dimensional: product b (row-major index over
// `dims`) reads A at sum_k idx_k * stride_a[k], and likewise for B and C. Strides are in
// elements; a stride of 0 broadcasts one operand's matrix over that batch dim (numpy
// matmul broadcasting without materialising the copies).
struct GemmBatch {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t stride_a[kMaxRank] = {}, stride_b[kMaxRank] = {}, stride_c[kMaxRank] = {};

  int64_t count() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  // Element offsets of product b's operands.
  void Offsets(int64_t b, int64_t* oa, int64_t* ob, int64_t* oc) const {
    *oa = *ob = *oc = 0;
    for (int k = rank - 1; k >= 0; --k) {
      int64_t i = b % dims[k];
      b /= dims[k];
      *oa += i * stride_a[k];
      *ob += i * stride_b[k];
      *oc += i * stride_c[k];
    }
  }
};

void SgemmBatched(const GemmParams& p, const GemmBatch& batch, const float* A, const float* B,
                  float* C, ThreadPool* pool);

// Batched GEMM with per-operand batch strides (0 broadcasts one matrix over the batch).
void SgemmBatched(const GemmParams& p, int64_t batch, const float* A, int64_t stride_a,
                  const float* B, int64_t stride_b, float* C, int64_t stride_c, ThreadPool* pool);

// Plain triple-loop reference, in double accumulation, for tests and non-float types.
template <typename T>
void GemmReference(const GemmParams& p, const T* A, const T* B, T* C) {
  int64_t lda = p.lda ? p.lda : (p.trans_a ? p.M : p.K);
  int64_t ldb = p.ldb ? p.ldb : (p.trans_b ? p.K : p.N);
  int64_t ldc = p.ldc ? p.ldc : p.N;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        double a = static_cast<double>(p.trans_a ? A[k * lda + m] : A[m * lda + k]);
        double b = static_cast<double>(p.trans_b ? B[n * ldb + k] : B[k * ldb + n]);
        acc += a * b;
      }
      T& c = C[m * ldc + n];
      c = static_cast<T>(p.alpha * acc + (p.beta == 0.f ? 0.0 : p.beta * static_cast<double>(c)));
    }
}

// Sgemm for float, the reference loop for the other types (float64 in double accumulation).
template <typename T>
void GemmOf(const GemmParams& p, const T* A, const T* B, T* C, ThreadPool* pool = nullptr) {
  if constexpr (std::is_same_v<T, float>) Sgemm(p, A, B, C, pool);
  else GemmReference(p, A, B, C);
}

}  // namespace cleave::kernels::cpu
