// What a random op (RandomNormal, RandomUniform, their Like forms, Bernoulli, Multinomial) draws,
// and the Philox key of each of its runs, for the CPU and CUDA providers alike (providers/). With a run seed
// (KernelContext::run_seed; the training session sets one per step) the key is a function of
// that seed and the node's name, so a step's draws are reproducible. Otherwise each kernel
// counts its runs from a base fixed by the node's seed attribute (else drawn at random), so a
// seeded model replays the same sequence of draws, run after run, on either provider.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "graph/graph.h"
#include "kernels/random_draw.h"
#include "providers/kernel.h"

namespace cleave::providers {

// What a random node draws: its distribution and parameters (mean and scale, or low and high),
// and its output's dims from the `shape` attribute unless it reads its input's (the Like forms
// and Bernoulli).
struct RandomSpec {
  explicit RandomSpec(const graph::Node& n)
      : kind(n.op_type() == "Bernoulli"                   ? kernels::RandomKind::kBernoulli
             : n.op_type().rfind("RandomNormal", 0) == 0 ? kernels::RandomKind::kNormal
                                                         : kernels::RandomKind::kUniform),
        a(kind == kernels::RandomKind::kNormal ? n.AttrFloat("mean", 0.f) : n.AttrFloat("low", 0.f)),
        b(kind == kernels::RandomKind::kNormal ? n.AttrFloat("scale", 1.f) : n.AttrFloat("high", 1.f)),
        shape(n.AttrInts("shape")), like(n.num_inputs() > 0) {}
  kernels::RandomKind kind;
  double a, b;
  std::vector<int64_t> shape;
  bool like;
};

class RandomKeys {
 public:
  explicit RandomKeys(const graph::Node& n) {
    for (unsigned char c : n.name()) salt_ = (salt_ ^ c) * 1099511628211ull;
    if (n.HasAttr("seed")) {
      base_ = std::bit_cast<uint32_t>(n.AttrFloat("seed", 0.f)) * 0x9E3779B97F4A7C15ull + 1;
    } else {
      std::random_device rd;
      base_ = (static_cast<uint64_t>(rd()) << 32) | rd();
    }
  }
  // The next run's key.
  uint64_t Next(const KernelContext& ctx) const {
    if (ctx.run_seed() != KernelContext::kNoRunSeed) return Mix(ctx.run_seed() * 0xd1342543de82ef95ull ^ salt_);
    return Mix(base_ + runs_.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  }

 private:
  // splitmix64's finaliser.
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t salt_ = 1469598103934665603ull;  // FNV-1a of the node name
  uint64_t base_ = 0;
  mutable std::atomic<uint64_t> runs_{0};
};

}  // namespace cleave::providers
