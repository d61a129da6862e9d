// CUDA optimizer kernels (kernels/cuda/): the AdamW and SGD steps as the CPU computes them,
// the sum of squares of many tensors behind global-norm clipping (accumulated in fp64), the
// clipping scale formed on the device from it, and the loss scaler's finiteness test.
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace cleave::kernels::cuda {
namespace {

constexpr int kTensorsPerLaunch = 32;

// Tensor pointers by value (a kernel parameter, no device table): blockIdx.y picks the tensor.
struct AdamWBatch {
  const float* param[kTensorsPerLaunch];
  const float* grad[kTensorsPerLaunch];
  const float* m[kTensorsPerLaunch];
  const float* v[kTensorsPerLaunch];
  float* param_out[kTensorsPerLaunch];
  float* m_out[kTensorsPerLaunch];
  float* v_out[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
};

__global__ void MultiAdamWKernel(AdamWBatch b, float decay, float b1, float b2, float one_minus_b1,
                                 float one_minus_b2, float neg_step_size, float bc2_sqrt, float eps, float host_scale,
                                 const float* device_scale) {
  const float scale = device_scale ? *device_scale : host_scale;
  const int t = blockIdx.y;
  const int64_t n = b.n[t];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = b.grad[t][i] * scale;
    const float w = b.param[t][i] * decay;
    const float m = b.m[t][i] * b1 + one_minus_b1 * g;
    const float v = b.v[t][i] * b2 + one_minus_b2 * (g * g);
    const float denom = sqrtf(v) / bc2_sqrt + eps;
    b.param_out[t][i] = w + neg_step_size * (m / denom);
    b.m_out[t][i] = m;
    b.v_out[t][i] = v;
  }
}

struct SgdBatch {
  const float* param[kTensorsPerLaunch];
  const float* grad[kTensorsPerLaunch];
  const float* buf[kTensorsPerLaunch];
  float* param_out[kTensorsPerLaunch];
  float* buf_out[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
};

// The CPU's SgdStep per element: d = g*scale (+ wd*param); with momentum buf = first ? d :
// momentum*buf + (1-dampening)*d and d = nesterov ? d + momentum*buf : buf; param -= lr*d.
__global__ void MultiSgdKernel(SgdBatch b, float neg_lr, float wd, float mom, float keep, bool first,
                               bool use_momentum, bool nesterov, float host_scale, const float* device_scale) {
  const float scale = device_scale ? *device_scale : host_scale;
  const int t = blockIdx.y;
  const int64_t n = b.n[t];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float d = b.grad[t][i] * scale;
    if (wd != 0.f) d = d + wd * b.param[t][i];
    if (use_momentum) {
      const float m = first ? d : b.buf[t][i] * mom + keep * d;
      b.buf_out[t][i] = m;
      d = nesterov ? d + mom * m : m;
    }
    b.param_out[t][i] = b.param[t][i] + neg_lr * d;
  }
}

// Up to kNormTensors tensors per launch, their pointers by value; blockIdx.y picks the tensor.
constexpr int kNormTensors = 128;
struct NormBatch {
  const float* x[kNormTensors];
  int64_t n[kNormTensors];
};

// Every square is added in double, as on the CPU; the blocks' sums meet in one double.
__global__ void SumSquares(NormBatch b, double* acc) {
  __shared__ double shared[32];
  const float* x = b.x[blockIdx.y];
  const int64_t n = b.n[blockIdx.y];
  double s = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += static_cast<double>(x[i]) * x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < static_cast<int>((blockDim.x + 31) >> 5); ++w) s += shared[w];
  atomicAdd(acc, s);
}

// `count` tensors in launches of kTensorsPerLaunch: fill(batch, slot, tensor) puts a tensor's
// pointers in the batch and returns its elements; launch(batch, grid) runs one launch (y: the
// tensors, x: blocks for the largest).
template <typename Batch, typename Fill, typename Launch>
int InLaunches(int count, Fill fill, Launch launch) {
  for (int k0 = 0; k0 < count; k0 += kTensorsPerLaunch) {
    Batch b{};
    const int k1 = count - k0 < kTensorsPerLaunch ? count : k0 + kTensorsPerLaunch;
    int64_t largest = 0;
    for (int k = k0; k < k1; ++k) {
      const int64_t n = fill(b, k - k0, k);
      largest = n > largest ? n : largest;
    }
    if (largest == 0) continue;
    launch(b, dim3(Blocks(largest) < 1024 ? Blocks(largest) : 1024, static_cast<unsigned>(k1 - k0)));
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

__global__ void ToFloatOut(const double* acc, float* out) { out[0] = static_cast<float>(acc[0]); }

// Clears *finite where an element is infinite or NaN (NaN fails every comparison, so the test
// is that |x| is at most the largest float).
__global__ void ClearIfNonFinite(NormBatch b, bool* finite) {
  const float* x = b.x[blockIdx.y];
  const int64_t n = b.n[blockIdx.y];
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bad |= !(fabsf(x[i]) <= 3.402823466e38f);
  if (bad) *finite = false;
}

// `count` tensors read kNormTensors per launch of up to 256 blocks per tensor:
// launch(batch, grid, stream) runs one.
template <typename Launch>
int InNormLaunches(const float* const* xs, const int64_t* ns, int count, cudaStream_t s, Launch launch) {
  for (int k0 = 0; k0 < count; k0 += kNormTensors) {
    NormBatch b{};
    const int k1 = count - k0 < kNormTensors ? count : k0 + kNormTensors;
    int64_t largest = 0;
    for (int k = k0; k < k1; ++k) {
      b.x[k - k0] = xs[k];
      b.n[k - k0] = ns[k];
      largest = ns[k] > largest ? ns[k] : largest;
    }
    if (largest == 0) continue;
    const unsigned blocks = Blocks(largest) < 256 ? Blocks(largest) : 256;
    launch(b, dim3(blocks, static_cast<unsigned>(k1 - k0)), s);
  }
  return static_cast<int>(cudaGetLastError());
}

// One thread; __fsqrt_rn and __fdiv_rn are IEEE round-to-nearest, as the CPU's sqrt and /.
__global__ void ClipScaleKernel(const float* sumsq, float grad_scale, float max_norm, float epsilon, float* norm_out,
                                float* scale_out) {
  const float norm = __fmul_rn(__fsqrt_rn(*sumsq), grad_scale);
  *norm_out = norm;
  *scale_out = max_norm > 0.f ? __fmul_rn(grad_scale, fminf(__fdiv_rn(max_norm, __fadd_rn(norm, epsilon)), 1.f))
                              : grad_scale;
}

}  // namespace

int MultiTensorAdamW(int count, const float* const* param, const float* const* grad, const float* const* m,
                     const float* const* v, float* const* param_out, float* const* m_out, float* const* v_out,
                     const int64_t* n, float lr, float beta1, float beta2, float epsilon, float weight_decay,
                     int64_t step, float grad_scale, void* stream, const float* device_scale) {
  // The scalar terms exactly as the CPU step forms them (in double, then rounded).
  const double st = static_cast<double>(step);
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), st);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), st);
  const float neg_step_size = static_cast<float>(-(static_cast<double>(lr) / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return InLaunches<AdamWBatch>(count, [&](AdamWBatch& b, int t, int k) {
    b.param[t] = param[k], b.grad[t] = grad[k], b.m[t] = m[k], b.v[t] = v[k];
    b.param_out[t] = param_out[k], b.m_out[t] = m_out[k], b.v_out[t] = v_out[k];
    return b.n[t] = n[k];
  }, [&](const AdamWBatch& b, dim3 grid) {
    MultiAdamWKernel<<<grid, kThreads, 0, Stream(stream)>>>(b, decay, beta1, beta2, static_cast<float>(1.0 - beta1),
                                                            static_cast<float>(1.0 - beta2), neg_step_size, bc2_sqrt,
                                                            epsilon, grad_scale, device_scale);
  });
}

int MultiTensorSgd(int count, const float* const* param, const float* const* grad, const float* const* buf,
                   float* const* param_out, float* const* buf_out, const int64_t* n, float lr, float momentum,
                   float dampening, float weight_decay, bool nesterov, int64_t step, float grad_scale, void* stream,
                   const float* device_scale) {
  const bool use_momentum = momentum != 0.f;
  return InLaunches<SgdBatch>(count, [&](SgdBatch& b, int t, int k) {
    b.param[t] = param[k], b.grad[t] = grad[k], b.param_out[t] = param_out[k];
    if (use_momentum) b.buf[t] = buf[k], b.buf_out[t] = buf_out[k];
    return b.n[t] = n[k];
  }, [&](const SgdBatch& b, dim3 grid) {
    MultiSgdKernel<<<grid, kThreads, 0, Stream(stream)>>>(b, static_cast<float>(-static_cast<double>(lr)),
                                                          weight_decay, momentum, 1.f - dampening, step <= 1,
                                                          use_momentum, nesterov, grad_scale, device_scale);
  });
}

int ClipScale(const float* sumsq, float grad_scale, float max_norm, float epsilon, float* norm_out, float* scale_out,
              void* stream) {
  ClipScaleKernel<<<1, 1, 0, Stream(stream)>>>(sumsq, grad_scale, max_norm, epsilon, norm_out, scale_out);
  return static_cast<int>(cudaGetLastError());
}

int SquaredNorm(const float* const* xs, const int64_t* ns, int count, float* out, double* acc, void* stream) {
  cudaStream_t s = Stream(stream);
  cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(double), s);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (int r = InNormLaunches(xs, ns, count, s, [acc](const NormBatch& b, dim3 grid, cudaStream_t st) {
        SumSquares<<<grid, kThreads, 0, st>>>(b, acc);
      }))
    return r;
  ToFloatOut<<<1, 1, 0, s>>>(acc, out);
  return static_cast<int>(cudaGetLastError());
}

int AllFinite(const float* const* xs, const int64_t* ns, int count, bool* out, void* stream) {
  cudaStream_t s = Stream(stream);
  cudaError_t e = cudaMemsetAsync(out, 1, sizeof(bool), s);
  if (e != cudaSuccess) return static_cast<int>(e);
  return InNormLaunches(xs, ns, count, s, [out](const NormBatch& b, dim3 grid, cudaStream_t st) {
    ClearIfNonFinite<<<grid, kThreads, 0, st>>>(b, out);
  });
}

}  // namespace cleave::kernels::cuda
