// CUDA softmax cross-entropy (kernels/cuda/): one block per row computes the log-sum-exp (one
// online pass over the row) and the label's score without storing probabilities; a second
// single-block pass reduces the rows. The gradient from the scores forms the log-sum-exp the
// same way, then writes softmax - onehot (and, the forward folded in, the loss).
// A label outside [0, C) that is not ignore_index makes its row's loss NaN, so it shows in the
// loss instead of passing silently.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

__device__ __forceinline__ bool Ignored(int64_t label, bool has_ignore, int64_t ignore_index) {
  return has_ignore && label == ignore_index;
}

// log(sum(exp(s[0..C)))) over the block, in one online pass: each thread keeps its running max
// and its sum of exponentials relative to it, rescaling the sum when the max grows.
template <typename S>
__device__ float RowLogSumExp(const S* s, int64_t C, float* shared) {
  float m = -INFINITY, e = 0.f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float x = ToFloat(s[c]);
    if (x > m) {
      e = e * expf(m - x) + 1.f;
      m = x;
    } else if (x != -INFINITY) {  // a -inf score adds nothing (exp(-inf - -inf) would be NaN); a NaN spreads
      e += expf(x - m);
    }
  }
  const float row_max = BlockMax(m, shared);
  const float sum = BlockSum(e == 0.f ? 0.f : e * expf(m - row_max), shared);
  return row_max + logf(sum);
}

__global__ void SceRows(const float* scores, const int64_t* labels, float* row_loss, float* log_prob, int64_t C,
                        bool has_ignore, int64_t ignore_index) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* s = scores + n * C;
  const float lse = RowLogSumExp(s, C, shared);
  if (log_prob)
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) log_prob[n * C + c] = s[c] - lse;
  if (threadIdx.x == 0) {
    const int64_t l = labels[n];
    if (Ignored(l, has_ignore, ignore_index)) row_loss[n] = 0.f;
    else if (l < 0 || l >= C) row_loss[n] = NAN;
    else row_loss[n] = lse - s[l];
  }
}

// One block: count[0] = rows not ignored; loss[0] = sum (reduction 1) or mean (0) of row_loss.
__global__ void SceReduce(const float* row_loss, const int64_t* labels, float* loss, double* count, int64_t N,
                          int reduction, bool has_ignore, int64_t ignore_index) {
  __shared__ float shared[32];
  float sum = 0.f, k = 0.f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    if (Ignored(labels[n], has_ignore, ignore_index)) continue;
    sum += row_loss ? row_loss[n] : 0.f;
    k += 1.f;
  }
  sum = BlockSum(sum, shared);
  k = BlockSum(k, shared);
  if (threadIdx.x == 0) {
    count[0] = k;
    if (loss) loss[0] = reduction == 0 ? sum / k : sum;
  }
}

__device__ __forceinline__ float SceScale(const float* dy, const double* count, int64_t n, int reduction) {
  return reduction == 2 ? dy[n] : reduction == 1 ? dy[0] : dy[0] / static_cast<float>(count[0]);
}

template <typename OutT>
__global__ void SceGradKernel(const float* dy, const float* log_prob, const int64_t* labels, OutT* dx,
                              const double* count, int64_t N, int64_t C, int reduction, bool has_ignore,
                              int64_t ignore_index, int64_t class_offset) {
  const int64_t total = N * C;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / C, c = i % C;
    const int64_t l = labels[n];
    if (Ignored(l, has_ignore, ignore_index)) {
      dx[i] = FromFloat<OutT>(0.f);
      continue;
    }
    const float g = SceScale(dy, count, n, reduction);
    dx[i] = FromFloat<OutT>(g * (expf(log_prob[i]) - (c + class_offset == l ? 1.f : 0.f)));
  }
}

// One block per row of scores (of type S, read as float32): the row's log-sum-exp, then the
// gradient softmax - onehot; with row_loss, also the row's loss as SceRows forms it (the forward
// folded in).
template <typename S, typename OutT>
__global__ void SceGradFromScores(const float* dy, const S* scores, const int64_t* labels, OutT* dx,
                                  const double* count, int64_t C, int reduction, bool has_ignore,
                                  int64_t ignore_index, int64_t class_offset, float* row_loss) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const S* s = scores + n * C;
  OutT* out = dx + n * C;
  const int64_t l = labels[n];
  if (Ignored(l, has_ignore, ignore_index)) {  // the same for the whole block
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[c] = FromFloat<OutT>(0.f);
    if (row_loss && threadIdx.x == 0) row_loss[n] = 0.f;
    return;
  }
  const float lse = RowLogSumExp(s, C, shared);
  if (row_loss && threadIdx.x == 0) row_loss[n] = l < 0 || l >= C ? NAN : lse - ToFloat(s[l]);
  const float g = SceScale(dy, count, n, reduction);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    out[c] = FromFloat<OutT>(g * (expf(ToFloat(s[c]) - lse) - (c + class_offset == l ? 1.f : 0.f)));
}

// NegativeLogLikelihoodLoss, position p = (n, d) of [N, D]: its weight (0 where ignored or out of
// range, the latter recorded in `bad`) and, with input, its loss -w * input[n, label, d]:
// written in T to `out` (no reduction) or kept in float32 for NllSum.
template <typename T, typename L>
__global__ void NllPositions(const T* input, const L* target, const T* weight, T* out, float* pos_loss,
                             float* pos_weight, int64_t N, int64_t C, int64_t D, bool has_ignore, int64_t ignore_index,
                             BadIndex bad) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < N * D;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t l = static_cast<int64_t>(target[p]);
    float w = 0.f, loss = 0.f;
    if (!Ignored(l, has_ignore, ignore_index)) {
      if (l < 0 || l >= C) {
        RecordBadIndex(bad, l, p, C);
      } else {
        w = weight ? ToFloat(weight[l]) : 1.f;
        if (input) loss = -w * ToFloat(input[(p / D * C + l) * D + p % D]);
      }
    }
    if (out) out[p] = FromFloat<T>(loss);
    if (pos_loss) pos_loss[p] = loss;
    if (pos_weight) pos_weight[p] = w;
  }
}

// One block of 256: sums[0] = the losses' sum, sums[1] = the weights', in double and in a fixed
// order; loss (when given) = their sum, or with `mean` their ratio.
template <typename T>
__global__ void NllSum(const float* pos_loss, const float* pos_weight, double* sums, T* loss, int64_t n, bool mean) {
  __shared__ double sh[2][256];
  double a = 0.0, b = 0.0;
  for (int64_t p = threadIdx.x; p < n; p += 256) {
    if (pos_loss) a += pos_loss[p];
    b += pos_weight[p];
  }
  sh[0][threadIdx.x] = a;
  sh[1][threadIdx.x] = b;
  __syncthreads();
  for (int half = 128; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      sh[0][threadIdx.x] += sh[0][threadIdx.x + half];
      sh[1][threadIdx.x] += sh[1][threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    sums[0] = sh[0][0];
    sums[1] = sh[1][0];
    if (loss) loss[0] = FromFloat<T>(static_cast<float>(mean ? sh[0][0] / sh[1][0] : sh[0][0]));
  }
}

// d_input [N, C, D]: -w * g at each position's label, zeros elsewhere; g is dY there (no
// reduction), dY (sum) or dY / the weights' sum (mean).
template <typename T, typename L>
__global__ void NllGradKernel(const T* dy, const L* target, const T* weight, T* dx, const double* sums, int64_t N,
                              int64_t C, int64_t D, int reduction, bool has_ignore, int64_t ignore_index) {
  const int64_t total = N * C * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, c = i / D % C, n = i / (D * C), p = n * D + d;
    const int64_t l = static_cast<int64_t>(target[p]);
    float g = 0.f;
    if (c == l && !Ignored(l, has_ignore, ignore_index)) {
      const float w = weight ? ToFloat(weight[l]) : 1.f;
      const float scale = reduction == 2   ? ToFloat(dy[p])
                          : reduction == 1 ? ToFloat(dy[0])
                                           : static_cast<float>(ToFloat(dy[0]) / sums[1]);
      g = -w * scale;
    }
    dx[i] = FromFloat<T>(g);
  }
}

}  // namespace

int SoftmaxCrossEntropy(const float* scores, const int64_t* labels, float* row_loss, float* log_prob, float* loss,
                        double* count, int64_t N, int64_t C, int reduction, bool has_ignore, int64_t ignore_index,
                        void* stream) {
  if (N == 0) return 0;
  cudaStream_t s = Stream(stream);
  SceRows<<<static_cast<unsigned>(N), kThreads, 0, s>>>(scores, labels, row_loss, log_prob, C, has_ignore,
                                                        ignore_index);
  if (reduction != 2)
    SceReduce<<<1, 1024, 0, s>>>(row_loss, labels, loss, count, N, reduction, has_ignore, ignore_index);
  return static_cast<int>(cudaGetLastError());
}

int SoftmaxCrossEntropyGrad(const float* dy, const void* in, Dt in_dt, bool from_scores, const int64_t* labels,
                            void* dx, Dt out_dt, double* count, int64_t N, int64_t C, int reduction, bool has_ignore,
                            int64_t ignore_index, int64_t class_offset, float* row_loss, float* loss,
                            void* stream) {
  if (N == 0) return 0;
  if ((row_loss || in_dt != Dt::kF32) && !from_scores) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = Stream(stream);
  if (reduction == 0)
    SceReduce<<<1, 1024, 0, s>>>(nullptr, labels, nullptr, count, N, reduction, has_ignore, ignore_index);
  if (from_scores) {
    DISPATCH_DT(in_dt, S, {
      DISPATCH_DT(out_dt, T, {
        SceGradFromScores<S, T><<<static_cast<unsigned>(N), kThreads, 0, s>>>(
            dy, static_cast<const S*>(in), labels, static_cast<T*>(dx), count, C, reduction, has_ignore, ignore_index,
            class_offset, row_loss);
      });
    });
  } else {
    DISPATCH_DT(out_dt, T, {
      SceGradKernel<T><<<Blocks(N * C), kThreads, 0, s>>>(dy, static_cast<const float*>(in), labels,
                                                          static_cast<T*>(dx), count, N, C, reduction, has_ignore,
                                                          ignore_index, class_offset);
    });
  }
  // The rows' losses reduced as the forward reduces them (count is the same either way).
  if (row_loss && loss && reduction != 2)
    SceReduce<<<1, 1024, 0, s>>>(row_loss, labels, loss, count, N, reduction, has_ignore, ignore_index);
  return static_cast<int>(cudaGetLastError());
}

int NllLoss(Dt dt, const void* input, const void* target, bool target_int32, const void* weight, void* loss,
            float* pos_loss, float* pos_weight, double* sums, int64_t N, int64_t C, int64_t D, int reduction,
            bool has_ignore, int64_t ignore_index, void* stream, BadIndex bad) {
  const int64_t n = N * D;
  cudaStream_t s = Stream(stream);
  DISPATCH_DT(dt, T, {
    auto positions = [&](auto* labels) {
      NllPositions<T><<<Blocks(n), kThreads, 0, s>>>(
          static_cast<const T*>(input), labels, static_cast<const T*>(weight),
          reduction == 2 ? static_cast<T*>(loss) : nullptr, reduction == 2 ? nullptr : pos_loss,
          reduction == 2 ? nullptr : pos_weight, N, C, D, has_ignore, ignore_index, bad);
    };
    if (n > 0) {
      if (target_int32) positions(static_cast<const int32_t*>(target));
      else positions(static_cast<const int64_t*>(target));
    }
    if (reduction != 2) NllSum<T><<<1, 256, 0, s>>>(pos_loss, pos_weight, sums, static_cast<T*>(loss), n, reduction == 0);
  });
  return static_cast<int>(cudaGetLastError());
}

int NllLossGrad(Dt dt, const void* dy, const void* target, bool target_int32, const void* weight, void* dx,
                float* pos_weight, double* sums, int64_t N, int64_t C, int64_t D, int reduction, bool has_ignore,
                int64_t ignore_index, void* stream) {
  const int64_t n = N * D, total = N * C * D;
  cudaStream_t s = Stream(stream);
  DISPATCH_DT(dt, T, {
    auto run = [&](auto* labels) {
      if (reduction == 0) {  // the weights' sum first
        if (n > 0)
          NllPositions<T><<<Blocks(n), kThreads, 0, s>>>(static_cast<const T*>(nullptr), labels,
                                                         static_cast<const T*>(weight), static_cast<T*>(nullptr),
                                                         nullptr, pos_weight, N, C, D, has_ignore, ignore_index,
                                                         BadIndex{});
        NllSum<T><<<1, 256, 0, s>>>(nullptr, pos_weight, sums, static_cast<T*>(nullptr), n, true);
      }
      if (total > 0)
        NllGradKernel<T><<<Blocks(total), kThreads, 0, s>>>(static_cast<const T*>(dy), labels,
                                                            static_cast<const T*>(weight), static_cast<T*>(dx), sums, N,
                                                            C, D, reduction, has_ignore, ignore_index);
    };
    if (target_int32) run(static_cast<const int32_t*>(target));
    else run(static_cast<const int64_t*>(target));
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda
