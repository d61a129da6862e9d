// The gradient reducer (trainer/), after PyTorch DDP's: the optimizer graph's reductions of
// gradients are taken out of the graph and run as soon as their gradients are final in the
// last backward of a step, so that the communication overlaps the rest of the backward
// instead of following it.
//
// Taken out: an AllReduce (sum) of one gradient or of a flat bucket of them (Reshape to 1-D
// and Concat, as the lowering packs them), and a ReduceScatter (sum, axis 0) of a gradient
// under ZeRO-1. The gradient buffers of a bucket become views of one flat buffer, so a bucket
// is reduced where it lies, with no packing copy (DDP's gradient_as_bucket_view). The
// collective's result becomes an input of the optimizer graph; the rest of the graph (the
// Split back into tensors, the update) is unchanged, so results are bit-identical to the
// graph's own collectives.
//
// Reductions run on a duplicate of the rank's communicator: over MPI on a second thread, over
// NCCL on the duplicate's own stream (deferred: the compute stream waits for them only when
// the optimizer needs them). They start in one order fixed at load, by when the training
// graph makes their gradients final, which every rank shares: a reduction starts once its own
// gradients and those of every reduction before it are final.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "providers/communicator.h"
#include "runtime/comm_queue.h"

namespace cleave::runtime {
class Profiler;
}

namespace cleave::trainer {

class GradientReducer {
 public:
  // One reduction taken out of the optimizer graph.
  struct Reduction {
    std::string op;                 // "AllReduce" or "ReduceScatter"
    std::string label;              // the collective's node name, for errors and profiles
    std::string result;             // the optimizer graph input that now carries its result
    std::vector<int> group;         // global ranks
    std::vector<int> params;        // the gradients it reads: one, or a bucket's in flat order
    std::vector<int64_t> offsets;   // a bucket's: each gradient's first element in the flat buffer
    int64_t input_numel = 0;        // the gradient's or the bucket's elements
    std::vector<int64_t> result_dims;
    int node_index = 0;             // position among the optimizer graph's nodes
  };

  // Takes the reductions of the gradient inputs `grad_inputs[i]` (parameter i's gradient) out
  // of `optimizer` and returns them; none when there are none (no data parallelism).
  static absl::StatusOr<std::vector<Reduction>> Extract(graph::Graph& optimizer,
                                                        const std::vector<std::string>& grad_inputs);

  // `comm`: the duplicate communicator it runs on (owned). `buffers[r]`: reduction r's input
  // (the gradient, or the bucket's flat buffer) and `results[r]` its output, both in the memory
  // the communicator moves. `ready_step[i]`: when the last backward makes gradient i final
  // (its position in the training graph's run order).
  GradientReducer(std::vector<Reduction> reductions, std::vector<Tensor> buffers, std::vector<Tensor> results,
                  const std::vector<int>& ready_step, std::unique_ptr<Communicator> comm);
  ~GradientReducer();  // waits for reductions in flight

  const std::vector<Reduction>& reductions() const { return reductions_; }
  // Re-derives the launch order from new `ready_step` keys (a pipeline's, once its schedule is
  // known); only between steps.
  void SetReadySteps(const std::vector<int>& ready_step);
  const std::vector<Tensor>& results() const { return results_; }
  // Records each reduction on the profiler's "gradient reduction" track: as it runs (host
  // communicators), or timed on the device and added by AddDeviceTimes (device communicators).
  void set_profiler(runtime::Profiler* p);
  // Device communicators: adds the reductions timed since the last call (waits for them).
  absl::Status AddDeviceTimes();

  // Before a run that writes the gradients: waits for reductions still reading them. `final`:
  // that run is the step's last backward, so its gradients start reductions as they become
  // final (Ready); otherwise the results no longer match the gradients.
  absl::Status BeginBackward(bool final);
  // Gradient `param` is final (from the training run's output_ready).
  void Ready(int param);
  // Starts whatever has not started for the current gradients and waits until every result is
  // in place (on a device: until the compute stream is ordered after them). The first error
  // of any reduction, naming the rank, the group and the operation.
  absl::Status Finish();

  // Reductions started during the last backward (by Ready) and after it (by Finish), since
  // the last BeginBackward: how much of the communication had the chance to overlap.
  int launched_in_backward() const { return launched_in_backward_; }
  int launched_after_backward() const { return launched_after_; }
  // Seconds so far that reductions ran (host communicators; on a device they are queued, not
  // timed) and that the caller was blocked waiting for them: the difference is communication
  // hidden behind compute.
  using Time = runtime::CommQueue::Time;
  Time time_spent() const { return queue_.time_spent(); }

 private:
  void Launch(int r);
  absl::Status Run(int r);
  absl::Status WaitIdle();
  // Reduction `r` on the profile's track, from `start` to `end` (`timed`: where, when on the
  // device; null on the host).
  void Profile(int r, std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end,
               const char* timed);

  std::vector<Reduction> reductions_;
  std::vector<Tensor> buffers_, results_;
  std::vector<int> order_;                       // launch order: indices into reductions_
  std::vector<std::vector<int>> of_param_;       // per gradient: the reductions reading it
  std::vector<int> waiting_;                     // per reduction: gradients not yet final
  size_t next_ = 0;                              // next position in order_ to launch
  bool armed_ = false;                           // the current backward launches reductions
  bool current_ = false;                         // every launched result matches the gradients
  int launched_in_backward_ = 0, launched_after_ = 0;
  std::vector<int64_t> queued_us_;               // per reduction: when it was last launched
  std::vector<int> timed_;                       // device: the reductions queued since AddDeviceTimes
  runtime::Profiler* profiler_ = nullptr;
  int track_ = 0;
  // The duplicate communicator and its worker; last, so that it stops before what work reads.
  runtime::CommQueue queue_;
};

}  // namespace cleave::trainer
