// TrainingSession (trainer/): see training_session.h.
#include "trainer/training_session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "graph/passes/pass.h"
#include "base/status.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "onnx_ext/onnx_io.h"
#include "providers/communicator.h"
#include "runtime/profiler.h"
#include "trainer/autodiff.h"
#include "trainer/checkpoint.h"

namespace cleave::trainer {

namespace {

Tensor Zeros(const Tensor& like) { return Tensor(like.dtype(), like.dims()); }

bool SameShape(const Tensor& a, const Tensor& b) { return a.dtype() == b.dtype() && a.dims() == b.dims(); }

std::string Describe(const Tensor& t) { return absl::StrCat(DataTypeName(t.dtype()), DimsToString(t.dims())); }

}  // namespace

TrainingSession::~TrainingSession() = default;

absl::StatusOr<std::unique_ptr<TrainingSession>> TrainingSession::Create(
    TrainingArtifacts artifacts, TrainingSessionOptions options) {
  std::unique_ptr<TrainingSession> s(new TrainingSession());
  s->artifacts_ = std::move(artifacts);
  RETURN_IF_ERROR(s->Initialize(options));
  return s;
}

absl::StatusOr<Tensor> TrainingSession::NewState(DataType dtype, const std::vector<int64_t>& dims) const {
  Tensor host(dtype, dims);  // zeros
  if (!device_) return host;
  return StateFrom(host);
}

absl::StatusOr<Tensor> TrainingSession::OnDevice(DataType dtype, const std::vector<int64_t>& dims) const {
  providers::Allocator* a = device_->allocator();
  const size_t bytes = static_cast<size_t>(Shape::FromDims(dims).NumElements()) * ElementSize(dtype);
  void* p = a->Allocate(std::max<size_t>(bytes, 1));
  if (!p)
    return absl::ResourceExhaustedError(absl::StrCat("training state of ", bytes, " bytes on ", device_->name(),
                                                     ": ", a->last_error()));
  // The deleter holds the provider, so its memory outlives every tensor in it.
  std::shared_ptr<void> storage(p, [device = device_](void* q) { device->allocator()->Free(q); });
  return Tensor(dtype, dims, std::move(storage), p);
}

absl::StatusOr<Tensor> TrainingSession::StateFrom(const Tensor& host) const {
  if (!device_) return CopyToTensor(host.view());
  ASSIGN_OR_RETURN(Tensor t, OnDevice(host.dtype(), host.dims()));
  RETURN_IF_ERROR(CopyInto(t, host));
  return t;
}

absl::StatusOr<Tensor> TrainingSession::ToHost(const Tensor& state) const {
  if (!device_ || !device_->allocator()->Owns(state.raw())) return CopyToTensor(state.view());
  Tensor host(state.dtype(), state.dims());
  TensorView dst = host.view();
  RETURN_IF_ERROR(device_->CopyTensor(state.view(), dst));
  return host;
}

absl::Status TrainingSession::CopyInto(Tensor& state, const Tensor& host) const {
  if (state.nbytes() != host.nbytes()) return Internal("state of ", state.nbytes(), " bytes, value of ", host.nbytes());
  if (!device_ || !device_->allocator()->Owns(state.raw())) {
    if (host.nbytes()) std::memcpy(state.raw(), host.raw(), host.nbytes());
    return absl::OkStatus();
  }
  TensorView dst = state.view();
  return device_->CopyTensor(host.view(), dst);
}

std::string TrainingSession::warnings() const {
  std::vector<std::string> w;
  if (!device_warning_.empty()) w.push_back(device_warning_);
  auto add = [&](const std::unique_ptr<InferenceSession>& s, const char* what) {
    if (s && !s->warning().empty()) w.push_back(absl::StrCat(what, ": ", s->warning()));
  };
  add(train_, "training");
  add(eval_, "eval");
  add(optimizer_, "optimizer");
  for (const auto& st : stages_) {
    add(st.forward, "stage forward");
    add(st.backward, "stage backward");
  }
  return absl::StrJoin(w, "; ");
}

absl::Status TrainingSession::Initialize(TrainingSessionOptions options) {
  options_ = options;
  TrainingArtifacts& a = artifacts_;
  if (!a.optimizer || (a.stages.empty() && (!a.training || !a.eval)))
    return InvalidArgument("incomplete training artifacts");
  // One device provider for all the session's graphs: one stream, one memory arena, and the
  // state tensors in it.
  if (options.device_provider) {
    device_ = options.device_provider;
  } else {
    ASSIGN_OR_RETURN(device_, InferenceSession::MakeDeviceProvider(options.device, options.cuda_device,
                                                                   &device_warning_));
  }
  if (device_) device_->set_communicator(options.device_communicator);
  if (!device_warning_.empty()) std::fprintf(stderr, "cleave: warning: %s\n", device_warning_.c_str());
  SessionOptions so;
  so.device_provider = device_;
  so.intra_op_threads = options.intra_op_threads;
  so.optimize = options.optimize;
  so.disabled_optimizers = options.disabled_optimizers;
  so.communicator = options.communicator;
  RETURN_IF_ERROR(MakeCollectiveQueue());
  so.collective_queue = collective_queue_.get();
  if (a.stages.empty()) {
    ASSIGN_OR_RETURN(train_, InferenceSession::FromGraph(a.training->Clone(), so));
    ASSIGN_OR_RETURN(eval_, InferenceSession::FromGraph(a.eval->Clone(), so));
  }
  for (const PipelineStage& st : a.stages) {
    if (!st.forward || !st.backward) return InvalidArgument("pipeline stage ", st.stage, " lacks its forward or backward part");
    StageSessions ss;
    ASSIGN_OR_RETURN(ss.forward, InferenceSession::FromGraph(st.forward->Clone(), so));
    ASSIGN_OR_RETURN(ss.backward, InferenceSession::FromGraph(st.backward->Clone(), so));
    if (st.eval) {
      ASSIGN_OR_RETURN(ss.eval, InferenceSession::FromGraph(st.eval->Clone(), so));
    }
    stages_.push_back(std::move(ss));
  }
  SessionOptions plain = so;
  plain.optimize = false;
  std::unique_ptr<graph::Graph> optimizer_graph = a.optimizer->Clone();
  RETURN_IF_ERROR(ExtractReductions(*optimizer_graph));
  if (device_) {
    // One multi-tensor update for all parameters instead of a launch per parameter.
    graph::MultiTensorFusion multi;
    RETURN_IF_ERROR(graph::RunPass(multi, optimizer_graph.get()).status());
  }
  ASSIGN_OR_RETURN(optimizer_, InferenceSession::FromGraph(std::move(optimizer_graph), plain));

  // Session-owned state: deep copies, so the artifacts' initial values stay untouched.
  for (const std::string& p : a.params) {
    ASSIGN_OR_RETURN(Tensor param, StateFrom(a.initial.at(p)));
    params_.push_back(std::move(param));
    // The gradient buffer takes the training graph's shape: under ZeRO-2 it holds only this
    // rank's shard.
    const graph::Value* buffer = nullptr;
    if (a.training) buffer = a.training->FindValue(AccumulationBuffer(p));
    for (const PipelineStage& st : a.stages)
      if (!buffer && st.backward) buffer = st.backward->FindValue(AccumulationBuffer(p));
    ASSIGN_OR_RETURN(Tensor grad, NewState(DataType::kFloat32, buffer && buffer->is_graph_input() && buffer->shape().is_static()
                                                                    ? buffer->shape().StaticDims()
                                                                    : params_.back().dims()));
    grads_.push_back(std::move(grad));
    states_.emplace_back();
    // Optimizer state takes the optimizer graph's shapes: a ZeRO-partitioned graph keeps only
    // this rank's shard of it.
    for (const std::string& suf : a.state_suffixes) {
      const graph::Value* sv = a.optimizer->FindValue(p + suf);
      if (!sv || !sv->shape().is_static())
        return InvalidArgument("the optimizer graph has no static input '", p + suf, "'");
      ASSIGN_OR_RETURN(Tensor state, NewState(DataType::kFloat32, sv->shape().StaticDims()));
      states_.back().push_back(std::move(state));
    }
  }
  if (!a.buffers.empty() && (!a.stages.empty() || options.communicator))
    return Unimplemented("training-mode BatchNormalization (running statistics ", a.buffers.front(),
                         ") in a partitioned or pipelined run; train it on one process, or export the model in "
                         "eval mode (training_mode = 0) to train with fixed statistics");
  for (const std::string& b : a.buffers) {
    ASSIGN_OR_RETURN(Tensor buffer, StateFrom(a.initial.at(b)));
    buffers_.push_back(std::move(buffer));
  }
  RETURN_IF_ERROR(MakeReducer());
  for (size_t i = 0; i < a.buffers.size(); ++i) by_name_[a.buffers[i]] = &buffers_[i];
  for (size_t i = 0; i < a.params.size(); ++i) {
    grad_by_name_[AccumulationBuffer(a.params[i])] = &grads_[i];
    grad_by_name_[AccumulationOut(a.params[i])] = &grads_[i];
    by_name_[a.params[i]] = &params_[i];
    for (size_t k = 0; k < a.state_suffixes.size(); ++k)
      by_name_[a.params[i] + a.state_suffixes[k]] = &states_[i][k];
  }
  loss_ = Tensor(DataType::kFloat32, {});
  grad_norm_ = Tensor(DataType::kFloat32, {});
  reset_ = Tensor(DataType::kBool, {});
  lr_tensor_ = Tensor(DataType::kFloat32, {});
  step_tensor_ = Tensor(DataType::kInt64, {});
  scale_tensor_ = Tensor(DataType::kFloat32, {});

  // Feeds and outputs bound once: the graphs update the session's tensors in place.
  num_data_ = a.data_inputs.size();
  for (const std::string& d : a.data_inputs) train_feeds_.emplace_back(d, Tensor());
  for (size_t i = 0; i < params_.size(); ++i) train_feeds_.emplace_back(a.params[i], params_[i]);
  for (size_t i = 0; i < params_.size(); ++i)
    train_feeds_.emplace_back(AccumulationBuffer(a.params[i]), grads_[i]);
  train_feeds_.emplace_back(kLazyResetGrad, reset_);
  for (size_t i = 0; i < buffers_.size(); ++i) train_feeds_.emplace_back(a.buffers[i], buffers_[i]);
  loss_scale_tensor_ = Tensor::Scalar<float>(options.initial_loss_scale);
  loss_scale_ = options.initial_loss_scale;
  loss_scaling_ = options.loss_scaling;
  if (a.training && a.training->FindValue(kLossScale) && a.training->FindValue(kLossScale)->is_graph_input()) {
    loss_scaling_ = true;
    train_feeds_.emplace_back(kLossScale, loss_scale_tensor_);
  }
  for (const PipelineStage& st : a.stages)
    if (const graph::Value* v = st.backward->FindValue(kLossScale); v && v->is_graph_input()) loss_scaling_ = true;
  train_outputs_.push_back(loss_);
  for (const Tensor& g : grads_) train_outputs_.push_back(g);
  for (const Tensor& b : buffers_) train_outputs_.push_back(b);  // updated in place
  if (loss_scaling_) RETURN_IF_ERROR(MakeOverflowCheck(plain));

  optimizer_feeds_ = {{"learning_rate", lr_tensor_}, {"step", step_tensor_}, {"grad_scale", scale_tensor_}};
  optimizer_outputs_.push_back(grad_norm_);
  for (size_t i = 0; i < params_.size(); ++i) {
    optimizer_feeds_.emplace_back(a.params[i], params_[i]);
    optimizer_feeds_.emplace_back(GradName(a.params[i]), grads_[i]);
    optimizer_outputs_.push_back(params_[i]);
    for (size_t k = 0; k < a.state_suffixes.size(); ++k) {
      optimizer_feeds_.emplace_back(a.params[i] + a.state_suffixes[k], states_[i][k]);
      optimizer_outputs_.push_back(states_[i][k]);
    }
  }
  if (reducer_)
    for (size_t r = 0; r < reducer_->reductions().size(); ++r)
      optimizer_feeds_.emplace_back(reducer_->reductions()[r].result, reducer_->results()[r]);
  return absl::OkStatus();
}

absl::Status TrainingSession::MakeOverflowCheck(const SessionOptions& options) {
  if (grads_.empty()) return absl::OkStatus();  // nothing can overflow here
  auto g = std::make_unique<graph::Graph>();
  g->opset_imports()[""] = 17;
  g->opset_imports()[graph::kCleaveDomain] = 1;
  g->info().graph_name = "overflow check";
  std::vector<graph::Value*> grads;
  for (size_t i = 0; i < grads_.size(); ++i) {
    const std::string name = GradName(artifacts_.params[i]);
    grads.push_back(g->AddInput(name, DataType::kFloat32, Shape::FromDims(grads_[i].dims())));
    overflow_feeds_.emplace_back(name, grads_[i]);
  }
  graph::Value* finite = g->GetOrCreateValue("grads_finite");
  g->AddNode("IsAllFinite", grads, {finite}, "grads_finite", graph::kCleaveDomain);
  g->SetOutputs({finite});
  ASSIGN_OR_RETURN(overflow_check_, InferenceSession::FromGraph(std::move(g), options));
  overflow_outputs_.push_back(Tensor(DataType::kBool, {}));
  return absl::OkStatus();
}

std::unique_ptr<Communicator> TrainingSession::DuplicateCommunicator(const char* otherwise) const {
  // The device's own communicator where it has one, else the host's (the graphs' collectives
  // then run on the CPU provider).
  Communicator* base = device_ && options_.device_communicator ? options_.device_communicator : options_.communicator;
  absl::StatusOr<std::unique_ptr<Communicator>> dup = base->Duplicate();
  if (dup.ok()) return *std::move(dup);
  std::fprintf(stderr, "cleave: warning: %s: %s\n", otherwise, std::string(dup.status().message()).c_str());
  return nullptr;
}

absl::Status TrainingSession::MakeCollectiveQueue() {
  if (!options_.communicator || !options_.overlap_collectives) return absl::OkStatus();
  if (std::unique_ptr<Communicator> dup =
          DuplicateCommunicator("collectives will run in line, not overlapping compute"))
    collective_queue_ = std::make_unique<runtime::CommQueue>(std::move(dup));
  return absl::OkStatus();
}

runtime::CommQueue::Time TrainingSession::reduction_time() const {
  runtime::CommQueue::Time t = reducer_ ? reducer_->time_spent() : runtime::CommQueue::Time{};
  if (collective_queue_) {
    const runtime::CommQueue::Time c = collective_queue_->time_spent();
    t.busy += c.busy;
    t.waited += c.waited;
  }
  return t;
}

std::vector<runtime::AsyncCollective> TrainingSession::async_collectives() const {
  std::vector<runtime::AsyncCollective> out;
  auto add = [&](const std::unique_ptr<InferenceSession>& s) {
    if (!s) return;
    for (const auto& c : s->async_collectives()) out.push_back(c);
  };
  add(train_);
  for (const StageSessions& st : stages_) {
    add(st.forward);
    add(st.backward);
  }
  add(optimizer_);
  return out;
}

absl::Status TrainingSession::ExtractReductions(graph::Graph& optimizer) {
  const TrainingSessionOptions& o = options_;
  // Device tensors whose collectives run on the host keep them in the graph, which copies.
  if (!o.communicator || !o.overlap_grad_reduce || (device_ && !o.device_communicator))
    return absl::OkStatus();
  reduce_comm_ = DuplicateCommunicator("gradient reductions will not overlap the backward");
  if (!reduce_comm_) return absl::OkStatus();
  std::vector<std::string> grad_inputs;
  for (const std::string& p : artifacts_.params) grad_inputs.push_back(GradName(p));
  ASSIGN_OR_RETURN(reductions_, GradientReducer::Extract(optimizer, grad_inputs));
  return absl::OkStatus();
}

absl::Status TrainingSession::MakeReducer() {
  if (reductions_.empty()) return absl::OkStatus();
  std::vector<Tensor> buffers, results;
  for (const GradientReducer::Reduction& r : reductions_) {
    if (r.params.size() == 1) {
      const Tensor& g = grads_[r.params[0]];
      if (g.numel() != r.input_numel)
        return Internal("gradient reduction '", r.label, "' reads ", r.input_numel, " elements; the gradient of '",
                        artifacts_.params[r.params[0]], "' holds ", g.numel());
      buffers.push_back(g);
    } else {
      // The bucket's gradient buffers become views of one flat buffer, reduced where it lies.
      ASSIGN_OR_RETURN(Tensor flat, NewState(DataType::kFloat32, {r.input_numel}));
      auto keep = std::make_shared<Tensor>(flat);
      for (size_t k = 0; k < r.params.size(); ++k) {
        Tensor& g = grads_[r.params[k]];
        const int64_t end = k + 1 < r.params.size() ? r.offsets[k + 1] : r.input_numel;
        if (g.numel() != end - r.offsets[k])
          return Internal("gradient bucket '", r.label, "' holds ", end - r.offsets[k], " elements of '",
                          artifacts_.params[r.params[k]], "', whose gradient has ", g.numel());
        g = Tensor(DataType::kFloat32, g.dims(), keep, static_cast<float*>(flat.raw()) + r.offsets[k]);
      }
      buffers.push_back(flat);
    }
    ASSIGN_OR_RETURN(Tensor result, NewState(DataType::kFloat32, r.result_dims));
    results.push_back(std::move(result));
  }
  // Which parameter's gradient each output of the training graph (or of each stage's backward)
  // makes final, and when: the run-order position of the node writing it. A pipeline's order
  // also depends on its schedule (OrderPipelineReductions).
  std::map<std::string, int> param_of;
  for (size_t i = 0; i < artifacts_.params.size(); ++i) param_of[AccumulationOut(artifacts_.params[i])] = static_cast<int>(i);
  auto outputs_to_params = [&](const InferenceSession& s) {
    std::vector<int> params;
    for (const IoInfo& o : s.outputs()) params.push_back(param_of.count(o.name) ? param_of[o.name] : -1);
    return params;
  };
  std::vector<int> ready(artifacts_.params.size(), -1);
  if (train_) {
    output_param_ = outputs_to_params(*train_);
    const std::vector<int> steps = train_->OutputSteps();
    for (size_t o = 0; o < output_param_.size(); ++o)
      if (output_param_[o] >= 0) ready[output_param_[o]] = steps[o];
  }
  for (const StageSessions& st : stages_) stage_output_param_.push_back(outputs_to_params(*st.backward));
  // The reductions' communicators are made now, on every rank at start-up.
  std::vector<std::vector<int>> groups;
  for (const GradientReducer::Reduction& r : reductions_) groups.push_back(r.group);
  RETURN_IF_ERROR(reduce_comm_->Prepare(groups));
  reducer_ = std::make_unique<GradientReducer>(std::move(reductions_), std::move(buffers), std::move(results),
                                               ready, std::move(reduce_comm_));
  return absl::OkStatus();
}

void TrainingSession::OrderPipelineReductions(const std::vector<PipelineWork>& work) {
  std::vector<std::tuple<bool, int, int>> key;
  for (const PipelineWork& w : work) key.emplace_back(w.backward, w.microbatch, w.chunk);
  if (key != ordered_work_) {
    ordered_work_ = key;
    // A gradient is final after the last backward of the last chunk that writes it.
    last_backward_.assign(stages_.size(), -1);
    for (size_t i = 0; i < work.size(); ++i)
      if (work[i].backward && work[i].chunk >= 0 && work[i].chunk < static_cast<int>(stages_.size()))
        last_backward_[work[i].chunk] = static_cast<int>(i);
    std::vector<int> ready(artifacts_.params.size(), -1);
    writers_.assign(artifacts_.params.size(), 0);
    for (size_t c = 0; c < stages_.size(); ++c) {
      const std::vector<int> steps = stages_[c].backward->OutputSteps();
      for (size_t o = 0; o < stage_output_param_[c].size(); ++o) {
        const int p = stage_output_param_[c][o];
        if (p < 0 || last_backward_[c] < 0) continue;
        ++writers_[p];
        ready[p] = std::max(ready[p], last_backward_[c] * 1000000 + std::min(std::max(steps[o], 0), 999999));
      }
    }
    reducer_->SetReadySteps(ready);
  }
  writers_left_ = writers_;
}

std::vector<std::string> TrainingSession::overlapped_reductions() const {
  std::vector<std::string> out;
  if (reducer_)
    for (const GradientReducer::Reduction& r : reducer_->reductions())
      out.push_back(absl::StrCat(r.op, " ", r.label, " (", r.params.size(), " gradients)"));
  return out;
}

void TrainingSession::set_profiler(runtime::Profiler* p) {
  profiler_ = p;
  compute_track_ = p ? p->Track("compute") : 0;
  if (reducer_) reducer_->set_profiler(p);
  for (Communicator* c : DeviceCommunicators()) c->set_timing(p != nullptr);
}

// The device communicators the graphs' collectives and messages run on (the gradient
// reducer's is its own).
std::vector<Communicator*> TrainingSession::DeviceCommunicators() const {
  std::vector<Communicator*> out;
  if (!device_ || !options_.device_communicator) return out;
  out.push_back(options_.device_communicator);
  if (collective_queue_ && collective_queue_->device()) out.push_back(collective_queue_->comm());
  return out;
}

// What the device communicators ran since the last step, timed on the device, on the
// profile's "gradient reduction" and "collectives" tracks (the host only queued it).
absl::Status TrainingSession::AddDeviceCommunication() {
  if (!profiler_) return absl::OkStatus();
  if (reducer_) RETURN_IF_ERROR(reducer_->AddDeviceTimes());
  const std::vector<Communicator*> comms = DeviceCommunicators();
  if (comms.empty()) return absl::OkStatus();
  const int track = profiler_->Track("collectives");
  for (Communicator* c : comms) {
    ASSIGN_OR_RETURN(std::vector<Communicator::TimedOperation> ops, c->TakeTimedOperations());
    for (const Communicator::TimedOperation& op : ops)
      profiler_->Add(op.what, "comm", track, op.start, op.end, {{"timed", "on the device"}});
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> TrainingSession::GetState(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return NotFound("no parameter or optimizer state named '", name, "'");
  return ToHost(*it->second);
}

Tensor* TrainingSession::FindState(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

absl::Status TrainingSession::SetState(const std::string& name, const Tensor& value) {
  Tensor* t = FindState(name);
  if (!t) return NotFound("no parameter or optimizer state named '", name, "'");
  if (!SameShape(*t, value))
    return InvalidArgument("'", name, "' is ", Describe(*t), ", got ", Describe(value));
  return CopyInto(*t, value);
}

absl::StatusOr<Tensor> TrainingSession::GetGradient(const std::string& param) const {
  for (size_t i = 0; i < artifacts_.params.size(); ++i)
    if (artifacts_.params[i] == param) return ToHost(grads_[i]);
  return NotFound("no trainable parameter named '", param, "'");
}

absl::StatusOr<float> TrainingSession::TrainStep(const Feeds& feeds, bool last_microbatch) {
  if (pipelined())
    return absl::FailedPreconditionError("these artifacts are one rank's pipeline stages: use PipelineStep");
  if (feeds.size() != num_data_) {
    std::vector<std::string> got;
    for (const auto& f : feeds) got.push_back(f.first);
    return InvalidArgument("TrainStep expects feeds for [", absl::StrJoin(artifacts_.data_inputs, ", "),
                           "], got [", absl::StrJoin(got, ", "), "]");
  }
  for (size_t i = 0; i < num_data_; ++i) train_feeds_[i] = feeds[i];
  // Reductions still reading the gradients finish before this run writes them.
  if (reducer_) RETURN_IF_ERROR(reducer_->BeginBackward(last_microbatch));
  *reset_.data<bool>() = pending_reset_;
  *loss_scale_tensor_.data<float>() = static_cast<float>(loss_scale_);
  const uint64_t micro = pending_reset_ ? 0 : static_cast<uint64_t>(micro_batches_);
  RunOptions run;
  run.seed = options_.seed * 0x9e3779b97f4a7c15ull + (static_cast<uint64_t>(step_) << 20) + micro;
  run.profiler = profiler_;
  run.profile_track = compute_track_;
  if (reducer_ && last_microbatch)
    run.output_ready = [this](int o) {
      if (o < static_cast<int>(output_param_.size())) reducer_->Ready(output_param_[o]);
    };
  RETURN_IF_ERROR(train_->RunInto(train_feeds_, train_outputs_, run));
  if (pending_reset_) micro_batches_ = 0;
  pending_reset_ = false;
  ++micro_batches_;
  return *loss_.data<float>();
}

absl::StatusOr<float> TrainingSession::EvalStep(const Feeds& feeds) {
  if (pipelined())
    return absl::FailedPreconditionError("these artifacts are one rank's pipeline stages: use PipelineEval");
  Feeds all = feeds;
  for (size_t i = 0; i < params_.size(); ++i) all.emplace_back(artifacts_.params[i], params_[i]);
  for (size_t i = 0; i < buffers_.size(); ++i) all.emplace_back(artifacts_.buffers[i], buffers_[i]);
  ASSIGN_OR_RETURN(std::vector<Tensor> out, eval_->Run(all, {kLoss}));
  return *out[0].data<float>();
}

bool TrainingSession::holds_loss() const {
  if (!pipelined()) return true;
  for (const PipelineStage& st : artifacts_.stages)
    for (const graph::Value* v : st.forward->outputs())
      if (v->name() == kLoss) return true;
  return false;
}

absl::Status TrainingSession::RunPart(InferenceSession& s, const Feeds& data, const std::map<std::string, Tensor>& extra,
                                      std::map<std::string, Tensor>* outputs, uint64_t seed,
                                      std::function<void(int)> output_ready) {
  Feeds feeds;
  for (const IoInfo& in : s.inputs()) {
    if (auto e = extra.find(in.name); e != extra.end()) {
      feeds.emplace_back(in.name, e->second);
      continue;
    }
    if (in.name == kLazyResetGrad) {
      feeds.emplace_back(in.name, reset_);
      continue;
    }
    if (in.name == kLossScale) {
      feeds.emplace_back(in.name, loss_scale_tensor_);
      continue;
    }
    if (Tensor* t = FindState(in.name)) {
      feeds.emplace_back(in.name, *t);
      continue;
    }
    bool found = false;
    if (auto g = grad_by_name_.find(in.name); g != grad_by_name_.end()) {
      feeds.emplace_back(in.name, *g->second);
      found = true;
    }
    for (const auto& [name, t] : data)
      if (!found && name == in.name) {
        feeds.emplace_back(name, t);
        found = true;
      }
    if (!found) return InvalidArgument("pipeline stage input '", in.name, "' is not fed (no data, parameter or stash)");
  }
  std::vector<Tensor> outs;
  for (const IoInfo& o : s.outputs()) {
    Tensor t;
    // An accumulation output is its gradient buffer, updated in place.
    auto g = grad_by_name_.find(o.name);
    const bool bound = g != grad_by_name_.end();
    if (bound) t = *g->second;
    if (!bound) {
      if (!o.shape.is_static())
        return Internal("pipeline stage output '", o.name, "' has no static shape: ", o.shape.ToString());
      // Reused from an earlier micro-batch when one is free: a fresh activation-sized buffer
      // per part costs its page faults every time (milliseconds per micro-batch).
      std::vector<Tensor>& free = free_outputs_[o.name];
      if (!free.empty() && free.back().dtype() == o.dtype && free.back().dims() == o.shape.StaticDims()) {
        t = std::move(free.back());
        free.pop_back();
      } else if (device_ && o.name != kLoss) {
        // Activations stashed for the backward and sent ones stay on the device; only the loss,
        // which the host reads, comes back.
        ASSIGN_OR_RETURN(t, OnDevice(o.dtype, o.shape.StaticDims()));
      } else {
        t = Tensor::Uninitialized(o.dtype, o.shape.StaticDims());  // the run writes it whole
      }
    }
    outs.push_back(t);
  }
  RunOptions run;
  run.seed = seed;
  run.profiler = profiler_;
  run.profile_track = compute_track_;
  run.output_ready = std::move(output_ready);
  RETURN_IF_ERROR(s.RunInto(feeds, outs, run));
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = s.outputs()[i].name;
    if (outputs) (*outputs)[name] = std::move(outs[i]);
    else if (!grad_by_name_.count(name)) free_outputs_[name].push_back(std::move(outs[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<float> TrainingSession::PipelineStep(const std::vector<PipelineWork>& work,
                                                    const std::vector<Feeds>& microbatches) {
  if (!pipelined()) return absl::FailedPreconditionError("PipelineStep needs pipeline stage artifacts");
  if (microbatches.empty()) return InvalidArgument("PipelineStep: no micro-batches");
  // Reductions still reading the gradients finish first; this step's start as their gradients
  // are final (after the last backward of every chunk that writes them).
  if (reducer_) {
    RETURN_IF_ERROR(reducer_->BeginBackward(true));
    OrderPipelineReductions(work);
  }
  // A fresh accumulation: the buffers start at zero and every backward adds to them (two
  // stages of one rank may add to the same tied parameter's buffer).
  for (Tensor& g : grads_) {
    if (device_ && device_->allocator()->Owns(g.raw())) {
      TensorView v = g.view();
      RETURN_IF_ERROR(device_->Zero(v));
    } else if (g.nbytes()) {
      std::memset(g.raw(), 0, g.nbytes());
    }
  }
  *reset_.data<bool>() = false;
  *loss_scale_tensor_.data<float>() = static_cast<float>(loss_scale_);
  std::map<std::pair<int, int>, std::map<std::string, Tensor>> stash;  // (micro-batch, chunk)
  double loss_sum = 0;
  int losses = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const PipelineWork& w = work[i];
    if (w.chunk < 0 || w.chunk >= static_cast<int>(stages_.size()) || w.microbatch < 0 ||
        w.microbatch >= static_cast<int>(microbatches.size()))
      return InvalidArgument("PipelineStep: work item (micro-batch ", w.microbatch, ", chunk ", w.chunk,
                             ") is outside ", microbatches.size(), " micro-batches and ", stages_.size(), " chunks");
    const PipelineStage& st = artifacts_.stages[w.chunk];
    const uint64_t seed = options_.seed * 0x9e3779b97f4a7c15ull + (static_cast<uint64_t>(step_) << 20) +
                          static_cast<uint64_t>(w.microbatch);
    const auto key = std::make_pair(w.microbatch, w.chunk);
    if (!w.backward) {
      std::map<std::string, Tensor> out;
      RETURN_IF_ERROR(RunPart(*stages_[w.chunk].forward, microbatches[w.microbatch], {}, &out, seed));
      if (auto l = out.find(kLoss); l != out.end()) {
        loss_sum += *l->second.data<float>();
        ++losses;
      }
      std::map<std::string, Tensor>& kept = stash[key];
      for (const std::string& name : st.stash) kept[name] = out.at(name);
      // What the backward does not read (sent activations, the loss, read above) is free again.
      for (auto& [name, t] : out)
        if (!kept.count(name) && !grad_by_name_.count(name)) free_outputs_[name].push_back(std::move(t));
    } else {
      auto it = stash.find(key);
      if (it == stash.end())
        return InvalidArgument("PipelineStep: backward of micro-batch ", w.microbatch, " on chunk ", w.chunk,
                               " before its forward");
      std::function<void(int)> final_grads;
      if (reducer_ && static_cast<int>(i) == last_backward_[w.chunk])
        final_grads = [this, chunk = w.chunk](int o) {
          const int p = stage_output_param_[chunk][o];
          if (p >= 0 && --writers_left_[p] == 0) reducer_->Ready(p);
        };
      RETURN_IF_ERROR(RunPart(*stages_[w.chunk].backward, microbatches[w.microbatch], it->second, nullptr, seed,
                              std::move(final_grads)));
      for (auto& [name, t] : it->second) free_outputs_[name].push_back(std::move(t));
      stash.erase(it);
    }
  }
  micro_batches_ = static_cast<int64_t>(microbatches.size());
  pending_reset_ = false;
  return losses ? static_cast<float>(loss_sum / losses) : std::numeric_limits<float>::quiet_NaN();
}

absl::StatusOr<float> TrainingSession::PipelineEval(const std::vector<Feeds>& microbatches) {
  if (!pipelined()) return absl::FailedPreconditionError("PipelineEval needs pipeline stage artifacts");
  double loss_sum = 0;
  int losses = 0;
  for (const Feeds& mb : microbatches)
    for (size_t c = 0; c < stages_.size(); ++c) {
      if (!stages_[c].eval)
        return InvalidArgument("pipeline stage ", artifacts_.stages[c].stage, " has no eval part");
      std::map<std::string, Tensor> out;
      RETURN_IF_ERROR(RunPart(*stages_[c].eval, mb, {}, &out, 0));
      if (auto l = out.find(kLoss); l != out.end()) {
        loss_sum += *l->second.data<float>();
        ++losses;
      }
      for (auto& [name, t] : out) free_outputs_[name].push_back(std::move(t));
    }
  return losses ? static_cast<float>(loss_sum / losses) : std::numeric_limits<float>::quiet_NaN();
}

void TrainingSession::RegisterScheduler(const LrSchedule& schedule) {
  schedule_ = schedule;
  has_schedule_ = true;
}

absl::StatusOr<float> TrainingSession::OptimizerStep() {
  if (micro_batches_ == 0 || pending_reset_)
    return absl::FailedPreconditionError("OptimizerStep without gradients: call TrainStep first");
  if (has_schedule_) lr_ = schedule_.At(step_);
  last_skipped_ = false;
  if (loss_scaling_) {
    // A gradient that overflowed (here or on any rank of the group) skips the update.
    RunOptions check;
    check.profiler = profiler_;
    check.profile_track = compute_track_;
    int32_t overflow = 0;
    if (overflow_check_) {
      RETURN_IF_ERROR(overflow_check_->RunInto(overflow_feeds_, overflow_outputs_, check));
      overflow = *overflow_outputs_[0].data<bool>() ? 0 : 1;
    }
    if (options_.communicator && !options_.overflow_group.empty()) {
      Tensor flag = Tensor::Scalar<int32_t>(overflow);
      RETURN_IF_ERROR(options_.communicator->AllReduce(flag.view(), flag.view(), ReduceOp::kMax, options_.overflow_group));
      overflow = *flag.data<int32_t>();
    }
    if (overflow) {
      last_skipped_ = true;
      loss_scale_ = std::max(1.0, loss_scale_ * 0.5);
      clean_steps_ = 0;
      ++step_;
      pending_reset_ = true;
      return std::numeric_limits<float>::infinity();
    }
  }
  *lr_tensor_.data<float>() = static_cast<float>(lr_);
  *step_tensor_.data<int64_t>() = updates_ + 1;
  *scale_tensor_.data<float>() =
      static_cast<float>(1.0 / (static_cast<double>(micro_batches_) * (loss_scaling_ ? loss_scale_ : 1.0)));
  if (reducer_) RETURN_IF_ERROR(reducer_->Finish());
  RunOptions run;
  run.profiler = profiler_;
  run.profile_track = compute_track_;
  RETURN_IF_ERROR(optimizer_->RunInto(optimizer_feeds_, optimizer_outputs_, run));
  RETURN_IF_ERROR(AddDeviceCommunication());
  ++step_;
  ++updates_;
  if (loss_scaling_ && ++clean_steps_ >= options_.loss_scale_growth_interval) {
    loss_scale_ *= 2;
    clean_steps_ = 0;
  }
  return *grad_norm_.data<float>();
}

std::string TrainingSession::ModelSignature() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  for (size_t i = 0; i < params_.size(); ++i)
    mix(absl::StrCat(artifacts_.params[i], ":", Describe(params_[i]), ";"));
  for (size_t i = 0; i < buffers_.size(); ++i)
    mix(absl::StrCat(artifacts_.buffers[i], ":", Describe(buffers_[i]), ";"));
  return absl::StrFormat("%016x", h);
}

std::string TrainingSession::OptimizerName() const {
  const graph::Graph& o = *artifacts_.optimizer;
  for (const auto& n : o.nodes())
    if (n->metadata().count("param")) return absl::StrCat(n->op_type(), "/", artifacts_.state_suffixes.size());
  return "none";
}

absl::Status TrainingSession::SaveCheckpoint(const std::string& path,
                                             const std::map<std::string, std::string>& properties) const {
  Checkpoint c;
  c.properties = properties;
  c.properties["cleave.model_signature"] = ModelSignature();
  c.properties["cleave.optimizer"] = OptimizerName();
  c.properties["cleave.step"] = absl::StrCat(step_);
  c.properties["cleave.learning_rate"] = absl::StrFormat("%.17g", lr_);
  c.properties["cleave.updates"] = absl::StrCat(updates_);
  if (loss_scaling_) {
    c.properties["cleave.loss_scale"] = absl::StrFormat("%.17g", loss_scale_);
    c.properties["cleave.loss_scale_clean_steps"] = absl::StrCat(clean_steps_);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor param, ToHost(params_[i]));
    c.tensors.emplace_back(artifacts_.params[i], std::move(param));
    for (size_t k = 0; k < artifacts_.state_suffixes.size(); ++k) {
      ASSIGN_OR_RETURN(Tensor state, ToHost(states_[i][k]));
      c.tensors.emplace_back(artifacts_.params[i] + artifacts_.state_suffixes[k], std::move(state));
    }
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor buffer, ToHost(buffers_[i]));
    c.tensors.emplace_back(artifacts_.buffers[i], std::move(buffer));
  }
  return WriteCheckpoint(path, c);
}

absl::StatusOr<std::map<std::string, std::string>> TrainingSession::LoadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(Checkpoint c, ReadCheckpoint(path));
  // Validate everything first: nothing changes unless the whole checkpoint fits.
  std::vector<std::string> problems;
  for (const auto& [name, t] : by_name_) {
    const Tensor* found = c.Find(name);
    if (!found) problems.push_back(absl::StrCat("missing '", name, "' (expected ", Describe(*t), ")"));
    else if (!SameShape(*found, *t))
      problems.push_back(absl::StrCat("'", name, "' is ", Describe(*found), ", expected ", Describe(*t)));
  }
  for (const auto& [name, t] : c.tensors)
    if (!by_name_.count(name)) problems.push_back(absl::StrCat("unexpected tensor '", name, "'"));
  auto prop = [&c](const char* k) {
    auto it = c.properties.find(k);
    return it == c.properties.end() ? std::string("(none)") : it->second;
  };
  if (prop("cleave.optimizer") != OptimizerName())
    problems.push_back(absl::StrCat("optimizer is ", prop("cleave.optimizer"), ", expected ", OptimizerName()));
  if (!problems.empty()) {
    const size_t shown = std::min<size_t>(problems.size(), 12);
    return InvalidArgument("checkpoint '", path, "' does not belong to this model (model signature ",
                           prop("cleave.model_signature"), ", expected ", ModelSignature(), "): ",
                           problems.size(), " problem(s):\n  ",
                           absl::StrJoin(problems.begin(), problems.begin() + shown, "\n  "),
                           problems.size() > shown ? "\n  ..." : "");
  }
  int64_t step = 0;
  double lr = 0;
  if (!absl::SimpleAtoi(prop("cleave.step"), &step) || !absl::SimpleAtod(prop("cleave.learning_rate"), &lr))
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' has no valid step or learning rate"));
  for (const auto& [name, t] : c.tensors) RETURN_IF_ERROR(CopyInto(*by_name_.at(name), t));
  step_ = step;
  lr_ = lr;
  if (!absl::SimpleAtoi(prop("cleave.updates"), &updates_)) updates_ = step;
  double scale;
  if (loss_scaling_ && absl::SimpleAtod(prop("cleave.loss_scale"), &scale)) loss_scale_ = scale;
  if (loss_scaling_ && !absl::SimpleAtoi(prop("cleave.loss_scale_clean_steps"), &clean_steps_)) clean_steps_ = 0;
  pending_reset_ = true;
  micro_batches_ = 0;
  return c.properties;
}

absl::Status TrainingSession::ExportModelForInferencing(const std::string& path) const {
  if (!artifacts_.forward) return absl::FailedPreconditionError("these artifacts have no forward model to export");
  std::unique_ptr<graph::Graph> g = artifacts_.forward->Clone();
  for (size_t i = 0; i < params_.size(); ++i) {
    graph::Value* v = g->FindValue(artifacts_.params[i]);
    if (!v) return Internal("parameter '", artifacts_.params[i], "' is not in the forward graph");
    ASSIGN_OR_RETURN(Tensor param, ToHost(params_[i]));
    g->SetInitializer(v, std::move(param));
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    graph::Value* v = g->FindValue(artifacts_.buffers[i]);
    if (!v) return Internal("running statistic '", artifacts_.buffers[i], "' is not in the forward graph");
    ASSIGN_OR_RETURN(Tensor buffer, ToHost(buffers_[i]));
    g->SetInitializer(v, std::move(buffer));
  }
  return onnx_ext::SaveModel(*g, path);
}

absl::StatusOr<std::string> TrainingSession::FirstNonFinite(const Feeds& feeds) const {
  std::unique_ptr<graph::Graph> g = artifacts_.training->Clone();
  ASSIGN_OR_RETURN(std::vector<graph::Node*> order, g->TopologicalOrder());
  std::vector<graph::Value*> outs;
  std::vector<const graph::Node*> producers;
  for (graph::Node* n : order)
    for (graph::Value* v : n->outputs())
      if (v && (v->dtype() == DataType::kFloat32 || v->dtype() == DataType::kFloat64)) {
        outs.push_back(v);
        producers.push_back(n);
      }
  g->SetOutputs(outs);
  SessionOptions plain;
  plain.intra_op_threads = options_.intra_op_threads;
  plain.optimize = false;
  ASSIGN_OR_RETURN(auto s, InferenceSession::FromGraph(std::move(g), plain));
  // Data and parameters as the failed step saw them; fresh zero accumulation buffers (the
  // failed step has already written into the real ones).
  Feeds all = feeds;
  for (size_t i = 0; i < params_.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor param, ToHost(params_[i]));
    all.emplace_back(artifacts_.params[i], std::move(param));
  }
  for (size_t i = 0; i < params_.size(); ++i) all.emplace_back(AccumulationBuffer(artifacts_.params[i]), Zeros(params_[i]));
  all.emplace_back(kLazyResetGrad, Tensor::Scalar<bool>(true));
  for (size_t i = 0; i < buffers_.size(); ++i) {  // copies: the rerun must not move the statistics
    ASSIGN_OR_RETURN(Tensor buffer, ToHost(buffers_[i]));
    all.emplace_back(artifacts_.buffers[i], buffer.Clone());
  }
  // The first element that is NaN (or, with nan_only false, NaN or +-Inf).
  auto first_bad = [](const Tensor& t, bool nan_only) -> int64_t {
    if (t.dtype() != DataType::kFloat32 && t.dtype() != DataType::kFloat64) return -1;
    for (int64_t k = 0; k < t.numel(); ++k) {
      const double x = t.dtype() == DataType::kFloat64 ? t.data<double>()[k] : t.data<float>()[k];
      if (nan_only ? std::isnan(x) : !std::isfinite(x)) return k;
    }
    return -1;
  };
  auto at = [](const Tensor& t, int64_t k) {
    return t.dtype() == DataType::kFloat64 ? t.data<double>()[k] : static_cast<double>(t.data<float>()[k]);
  };
  // A parameter or input that is already broken.
  for (const auto& [name, t] : all)
    if (int64_t k = first_bad(t, false); k >= 0)
      return absl::StrCat("input '", name, "' holds ", at(t, k), " at flat index ", k);
  ASSIGN_OR_RETURN(std::vector<Tensor> values, s->Run(all));
  // Masks legitimately hold -inf, so: the first NaN, else the first Inf that a node made from
  // finite inputs (an overflow).
  std::map<const graph::Value*, bool> finite;
  for (size_t i = 0; i < values.size(); ++i) finite[outs[i]] = first_bad(values[i], false) < 0;
  for (size_t i = 0; i < values.size(); ++i)
    if (int64_t k = first_bad(values[i], true); k >= 0)
      return absl::StrCat("'", outs[i]->name(), "' (output of ", producers[i]->Describe(), ") holds nan at flat index ", k);
  for (size_t i = 0; i < values.size(); ++i) {
    if (finite[outs[i]] || producers[i]->op_type() == "Constant") continue;
    bool inputs_finite = true;
    for (const graph::Value* in : producers[i]->inputs()) {
      auto it = in ? finite.find(in) : finite.end();
      if (it != finite.end()) inputs_finite &= it->second;
      else if (in && in->is_initializer()) inputs_finite &= first_bad(*in->initializer(), false) < 0;
    }
    if (inputs_finite) {
      const int64_t k = first_bad(values[i], false);
      return absl::StrCat("'", outs[i]->name(), "' (output of ", producers[i]->Describe(), ") holds ", at(values[i], k),
                          " at flat index ", k, " from finite inputs");
    }
  }
  return std::string("no non-finite value found on a rerun");
}

}  // namespace cleave::trainer
