// One step of the executor's run order (runtime/, private to the executor's .cc files).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "graph/graph.h"
#include "providers/execution_provider.h"
#include "runtime/executor.h"

namespace cleave::runtime {

struct Executor::Step {
  const graph::Node* node = nullptr;
  std::unique_ptr<providers::OpKernel> kernel;
  providers::ExecutionProvider* provider = nullptr;
  std::vector<int> inputs, outputs;  // slots, -1 when omitted
  int order_pos = 0;                 // position in the run order before constant uploads left it
};

// 64-byte aligned host memory of at least `bytes` (64 for none), freed with the last owner.
std::shared_ptr<void> HeapBuffer(size_t bytes);

}  // namespace cleave::runtime
