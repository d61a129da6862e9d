// InferenceSession (runtime/): load an ONNX model or an IR graph, bind inputs, run, get
// outputs. Shaped like ONNX Runtime's session so its users feel at home.
//
// Load does all validation: op support on the providers (every unsupported node is listed
// in one error), shape inference, graph optimisation, kernel creation and the run order.
// Run checks each feed's dtype and shape against the model's inputs (symbolic dims must
// agree across inputs), then executes the fixed run order. Activations live in one arena
// planned from liveness; the first run with a given set of input shapes plans it, later
// runs with the same shapes allocate nothing but the outputs they hand back (RunInto
// writes into caller-owned outputs and allocates nothing at all). Run may be called from
// several threads; the runs take turns.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/shape.h"
#include "base/tensor.h"
#include "runtime/comm_queue.h"

namespace cleave {

class Communicator;

namespace graph {
class Graph;
}
namespace runtime {
class Executor;
class Profiler;
}
namespace providers {
class ExecutionProvider;
}

// Where a session runs its nodes. kCuda demands the CUDA provider (an error names why it is
// unusable: no device, a driver too old, a build without CUDA); kCudaIfAvailable uses it when
// it can and otherwise runs on the CPU with a warning. Nodes the CUDA provider has no kernel
// for run on the CPU either way, with copies at the boundaries and a warning listing the ops.
enum class DeviceChoice { kCpu, kCudaIfAvailable, kCuda };

struct SessionOptions {
  DeviceChoice device = DeviceChoice::kCpu;
  int cuda_device = 0;
  // A device provider to share (one stream and memory arena for several sessions, as a
  // TrainingSession's training, eval and optimizer graphs do); used instead of making one for
  // `device` when set.
  std::shared_ptr<providers::ExecutionProvider> device_provider;
  int intra_op_threads = 0;  // 0: CLEAVE_NUM_THREADS or every core
  bool optimize = true;      // constant folding, shape folding, fusions
  // Passes to skip, by name (graph::Pass::name(): "AttentionLayoutFusion", "ClassPadding", ...),
  // as ONNX Runtime's sessions take disabled_optimizers. The environment variable
  // CLEAVE_DISABLED_OPTIMIZERS (comma-separated names) adds to them. An unknown name is an error.
  std::set<std::string> disabled_optimizers;
  // Fixes named symbolic dims (e.g. {"batch", 1}) so shape arithmetic folds at load.
  std::map<std::string, int64_t> free_dimension_overrides;
  // This rank's communicator, for graphs with ai.cleave collectives (not owned).
  Communicator* communicator = nullptr;
  // Runs the graph's collectives asynchronously, overlapping the compute that does not need
  // their results (not owned; see runtime/executor.h). Sessions of one rank may share one.
  runtime::CommQueue* collective_queue = nullptr;
};

struct IoInfo {
  std::string name;
  DataType dtype;
  Shape shape;
};

struct RunStats {
  int64_t runs = 0;
  int64_t plans = 0;             // memory plans made (one per new input-shape signature)
  int64_t arena_bytes = 0;       // size of the current activation arena
  int64_t heap_allocations = 0;  // buffers allocated outside the arena, all runs
  int64_t bases_in_place = 0;    // scatter bases written where their result lies, all runs
};

using Feeds = std::vector<std::pair<std::string, Tensor>>;

struct RunOptions {
  // Seeds the run's randomness (training-mode Dropout): the same seed gives the same masks.
  // Without one, Dropout draws from its node's own generator.
  std::optional<uint64_t> seed;
  // Records every node the run executes, on the profiler's `profile_track` (null: none).
  runtime::Profiler* profiler = nullptr;
  int profile_track = 0;
  // Told each output's index (model order) as soon as the run has made it final, before the
  // run goes on: the trainer starts a gradient's reduction there, during the rest of the
  // backward.
  std::function<void(int output)> output_ready;
};

class InferenceSession {
 public:
  // The provider a session would put ahead of the CPU one for `choice` (null for kCpu, or for
  // kCudaIfAvailable without a usable device, with *warning saying why), or why kCuda cannot
  // be had.
  static absl::StatusOr<std::shared_ptr<providers::ExecutionProvider>> MakeDeviceProvider(DeviceChoice choice,
                                                                                          int cuda_device,
                                                                                          std::string* warning);
  static absl::StatusOr<std::unique_ptr<InferenceSession>> Load(const std::string& model_path,
                                                                SessionOptions options = {});
  static absl::StatusOr<std::unique_ptr<InferenceSession>> FromGraph(
      std::unique_ptr<graph::Graph> graph, SessionOptions options = {});
  // With execution providers of the caller's, in priority order, ahead of the CPU provider
  // (which always comes last and takes what they do not claim).
  static absl::StatusOr<std::unique_ptr<InferenceSession>> FromGraph(
      std::unique_ptr<graph::Graph> graph, SessionOptions options,
      std::vector<std::shared_ptr<providers::ExecutionProvider>> providers);
  ~InferenceSession();

  const std::vector<IoInfo>& inputs() const { return inputs_; }
  const std::vector<IoInfo>& outputs() const { return outputs_; }

  // Runs with every model input fed; returns every model output in model order.
  absl::StatusOr<std::vector<Tensor>> Run(const Feeds& feeds);
  // Returns only the named outputs, in the order asked.
  absl::StatusOr<std::vector<Tensor>> Run(const Feeds& feeds,
                                          const std::vector<std::string>& output_names);
  // Writes every model output into `outputs` (preallocated with the right dtype and shape).
  // Feeds and outputs may live in the device provider's memory (its allocator owns them): a
  // device-resident feed is read in place and a device-resident output is written in place,
  // with no host round trip.
  absl::Status RunInto(const Feeds& feeds, std::vector<Tensor>& outputs, const RunOptions& options = {});
  // The order in which a run makes its outputs final: per output, the position in the run
  // order of the node that writes it (-1: none, the output is a feed or a constant).
  std::vector<int> OutputSteps() const;
  // The collectives that run asynchronously (SessionOptions::collective_queue), with the steps
  // that launch and wait for them.
  std::vector<runtime::AsyncCollective> async_collectives() const;

  // The optimised graph the session executes.
  const graph::Graph& graph() const;
  RunStats stats() const;
  // Nodes per provider (host/device copies included).
  const std::map<std::string, int>& placement() const;
  // Why nodes or the whole session fell back to the CPU ("" when nothing did).
  const std::string& warning() const { return warning_; }

 private:
  InferenceSession();
  absl::Status Initialize(std::unique_ptr<graph::Graph> graph, SessionOptions options,
                          std::vector<std::shared_ptr<providers::ExecutionProvider>> providers);
  // Checks feeds against the model inputs into feed_views_, in model order.
  absl::Status BindFeeds(const Feeds& feeds);
  absl::Status CheckDim(const IoInfo& in, int i, const Tensor& t);

  std::vector<IoInfo> inputs_, outputs_;
  std::unique_ptr<runtime::Executor> executor_;
  std::mutex bind_mu_;  // guards the binding buffers below
  std::vector<TensorView> feed_views_;
  // Each input's position by name, made at load, and the feed found for each in a binding: a
  // training step's optimizer binds four feeds per parameter, so matching them pairwise would
  // cost more host time than the step's kernel launches.
  std::unordered_map<std::string, int> input_index_;
  std::vector<const Tensor*> fed_;
  std::vector<std::pair<const std::string*, int64_t>> symbols_;
  std::vector<void*> output_ptrs_;
  std::string warning_;
};

}  // namespace cleave
