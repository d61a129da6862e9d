// SwiGLU on the CPU (kernels/cpu/): y = silu(gate) * up and its gradients, over blocks that stay
// on the stack between the sigmoid and the products. float32 takes the vectorised sigmoid of
// fast_math.h (what the Sigmoid op computes), float64 std::exp.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/grad.h"
#include "kernels/cpu/nn.h"

namespace cleave::kernels::cpu {

namespace {

constexpr int64_t kBlock = 512;       // elements per stack buffer
constexpr int64_t kGrain = 1 << 14;   // elements per parallel task

void SigmoidBlock(const float* x, float* y, int64_t n) { SigmoidF32(x, y, n); }
void SigmoidBlock(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0 / (1.0 + std::exp(-x[i]));
}

}  // namespace

template <typename T>
void SwiGlu(const T* gate, const T* up, T* y, int64_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kGrain, [&](int64_t i0, int64_t i1) {
    T s[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t m = std::min(kBlock, i1 - b);
      SigmoidBlock(gate + b, s, m);
      // (gate * sigmoid(gate)) * up, in the order the exported Mul nodes take.
      for (int64_t i = 0; i < m; ++i) y[b + i] = gate[b + i] * s[i] * up[b + i];
    }
  });
}

template <typename T>
void SwiGluGrad(const T* dy, const T* gate, const T* up, T* dgate, T* dup, int64_t n, ThreadPool* pool) {
  ParallelFor(pool, n, kGrain, [&](int64_t i0, int64_t i1) {
    T s[kBlock];
    for (int64_t b = i0; b < i1; b += kBlock) {
      const int64_t m = std::min(kBlock, i1 - b);
      SigmoidBlock(gate + b, s, m);
      for (int64_t i = 0; i < m; ++i) {
        const T g = gate[b + i], si = s[i], d = dy[b + i];
        if (dup) dup[b + i] = d * (g * si);
        // silu'(g) = s + g s (1 - s)
        if (dgate) dgate[b + i] = d * up[b + i] * (si + g * si * (T(1) - si));
      }
    }
  });
}

template void SwiGlu<float>(const float*, const float*, float*, int64_t, ThreadPool*);
template void SwiGlu<double>(const double*, const double*, double*, int64_t, ThreadPool*);
template void SwiGluGrad<float>(const float*, const float*, const float*, float*, float*, int64_t, ThreadPool*);
template void SwiGluGrad<double>(const double*, const double*, const double*, double*, double*, int64_t,
                                 ThreadPool*);

}  // namespace cleave::kernels::cpu
