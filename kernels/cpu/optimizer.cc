// Optimizer math on the CPU (kernels/): see optimizer.h. The float/double split follows
// PyTorch's single-tensor optimizers: per-element arithmetic in fp32, step-wide scalars
// (bias corrections, step size, decay factor) in double and rounded once to fp32.
#include "kernels/cpu/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/lanes.h"

namespace cleave::kernels::cpu {

namespace {
constexpr int64_t kGrain = 1 << 14;
}

void AccumulateGrad(const float* buffer, const float* grad, bool reset, float* out, int64_t n,
                    ThreadPool* pool) {
  ParallelFor(pool, n, kGrain, [&](int64_t i0, int64_t i1) {
    if (reset) {
      for (int64_t i = i0; i < i1; ++i) out[i] = grad[i];
    } else {
      for (int64_t i = i0; i < i1; ++i) out[i] = buffer[i] + grad[i];
    }
  });
}

namespace {

// f(i0, i1) over fixed blocks of kGrain elements, in parallel; the results in block order, so
// that what is made of them does not depend on the thread count.
template <typename R, typename F>
std::vector<R> PerBlock(int64_t n, ThreadPool* pool, F f) {
  const int64_t blocks = (n + kGrain - 1) / kGrain;
  std::vector<R> out(static_cast<size_t>(blocks));
  ParallelFor(pool, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) out[static_cast<size_t>(b)] = f(b * kGrain, std::min(n, (b + 1) * kGrain));
  });
  return out;
}

// sum x[i]^2 of one block in double, in lanes (lanes.h) built for each vector width.
CLEAVE_SIMD_CLONES double BlockSquares(const float* x, int64_t n) { return LaneSumSquares(x, n, 0.0); }

}  // namespace

double SquaredNorm(const float* x, int64_t n, ThreadPool* pool) {
  double total = 0.0;
  for (double s : PerBlock<double>(n, pool, [x](int64_t i0, int64_t i1) { return BlockSquares(x + i0, i1 - i0); }))
    total += s;
  return total;
}

bool AllFinite(const float* x, int64_t n, ThreadPool* pool) {
  for (char bad : PerBlock<char>(n, pool, [x](int64_t i0, int64_t i1) {
         bool any = false;
         for (int64_t i = i0; i < i1; ++i) any |= !std::isfinite(x[i]);
         return static_cast<char>(any);
       }))
    if (bad) return false;
  return true;
}

namespace {

// The step-wide float32 factors of one AdamW update.
struct AdamWFactors {
  float decay, one_minus_beta1, one_minus_beta2, neg_step_size, bc2_sqrt, b1, b2, eps, scale;
};

// The update of n elements, built for each vector width (lanes.h). The outputs may be the
// inputs (an update in place): each element reads and writes its own index only, which is
// what `ivdep` tells the vectoriser (it would otherwise test every pair of the seven arrays
// for overlap, and give up).
CLEAVE_SIMD_CLONES void AdamWRange(const AdamWFactors& f, const float* param, const float* grad,
                                   const float* exp_avg, const float* exp_avg_sq, float* param_out,
                                   float* exp_avg_out, float* exp_avg_sq_out, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * f.scale;
    const float w = param[i] * f.decay;
    const float m = exp_avg[i] * f.b1 + f.one_minus_beta1 * g;
    const float v = exp_avg_sq[i] * f.b2 + f.one_minus_beta2 * (g * g);
    const float denom = std::sqrt(v) / f.bc2_sqrt + f.eps;
    param_out[i] = w + f.neg_step_size * (m / denom);
    exp_avg_out[i] = m;
    exp_avg_sq_out[i] = v;
  }
}

}  // namespace

void AdamWStep(const AdamWParams& p, const float* param, const float* grad, const float* exp_avg,
               const float* exp_avg_sq, float* param_out, float* exp_avg_out,
               float* exp_avg_sq_out, int64_t n, ThreadPool* pool) {
  const double step = static_cast<double>(p.step);
  const double beta1 = p.beta1, beta2 = p.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, step);
  const double bias_correction2 = 1.0 - std::pow(beta2, step);
  const AdamWFactors f{static_cast<float>(1.0 - p.lr * p.weight_decay),
                       static_cast<float>(1.0 - beta1),
                       static_cast<float>(1.0 - beta2),
                       static_cast<float>(-(p.lr / bias_correction1)),
                       static_cast<float>(std::sqrt(bias_correction2)),
                       p.beta1,
                       p.beta2,
                       p.epsilon,
                       p.grad_scale};
  ParallelFor(pool, n, kGrain, [&](int64_t i0, int64_t i1) {
    AdamWRange(f, param + i0, grad + i0, exp_avg + i0, exp_avg_sq + i0, param_out + i0, exp_avg_out + i0,
               exp_avg_sq_out + i0, i1 - i0);
  });
}

namespace {

// The SGD update of n elements, built for each vector width; in place as AdamWRange.
CLEAVE_SIMD_CLONES void SgdRange(const SgdParams& p, const float* param, const float* grad, const float* buffer,
                                 float* param_out, float* buffer_out, int64_t n) {
  const float neg_lr = static_cast<float>(-p.lr);
  const float wd = p.weight_decay, mom = p.momentum;
  const float keep = 1.0f - p.dampening;
  const bool first = p.step <= 1, use_momentum = p.momentum != 0.0f;
  const float scale = p.grad_scale;
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    float d = grad[i] * scale;
    if (wd != 0.0f) d = d + wd * param[i];
    if (use_momentum) {
      const float b = first ? d : buffer[i] * mom + keep * d;
      buffer_out[i] = b;
      d = p.nesterov ? d + mom * b : b;
    }
    param_out[i] = param[i] + neg_lr * d;
  }
}

}  // namespace

void SgdStep(const SgdParams& p, const float* param, const float* grad, const float* buffer,
             float* param_out, float* buffer_out, int64_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kGrain, [&](int64_t i0, int64_t i1) {
    // Without momentum the buffers may be null (and go unread).
    SgdRange(p, param + i0, grad + i0, buffer ? buffer + i0 : nullptr, param_out + i0,
             buffer_out ? buffer_out + i0 : nullptr, i1 - i0);
  });
}

}  // namespace cleave::kernels::cpu
