// The kernel API of execution providers (providers/).
// A kernel is created once per node when a session loads (attributes parsed and checked
// there, never on the step path) and then computed once per run. Compute reads input views
// and asks the context for outputs; the context hands out memory from the session's memory
// plan, so a kernel never allocates tensors itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "base/thread_pool.h"
#include "graph/graph.h"

namespace cleave {
class Communicator;
}

namespace cleave::providers {

class KernelContext {
 public:
  virtual ~KernelContext() = default;
  virtual int num_inputs() const = 0;
  virtual int num_outputs() const = 0;
  // nullptr when an optional input is omitted.
  virtual const TensorView* input(int i) const = 0;
  // Allocates output i with the given dims and returns its view (valid until the run ends).
  // Returns nullptr for an output the graph does not use (an omitted optional output); the
  // kernel must then skip writing it.
  virtual TensorView* Output(int i, std::span<const int64_t> dims) = 0;
  // A scratch buffer that lives until Compute returns. nullptr when the memory cannot be had:
  // the context has then recorded why, and the kernel returns NoScratch() without writing.
  virtual void* Scratch(size_t bytes) = 0;
  virtual ThreadPool* thread_pool() const = 0;
  // The run's random seed, set by the caller for reproducible randomness (the training
  // session derives one per training run from its seed, step and micro-batch);
  // kNoRunSeed when the caller gave none.
  static constexpr uint64_t kNoRunSeed = ~uint64_t{0};
  virtual uint64_t run_seed() const { return kNoRunSeed; }
  // The communicator of this rank for collective kernels; nullptr outside a distributed run.
  virtual Communicator* communicator() const { return nullptr; }

  // Scratch for n values of T (nullptr as Scratch; a count whose bytes size_t cannot hold asks
  // for more than any host has, so the context records that as it records any failure).
  template <typename T>
  T* ScratchOf(int64_t n) {
    constexpr size_t kMost = static_cast<size_t>(PTRDIFF_MAX) / 2;
    const bool fits = n >= 0 && static_cast<uint64_t>(n) <= kMost / sizeof(T);
    return static_cast<T*>(Scratch(fits ? sizeof(T) * static_cast<size_t>(n) : kMost));
  }

  TensorView* Output(int i, std::initializer_list<int64_t> dims) {
    return Output(i, std::span<const int64_t>(dims.begin(), dims.size()));
  }
  TensorView* Output(int i, const std::vector<int64_t>& dims) {
    return Output(i, std::span<const int64_t>(dims.data(), dims.size()));
  }
};

// What a kernel returns when Scratch gave it nullptr. The executor reports the reason the
// context recorded (the bytes, and the allocator's message) in its place.
absl::Status NoScratch();

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual absl::Status Compute(KernelContext& ctx) const = 0;
};

// Returns "" when the provider can run the node, else a reason ("dtype float16 of input 0
// 'x' is not supported"). Called at load with input dtypes known.
using SupportsFn = std::function<std::string(const graph::Node&, int version)>;
using KernelFactory =
    std::function<absl::StatusOr<std::unique_ptr<OpKernel>>(const graph::Node&, int version)>;

struct KernelDef {
  std::string domain;  // "" for the ONNX default domain
  std::string op;
  int min_version = 1;  // inclusive range of op versions this kernel implements
  int max_version = 1 << 30;
  SupportsFn supports;
  KernelFactory create;
  // Inputs a device kernel reads on the host (shapes, axes, scalar hyper-parameters): the
  // executor leaves them in host memory instead of copying them to the device.
  std::vector<int> host_inputs = {};
  // Inputs a host kernel reads the dims of only (Shape): a device value is read where it is,
  // with no copy to the host.
  std::vector<int> shape_only_inputs = {};
};

class KernelRegistry {
 public:
  void Register(KernelDef def);
  // The kernel for this node and op version, or nullptr with `why` set.
  const KernelDef* Find(const graph::Node& node, int version, std::string* why) const;
  bool HasOp(const std::string& domain, const std::string& op) const;
  const std::vector<KernelDef>& defs() const { return defs_; }

 private:
  std::vector<KernelDef> defs_;
};

// SupportsFn helpers: the dtype of input `i` (or output when i < 0: -1 is output 0) must be
// one of `types`.
SupportsFn InputTypeIn(int i, std::vector<DataType> types);
SupportsFn AllOf(std::vector<SupportsFn> fns);

// Makes a KernelFactory for a kernel class constructible as K(const Node&, int version)
// whose constructor cannot fail.
template <typename K>
KernelFactory MakeFactory() {
  return [](const graph::Node& n, int v) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new K(n, v));
  };
}
// For kernels with a static `absl::StatusOr<std::unique_ptr<OpKernel>> Create(node, version)`.
template <typename K>
KernelFactory MakeCheckedFactory() {
  return [](const graph::Node& n, int v) { return K::Create(n, v); };
}

}  // namespace cleave::providers
