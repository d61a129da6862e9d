// fp32 GEMM, one kernel: cleave's products against OpenBLAS sgemm (the anchor), in the same run
// on the same operands and threads. The shapes are a transformer's: a layer's forward products
// (X W^T and X W), the input gradients (dY W) and the weight gradients (dY^T X, added to their
// accumulation), and the LM head. For each it times Sgemm as cleave runs it (GemmAvx512 where
// UseAvx512Gemm says so, else OpenBLAS itself), OpenBLAS alone, and, for the forward shapes,
// the packed-weight kernel of constant weights; it prints ms and GFLOP/s (median of --iters),
// cleave/OpenBLAS, and the largest difference between the two results.
//
//   cleave_bench_gemm [--threads 2] [--tokens 1024] [--width 768] [--vocab 32000] [--iters 9]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/packed_gemm.h"

namespace {

using cleave::ThreadPool;
using cleave::kernels::cpu::GemmParams;

struct Shape {
  const char* what;
  int64_t M, K, N;
  bool trans_a, trans_b;
  float beta;
};

template <typename Fn>
double MedianMs(int iters, Fn fn) {
  fn();  // warm-up: page faults, the packing buffers
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int64_t Arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cpu = cleave::kernels::cpu;
  const int threads = static_cast<int>(Arg(argc, argv, "--threads", 2));
  const int64_t T = Arg(argc, argv, "--tokens", 1024), C = Arg(argc, argv, "--width", 768);
  const int64_t V = Arg(argc, argv, "--vocab", 32000);
  const int iters = static_cast<int>(Arg(argc, argv, "--iters", 9));
  ThreadPool pool(threads);
  cpu::SetGemmThreads(threads);
  const char* forced = std::getenv("CLEAVE_FP32_GEMM");
  std::printf("threads %d; OpenBLAS core %s (%s); AVX-512F %s; CLEAVE_FP32_GEMM %s\n", threads,
              cpu::GemmBackendName(), cpu::GemmBackendIsAvx512() ? "512-bit" : "256-bit or narrower",
              cpu::PackedGemmAvailable() ? "yes" : "no", forced ? forced : "(unset)");
  const std::vector<Shape> shapes = {
      {"qkv: X W^T", T, C, 3 * C, false, true, 0.f},
      {"mlp up: X W^T", T, C, 4 * C, false, true, 0.f},
      {"mlp down: X W^T", T, 4 * C, C, false, true, 0.f},
      {"mlp down dX: dY W", T, C, 4 * C, false, false, 0.f},
      {"mlp up dX: dY W", T, 4 * C, C, false, false, 0.f},
      {"mlp up dW += dY^T X", 4 * C, T, C, true, false, 1.f},
      {"mlp down dW += dY^T X", C, T, 4 * C, true, false, 1.f},
      {"LM head: X E^T", T, C, V, false, true, 0.f},
      {"LM head dE += dY^T X", V, T, C, true, false, 1.f},
  };
  std::printf("\n| product | M | K | N | cleave ms (GFLOP/s) | path | OpenBLAS ms (GFLOP/s) | cleave/OpenBLAS "
              "| packed weight ms | max diff |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (const Shape& s : shapes) {
    GemmParams p;
    p.M = s.M, p.N = s.N, p.K = s.K, p.trans_a = s.trans_a, p.trans_b = s.trans_b, p.beta = s.beta;
    std::vector<float> a(s.M * s.K), b(s.K * s.N), c0(s.M * s.N), c1, c2;
    for (float& v : a) v = uniform(rng);
    for (float& v : b) v = uniform(rng);
    for (float& v : c0) v = uniform(rng);
    const double gflop = 2.0 * s.M * s.K * s.N / 1e9;
    // The timed calls add to C again and again where beta is 1; the compared results come from
    // one call each on the same C.
    c1 = c0, c2 = c0;
    const double ms_cleave = MedianMs(iters, [&] { cpu::Sgemm(p, a.data(), b.data(), c1.data(), &pool); });
    const double ms_blas = MedianMs(iters, [&] { cpu::SgemmOpenBlas(p, a.data(), b.data(), c2.data(), &pool); });
    c1 = c0, c2 = c0;
    cpu::Sgemm(p, a.data(), b.data(), c1.data(), &pool);
    cpu::SgemmOpenBlas(p, a.data(), b.data(), c2.data(), &pool);
    double diff = 0;
    for (size_t i = 0; i < c1.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(c1[i] - c2[i])));
    std::string packed = "-";
    if (!s.trans_a && s.beta == 0.f && cpu::PackedGemmAvailable()) {
      const cpu::PackedB w = cpu::PackB(b.data(), s.K, s.N, s.trans_b);
      std::vector<float> c3(s.M * s.N);
      const double ms = MedianMs(iters, [&] {
        cpu::GemmPacked(s.M, a.data(), s.K, w, nullptr, cpu::Activation::kNone, c3.data(), s.N, &pool);
      });
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.2f (%.0f)", ms, gflop / ms * 1e3);
      packed = buf;
    }
    std::printf("| %s | %lld | %lld | %lld | %.2f (%.0f) | %s | %.2f (%.0f) | %.2f | %s | %.1e |\n", s.what,
                static_cast<long long>(s.M), static_cast<long long>(s.K), static_cast<long long>(s.N), ms_cleave,
                gflop / ms_cleave * 1e3, cpu::UseAvx512Gemm(p) ? "avx512" : "openblas", ms_blas,
                gflop / ms_blas * 1e3, ms_cleave / ms_blas, packed.c_str(), diff);
  }
  return 0;
}
