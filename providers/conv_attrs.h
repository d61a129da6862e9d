// Conv's and ConvTranspose's attributes as a node carries them (providers/), read the same way by
// the CPU and CUDA providers' kernels and their gradients'.
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

inline kernels::cpu::ConvTransposeAttrs ConvTransposeAttrsOf(const graph::Node& n) {
  kernels::cpu::ConvTransposeAttrs a;
  static_cast<kernels::cpu::ConvAttrs&>(a) = ConvAttrsOf(n);
  a.output_padding = n.AttrInts("output_padding");
  a.output_shape = n.AttrInts("output_shape");
  return a;
}

}  // namespace cleave::providers
