// OpenBLAS-backed GEMM (kernels/cpu/).
// Every sgemm goes through Sgemm, which runs cleave's own AVX-512 kernel where OpenBLAS runs
// narrower ones (UseAvx512Gemm), and otherwise first makes sure OpenBLAS runs kernels that fit
// the CPU (see SelectOpenBlasCore).
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cblas.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "kernels/cpu/packed_gemm.h"

// Core selection of OpenBLAS builds with DYNAMIC_ARCH. Weak, so that a build without it
// still links (the pointers are then null and the selection is left alone).
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace cleave::kernels::cpu {

namespace {

// OpenBLAS 0.3.21 (Debian 12) does not recognise Sapphire / Emerald Rapids and falls back
// to its SSE3 "Prescott" kernels, which run sgemm about 5x slower than its AVX-512 ones on
// those CPUs (measured: 27 vs 150 GFLOP/s on 2 cores). When the library settled on that
// fallback although the CPU has AVX-512 or AVX2, and the user has not named a core in
// OPENBLAS_CORETYPE, rerun its core selection with the matching core named. This happens
// once, before the first sgemm, while no other BLAS call can be in flight.
void SelectOpenBlasCore() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit)
      return;
    const char* core = openblas_get_corename();
    if (core == nullptr || std::string_view(core) != "Prescott") return;
    __builtin_cpu_init();
    const char* want = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")) {
      want = "SkylakeX";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      want = "Haswell";
    }
    if (want == nullptr) return;
    // The selection reads the variable; it is removed again so child processes see the
    // environment the user set.
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
  });
}

}  // namespace

void SetGemmThreads(int) {
  SelectOpenBlasCore();
  openblas_set_num_threads(1);
}

const char* GemmBackendName() {
  SelectOpenBlasCore();
  return openblas_get_corename();
}

bool GemmBackendIsAvx512() {
  static const bool wide = [] {
    const std::string_view core = GemmBackendName() ? GemmBackendName() : "";
    for (std::string_view avx512 : {"SkylakeX", "Cooperlake", "SapphireRapids"})
      if (core == avx512) return true;
    return false;
  }();
  return wide;
}

namespace {

void SgemmOne(const GemmParams& p, const float* A, const float* B, float* C) {
  int64_t lda = p.lda ? p.lda : (p.trans_a ? p.M : p.K);
  int64_t ldb = p.ldb ? p.ldb : (p.trans_b ? p.K : p.N);
  int64_t ldc = p.ldc ? p.ldc : p.N;
  if (p.K == 0) {  // sgemm leaves C untouched for K == 0 on some builds; be explicit
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t n = 0; n < p.N; ++n) C[m * ldc + n] = p.beta == 0.f ? 0.f : p.beta * C[m * ldc + n];
    return;
  }
  // BLAS wants a leading dimension >= 1 even for a matrix with no rows.
  auto ld = [](int64_t v) { return static_cast<blasint>(v > 0 ? v : 1); };
  cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans,
              p.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(p.M),
              static_cast<blasint>(p.N), static_cast<blasint>(p.K), p.alpha, A, ld(lda), B,
              ld(ldb), p.beta, C, ld(ldc));
}

}  // namespace

GemmPanels SplitIntoPanels(int64_t M, int64_t N, int threads) {
  GemmPanels s;
  s.by_rows = M >= 32 * threads || M >= N;
  s.extent = s.by_rows ? M : N;
  s.panel = std::min(s.extent, ((s.extent + threads - 1) / threads + 15) / 16 * 16);
  s.panels = s.panel > 0 ? (s.extent + s.panel - 1) / s.panel : 0;
  return s;
}

bool UseAvx512Gemm(const GemmParams& p) {
  static const int mode = [] {
    const char* env = std::getenv("CLEAVE_FP32_GEMM");
    const std::string_view v = env ? env : "";
    if (v == "openblas") return 0;
    if (v == "avx512") return 1;
    if (!v.empty())
      Log(LogLevel::kWarning, absl::StrCat("CLEAVE_FP32_GEMM=", std::string(v),
                                           ": expected openblas or avx512; choosing by the CPU and OpenBLAS's core"));
    return -1;
  }();
  if (mode == 0 || !PackedGemmAvailable() || p.alpha != 1.f || (p.beta != 0.f && p.beta != 1.f)) return false;
  return mode == 1 || !GemmBackendIsAvx512();
}

void Sgemm(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool) {
  if (p.M == 0 || p.N == 0) return;
  if (UseAvx512Gemm(p)) return GemmAvx512(p, A, B, C, pool);
  SgemmOpenBlas(p, A, B, C, pool);
}

void SgemmOpenBlas(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool) {
  SelectOpenBlasCore();
  if (p.M == 0 || p.N == 0) return;
  const int threads = pool ? pool->num_threads() : 1;
  const double flops = 2.0 * p.M * p.N * p.K;
  if (threads <= 1 || flops < 2e6) return SgemmOne(p, A, B, C);
  GemmParams q = p;
  q.lda = p.lda ? p.lda : (p.trans_a ? p.M : p.K);
  q.ldb = p.ldb ? p.ldb : (p.trans_b ? p.K : p.N);
  q.ldc = p.ldc ? p.ldc : p.N;
  const GemmPanels split = SplitIntoPanels(p.M, p.N, threads);
  const bool by_rows = split.by_rows;
  const int64_t extent = split.extent, panel = split.panel;
  pool->ParallelFor(split.panels, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t lo = i * panel, n = std::min(panel, extent - lo);
      GemmParams r = q;
      if (by_rows) {
        r.M = n;
        SgemmOne(r, A + (p.trans_a ? lo : lo * q.lda), B, C + lo * q.ldc);
      } else {
        r.N = n;
        SgemmOne(r, A, B + (p.trans_b ? lo * q.ldb : lo), C + lo);
      }
    }
  });
}

void SgemmBatched(const GemmParams& p, const GemmBatch& batch, const float* A, const float* B,
                  float* C, ThreadPool* pool) {
  const int64_t count = batch.count();
  if (count == 0) return;
  const int threads = pool ? pool->num_threads() : 1;
  // Enough products to go round: one per pool thread, each single-threaded. Otherwise each
  // product is split across the pool. Either way every product is computed by the same
  // sgemm calls whatever the split, so the result does not depend on it.
  const bool spread = threads > 1 && count >= threads;
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t oa, ob, oc;
      batch.Offsets(b, &oa, &ob, &oc);
      Sgemm(p, A + oa, B + ob, C + oc, spread ? nullptr : pool);
    }
  };
  if (spread) {
    pool->ParallelFor(count, 1, run);
    return;
  }
  run(0, count);
}

void SgemmBatched(const GemmParams& p, int64_t batch, const float* A, int64_t stride_a,
                  const float* B, int64_t stride_b, float* C, int64_t stride_c, ThreadPool* pool) {
  GemmBatch b;
  b.rank = 1;
  b.dims[0] = batch;
  b.stride_a[0] = stride_a;
  b.stride_b[0] = stride_b;
  b.stride_c[0] = stride_c;
  SgemmBatched(p, b, A, B, C, pool);
}

}  // namespace cleave::kernels::cpu
