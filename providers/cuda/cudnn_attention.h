// Attention through cuDNN's fused flash attention (providers/cuda/): scaled dot-product
// attention forward and backward as cuDNN graphs (the cuDNN frontend's sdpa and
// sdpa_backward), built once per shape and cached, run on the provider's stream with workspace
// from the kernel's device scratch. Tensor cores do the work.
//
// Only what the fused engines take is tried: bf16 or fp16 q, k, v with equal head dims (a
// multiple of 8, at most 128), causal aligned to the bottom right as the Attention op defines
// it, and an fp32 bias added to the scaled scores (a padding mask, ALiBi; with causal only when
// T = S, where both alignments agree, as cuDNN takes no bias with the bottom-right one; the
// backward leaves a bias that needs its gradient to the caller's kernels). Anything else, or a
// graph cuDNN refuses (an older library, a shape without an engine), is Unimplemented and the
// caller runs its own kernel; a refusal is remembered per shape. The
// log-sum-exp it saves is the op's (natural log of the scaled scores' sum of exponentials), so
// a backward may run on either implementation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "base/tensor.h"

namespace cleave::providers {

// q [batch, T, D], k [batch, S, D], v [batch, S, Dv] in memory order (batch = every leading dim);
// with heads > 0 (the Attention ops' layout "bshd"), q [batch / heads, T, heads, D] and likewise
// k, v, out and the gradients, read and written through their strides (lse stays
// [batch, T]); with packed as well (layout "bs3hd"), q, k and v lie in one [batch / heads, T,
// 3, heads, D] tensor (q, k and v start 0, heads * D and 2 heads * D elements in; T = S), and
// dq, dk and dv likewise.
struct SdpaShape {
  DataType dtype = DataType::kBFloat16;
  int64_t batch = 1, T = 0, S = 0, D = 0, Dv = 0;
  float scale = 1.0f;
  bool causal = false;
  int64_t heads = 0;
  bool packed = false;
  // The bias of the scores (fp32), if any: cuDNN's [batch / bias_heads, bias_heads, T, S] view
  // of it, element strides (0 where it broadcasts). With heads > 0, bias_heads is heads.
  bool bias = false;
  int64_t bias_heads = 1;
  int64_t bias_strides[4] = {};
};

class CudnnAttention {
 public:
  // Device scratch of the asked bytes on the provider's stream (null if it cannot be had).
  using Scratch = std::function<void*(size_t)>;

  // On `stream` (a cudaStream_t); null when cuDNN cannot be loaded or this build has none, with
  // *why saying which.
  static std::unique_ptr<CudnnAttention> Create(void* stream, std::string* why);
  ~CudnnAttention();

  // Whether the fused engines may take the case (before asking cuDNN).
  static bool Eligible(const SdpaShape& s);
  // out [batch, T, Dv] and lse [batch, T] (fp32).
  absl::Status Forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* out, float* lse,
                       const Scratch& scratch, const float* bias = nullptr);
  // How many biased forwards (or backwards) cuDNN has run in this process, for the tests to say
  // whether it took the bias.
  static int64_t BiasedRuns(bool backward);
  // dq, dk, dv from dout, the forward's inputs, out and lse.
  absl::Status Backward(const SdpaShape& s, const void* dout, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, void* dq, void* dk, void* dv, const Scratch& scratch,
                        const float* bias = nullptr);

  struct Impl;

 private:
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave::providers
