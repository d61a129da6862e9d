// The random ops' draws (kernels/): element i of RandomUniform, RandomNormal and Bernoulli from
// Philox4x32-10 (kernels/philox.h) under one key per run, for the CPU and CUDA kernels alike, so
// both providers draw the same numbers for the same key. Elements 2j and 2j + 1 share counter
// j's two 53-bit uniforms; a normal is their Box-Muller transform (cos for the even element,
// sin for the odd).
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/philox.h"

namespace cleave::kernels {

enum class RandomKind : int { kUniform, kNormal, kBernoulli };

// A uniform in [0, 1).
CLEAVE_HOST_DEVICE inline double RandomUniformAt(uint64_t key, int64_t i) {
  double u0, u1;
  PhiloxUniformPair(key, static_cast<uint64_t>(i) >> 1, &u0, &u1);
  return (i & 1) ? u1 : u0;
}

// A standard normal.
CLEAVE_HOST_DEVICE inline double RandomNormalAt(uint64_t key, int64_t i) {
  double u0, u1;
  PhiloxUniformPair(key, static_cast<uint64_t>(i) >> 1, &u0, &u1);
  const double r = sqrt(-2.0 * log(1.0 - u0)), theta = 6.283185307179586 * u1;
  return (i & 1) ? r * sin(theta) : r * cos(theta);
}

// Element i of a draw: uniform in [a, b), normal of mean a and scale b, or Bernoulli(p) (1 or 0).
CLEAVE_HOST_DEVICE inline double RandomDrawAt(RandomKind kind, uint64_t key, int64_t i, double a, double b, double p) {
  switch (kind) {
    case RandomKind::kUniform: return a + (b - a) * RandomUniformAt(key, i);
    case RandomKind::kNormal: return a + b * RandomNormalAt(key, i);
    case RandomKind::kBernoulli: return RandomUniformAt(key, i) < p ? 1.0 : 0.0;
  }
  return 0.0;
}

}  // namespace cleave::kernels
