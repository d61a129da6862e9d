// Vectorisable fp32 transcendental functions for CPU kernels (kernels/).
// Each works on a block of floats with branch-free arithmetic so the compiler vectorises
// it, and each is built for AVX-512, AVX2 and baseline x86-64, picked at load time.
// They agree with the std:: functions to a few ulp (bounds in fast_math.cc, checked by
// tests against std::); the std:: versions remain the reference for every other dtype.
#pragma once

#include <cstdint>

namespace cleave::kernels::cpu {

// y[i] = exp(x[i]). Relative error <= 2 ulp; subnormal results included.
void ExpF32(const float* x, float* y, int64_t n);
// y[i] = tanh(x[i]). Relative error about 3e-7.
void TanhF32(const float* x, float* y, int64_t n);
// y[i] = 1 / (1 + exp(-x[i])).
void SigmoidF32(const float* x, float* y, int64_t n);
// y[i] = erf(x[i]). Relative error below 4e-7.
void ErfF32(const float* x, float* y, int64_t n);
// y[i] = 0.5 x (1 + erf(x / sqrt 2)), computed through erfc for x < 0 so that the tail
// keeps its relative accuracy instead of cancelling in 1 + erf.
void GeluF32(const float* x, float* y, int64_t n);
// y[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as x * sigmoid(2u).
void GeluTanhF32(const float* x, float* y, int64_t n);
// dx[i] = dy[i] * gelu'(x[i]) with gelu'(x) = Phi(x) + x phi(x) (the erf form); Phi from
// erfc as in GeluF32, phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
void GeluGradF32(const float* dy, const float* x, float* dx, int64_t n);
// dx[i] = dy[i] * d/dx of the tanh form, written with p = sigmoid(2u) = 0.5 (1 + tanh u):
// p + 2 x p (1 - p) sqrt(2/pi) (1 + 3 * 0.044715 x^2), with 1 - p = exp(-2u) p (no
// cancellation).
void GeluTanhGradF32(const float* dy, const float* x, float* dx, int64_t n);

}  // namespace cleave::kernels::cpu
