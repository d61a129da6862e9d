// The execution-provider interface (providers/), after ONNX Runtime's but smaller.
//
// A session asks each provider, in priority order, which nodes it takes (GetCapability);
// the CPU provider comes last and is the fallback. A provider answers from its kernel table
// alone, so the answer is the single place that says what it can run. For each node it
// takes, the session then asks it for a kernel (CreateKernel). Memory comes from the
// provider's allocator; tensors cross providers through CopyTensor, which the session
// inserts at device boundaries.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graph/graph.h"
#include "providers/kernel.h"

namespace cleave::providers {

enum class DeviceKind { kCpu, kCuda };

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual DeviceKind device() const = 0;
  // Why the last Allocate returned nullptr.
  virtual std::string last_error() const { return "out of memory"; }
  // Whether p lies in memory this allocator handed out and still holds (device-resident feeds
  // and outputs are recognised by it).
  virtual bool Owns(const void* p) const { return false; }
};

struct NodeCapability {
  const graph::Node* node;
  int version;
  const KernelDef* kernel;
};

struct UnsupportedNode {
  const graph::Node* node;
  std::string reason;
};

struct Capability {
  std::vector<NodeCapability> claimed;
  std::vector<UnsupportedNode> rejected;
};

// Timing of the work a device provider queues: its kernels run on a stream after Compute has
// returned, so the host's clock says when they were launched, not how long they ran. A mark is
// an event on the provider's stream after the work queued so far; the profiler puts each
// device node between two marks on a track of the stream's own.
class StreamTimer {
 public:
  virtual ~StreamTimer() = default;
  // Records a mark and returns its index in this round (0, 1, ...).
  virtual absl::StatusOr<int> Mark() = 0;
  // Waits for the round's marks and returns each one's time in microseconds after mark 0;
  // the next Mark starts a new round.
  virtual absl::StatusOr<std::vector<double>> Collect() = 0;
};

class ExecutionProvider {
 public:
  virtual ~ExecutionProvider() = default;
  virtual std::string name() const = 0;
  virtual DeviceKind device() const = 0;
  // The nodes this provider can run, and why it rejects the others. Input dtypes must be
  // inferred before the call.
  virtual Capability GetCapability(const graph::Graph& graph) const;
  virtual absl::StatusOr<std::unique_ptr<OpKernel>> CreateKernel(const NodeCapability& c) const;
  virtual Allocator* allocator() = 0;
  // Copies between this provider's memory and host memory (same-size views).
  virtual absl::Status CopyTensor(const TensorView& src, TensorView& dst) const = 0;
  // Sets a tensor in this provider's memory to zero bytes, in the order of the provider's work
  // (the default copies zeros from the host; a device sets them where they are).
  virtual absl::Status Zero(TensorView& dst) const;
  virtual ThreadPool* thread_pool() const { return nullptr; }
  // A timer over the provider's stream (null: the provider's kernels finish before Compute
  // returns, and host time is theirs, as on the CPU).
  virtual std::unique_ptr<StreamTimer> MakeStreamTimer() const { return nullptr; }
  // The rank's communicator, which collective kernels use (not owned; may be null).
  Communicator* communicator() const { return communicator_; }
  void set_communicator(Communicator* c) { communicator_ = c; }
  const KernelRegistry& registry() const { return registry_; }

 protected:
  KernelRegistry registry_;
  Communicator* communicator_ = nullptr;
};

}  // namespace cleave::providers
