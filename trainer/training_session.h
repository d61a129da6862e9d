// TrainingSession (trainer/): trains the artifacts of training_graph.h on one process,
// shaped like ONNX Runtime's training Module + Optimizer + CheckpointState.
//
//   TrainStep(feeds)    forward + backward on one micro-batch; gradients are added to the
//                       accumulation buffers (the first TrainStep after LazyResetGrad
//                       overwrites them). Returns the loss.
//   EvalStep(feeds)     forward + loss only.
//   OptimizerStep()     one update from the accumulated gradients, averaged over the
//                       micro-batches since the last reset (so K micro-batches of B/K rows give
//                       the gradient of one batch of B rows). Uses the scheduler's rate when one
//                       is registered. Returns the global gradient norm before clipping.
//   LazyResetGrad()     the next TrainStep starts a new accumulation.
//   PipelineStep(work, micro-batches)
//                       under pipeline parallelism (artifacts with `stages`): this rank's
//                       forward and backward work of one step, in its schedule's order; the
//                       stage parts exchange activations and gradients with the neighbouring
//                       ranks themselves (Send/Recv). Gradients of all micro-batches are
//                       accumulated; OptimizerStep follows.
//
// The session owns the parameters, gradient buffers, optimizer state and the buffers (training-
// mode BatchNormalization's running statistics, which each TrainStep updates and EvalStep
// normalises by); the graphs read and write them in place (no copies per step). Checkpoints
// hold parameters, optimizer state, buffers, the step and the caller's properties (data
// position, RNG seed, ...).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "providers/execution_provider.h"
#include "runtime/comm_queue.h"
#include "runtime/inference_session.h"
#include "trainer/grad_reducer.h"
#include "trainer/lr_schedule.h"
#include "trainer/training_graph.h"

namespace cleave::trainer {

struct TrainingSessionOptions {
  // The device the graphs run on (see SessionOptions::device); nodes without a CUDA kernel run
  // on the CPU.
  DeviceChoice device = DeviceChoice::kCpu;
  int cuda_device = 0;
  // A device provider to use instead of making one for `device`. With a device provider the
  // session's parameters, gradient buffers and optimizer state live in its memory: steps read
  // and update them in place, and only data, the loss and scalars cross to the host.
  std::shared_ptr<providers::ExecutionProvider> device_provider = nullptr;
  // This rank's communicator for device memory (NCCL), which the device provider's collective
  // and Send/Recv kernels use; without one they run on the host over `communicator`.
  Communicator* device_communicator = nullptr;
  int intra_op_threads = 0;  // 0: CLEAVE_NUM_THREADS or every core
  bool optimize = true;      // constant folding and fusions on the training and eval graphs
  // Passes to skip on them, by name (see SessionOptions::disabled_optimizers).
  std::set<std::string> disabled_optimizers = {};
  // Training-mode Dropout masks are a function of (seed, step, micro-batch, node), so runs are
  // reproducible and a resumed run draws the masks an uninterrupted one would.
  uint64_t seed = 0;
  // This rank's communicator when the graphs are one rank's part of a partitioned plan.
  Communicator* communicator = nullptr;
  // Dynamic loss scaling, used when the training graph has a `loss_scale` input (fp16): the
  // first scale, and how many clean steps double it. `overflow_group`: the ranks that must
  // agree to skip a step (every rank of a plan; empty: this process decides alone).
  float initial_loss_scale = 65536.0f;
  // Scale even when this rank's graphs have no `loss_scale` input (a pipeline stage before the
  // last: its gradients arrive scaled from the stage that seeds the backward).
  bool loss_scaling = false;
  int64_t loss_scale_growth_interval = 2000;
  std::vector<int> overflow_group = {};
  // With a communicator: the optimizer graph's gradient reductions (data-parallel AllReduce of
  // gradients or their buckets, ZeRO-1 ReduceScatter) run as soon as each gradient is final in
  // the step's last backward, on a duplicate communicator, overlapping the rest of the backward
  // (grad_reducer.h); in a pipeline, once the last backward of every chunk writing a gradient
  // has run. Every rank must agree.
  bool overlap_grad_reduce = true;
  // With a communicator: the collectives inside the graphs (tensor parallelism's AllReduces,
  // ZeRO-2's ReduceScatters of each micro-batch's gradients, sequence parallelism's gathers)
  // run asynchronously on a duplicate communicator, overlapping the nodes that do not need
  // their results (runtime/executor.h). Every rank must agree.
  bool overlap_collectives = true;
};

class TrainingSession {
 public:
  static absl::StatusOr<std::unique_ptr<TrainingSession>> Create(TrainingArtifacts artifacts,
                                                                 TrainingSessionOptions options = {});
  ~TrainingSession();

  const std::vector<std::string>& parameter_names() const { return artifacts_.params; }
  // The current value of a parameter or optimizer state tensor ("<p>.exp_avg", ...).
  absl::StatusOr<Tensor> GetState(const std::string& name) const;
  // Replaces a parameter's or state's value (same dtype and shape).
  absl::Status SetState(const std::string& name, const Tensor& value);
  // The accumulated gradient of a parameter.
  absl::StatusOr<Tensor> GetGradient(const std::string& param) const;
  const std::vector<std::string>& data_inputs() const { return artifacts_.data_inputs; }
  const TrainingArtifacts& artifacts() const { return artifacts_; }
  // What the sessions warned about at load (nodes that fell back to the CPU, or the whole
  // session when CUDA was asked for if available and is not); "" when nothing.
  std::string warnings() const;
  // Whether parameters and optimizer state live in a device's memory.
  bool device_resident() const { return device_ != nullptr; }
  // The gradient reductions that overlap the backward (empty when they stay in the optimizer
  // graph), each as "<op> <node> (<n> gradients)".
  std::vector<std::string> overlapped_reductions() const;
  // The reducer, while there is one (for its counters).
  const GradientReducer* gradient_reducer() const { return reducer_.get(); }
  // The overlapped communication's running and waited-for time so far: the gradient
  // reductions' and the asynchronous collectives' (zero without either).
  runtime::CommQueue::Time reduction_time() const;
  // The queue the graphs' asynchronous collectives run on (null when they run in line).
  const runtime::CommQueue* collective_queue() const { return collective_queue_.get(); }
  // The graphs' asynchronous collectives, each with where it starts and where it is waited for.
  std::vector<runtime::AsyncCollective> async_collectives() const;
  // Records the nodes of every step (track "compute") and the overlapped reductions (track
  // "gradient reduction") on `p`, which must outlive the session or be reset to null.
  void set_profiler(runtime::Profiler* p);

  // `last_microbatch`: this is the last TrainStep before OptimizerStep, so the gradient
  // reductions may start during its backward (DDP outside no_sync). A later TrainStep only
  // costs the overlap: OptimizerStep then reduces the final gradients itself.
  absl::StatusOr<float> TrainStep(const Feeds& feeds, bool last_microbatch = true);

  // One unit of a pipeline schedule: the forward or backward of micro-batch `microbatch` on
  // this rank's stage `chunk` (an index into artifacts().stages).
  struct PipelineWork {
    bool backward = false;
    int microbatch = 0;
    int chunk = 0;
  };
  bool pipelined() const { return !artifacts_.stages.empty(); }
  // Whether this rank computes the loss (it holds the last stage).
  bool holds_loss() const;
  // Runs `work` with `microbatches[m]` as micro-batch m's data (every rank gets the same
  // feeds; each stage takes the inputs it reads). Returns the mean loss over the micro-batches
  // on the rank that holds the loss, NaN on the others.
  absl::StatusOr<float> PipelineStep(const std::vector<PipelineWork>& work, const std::vector<Feeds>& microbatches);
  // The eval parts over `microbatches`, each micro-batch through this rank's stages in order;
  // the mean loss as PipelineStep returns it.
  absl::StatusOr<float> PipelineEval(const std::vector<Feeds>& microbatches);
  absl::StatusOr<float> EvalStep(const Feeds& feeds);
  void LazyResetGrad() { pending_reset_ = true; }
  absl::StatusOr<float> OptimizerStep();

  // Loss scaling: the current scale, and whether the last OptimizerStep found a gradient that
  // overflowed and skipped its update (it then returns +inf and halves the scale).
  bool loss_scaling() const { return loss_scaling_; }
  double loss_scale() const { return loss_scale_; }
  bool last_step_skipped() const { return last_skipped_; }

  void SetLearningRate(double lr) { lr_ = lr; }
  double learning_rate() const { return lr_; }
  // From now on OptimizerStep sets the rate to schedule.At(step()) first.
  void RegisterScheduler(const LrSchedule& schedule);
  int64_t step() const { return step_; }  // optimizer steps taken
  // For state restored from elsewhere (a resharded checkpoint): the steps already taken.
  void SetStep(int64_t step) {
    step_ = step;
    updates_ = step;
    pending_reset_ = true;
    micro_batches_ = 0;
  }

  // Parameters, optimizer state, step and learning rate, plus `properties`.
  absl::Status SaveCheckpoint(const std::string& path,
                              const std::map<std::string, std::string>& properties = {}) const;
  // Restores a checkpoint of this model and optimizer and returns its properties. Validates
  // everything (names, shapes, dtypes, optimizer) before changing anything.
  absl::StatusOr<std::map<std::string, std::string>> LoadCheckpoint(const std::string& path);
  // The forward model with the current parameters as initializers.
  absl::Status ExportModelForInferencing(const std::string& path) const;

  // The training graph as the session runs it (after its fusions and placement), or null under
  // pipeline parallelism (whose stages have parts of their own).
  const graph::Graph* training_graph() const { return train_ ? &train_->graph() : nullptr; }
  // The training graph's run statistics (zeros under pipeline parallelism).
  RunStats training_stats() const { return train_ ? train_->stats() : RunStats{}; }

  // Diagnostics for a non-finite loss: reruns the training graph on `feeds` and names the
  // first node (in run order) whose output holds a NaN or Inf.
  absl::StatusOr<std::string> FirstNonFinite(const Feeds& feeds) const;

 private:
  TrainingSession() = default;
  absl::Status Initialize(TrainingSessionOptions options);
  // A signature of the parameter names and shapes, stored in checkpoints.
  std::string ModelSignature() const;
  std::string OptimizerName() const;
  Tensor* FindState(const std::string& name);

  TrainingArtifacts artifacts_;
  TrainingSessionOptions options_;
  // State tensors in the device's memory when there is a device provider, else on the host.
  absl::StatusOr<Tensor> NewState(DataType dtype, const std::vector<int64_t>& dims) const;  // zeros
  absl::StatusOr<Tensor> StateFrom(const Tensor& host) const;
  // An uninitialized tensor in the device provider's memory.
  absl::StatusOr<Tensor> OnDevice(DataType dtype, const std::vector<int64_t>& dims) const;
  absl::StatusOr<Tensor> ToHost(const Tensor& state) const;
  absl::Status CopyInto(Tensor& state, const Tensor& host) const;

  std::shared_ptr<providers::ExecutionProvider> device_;
  std::string device_warning_;
  // The graphs' asynchronous collectives run here; made before the sessions that use it and
  // declared before them, so that it outlives them.
  std::unique_ptr<runtime::CommQueue> collective_queue_;
  std::unique_ptr<InferenceSession> train_, eval_, optimizer_;
  // With loss scaling: IsAllFinite over the gradient buffers, run where they are (on a device
  // one pass and a one-byte read, not every gradient brought to the host) before each update.
  std::unique_ptr<InferenceSession> overflow_check_;
  Feeds overflow_feeds_;
  std::vector<Tensor> overflow_outputs_;  // the bool
  absl::Status MakeOverflowCheck(const SessionOptions& options);
  struct StageSessions {
    std::unique_ptr<InferenceSession> forward, backward, eval;
  };
  std::vector<StageSessions> stages_;
  // Feeds for a stage part: data by name, parameters, gradient buffers, the reset flag and
  // `extra` (stashed values); outputs bound to the gradient buffers where they are
  // accumulation outputs, fresh tensors otherwise.
  absl::Status RunPart(InferenceSession& s, const Feeds& data, const std::map<std::string, Tensor>& extra,
                       std::map<std::string, Tensor>* outputs, uint64_t seed,
                       std::function<void(int)> output_ready = {});
  // Stage part outputs (activations, stashes) free for the next micro-batch, by output name.
  std::map<std::string, std::vector<Tensor>> free_outputs_;
  std::vector<Tensor> params_, grads_;
  std::vector<Tensor> buffers_;  // artifacts_.buffers: BatchNormalization's running statistics
  std::vector<std::vector<Tensor>> states_;  // [param][suffix]
  std::map<std::string, Tensor*> by_name_;
  // Accumulation buffer and output names -> the gradient buffer (pipeline stage parts).
  std::map<std::string, Tensor*> grad_by_name_;
  Tensor loss_, grad_norm_, reset_, lr_tensor_, step_tensor_, scale_tensor_, loss_scale_tensor_;
  bool loss_scaling_ = false, last_skipped_ = false;
  double loss_scale_ = 65536.0;
  int64_t clean_steps_ = 0;
  int64_t updates_ = 0;  // optimizer updates applied (AdamW's step; skipped steps do not count)
  std::vector<Tensor> train_outputs_, optimizer_outputs_;
  // Declared after the gradient buffers it reads, so it stops before they go.
  std::unique_ptr<GradientReducer> reducer_;
  std::vector<int> output_param_;  // per training graph output: its parameter, -1 for the loss
  // Pipelines: per chunk, each backward output's parameter; per chunk, its last backward in the
  // schedule; per parameter, the chunks writing its gradient (and those still to, this step).
  std::vector<std::vector<int>> stage_output_param_;
  std::vector<int> last_backward_, writers_, writers_left_;
  std::vector<std::tuple<bool, int, int>> ordered_work_;
  void OrderPipelineReductions(const std::vector<PipelineWork>& work);
  runtime::Profiler* profiler_ = nullptr;
  int compute_track_ = 0;
  std::vector<Communicator*> DeviceCommunicators() const;
  absl::Status AddDeviceCommunication();
  // Takes the gradient reductions out of the optimizer graph when they can overlap the
  // backward; makes the reducer once the gradient buffers exist (MakeReducer).
  absl::Status ExtractReductions(graph::Graph& optimizer);
  absl::Status MakeCollectiveQueue();
  // A duplicate of the rank's communicator for the graphs' tensors (every rank makes the call
  // at the same point); null after warning that `otherwise` happens instead.
  std::unique_ptr<Communicator> DuplicateCommunicator(const char* otherwise) const;
  absl::Status MakeReducer();
  // Between the two: what ExtractReductions found, handed over to the reducer.
  std::vector<GradientReducer::Reduction> reductions_;
  std::unique_ptr<Communicator> reduce_comm_;
  Feeds train_feeds_, optimizer_feeds_;
  size_t num_data_ = 0;
  bool pending_reset_ = true;
  int64_t micro_batches_ = 0;
  int64_t step_ = 0;
  double lr_ = 1e-3;
  bool has_schedule_ = false;
  LrSchedule schedule_;
};

}  // namespace cleave::trainer
