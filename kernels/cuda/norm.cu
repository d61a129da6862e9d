// CUDA row kernels (kernels/cuda/): LayerNormalization and RMSNormalization forward and
// backward, Softmax and LogSoftmax and their gradients. One block per row; statistics in fp32.
// Softmax along an inner axis (elements `inner` apart) takes one thread per line instead, the
// threads of a warp on neighbouring lines, so each step along the axis reads adjacent elements.
// RMSNorm is the uncentred LayerNorm: a mean of 0, and in the backward no mean(g) term.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

template <typename T>
__global__ void LayerNormKernel(const T* x, const T* gamma, const T* beta, T* y, float* mean_out, float* inv_out,
                                int64_t cols, float eps, bool rms) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float s = 0.f;
  if (!rms)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += ToFloat(xr[c]);
  const float mean = rms ? 0.f : BlockSum(s, shared) / static_cast<float>(cols);
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = ToFloat(xr[c]) - mean;
    q += d * d;
  }
  const float var = BlockSum(q, shared) / static_cast<float>(cols);
  const float inv = rsqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (ToFloat(xr[c]) - mean) * inv * ToFloat(gamma[c]);
    if (beta) v += ToFloat(beta[c]);
    yr[c] = FromFloat<T>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (inv_out) inv_out[row] = inv;
  }
}

// LayerNorm of x + skip: the sum is re-formed in each pass over the row rather than stored (and
// written once to `sum` when asked). y is of x's type, or (mixed precision) of a lower one Y;
// skip is of x's type, or (a low-precision product's result) of a lower one S.
template <typename T, typename S, typename Y>
__global__ void SkipLayerNormKernel(const T* x, const S* skip, const T* gamma, const T* beta, Y* y, float* mean_out,
                                    float* inv_out, T* sum, int64_t cols, float eps, bool rms) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const S* sr = skip + row * cols;
  Y* yr = y + row * cols;
  // The sum rounded to the storage type, as Add would store it.
  auto at = [&](int64_t c) { return ToFloat(FromFloat<T>(ToFloat(xr[c]) + ToFloat(sr[c]))); };
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = at(c);
    if (sum) sum[row * cols + c] = FromFloat<T>(v);
    s += v;
  }
  const float mean = rms ? 0.f : BlockSum(s, shared) / static_cast<float>(cols);
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = at(c) - mean;
    q += d * d;
  }
  const float inv = rsqrtf(BlockSum(q, shared) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = (at(c) - mean) * inv * ToFloat(gamma[c]);
    if (beta) v += ToFloat(beta[c]);
    yr[c] = FromFloat<Y>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[row] = mean;
    if (inv_out) inv_out[row] = inv;
  }
}

// dx (when not null) and its rounding to L (dx_low, when not null).
// dy is of x's type T, or (a low-precision product's result) of a lower one D. A null mean is
// RMSNorm's.
template <typename T, typename D, typename L>
__global__ void LayerNormGradRows(const D* dy, const T* x, const T* gamma, const float* mean, const float* inv,
                                  const T* add, T* dx, L* dx_low, int64_t cols) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const D* dyr = dy + row * cols;
  const T* xr = x + row * cols;
  const float mu = mean ? mean[row] : 0.f, is = inv[row];
  float a = 0.f, b = 0.f;  // sums of g*dy and g*dy*xhat
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float gd = ToFloat(gamma[c]) * ToFloat(dyr[c]);
    a += gd;
    b += gd * (ToFloat(xr[c]) - mu) * is;
  }
  const float mean_gd = mean ? BlockSum(a, shared) / static_cast<float>(cols) : 0.f;
  const float mean_gdx = BlockSum(b, shared) / static_cast<float>(cols);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = (ToFloat(xr[c]) - mu) * is;
    const float gd = ToFloat(gamma[c]) * ToFloat(dyr[c]);
    float v = is * (gd - mean_gd - xhat * mean_gdx);
    if (add) v = ToFloat(FromFloat<T>(v)) + ToFloat(add[row * cols + c]);  // as a separate Add
    const T stored = FromFloat<T>(v);
    if (dx) dx[row * cols + c] = stored;
    if (dx_low) dx_low[row * cols + c] = FromFloat<L>(ToFloat(stored));  // as a Cast of dx
  }
}

// dgamma and dbeta over a chunk of the rows: block (bx, by) sums rows [by * chunk, (by + 1) *
// chunk) of its 32 columns into part_g / part_b [by][c]; LayerNormGradParts adds each column's
// parts in order. (One thread per column over every row would leave the device idle: a
// 768-wide LayerNorm is 3 blocks.)
template <typename T, typename D>
__global__ void LayerNormGradColumns(const D* dy, const T* x, const float* mean, const float* inv, float* part_g,
                                     float* part_b, int64_t rows, int64_t cols, int64_t chunk) {
  __shared__ float sg[8][33], sb[8][33];
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float g = 0.f, b = 0.f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      const float d = ToFloat(dy[r * cols + c]);
      g += d * (ToFloat(x[r * cols + c]) - (mean ? mean[r] : 0.f)) * inv[r];
      b += d;
    }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < 8; ++k) {
    g += sg[k][threadIdx.x];
    b += sb[k][threadIdx.x];
  }
  part_g[blockIdx.y * cols + c] = g;
  part_b[blockIdx.y * cols + c] = b;
}

__global__ void LayerNormGradParts(const float* part_g, const float* part_b, float* dgamma, float* dbeta,
                                   int64_t parts, int64_t cols) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float g = 0.f, b = 0.f;
    for (int64_t k = 0; k < parts; ++k) {
      g += part_g[k * cols + c];
      b += part_b[k * cols + c];
    }
    if (dgamma) dgamma[c] = g;
    if (dbeta) dbeta[c] = b;
  }
}

template <typename T>
__global__ void SoftmaxKernel(const T* x, T* y, int64_t cols, bool log) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, ToFloat(xr[c]));
  m = BlockMax(m, shared);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(ToFloat(xr[c]) - m);
  s = BlockSum(s, shared);
  const float lse = m + logf(s);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = ToFloat(xr[c]);
    yr[c] = FromFloat<T>(log ? v - lse : expf(v - lse));
  }
}

// Softmax over lines of `len` elements `inner` apart: line l = (o, i) starts at o * len * inner + i.
template <typename T>
__global__ void SoftmaxLinesKernel(const T* x, T* y, int64_t lines, int64_t len, int64_t inner, bool log) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (l / inner) * len * inner + l % inner;
    float m = -INFINITY;
    for (int64_t c = 0; c < len; ++c) m = fmaxf(m, ToFloat(x[base + c * inner]));
    float s = 0.f;
    for (int64_t c = 0; c < len; ++c) s += expf(ToFloat(x[base + c * inner]) - m);
    const float lse = m + logf(s);
    for (int64_t c = 0; c < len; ++c) {
      const float v = ToFloat(x[base + c * inner]);
      y[base + c * inner] = FromFloat<T>(log ? v - lse : expf(v - lse));
    }
  }
}

template <typename T>
__global__ void SoftmaxGradLinesKernel(const T* dy, const T* y, T* dx, int64_t lines, int64_t len, int64_t inner,
                                       bool log) {
  for (int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = (l / inner) * len * inner + l % inner;
    float s = 0.f;
    for (int64_t c = 0; c < len; ++c) {
      const int64_t k = base + c * inner;
      s += log ? ToFloat(dy[k]) : ToFloat(dy[k]) * ToFloat(y[k]);
    }
    for (int64_t c = 0; c < len; ++c) {
      const int64_t k = base + c * inner;
      const float g = ToFloat(dy[k]), v = ToFloat(y[k]);
      dx[k] = FromFloat<T>(log ? g - expf(v) * s : v * (g - s));
    }
  }
}

unsigned Rows(int64_t rows) { return static_cast<unsigned>(rows); }

}  // namespace

int LayerNorm(Dt dt, const void* x, const void* gamma, const void* beta, void* y, float* mean, float* inv_std,
              int64_t rows, int64_t cols, float epsilon, void* stream, bool rms) {
  if (rows == 0) return 0;
  DISPATCH_DT(dt, T, {
    LayerNormKernel<T><<<Rows(rows), kThreads, 0, Stream(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta), static_cast<T*>(y), mean,
        inv_std, cols, epsilon, rms);
  });
  return static_cast<int>(cudaGetLastError());
}

int SkipLayerNorm(Dt dt, Dt skip_dt, Dt y_dt, const void* x, const void* skip, const void* gamma, const void* beta,
                  void* y, float* mean, float* inv_std, void* sum, int64_t rows, int64_t cols, float epsilon,
                  void* stream, bool rms) {
  if (rows == 0) return 0;
  if (skip_dt != dt && dt != Dt::kF32) return static_cast<int>(cudaErrorInvalidValue);
  DISPATCH_DT(dt, T, {
    DISPATCH_DT(skip_dt, S, {
      DISPATCH_DT(y_dt, Y, {
        SkipLayerNormKernel<T, S, Y><<<Rows(rows), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(x), static_cast<const S*>(skip), static_cast<const T*>(gamma),
            static_cast<const T*>(beta), static_cast<Y*>(y), mean, inv_std, static_cast<T*>(sum), cols, epsilon,
            rms);
      });
    });
  });
  return static_cast<int>(cudaGetLastError());
}

int64_t LayerNormGradScratch(int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return 0;
  int64_t chunk = 0;
  return 2 * ColumnChunks(rows, cols, &chunk) * cols;
}

namespace {
// The rows' dx (and its rounding to L) and the chunked dgamma / dbeta sums, for dy of type D.
template <typename T, typename D, typename L>
void LaunchLayerNormGrad(const D* dy, const T* x, const T* gamma, const float* mean, const float* inv_std, const T* add,
                         T* dx, L* dx_low, float* dgamma, float* dbeta, float* scratch, int64_t rows, int64_t cols,
                         cudaStream_t s) {
  if (dx || dx_low)
    LayerNormGradRows<T, D, L><<<Rows(rows), kThreads, 0, s>>>(dy, x, gamma, mean, inv_std, add, dx, dx_low, cols);
  if ((dgamma || dbeta) && cols > 0) {
    int64_t chunk = 0;
    const int64_t chunks = ColumnChunks(rows, cols, &chunk);
    float* part_g = scratch;
    float* part_b = scratch + chunks * cols;
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(chunks));
    LayerNormGradColumns<T, D><<<grid, dim3(32, 8), 0, s>>>(dy, x, mean, inv_std, part_g, part_b, rows, cols, chunk);
    LayerNormGradParts<<<Blocks(cols), kThreads, 0, s>>>(part_g, part_b, dgamma, dbeta, chunks, cols);
  }
}
}  // namespace

int LayerNormGrad(Dt dt, const void* dy, const void* x, const void* gamma, const float* mean, const float* inv_std,
                  const void* dx_add, void* dx, float* dgamma, float* dbeta, float* scratch, int64_t rows, int64_t cols,
                  void* dx_low, Dt low_dt, Dt dy_dt, void* stream) {
  if (rows == 0) {  // sums over no rows
    cudaStream_t s = Stream(stream);
    for (float* sum : {dgamma, dbeta})
      if (sum && cols > 0)
        if (cudaError_t e = cudaMemsetAsync(sum, 0, static_cast<size_t>(cols) * sizeof(float), s); e != cudaSuccess)
          return static_cast<int>(e);
    return 0;
  }
  if ((dgamma || dbeta) && cols > 0 && !scratch) return static_cast<int>(cudaErrorInvalidValue);
  // A lower dy and the rounded dx_low only with a float32 x.
  if ((dx_low && (dt != Dt::kF32 || low_dt == Dt::kF32)) || (dy_dt != dt && dt != Dt::kF32))
    return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = Stream(stream);
  if (dt == Dt::kF32) {
    const float *x32 = static_cast<const float*>(x), *g32 = static_cast<const float*>(gamma);
    const float* add32 = static_cast<const float*>(dx_add);
    float* dx32 = static_cast<float*>(dx);
    DISPATCH_DT(dy_dt, D, {
      const D* dyd = static_cast<const D*>(dy);
      if (!dx_low)
        LaunchLayerNormGrad<float, D, float>(dyd, x32, g32, mean, inv_std, add32, dx32, nullptr, dgamma, dbeta,
                                             scratch, rows, cols, s);
      else if (low_dt == Dt::kBf16)
        LaunchLayerNormGrad<float, D, __nv_bfloat16>(dyd, x32, g32, mean, inv_std, add32, dx32,
                                                     static_cast<__nv_bfloat16*>(dx_low), dgamma, dbeta, scratch, rows,
                                                     cols, s);
      else
        LaunchLayerNormGrad<float, D, __half>(dyd, x32, g32, mean, inv_std, add32, dx32, static_cast<__half*>(dx_low),
                                              dgamma, dbeta, scratch, rows, cols, s);
    });
  } else {
    DISPATCH_DT(dt, T, {
      LaunchLayerNormGrad<T, T, T>(static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(gamma),
                                   mean, inv_std, static_cast<const T*>(dx_add), static_cast<T*>(dx), nullptr, dgamma,
                                   dbeta, scratch, rows, cols, s);
    });
  }
  return static_cast<int>(cudaGetLastError());
}

int Softmax(Dt dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, void* stream, int64_t inner) {
  if (rows == 0 || inner == 0) return 0;
  if (inner > 1) {
    DISPATCH_DT(dt, T, {
      SoftmaxLinesKernel<T><<<Blocks(rows * inner), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(x), static_cast<T*>(y), rows * inner, cols, inner, log);
    });
    return static_cast<int>(cudaGetLastError());
  }
  DISPATCH_DT(dt, T, {
    SoftmaxKernel<T><<<Rows(rows), kThreads, 0, Stream(stream)>>>(static_cast<const T*>(x), static_cast<T*>(y), cols,
                                                                 log);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda

namespace cleave::kernels::cuda {
namespace {

template <typename T>
__global__ void SoftmaxGradKernel(const T* dy, const T* y, T* dx, int64_t cols, bool log) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * cols;
  const T* yr = y + row * cols;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += log ? ToFloat(dyr[c]) : ToFloat(dyr[c]) * ToFloat(yr[c]);
  s = BlockSum(s, shared);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = ToFloat(dyr[c]), v = ToFloat(yr[c]);
    dx[row * cols + c] = FromFloat<T>(log ? g - expf(v) * s : v * (g - s));
  }
}

}  // namespace

int SoftmaxGrad(Dt dt, const void* dy, const void* y, void* dx, int64_t rows, int64_t cols, bool log, void* stream,
                int64_t inner) {
  if (rows == 0 || inner == 0) return 0;
  if (inner > 1) {
    DISPATCH_DT(dt, T, {
      SoftmaxGradLinesKernel<T><<<Blocks(rows * inner), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx), rows * inner, cols, inner, log);
    });
    return static_cast<int>(cudaGetLastError());
  }
  DISPATCH_DT(dt, T, {
    SoftmaxGradKernel<T><<<static_cast<unsigned>(rows), kThreads, 0, Stream(stream)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(y), static_cast<T*>(dx), cols, log);
  });
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cleave::kernels::cuda

// BatchNormalization over x [N, C, S]: a block per channel forms its statistics (training: the
// batch's mean and biased variance, two passes over the channel's N * S elements; otherwise the
// inputs'), then the elements are normalised one thread each. The per-channel operands are of
// type P (float32 or X's type).
namespace cleave::kernels::cuda {
namespace {

template <typename T, typename P>
__global__ void BatchNormStatsKernel(const T* x, const P* mean_in, const P* var_in, P* running_mean, P* running_var,
                                     float* stats, int64_t N, int64_t C, int64_t S, float momentum, bool training) {
  __shared__ float shared[32];
  const int64_t c = blockIdx.x, M = N * S;
  float m, v;
  if (training) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) s += ToFloat(x[(i / S * C + c) * S + i % S]);
    m = BlockSum(s, shared) / static_cast<float>(M);
    float q = 0.f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
      const float d = ToFloat(x[(i / S * C + c) * S + i % S]) - m;
      q += d * d;
    }
    v = BlockSum(q, shared) / static_cast<float>(M);
  } else {
    m = ToFloat(mean_in[c]);
    v = ToFloat(var_in[c]);
  }
  if (threadIdx.x == 0) {
    stats[c] = m;
    stats[C + c] = v;
    if (running_mean) running_mean[c] = FromFloat<P>(ToFloat(mean_in[c]) * momentum + m * (1.f - momentum));
    if (running_var) running_var[c] = FromFloat<P>(ToFloat(var_in[c]) * momentum + v * (1.f - momentum));
  }
}

// The statistics are per channel c of C; the per-channel operands repeat every `period`
// channels (C for BatchNormalization; InstanceNormalization's "channels" are the N * C planes).
template <typename T, typename P>
__global__ void BatchNormApplyKernel(const T* x, const P* scale, const P* bias, const float* stats, T* y, int64_t C,
                                     int64_t S, int64_t period, int64_t total, float eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i / S % C, pc = c % period;
    const float inv = rsqrtf(stats[C + c] + eps);
    y[i] = FromFloat<T>((ToFloat(x[i]) - stats[c]) * inv * ToFloat(scale[pc]) + ToFloat(bias[pc]));
  }
}

// sums[c] = sum(dy), sums[C + c] = sum(dy xhat) over the channel; dscale / dbias from them.
template <typename T, typename P>
__global__ void BatchNormGradSumsKernel(const T* dy, const T* x, const float* stats, float* sums, P* dscale,
                                        P* dbias, int64_t N, int64_t C, int64_t S, float eps) {
  __shared__ float shared[32];
  const int64_t c = blockIdx.x, M = N * S;
  const float m = stats[c], inv = rsqrtf(stats[C + c] + eps);
  float g = 0.f, gx = 0.f;
  for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
    const int64_t at = (i / S * C + c) * S + i % S;
    const float d = ToFloat(dy[at]);
    g += d;
    gx += d * (ToFloat(x[at]) - m) * inv;
  }
  g = BlockSum(g, shared);
  gx = BlockSum(gx, shared);
  if (threadIdx.x == 0) {
    sums[c] = g;
    sums[C + c] = gx;
    if (dscale) dscale[c] = FromFloat<P>(gx);
    if (dbias) dbias[c] = FromFloat<P>(g);
  }
}

template <typename T, typename P>
__global__ void BatchNormGradApplyKernel(const T* dy, const T* x, const P* scale, const float* stats,
                                         const float* sums, T* dx, int64_t C, int64_t S, int64_t period, int64_t total,
                                         float count, float eps, bool training) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i / S % C;
    const float inv = rsqrtf(stats[C + c] + eps), mul = ToFloat(scale[c % period]) * inv, g = ToFloat(dy[i]);
    if (training) {
      const float xhat = (ToFloat(x[i]) - stats[c]) * inv;
      dx[i] = FromFloat<T>(mul * (g - sums[c] / count - xhat * sums[C + c] / count));
    } else {
      dx[i] = FromFloat<T>(mul * g);
    }
  }
}

// InstanceNormalization's dScale and dB: the planes' sums (sums[n C + c] = sum(dy),
// sums[N C + n C + c] = sum(dy xhat)) added over the images in image order, a thread per channel.
template <typename P>
__global__ void InstanceNormParamGradKernel(const float* sums, P* dscale, P* dbias, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float g = 0.f, gx = 0.f;
  for (int64_t n = 0; n < N; ++n) {
    g += sums[n * C + c];
    gx += sums[N * C + n * C + c];
  }
  if (dscale) dscale[c] = FromFloat<P>(gx);
  if (dbias) dbias[c] = FromFloat<P>(g);
}

// Runs f(P{}) with P float32 or T, as `p` says.
template <typename T, typename F>
int WithParam(Dt p, F&& f) {
  if (p == Dt::kF32) return f(float{});
  return f(T{});
}

}  // namespace

int BatchNorm(Dt t, Dt p, const void* x, const void* scale, const void* bias, const void* mean, const void* var,
              void* y, void* running_mean, void* running_var, float* stats, int64_t N, int64_t C, int64_t S,
              float eps, float momentum, bool training, void* stream) {
  if (C == 0) return 0;
  int err = 0;
  DISPATCH_DT(t, T, {
    err = WithParam<T>(p, [&](auto pw) {
      using P = decltype(pw);
      BatchNormStatsKernel<T, P><<<static_cast<unsigned>(C), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(x), static_cast<const P*>(mean), static_cast<const P*>(var),
          static_cast<P*>(running_mean), static_cast<P*>(running_var), stats, N, C, S, momentum, training);
      const int64_t total = N * C * S;
      if (y && total > 0)
        BatchNormApplyKernel<T, P><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(x), static_cast<const P*>(scale), static_cast<const P*>(bias), stats,
            static_cast<T*>(y), C, S, C, total, eps);
      return static_cast<int>(cudaGetLastError());
    });
  });
  return err;
}

int BatchNormGrad(Dt t, Dt p, const void* dy, const void* x, const void* scale, const void* mean, const void* var,
                  void* dx, void* dscale, void* dbias, float* stats, int64_t N, int64_t C, int64_t S, float eps,
                  bool training, void* stream) {
  if (C == 0) return 0;
  int err = 0;
  DISPATCH_DT(t, T, {
    err = WithParam<T>(p, [&](auto pw) {
      using P = decltype(pw);
      BatchNormStatsKernel<T, P><<<static_cast<unsigned>(C), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(x), static_cast<const P*>(mean), static_cast<const P*>(var), nullptr, nullptr, stats,
          N, C, S, 0.f, training);
      BatchNormGradSumsKernel<T, P><<<static_cast<unsigned>(C), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), stats, stats + 2 * C, static_cast<P*>(dscale),
          static_cast<P*>(dbias), N, C, S, eps);
      const int64_t total = N * C * S;
      if (dx && total > 0)
        BatchNormGradApplyKernel<T, P><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const P*>(scale), stats, stats + 2 * C,
            static_cast<T*>(dx), C, S, C, total, static_cast<float>(N * S), eps, training);
      return static_cast<int>(cudaGetLastError());
    });
  });
  return err;
}

// InstanceNormalization: BatchNormalization's kernels over x viewed as [1, N * C, S] (each
// image's channel a "channel" of the batch statistics), the per-channel operands repeating
// every C planes.
int InstanceNorm(Dt t, Dt p, const void* x, const void* scale, const void* bias, void* y, float* stats, int64_t N,
                 int64_t C, int64_t S, float eps, void* stream) {
  const int64_t planes = N * C, total = planes * S;
  if (total == 0) return 0;
  int err = 0;
  DISPATCH_DT(t, T, {
    err = WithParam<T>(p, [&](auto pw) {
      using P = decltype(pw);
      BatchNormStatsKernel<T, P><<<static_cast<unsigned>(planes), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(x), nullptr, nullptr, nullptr, nullptr, stats, 1, planes, S, 0.f, true);
      BatchNormApplyKernel<T, P><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
          static_cast<const T*>(x), static_cast<const P*>(scale), static_cast<const P*>(bias), stats,
          static_cast<T*>(y), planes, S, C, total, eps);
      return static_cast<int>(cudaGetLastError());
    });
  });
  return err;
}

int InstanceNormGrad(Dt t, Dt p, const void* dy, const void* x, const void* scale, void* dx, void* dscale,
                     void* dbias, float* stats, int64_t N, int64_t C, int64_t S, float eps, void* stream) {
  const int64_t planes = N * C, total = planes * S;
  if (C == 0) return 0;
  int err = 0;
  DISPATCH_DT(t, T, {
    err = WithParam<T>(p, [&](auto pw) {
      using P = decltype(pw);
      if (planes > 0) {
        BatchNormStatsKernel<T, P><<<static_cast<unsigned>(planes), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(x), nullptr, nullptr, nullptr, nullptr, stats, 1, planes, S, 0.f, true);
        BatchNormGradSumsKernel<T, P><<<static_cast<unsigned>(planes), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), stats, stats + 2 * planes, nullptr, nullptr, 1,
            planes, S, eps);
      }
      if (dscale || dbias)
        InstanceNormParamGradKernel<P><<<Blocks(C), kThreads, 0, Stream(stream)>>>(
            stats + 2 * planes, static_cast<P*>(dscale), static_cast<P*>(dbias), N, C);
      if (dx && total > 0)
        BatchNormGradApplyKernel<T, P><<<Blocks(total), kThreads, 0, Stream(stream)>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const P*>(scale), stats,
            stats + 2 * planes, static_cast<T*>(dx), planes, S, C, total, static_cast<float>(S), eps, true);
      return static_cast<int>(cudaGetLastError());
    });
  });
  return err;
}

}  // namespace cleave::kernels::cuda
