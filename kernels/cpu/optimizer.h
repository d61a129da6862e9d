// Optimizer math on the CPU (kernels/): gradient accumulation, the squared norm behind
// global-norm clipping, and one AdamW or SGD step, each with PyTorch's single-tensor
// semantics and rounding order. Every function is elementwise over flat fp32 arrays, so an
// output may alias the input it replaces (the training session updates state in place).
#pragma once

#include <cstdint>

#include "base/thread_pool.h"

namespace cleave::kernels::cpu {

// out = reset ? grad : buffer + grad.
void AccumulateGrad(const float* buffer, const float* grad, bool reset, float* out, int64_t n,
                    ThreadPool* pool);

// Sum of x[i]^2 in double, over fixed blocks summed in order: the result does not depend on
// the thread count.
double SquaredNorm(const float* x, int64_t n, ThreadPool* pool);

// Whether every x[i] is finite (neither infinite nor NaN): the loss scaler's overflow test.
bool AllFinite(const float* x, int64_t n, ThreadPool* pool);

struct AdamWParams {
  double lr = 1e-3;
  int64_t step = 1;  // 1-based, after this update
  float grad_scale = 1.0f;
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f, weight_decay = 0.0f;
};
// param *= 1 - lr*wd; m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
// param -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step) + eps), with g = grad*scale.
void AdamWStep(const AdamWParams& p, const float* param, const float* grad, const float* exp_avg,
               const float* exp_avg_sq, float* param_out, float* exp_avg_out,
               float* exp_avg_sq_out, int64_t n, ThreadPool* pool);

struct SgdParams {
  double lr = 1e-3;
  int64_t step = 1;
  float grad_scale = 1.0f;
  float momentum = 0.0f, dampening = 0.0f, weight_decay = 0.0f;
  bool nesterov = false;
};
// d = g*scale + wd*param; with momentum, buf = step == 1 ? d : momentum*buf + (1-dampening)*d
// and d = nesterov ? d + momentum*buf : buf; param -= lr*d. `buffer` may be null without
// momentum.
void SgdStep(const SgdParams& p, const float* param, const float* grad, const float* buffer,
             float* param_out, float* buffer_out, int64_t n, ThreadPool* pool);

}  // namespace cleave::kernels::cpu
