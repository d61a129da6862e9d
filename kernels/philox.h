// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator of cuRAND and PyTorch's CUDA generator, for the host and the device
// alike (kernels/): a pure function of a 128-bit counter and a 64-bit key, so the CPU and CUDA
// dropout kernels draw the same numbers for the same (key, counter), and a backward pass can
// recompute a mask instead of storing it.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace cleave::kernels {

// The round multipliers and the key schedule's Weyl steps.
inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

struct Philox4 {
  uint32_t v[4];
};

// The 4 words of counter c under key k (Random123's philox4x32_10).
CLEAVE_HOST_DEVICE inline Philox4 Philox4x32(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c.v[0], p1 = static_cast<uint64_t>(kPhiloxM1) * c.v[2];
    c = Philox4{{static_cast<uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<uint32_t>(p1),
                 static_cast<uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<uint32_t>(p0)}};
  }
  return c;
}

// The two 53-bit integers behind the uniforms of counter j under `key`: words 0-1 and 2-3,
// top 53 bits.
CLEAVE_HOST_DEVICE inline void PhiloxBitsPair(uint64_t key, uint64_t j, uint64_t* m0, uint64_t* m1) {
  const Philox4 r = Philox4x32(Philox4{{static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), 0u, 0u}},
                               static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
  *m0 = ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) >> 11;
  *m1 = ((static_cast<uint64_t>(r.v[2]) << 32) | r.v[3]) >> 11;
}

// Two uniforms in [0, 1) of 53 bits each from counter j under `key`: u = m * 2^-53.
CLEAVE_HOST_DEVICE inline void PhiloxUniformPair(uint64_t key, uint64_t j, double* u0, double* u1) {
  uint64_t m0, m1;
  PhiloxBitsPair(key, j, &m0, &m1);
  *u0 = static_cast<double>(m0) * 0x1.0p-53;
  *u1 = static_cast<double>(m1) * 0x1.0p-53;
}

// Dropout keeps an element when its uniform u >= ratio. With u = m * 2^-53 (m < 2^53) and
// ratio * 2^53 exact (a double in [0, 1) scaled by a power of two), that is m >= this
// threshold, so the kernels compare integers and draw exactly the masks of the uniforms.
inline uint64_t DropoutKeepThreshold(double ratio) {
  const double t = ratio * 0x1.0p53;
  const uint64_t whole = static_cast<uint64_t>(t);  // t >= 0; ceil without <cmath>
  return static_cast<double>(whole) == t ? whole : whole + 1;
}

}  // namespace cleave::kernels
