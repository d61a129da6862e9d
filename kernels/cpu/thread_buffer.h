// Per-thread float32 scratch for the CPU kernels (kernels/cpu/) that work one block or row at a
// time inside a ParallelFor task.
#pragma once

#include <cstddef>
#include <vector>

namespace cleave::kernels::cpu {

// Buffer `slot` (0 or 1) of the calling thread, at least n floats, kept between calls (a fresh
// one per call would take a page fault for each page of it). A task owns both until it
// returns; tasks do not nest.
inline float* ThreadBuffer(int slot, size_t n) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& b = buffers[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

}  // namespace cleave::kernels::cpu
