// One step of the executor's run order, and the host allocation helpers the executor and the
// constant evaluator share (runtime/, private to its .cc files).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
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

// Why output i of `n`, of `dims`, could not be had on the host: dims whose byte size does not
// fit int64 (InvalidArgument), else a failed allocation of that many bytes (ResourceExhausted).
absl::Status HostOutputError(const graph::Node& n, int i, DataType dtype, std::span<const int64_t> dims);

}  // namespace cleave::runtime
