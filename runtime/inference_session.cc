// InferenceSession: load-time validation and optimisation, run-time feed checks (runtime/).
#include "runtime/inference_session.h"

#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/verifier.h"
#include "onnx_ext/onnx_io.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
#include "runtime/executor.h"

namespace cleave {

namespace {

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

absl::Status Optimize(graph::Graph& g, const providers::ExecutionProvider& cpu) {
  graph::ConstantFolding fold(runtime::MakeConstantEvaluator(g, cpu));
  graph::DeadCodeElimination dce;
  graph::TransformerFusion fusion;
  RETURN_IF_ERROR(graph::RunToFixedPoint({&fold, &dce}, &g));
  return graph::RunToFixedPoint({&fusion, &dce}, &g);
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

absl::StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::FromGraph(
    std::unique_ptr<graph::Graph> graph, SessionOptions options) {
  std::unique_ptr<InferenceSession> s(new InferenceSession());
  RETURN_IF_ERROR(s->Initialize(std::move(graph), std::move(options)));
  return s;
}

absl::Status InferenceSession::Initialize(std::unique_ptr<graph::Graph> g, SessionOptions options) {
  RETURN_IF_ERROR(graph::Verify(*g));
  RETURN_IF_ERROR(CheckAllOpsKnown(*g));
  ApplyDimOverrides(*g, options.free_dimension_overrides);
  RETURN_IF_ERROR(graph::InferShapes(*g));
  auto cpu = std::make_unique<providers::CpuExecutionProvider>(options.intra_op_threads);
  if (options.optimize) RETURN_IF_ERROR(Optimize(*g, *cpu));
  RETURN_IF_ERROR(graph::Verify(*g, /*require_types=*/true));
  for (const graph::Value* v : g->inputs()) inputs_.push_back({v->name(), v->dtype(), v->shape()});
  for (const graph::Value* v : g->outputs()) outputs_.push_back({v->name(), v->dtype(), v->shape()});
  std::vector<std::unique_ptr<providers::ExecutionProvider>> providers;
  providers.push_back(std::move(cpu));
  ASSIGN_OR_RETURN(executor_, runtime::Executor::Create(std::move(g), std::move(providers)));
  return absl::OkStatus();
}

const graph::Graph& InferenceSession::graph() const { return executor_->graph(); }

RunStats InferenceSession::stats() const {
  const auto& s = executor_->stats();
  return {s.runs, s.plans, s.arena_bytes, s.heap_allocations};
}

namespace {

// Checks feeds against the model inputs and orders them as the graph expects.
absl::StatusOr<std::vector<TensorView>> BindFeeds(const std::vector<IoInfo>& inputs,
                                                  const Feeds& feeds) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : feeds) {
    bool known = false;
    for (const IoInfo& in : inputs) known |= in.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const IoInfo& in : inputs) names.push_back(in.name);
      return InvalidArgument("unknown input '", name, "'; the model's inputs are: ",
                             absl::StrJoin(names, ", "));
    }
    by_name[name] = &t;
  }
  std::vector<TensorView> views;
  std::unordered_map<std::string, int64_t> symbols;
  for (const IoInfo& in : inputs) {
    auto it = by_name.find(in.name);
    if (it == by_name.end()) return InvalidArgument("input '", in.name, "' was not fed");
    const Tensor& t = *it->second;
    if (t.dtype() != in.dtype)
      return InvalidArgument("input '", in.name, "': expected dtype ", DataTypeName(in.dtype),
                             ", got ", DataTypeName(t.dtype()));
    if (in.shape.has_rank()) {
      if (t.rank() != in.shape.rank())
        return InvalidArgument("input '", in.name, "': expected shape ", in.shape.ToString(),
                               " (rank ", in.shape.rank(), "), got ", DimsToString(t.dims()));
      for (int i = 0; i < t.rank(); ++i) {
        const Dim& d = in.shape[i];
        if (d.is_static() && d.value != t.dims()[i])
          return InvalidArgument("input '", in.name, "': dim ", i, " expected ", d.value, ", got ",
                                 t.dims()[i], " (shape ", DimsToString(t.dims()), ", expected ",
                                 in.shape.ToString(), ")");
        if (!d.symbol.empty()) {
          auto [sit, inserted] = symbols.emplace(d.symbol, t.dims()[i]);
          if (!inserted && sit->second != t.dims()[i])
            return InvalidArgument("input '", in.name, "': dim ", i, " ('", d.symbol, "') is ",
                                   t.dims()[i], " but another input has '", d.symbol, "' = ",
                                   sit->second);
        }
      }
    }
    if (t.rank() > kMaxRank) return InvalidArgument("input '", in.name, "': rank over ", kMaxRank);
    views.push_back(t.view());
  }
  return views;
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> InferenceSession::Run(const Feeds& feeds) {
  ASSIGN_OR_RETURN(std::vector<TensorView> views, BindFeeds(inputs_, feeds));
  std::vector<Tensor> outputs;
  RETURN_IF_ERROR(executor_->Run(views, outputs));
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

absl::Status InferenceSession::RunInto(const Feeds& feeds, std::vector<Tensor>& outputs) {
  if (outputs.size() != outputs_.size())
    return InvalidArgument("RunInto: expected ", outputs_.size(), " output tensors, got ",
                           outputs.size());
  std::vector<void*> before;
  for (const Tensor& t : outputs) before.push_back(t.raw());
  ASSIGN_OR_RETURN(std::vector<TensorView> views, BindFeeds(inputs_, feeds));
  RETURN_IF_ERROR(executor_->Run(views, outputs));
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].raw() != before[i])
      return InvalidArgument("RunInto: output '", outputs_[i].name, "' is ",
                             DataTypeName(outputs[i].dtype()), DimsToString(outputs[i].dims()),
                             ", which the preallocated tensor did not match");
  return absl::OkStatus();
}

}  // namespace cleave
