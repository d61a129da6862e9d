// Conv's attributes as a node carries them (providers/), read the same way by the CPU and CUDA
// providers' Conv and ConvGrad kernels.
#pragma once

#include "graph/graph.h"
#include "kernels/cpu/conv.h"

namespace cleave::providers {

inline kernels::cpu::ConvAttrs ConvAttrsOf(const graph::Node& n) {
  kernels::cpu::ConvAttrs a;
  a.auto_pad = n.AttrString("auto_pad", "NOTSET");
  a.strides = n.AttrInts("strides");
  a.dilations = n.AttrInts("dilations");
  a.pads = n.AttrInts("pads");
  a.kernel_shape = n.AttrInts("kernel_shape");
  a.group = n.AttrInt("group", 1);
  return a;
}

}  // namespace cleave::providers
