// InferenceSession: load-time validation and optimisation, run-time feed checks (runtime/).
#include "runtime/inference_session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/verifier.h"
#include "onnx_ext/onnx_io.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/kernel.h"
#include "runtime/constant_evaluator.h"
#include "runtime/executor.h"

#ifdef CLEAVE_HAVE_CUDA
#include "providers/cuda/cuda_provider.h"
#endif

namespace cleave {

namespace {

absl::StatusOr<std::unique_ptr<providers::ExecutionProvider>> MakeCudaProvider(int device) {
#ifdef CLEAVE_HAVE_CUDA
  return providers::CudaExecutionProvider::Create(device);
#else
  return absl::UnavailableError("this cleave was built without the CUDA provider (no CUDA toolkit when it was configured)");
#endif
}

// Every node the op table cannot resolve, listed together.
absl::Status CheckAllOpsKnown(const graph::Graph& g) {
  std::vector<std::string> errors;
  for (const auto& n : g.nodes()) {
    auto op = graph::ResolveNode(g, *n);
    if (!op.ok()) errors.emplace_back(op.status().message());
  }
  if (errors.empty()) return absl::OkStatus();
  return Unimplemented(errors.size(), " unsupported node(s):\n  ", absl::StrJoin(errors, "\n  "));
}

void ApplyDimOverrides(graph::Graph& g, const std::map<std::string, int64_t>& overrides) {
  if (overrides.empty()) return;
  for (graph::Value* v : g.inputs()) {
    if (!v->shape().has_rank()) continue;
    Shape s = v->shape();
    for (Dim& d : s.mutable_dims())
      if (!d.is_static() && overrides.count(d.symbol)) d = Dim(overrides.at(d.symbol));
    v->set_shape(s);
  }
}

// Folding and the activation and norm fusions, then attention (the flash-style kernels never store the probabilities) over the
// q/k/v products' own [B, T, H, D] layout (every provider's kernels read it in place) and the
// cross-entropy's loss and gradient in one pass over the scores (the forward stores no
// log_prob), with a device provider together with the other fusions its kernels pay off for:
// the residual add with its LayerNorm, then bf16 logits for the loss; then the transformer
// fusions; and last, with a device provider, once the products are final, the padding of a
// vocabulary whose rows would not be 16-byte aligned, the embeddings' gradients scattered into
// their accumulation, the weight gradients' products taking on their accumulation and their
// layers' bias gradients, the residual gradients' rounding to bf16 written by the LayerNorm
// gradients that form them, and the products read by the LayerNorms and their gradients writing
// bf16. Every session ends with the mixed-precision MLP's GELUs folded into their products (the
// tanh form alone with a device provider, whose cuBLASLt epilogues have no erf form).
absl::Status Optimize(graph::Graph& g, const providers::ExecutionProvider& cpu, bool device,
                      std::set<std::string> disabled) {
  if (const char* env = std::getenv("CLEAVE_DISABLED_OPTIMIZERS"))
    for (absl::string_view name : absl::StrSplit(env, ',', absl::SkipWhitespace()))
      disabled.insert(std::string(absl::StripAsciiWhitespace(name)));
  graph::ConstantFolding fold(runtime::MakeConstantEvaluator(g, cpu));
  graph::DeadCodeElimination dce;
  graph::TransformerFusion fusion;
  graph::ActivationNormFusion activation_norm;
  graph::AttentionFusion attention;
  graph::AttentionLayoutFusion attention_layout;
  graph::SkipLayerNormFusion skip_norm;
  graph::SoftmaxCrossEntropyFusion cross_entropy;
  graph::LowPrecisionScores low_scores;
  graph::ClassPadding padding;
  graph::GradientAccumulationFusion accumulation;
  graph::EmbeddingGradientAccumulation embedding_gradient;
  graph::BiasGradientFusion bias_gradient;
  graph::LayerNormGradCastFusion norm_grad_cast;
  graph::LowPrecisionNormInputs low_norm_inputs;
  graph::GeluEpilogueFusion gelu_epilogue(/*erf_too=*/!device);
  std::vector<std::string> known;
  for (graph::Pass* p : std::initializer_list<graph::Pass*>{&fold, &fusion, &attention, &attention_layout, &skip_norm,
                                                            &cross_entropy, &low_scores, &padding, &accumulation,
                                                            &embedding_gradient, &bias_gradient, &norm_grad_cast,
                                                            &low_norm_inputs, &gelu_epilogue})
    known.push_back(p->name());
  for (const std::string& name : disabled)
    if (std::find(known.begin(), known.end(), name) == known.end())
      return InvalidArgument("disabled optimizer '", name, "': no such pass; expected one of ",
                             absl::StrJoin(known, ", "));
  // The passes of `list` that are not disabled (DCE always runs).
  auto enabled = [&](std::vector<graph::Pass*> list) {
    std::vector<graph::Pass*> out;
    for (graph::Pass* p : list)
      if (p == &dce || !disabled.count(p->name())) out.push_back(p);
    return out;
  };
  // The norm, activation and rotary rules of TransformerFusion (and their constant tables
  // folded) before attention: a rotary embedding then sits ahead of its head swap, which
  // meets attention directly and folds into its layout as v's does.
  std::vector<graph::Pass*> first = enabled({&fold, &dce});
  if (!disabled.count(fusion.name())) first.push_back(&activation_norm);
  RETURN_IF_ERROR(graph::RunToFixedPoint(first, &g));
  if (device) {
    RETURN_IF_ERROR(
        graph::RunToFixedPoint(enabled({&attention, &attention_layout, &skip_norm, &cross_entropy, &dce}), &g));
    RETURN_IF_ERROR(graph::RunToFixedPoint(enabled({&low_scores}), &g));
  } else {
    RETURN_IF_ERROR(graph::RunToFixedPoint(enabled({&attention, &attention_layout, &cross_entropy, &dce}), &g));
  }
  RETURN_IF_ERROR(graph::RunToFixedPoint(enabled({&fusion, &dce}), &g));
  if (!device) return graph::RunToFixedPoint(enabled({&gelu_epilogue, &dce}), &g);
  RETURN_IF_ERROR(
      graph::RunToFixedPoint(enabled({&padding, &embedding_gradient, &accumulation, &bias_gradient, &dce}), &g));
  // Then the residual gradient's rounding into its LayerNorm gradient (the bias gradients above
  // find that gradient through its Cast).
  RETURN_IF_ERROR(graph::RunToFixedPoint(enabled({&norm_grad_cast, &low_norm_inputs, &dce}), &g));
  // And last, the tanh-form GELUs into the products' epilogues (once no other pass rewrites those
  // products).
  return graph::RunToFixedPoint(enabled({&gelu_epilogue, &dce}), &g);
}

}  // namespace

InferenceSession::InferenceSession() = default;
InferenceSession::~InferenceSession() = default;

absl::StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::Load(
    const std::string& model_path, SessionOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<graph::Graph> g, onnx_ext::LoadModel(model_path));
  auto s = FromGraph(std::move(g), std::move(options));
  if (!s.ok() && s.status().message().find(model_path) == std::string::npos)
    return absl::Status(s.status().code(), absl::StrCat(model_path, ": ", s.status().message()));
  return s;
}

absl::StatusOr<std::shared_ptr<providers::ExecutionProvider>> InferenceSession::MakeDeviceProvider(
    DeviceChoice choice, int cuda_device, std::string* warning) {
  if (choice == DeviceChoice::kCpu) return std::shared_ptr<providers::ExecutionProvider>();
  auto cuda = MakeCudaProvider(cuda_device);
  if (cuda.ok()) return std::shared_ptr<providers::ExecutionProvider>(std::move(*cuda));
  if (choice == DeviceChoice::kCuda)
    return absl::Status(cuda.status().code(), absl::StrCat("the session asks for CUDA: ", cuda.status().message()));
  if (warning) *warning = absl::StrCat("running on the CPU: ", cuda.status().message());
  return std::shared_ptr<providers::ExecutionProvider>();
}

absl::StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::FromGraph(
    std::unique_ptr<graph::Graph> graph, SessionOptions options) {
  return FromGraph(std::move(graph), std::move(options), {});
}

absl::StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::FromGraph(
    std::unique_ptr<graph::Graph> graph, SessionOptions options,
    std::vector<std::shared_ptr<providers::ExecutionProvider>> providers) {
  std::unique_ptr<InferenceSession> s(new InferenceSession());
  RETURN_IF_ERROR(s->Initialize(std::move(graph), std::move(options), std::move(providers)));
  return s;
}

absl::Status InferenceSession::Initialize(std::unique_ptr<graph::Graph> g, SessionOptions options,
                                          std::vector<std::shared_ptr<providers::ExecutionProvider>> providers) {
  if (options.device_provider) {
    providers.insert(providers.begin(), options.device_provider);
  } else if (options.device != DeviceChoice::kCpu) {
    ASSIGN_OR_RETURN(std::shared_ptr<providers::ExecutionProvider> device,
                     MakeDeviceProvider(options.device, options.cuda_device, &warning_));
    if (device) {
      device->set_communicator(options.communicator);
      providers.insert(providers.begin(), std::move(device));
    }
  }
  RETURN_IF_ERROR(graph::Verify(*g));
  RETURN_IF_ERROR(CheckAllOpsKnown(*g));
  ApplyDimOverrides(*g, options.free_dimension_overrides);
  RETURN_IF_ERROR(graph::InferShapes(*g));
  graph::OpDecomposition decompose;
  ASSIGN_OR_RETURN(bool decomposed, graph::RunPass(decompose, g.get()));
  if (decomposed) RETURN_IF_ERROR(graph::InferShapes(*g));
  auto cpu = std::make_unique<providers::CpuExecutionProvider>(options.intra_op_threads);
  cpu->set_communicator(options.communicator);
  if (options.optimize) RETURN_IF_ERROR(Optimize(*g, *cpu, !providers.empty(), options.disabled_optimizers));
  RETURN_IF_ERROR(graph::Verify(*g, /*require_types=*/true));
  for (const graph::Value* v : g->inputs()) inputs_.push_back({v->name(), v->dtype(), v->shape()});
  for (const graph::Value* v : g->outputs()) outputs_.push_back({v->name(), v->dtype(), v->shape()});
  feed_views_.reserve(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i) input_index_.emplace(inputs_[i].name, static_cast<int>(i));
  fed_.assign(inputs_.size(), nullptr);
  output_ptrs_.reserve(outputs_.size());
  size_t dims = 0;
  for (const IoInfo& in : inputs_) dims += in.shape.has_rank() ? in.shape.rank() : 0;
  symbols_.reserve(dims);
  providers.push_back(std::move(cpu));
  runtime::ExecutorOptions eo;
  eo.collectives = options.collective_queue;
  ASSIGN_OR_RETURN(executor_, runtime::Executor::Create(std::move(g), std::move(providers), eo));
  if (!executor_->fallback_warning().empty())
    warning_ = warning_.empty() ? executor_->fallback_warning() : absl::StrCat(warning_, "; ", executor_->fallback_warning());
  if (!warning_.empty()) std::fprintf(stderr, "cleave: warning: %s\n", warning_.c_str());
  return absl::OkStatus();
}

const std::map<std::string, int>& InferenceSession::placement() const { return executor_->placement(); }

const graph::Graph& InferenceSession::graph() const { return executor_->graph(); }

RunStats InferenceSession::stats() const {
  const auto& s = executor_->stats();
  return {s.runs, s.plans, s.arena_bytes, s.heap_allocations, s.bases_in_place};
}

absl::Status InferenceSession::BindFeeds(const Feeds& feeds) {
  std::fill(fed_.begin(), fed_.end(), nullptr);
  for (const auto& [name, t] : feeds) {
    auto it = input_index_.find(name);
    if (it == input_index_.end()) {
      std::vector<std::string> names;
      for (const IoInfo& in : inputs_) names.push_back(in.name);
      return InvalidArgument("unknown input '", name, "'; the model's inputs are: ",
                             absl::StrJoin(names, ", "));
    }
    fed_[it->second] = &t;  // a name fed twice: the last one
  }
  // Buffers are members, sized at load, so binding allocates nothing.
  feed_views_.clear();
  symbols_.clear();
  for (size_t k = 0; k < inputs_.size(); ++k) {
    const IoInfo& in = inputs_[k];
    const Tensor* found = fed_[k];
    if (!found) return InvalidArgument("input '", in.name, "' was not fed");
    const Tensor& t = *found;
    if (t.dtype() != in.dtype)
      return InvalidArgument("input '", in.name, "': expected dtype ", DataTypeName(in.dtype),
                             ", got ", DataTypeName(t.dtype()));
    if (t.rank() > kMaxRank) return InvalidArgument("input '", in.name, "': rank over ", kMaxRank);
    if (in.shape.has_rank()) {
      if (t.rank() != in.shape.rank())
        return InvalidArgument("input '", in.name, "': expected shape ", in.shape.ToString(),
                               " (rank ", in.shape.rank(), "), got ", DimsToString(t.dims()));
      for (int i = 0; i < t.rank(); ++i) RETURN_IF_ERROR(CheckDim(in, i, t));
    }
    feed_views_.push_back(t.view());
  }
  return absl::OkStatus();
}

// One dim of a feed against the model's declared dim; symbols must agree across inputs.
absl::Status InferenceSession::CheckDim(const IoInfo& in, int i, const Tensor& t) {
  const Dim& d = in.shape[i];
  int64_t got = t.dims()[i];
  if (d.is_static() && d.value != got)
    return InvalidArgument("input '", in.name, "': dim ", i, " expected ", d.value, ", got ", got,
                           " (shape ", DimsToString(t.dims()), ", expected ", in.shape.ToString(), ")");
  if (d.symbol.empty()) return absl::OkStatus();
  for (const auto& [symbol, value] : symbols_) {
    if (*symbol != d.symbol) continue;
    if (value != got)
      return InvalidArgument("input '", in.name, "': dim ", i, " ('", d.symbol, "') is ", got,
                             " but another input has '", d.symbol, "' = ", value);
    return absl::OkStatus();
  }
  symbols_.emplace_back(&d.symbol, got);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> InferenceSession::Run(const Feeds& feeds) {
  std::lock_guard<std::mutex> lock(bind_mu_);
  RETURN_IF_ERROR(BindFeeds(feeds));
  std::vector<Tensor> outputs;
  RETURN_IF_ERROR(executor_->Run(feed_views_, outputs));
  return outputs;
}

absl::StatusOr<std::vector<Tensor>> InferenceSession::Run(
    const Feeds& feeds, const std::vector<std::string>& output_names) {
  ASSIGN_OR_RETURN(std::vector<Tensor> all, Run(feeds));
  std::vector<Tensor> picked;
  for (const std::string& name : output_names) {
    size_t i = 0;
    while (i < outputs_.size() && outputs_[i].name != name) ++i;
    if (i == outputs_.size()) return InvalidArgument("unknown output '", name, "'");
    picked.push_back(all[i]);
  }
  return picked;
}

std::vector<int> InferenceSession::OutputSteps() const { return executor_->OutputSteps(); }
std::vector<runtime::AsyncCollective> InferenceSession::async_collectives() const {
  return executor_->async_collectives();
}

absl::Status InferenceSession::RunInto(const Feeds& feeds, std::vector<Tensor>& outputs,
                                       const RunOptions& options) {
  if (outputs.size() != outputs_.size())
    return InvalidArgument("RunInto: expected ", outputs_.size(), " output tensors, got ",
                           outputs.size());
  std::lock_guard<std::mutex> lock(bind_mu_);
  output_ptrs_.clear();
  for (const Tensor& t : outputs) output_ptrs_.push_back(t.raw());
  RETURN_IF_ERROR(BindFeeds(feeds));
  const uint64_t seed = options.seed ? *options.seed & ~(uint64_t{1} << 63) : providers::KernelContext::kNoRunSeed;
  runtime::RunObservers observers{options.profiler, options.profile_track, options.output_ready};
  const bool observed = options.profiler || options.output_ready;
  RETURN_IF_ERROR(executor_->Run(feed_views_, outputs, seed, observed ? &observers : nullptr));
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].raw() != output_ptrs_[i])
      return InvalidArgument("RunInto: output '", outputs_[i].name, "' is ",
                             DataTypeName(outputs[i].dtype()), DimsToString(outputs[i].dims()),
                             ", which the preallocated tensor did not match");
  return absl::OkStatus();
}

}  // namespace cleave
