// fp32 GEMM against a constant right-hand matrix packed once (kernels/cpu/).
// Inference weights never change, so PackB copies B once into column panels and every
// later product streams those panels into an AVX-512 register tile instead of re-packing
// B per call. Each output element is computed by one thread in a fixed K order, so
// results do not depend on the thread count; nothing allocates after packing.
#pragma once

#include <cstdint>
#include <memory>

#include "base/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

// B as op(B) [K, N] cut into panels of kPanelWidth columns. Panel p holds, for k = 0..K-1,
// the row op(B)[k, 32p .. 32p + 32) (zero-padded past N), so one K step of a
// panel is one contiguous 128-byte line pair, and a run of K steps is contiguous too.
class PackedB {
 public:
  static constexpr int64_t kPanelWidth = 32;

  PackedB() = default;
  int64_t K() const { return K_; }
  int64_t N() const { return N_; }
  int64_t panels() const { return (N_ + kPanelWidth - 1) / kPanelWidth; }
  const float* panel(int64_t p) const { return data_.get() + p * K_ * kPanelWidth; }
  bool empty() const { return data_ == nullptr; }

 private:
  struct AlignedFree {
    void operator()(float* p) const;
  };
  friend PackedB PackB(const float* B, int64_t K, int64_t N, bool trans_b);
  int64_t K_ = 0, N_ = 0;
  std::unique_ptr<float[], AlignedFree> data_;
};

// True when the CPU runs the packed kernels (AVX-512F); callers fall back to Sgemm otherwise.
bool PackedGemmAvailable();

// Whether GemmPacked beats Sgemm for a product of M rows. The packed path saves OpenBLAS's
// per-call packing of B, which matters while M is small (a batch of one sequence: 25% on
// GPT-2's layer GEMMs at M = 128); from about M = 512 on, that cost is amortised and
// OpenBLAS's AVX-512 kernel, which also packs A, is the faster one (measured on a Sapphire
// Rapids Xeon, 2 cores). Where OpenBLAS runs 256-bit kernels (GemmBackendIsAvx512), the packed
// kernel does twice the work per instruction and wins at every M (2x at M = 1024 on an AVX-512
// EPYC with OpenBLAS on its Haswell core).
bool PackedGemmPreferred(int64_t M);

// Packs op(B): B is [K, N] row-major, or [N, K] when trans_b.
PackedB PackB(const float* B, int64_t K, int64_t N, bool trans_b);

// C[M, N] = act(A[M, K] @ op(B) + bias) with row strides lda and ldc (elements); bias
// (length N) may be null. Requires PackedGemmAvailable().
void GemmPacked(int64_t M, const float* A, int64_t lda, const PackedB& B, const float* bias,
                Activation act, float* C, int64_t ldc, ThreadPool* pool);

// C = op(A) @ op(B), or C += op(A) @ op(B) when p.beta is 1, on the same register tiles, each
// thread packing the slices of op(B) it reaches (p.alpha 1, p.beta 0 or 1; any transposes and
// leading dimensions). Requires PackedGemmAvailable(). Sgemm takes this path where OpenBLAS
// runs 256-bit kernels on an AVX-512 CPU (UseAvx512Gemm).
void GemmAvx512(const GemmParams& p, const float* A, const float* B, float* C, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
