// The training graph builder (trainer/): see training_graph.h.
#include "trainer/training_graph.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "providers/cpu/cpu_provider.h"
#include "runtime/constant_evaluator.h"
#include "graph/verifier.h"
#include "onnx_ext/onnx_io.h"
#include "trainer/autodiff.h"

namespace cleave::trainer {

using graph::Attribute;
using graph::Graph;
using graph::Node;
using graph::Value;

std::string AccumulationBuffer(const std::string& p) { return p + "_grad.accumulation.buffer"; }
std::string AccumulationOut(const std::string& p) { return p + "_grad.accumulation.out"; }
std::string Updated(const std::string& name) { return name + ".updated"; }

absl::StatusOr<bool> IsFrozen(const std::string& name, const std::vector<std::string>& patterns) {
  for (const std::string& p : patterns) {
    if (p == name) return true;
    try {
      if (std::regex_match(name, std::regex(p))) return true;
    } catch (const std::regex_error& e) {
      return InvalidArgument("frozen-parameter pattern '", p, "' is not a valid regex: ", e.what());
    }
  }
  return false;
}

namespace {

Node* Add(Graph& g, const std::string& op, const std::vector<Value*>& in,
          const std::vector<Value*>& out, const std::string& role, const std::string& domain = "") {
  Node* n = g.AddNode(op, in, out, out[0]->name(), domain);
  n->metadata()["role"] = role;
  return n;
}

Value* NewValue(Graph& g, const std::string& name) { return g.GetOrCreateValue(g.UniqueName(name)); }

// Constant folding (on the CPU kernels) and dead-code elimination to a fixed point, keeping
// `variable` values unfolded; shapes re-inferred.
absl::Status FoldConstants(Graph& g, std::function<bool(const Value*)> variable) {
  providers::CpuExecutionProvider cpu(1);
  graph::ConstantFolding fold(runtime::MakeConstantEvaluator(g, cpu), std::move(variable));
  graph::DeadCodeElimination dce;
  RETURN_IF_ERROR(graph::RunToFixedPoint({&fold, &dce}, &g));
  return graph::InferShapes(g);
}

absl::Status ApplyDims(Graph& g, const std::map<std::string, int64_t>& dims) {
  for (Value* v : g.inputs()) {
    if (v->is_initializer() || !v->shape().has_rank()) continue;
    Shape s = v->shape();
    for (Dim& d : s.mutable_dims())
      if (!d.is_static() && dims.count(d.symbol)) d = Dim(dims.at(d.symbol));
    v->set_shape(s);
  }
  return graph::InferShapes(g);
}

std::string OutputNames(const Graph& g) {
  std::vector<std::string> names;
  for (const Value* v : g.outputs()) names.push_back(v->name());
  return absl::StrJoin(names, ", ");
}

absl::Status ExpectNewName(const Graph& g, const std::string& name, const char* what) {
  if (g.FindValue(name))
    return InvalidArgument("the model already has a value named '", name, "'; cannot add the ",
                           what, " under that name");
  return absl::OkStatus();
}

// Adds the loss to `g` and returns it (a float scalar named "loss").
absl::StatusOr<Value*> AttachLoss(Graph& g, const LossSpec& spec, std::vector<std::string>* data) {
  if (g.outputs().empty()) return InvalidArgument("the model has no outputs to attach a loss to");
  Value* out = nullptr;
  if (spec.output.empty()) {
    out = g.outputs()[0];
  } else {
    for (Value* v : g.outputs())
      if (v->name() == spec.output) out = v;
    if (!out)
      return NotFound("loss output '", spec.output, "' is not an output of the model; its outputs are: ",
                      OutputNames(g));
  }
  const Shape& s = out->shape();
  if (spec.kind == LossKind::kModelOutput) {
    if (out->dtype() != DataType::kFloat32 || !s.is_static() || s.NumElements() != 1)
      return InvalidArgument("loss output '", out->name(), "' is ", DataTypeName(out->dtype()),
                             s.ToString(), ", expected a float32 scalar");
    if (out->name() == kLoss) return out;
    RETURN_IF_ERROR(ExpectNewName(g, kLoss, "loss"));
    Value* loss = g.GetOrCreateValue(kLoss);
    Add(g, "Identity", {out}, {loss}, "fwd");
    RETURN_IF_ERROR(graph::InferNode(g, *loss->producer()));
    return loss;
  }
  if (out->dtype() != DataType::kFloat32)
    return InvalidArgument("output '", out->name(), "' is ", DataTypeName(out->dtype()),
                           ", expected float32 to attach a loss");
  if (!s.is_static())
    return InvalidArgument("output '", out->name(), "' has shape ", s.ToString(),
                           " after fixing the dims; a loss needs static shapes (set every "
                           "symbolic input dim)");
  RETURN_IF_ERROR(ExpectNewName(g, spec.labels, "labels input"));
  RETURN_IF_ERROR(ExpectNewName(g, kLoss, "loss"));
  std::vector<int64_t> dims = s.StaticDims();
  Value* loss = g.GetOrCreateValue(kLoss);
  data->push_back(spec.labels);
  if (spec.kind == LossKind::kMse) {
    Value* labels = g.AddInput(spec.labels, DataType::kFloat32, s);
    Value* diff = NewValue(g, "loss/diff");
    Value* sq = NewValue(g, "loss/squared");
    Add(g, "Sub", {out, labels}, {diff}, "fwd");
    Add(g, "Mul", {diff, diff}, {sq}, "fwd");
    Add(g, "ReduceMean", {sq}, {loss}, "fwd")->SetAttr("keepdims", Attribute::Int(0));
    return loss;
  }
  // Cross-entropy: classes on the last axis, like torch.nn.functional.cross_entropy on
  // logits.view(-1, C).
  if (dims.size() < 2)
    return InvalidArgument("output '", out->name(), "' has shape ", s.ToString(),
                           ", expected [..., classes] with rank >= 2 for cross-entropy");
  if (g.OpsetFor("") < 13)
    return InvalidArgument("cross-entropy needs the model's ONNX opset >= 13, it imports ",
                           g.OpsetFor(""));
  const int64_t classes = dims.back();
  std::vector<int64_t> label_dims(dims.begin(), dims.end() - 1);
  Value* labels = g.AddInput(spec.labels, DataType::kInt64, Shape::FromDims(label_dims));
  Value* scores = out;
  Value* targets = labels;
  if (dims.size() > 2) {
    Value* shape2 = g.AddInitializer(g.UniqueName("loss/scores_shape"),
                                     Tensor::FromVector<int64_t>({-1, classes}, {2}));
    Value* shape1 = g.AddInitializer(g.UniqueName("loss/labels_shape"),
                                     Tensor::FromVector<int64_t>({-1}, {1}));
    scores = NewValue(g, "loss/scores");
    targets = NewValue(g, "loss/targets");
    Add(g, "Reshape", {out, shape2}, {scores}, "fwd");
    Add(g, "Reshape", {labels, shape1}, {targets}, "fwd");
  }
  Value* log_prob = NewValue(g, "loss/log_prob");
  Node* sce = Add(g, "SoftmaxCrossEntropyLoss", {scores, targets}, {loss, log_prob}, "fwd");
  sce->SetAttr("reduction", Attribute::String("mean"));
  sce->SetAttr("ignore_index", Attribute::Int(spec.ignore_index));
  return loss;
}

bool IsBatchNorm(const Node& n) { return n.domain().empty() && n.op_type() == "BatchNormalization"; }

// The statistics BatchNormalization nodes read (input_mean, input_var): never parameters.
std::set<std::string> BatchNormStatistics(const Graph& g) {
  std::set<std::string> names;
  for (const auto& n : g.nodes())
    if (IsBatchNorm(*n))
      for (int i : {3, 4})
        if (n->num_inputs() > i && n->input(i)) names.insert(n->input(i)->name());
  return names;
}

absl::StatusOr<std::vector<Value*>> SelectParams(const Graph& g, const TrainingSpec& spec) {
  std::vector<Value*> params;
  const std::set<std::string> statistics = BatchNormStatistics(g);
  for (Value* v : g.Initializers()) {
    if (v->dtype() != DataType::kFloat32 || v->initializer()->numel() <= 1 || statistics.count(v->name())) continue;
    ASSIGN_OR_RETURN(bool frozen, IsFrozen(v->name(), spec.frozen));
    if (!frozen) params.push_back(v);
  }
  if (params.empty())
    return InvalidArgument("no trainable parameters: the model has no float32 initializer with "
                           "more than one element that is not frozen");
  return params;
}

std::unique_ptr<Graph> BuildOptimizer(const std::vector<Value*>& params, const OptimizerConfig& c,
                                      std::vector<std::string>* suffixes) {
  auto o = std::make_unique<Graph>();
  o->opset_imports()[""] = 17;
  o->opset_imports()[graph::kCleaveDomain] = 1;
  o->info().graph_name = "optimizer";
  const Shape scalar = Shape::Scalar();
  Value* lr = o->AddInput("learning_rate", DataType::kFloat32, scalar);
  Value* step = o->AddInput("step", DataType::kInt64, scalar);
  Value* grad_scale = o->AddInput("grad_scale", DataType::kFloat32, scalar);
  if (c.kind == OptimizerConfig::Kind::kAdamW) *suffixes = {".exp_avg", ".exp_avg_sq"};
  else if (c.momentum != 0.0f) *suffixes = {".momentum_buffer"};
  else suffixes->clear();
  std::vector<Value*> ps, gs;
  std::vector<std::vector<Value*>> states;
  for (Value* p : params) {
    ps.push_back(o->AddInput(p->name(), DataType::kFloat32, p->shape()));
    gs.push_back(o->AddInput(GradName(p->name()), DataType::kFloat32, p->shape()));
    states.emplace_back();
    for (const std::string& suf : *suffixes)
      states.back().push_back(o->AddInput(p->name() + suf, DataType::kFloat32, p->shape()));
  }
  // grad_norm = sqrt(sum of squares) * grad_scale; clipping scales the update by
  // min(1, max_norm / (grad_norm + 1e-6)) like torch.nn.utils.clip_grad_norm_.
  Value* sumsq = o->GetOrCreateValue("grad_norm/squared");
  Value* raw = o->GetOrCreateValue("grad_norm/unscaled");
  Value* norm = o->GetOrCreateValue(kGradNorm);
  Add(*o, "SquaredNorm", gs, {sumsq}, "opt", graph::kCleaveDomain);
  Add(*o, "Sqrt", {sumsq}, {raw}, "opt");
  Add(*o, "Mul", {raw, grad_scale}, {norm}, "opt");
  Value* update_scale = grad_scale;
  if (c.max_grad_norm > 0.0f) {
    Value* max_norm = o->AddInitializer("grad_norm/max", Tensor::Scalar<float>(c.max_grad_norm));
    Value* eps = o->AddInitializer("grad_norm/epsilon", Tensor::Scalar<float>(1e-6f));
    Value* one = o->AddInitializer("grad_norm/one", Tensor::Scalar<float>(1.0f));
    Value* denom = o->GetOrCreateValue("grad_norm/denominator");
    Value* coef = o->GetOrCreateValue("grad_norm/clip_coef");
    Value* clamped = o->GetOrCreateValue("grad_norm/clip_coef_clamped");
    update_scale = o->GetOrCreateValue("update_scale");
    Add(*o, "Add", {norm, eps}, {denom}, "opt");
    Add(*o, "Div", {max_norm, denom}, {coef}, "opt");
    Add(*o, "Min", {coef, one}, {clamped}, "opt");
    Add(*o, "Mul", {grad_scale, clamped}, {update_scale}, "opt");
  }
  std::vector<Value*> outs = {norm};
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<Value*> in = {lr, step, update_scale, ps[i], gs[i]};
    std::vector<Value*> out = {o->GetOrCreateValue(Updated(ps[i]->name()))};
    for (Value* s : states[i]) {
      in.push_back(s);
      out.push_back(o->GetOrCreateValue(Updated(s->name())));
    }
    Node* n;
    if (c.kind == OptimizerConfig::Kind::kAdamW) {
      n = Add(*o, "AdamW", in, out, "opt", graph::kCleaveDomain);
      n->SetAttr("beta1", Attribute::Float(c.beta1));
      n->SetAttr("beta2", Attribute::Float(c.beta2));
      n->SetAttr("epsilon", Attribute::Float(c.epsilon));
      n->SetAttr("weight_decay", Attribute::Float(c.weight_decay));
    } else {
      n = Add(*o, "SGD", in, out, "opt", graph::kCleaveDomain);
      n->SetAttr("momentum", Attribute::Float(c.momentum));
      n->SetAttr("dampening", Attribute::Float(c.dampening));
      n->SetAttr("weight_decay", Attribute::Float(c.weight_decay));
      n->SetAttr("nesterov", Attribute::Int(c.nesterov ? 1 : 0));
    }
    n->metadata()["param"] = ps[i]->name();
    outs.insert(outs.end(), out.begin(), out.end());
  }
  o->SetOutputs(outs);
  return o;
}

}  // namespace

// Fused attention stores no probabilities and is the faster on both providers, in bf16 too
// (bench/RESULTS.md), where it rounds its output and the q, k, v gradients to bf16, as
// PyTorch's autocast runs scaled_dot_product_attention. In fp16 on the CPU it is not the
// default: at fp16's first loss scale those rounded gradients overflow on a step whose fp32
// ones (the unfused products return fp32) do not.
bool FusesAttentionByDefault(bool cuda, Precision precision) { return cuda || precision != Precision::kFp16; }

absl::StatusOr<TrainingArtifacts> BuildTrainingArtifacts(const Graph& forward,
                                                         const TrainingSpec& spec) {
  TrainingArtifacts a;
  const OptimizerConfig& oc = spec.optimizer;
  if (oc.max_grad_norm < 0.0f) return InvalidArgument("max_grad_norm must be >= 0, got ", oc.max_grad_norm);
  if (oc.weight_decay < 0.0f) return InvalidArgument("weight_decay must be >= 0, got ", oc.weight_decay);
  if (oc.kind == OptimizerConfig::Kind::kAdamW &&
      (oc.beta1 < 0 || oc.beta1 >= 1 || oc.beta2 < 0 || oc.beta2 >= 1))
    return InvalidArgument("AdamW betas must be in [0, 1), got ", oc.beta1, ", ", oc.beta2);
  a.forward = forward.Clone();
  std::unique_ptr<Graph> g = forward.Clone();
  g->opset_imports()[graph::kCleaveDomain] = 1;
  for (Value* v : g->inputs())
    if (!v->is_initializer()) a.data_inputs.push_back(v->name());
  RETURN_IF_ERROR(ApplyDims(*g, spec.dims));
  ASSIGN_OR_RETURN(Value* loss, AttachLoss(*g, spec.loss, &a.data_inputs));
  RETURN_IF_ERROR(graph::InferShapes(*g));
  ASSIGN_OR_RETURN(std::vector<Value*> candidates, SelectParams(*g, spec));
  std::vector<std::string> candidate_names;
  for (const Value* p : candidates) candidate_names.push_back(p->name());
  const std::set<const Value*> variable(candidates.begin(), candidates.end());
  {
    // Einsum, GroupNormalization, ... become ops with gradient rules; the constants they bring
    // (GroupNormalization 21's ones and zeros) come after the parameters were chosen, so they
    // are never trained.
    graph::OpDecomposition decompose;
    ASSIGN_OR_RETURN(bool decomposed, graph::RunPass(decompose, g.get()));
    if (decomposed) RETURN_IF_ERROR(graph::InferShapes(*g));
  }
  {
    // Fold shape arithmetic and constant subgraphs (masks, rotary tables) now that the dims
    // are fixed, so every value the backward graph sees has a static shape. Candidates stay
    // variable; folded results are new initializers, never parameters.
    g->AddOutput(loss);  // so dead-code elimination keeps it
    RETURN_IF_ERROR(FoldConstants(*g, [&variable](const Value* v) { return variable.count(v) > 0; }));
  }
  {
    // Turn the GELU, LayerNorm, RMSNorm, SwiGLU and rotary subgraphs of exports into their
    // ai.cleave ops before autodiff, so the backward runs the fused gradient kernels (GeluGrad,
    // LayerNormalizationGrad, ...) instead of differentiating each small op. The rewrites
    // keep every value they do not remove, so parameters stay the same Values; fused nodes
    // keep their pattern's metadata (BuildBackward tags untagged ones role=fwd).
    graph::ActivationNormFusion fusion;
    graph::DeadCodeElimination dce;
    RETURN_IF_ERROR(graph::RunToFixedPoint({&fusion, &dce}, g.get()));
    // The rotary tables the fusion laid out for the embeddings' new places (ahead of the
    // head swaps) are constants again.
    RETURN_IF_ERROR(FoldConstants(*g, [&variable](const Value* v) { return variable.count(v) > 0; }));
    if (spec.fuse_attention) {
      graph::AttentionFusion attention;
      RETURN_IF_ERROR(graph::RunToFixedPoint({&attention, &dce}, g.get()));
    }
  }
  // Like PyTorch, where a parameter the loss does not reach keeps grad None and the optimizer
  // skips it (no weight decay either): such parameters are not trained. The passes above drop
  // initializers nothing reads, so candidates are looked up again by name; a dropped one
  // does not reach the loss either.
  std::vector<std::string> unreached;
  candidates.clear();
  for (const std::string& name : candidate_names) {
    Value* v = g->FindValue(name);
    if (v && v->is_initializer()) candidates.push_back(v);
    else unreached.push_back(name);
  }
  {
    std::unique_ptr<Graph> probe = g->Clone();
    std::vector<Value*> wrt;
    for (Value* p : candidates) wrt.push_back(probe->FindValue(p->name()));
    RETURN_IF_ERROR(BuildBackward(*probe, probe->FindValue(kLoss), wrt, &unreached).status());
  }
  std::vector<Value*> params;
  for (Value* p : candidates)
    if (std::find(unreached.begin(), unreached.end(), p->name()) == unreached.end()) params.push_back(p);
  std::sort(unreached.begin(), unreached.end());
  a.unreached = unreached;
  if (params.empty())
    return InvalidArgument("no parameter reaches the loss '", loss->name(), "' through differentiable ops");
  for (Value* p : params) {
    if (!p->shape().is_static()) return Internal("parameter '", p->name(), "' has no static shape");
    a.params.push_back(p->name());
    a.initial.emplace(p->name(), *p->initializer());
    g->ClearInitializer(p);
    g->AddInput(p->name(), p->dtype(), p->shape());
  }
  // Training-mode BatchNormalization's running statistics are buffers, as PyTorch's: graph
  // inputs the session owns, which each training run replaces with the node's running_mean and
  // running_var (outputs `<name>.updated`), and which evaluation normalises by.
  std::vector<std::pair<Node*, int>> buffer_outputs;  // the node and its output (1 or 2) per buffer
  for (const auto& n : g->nodes()) {
    if (!IsBatchNorm(*n) || n->AttrInt("training_mode", 0) == 0) continue;
    for (int i : {3, 4}) {
      Value* v = n->input(i);
      if (!v || !v->is_initializer() || v->dtype() != DataType::kFloat32) continue;
      if (std::find(a.buffers.begin(), a.buffers.end(), v->name()) != a.buffers.end())
        return Unimplemented(n->Describe(), ": running statistic '", v->name(),
                             "' is read by more than one training-mode BatchNormalization");
      a.buffers.push_back(v->name());
      buffer_outputs.emplace_back(n.get(), i - 2);
    }
  }
  for (const std::string& b : a.buffers) {
    Value* v = g->FindValue(b);
    a.initial.emplace(b, *v->initializer());
    g->ClearInitializer(v);
    g->AddInput(b, v->dtype(), v->shape());
  }
  // The eval graph: forward + loss.
  a.eval = g->Clone();
  std::vector<Value*> eval_outs = {a.eval->FindValue(kLoss)};
  for (Value* v : forward.outputs()) eval_outs.push_back(a.eval->FindValue(v->name()));
  a.eval->SetOutputs(eval_outs);
  a.eval->info().graph_name = "eval";
  // Evaluation runs Dropout as the identity, like model.eval().
  Value* off = nullptr;
  for (const auto& n : a.eval->nodes()) {
    if (n->op_type() != "Dropout" || !n->domain().empty() || n->num_inputs() < 3 || !n->input(2)) continue;
    if (!off) off = a.eval->AddInitializer(a.eval->UniqueName("eval/training_mode_off"), Tensor::Scalar<bool>(false));
    a.eval->SetNodeInput(n.get(), 2, off);
  }
  // ... and BatchNormalization by its running statistics, like model.eval().
  for (const auto& n : a.eval->nodes()) {
    if (!IsBatchNorm(*n) || n->AttrInt("training_mode", 0) == 0) continue;
    n->SetAttr("training_mode", Attribute::Int(0));
    for (int o = n->num_outputs() - 1; o >= 1; --o) a.eval->SetNodeOutput(n.get(), o, nullptr);
  }

  // The training graph: forward + loss + backward + in-place accumulation.
  ASSIGN_OR_RETURN(auto grads, BuildBackward(*g, loss, params));
  Value* reset = g->AddInput(kLazyResetGrad, DataType::kBool, Shape::Scalar());
  std::vector<Value*> outs = {loss};
  for (Value* p : params) {
    Value* buffer = g->AddInput(AccumulationBuffer(p->name()), DataType::kFloat32, p->shape());
    Value* acc = g->GetOrCreateValue(AccumulationOut(p->name()));
    Node* n = Add(*g, "InPlaceAccumulator", {buffer, grads.at(p->name()), reset}, {acc}, "bwd",
                  graph::kCleaveDomain);
    n->metadata()["grad_of"] = p->name();
    outs.push_back(acc);
  }
  // The running statistics' updates follow the accumulation outputs.
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    auto [n, o] = buffer_outputs[i];
    Value* updated = g->GetOrCreateValue(Updated(a.buffers[i]));
    if (Value* existing = n->num_outputs() > o ? n->output(o) : nullptr)
      Add(*g, "Identity", {existing}, {updated}, "fwd");
    else
      g->SetNodeOutput(n, o, updated);
    outs.push_back(updated);
  }
  RETURN_IF_ERROR(graph::InferShapes(*g));
  // Inputs in ORT's order: data, parameters, accumulation buffers, lazy_reset_grad; then the
  // running statistics.
  std::vector<Value*> ordered;
  for (const std::string& n : a.data_inputs) ordered.push_back(g->FindValue(n));
  for (Value* p : params) ordered.push_back(p);
  for (Value* p : params) ordered.push_back(g->FindValue(AccumulationBuffer(p->name())));
  ordered.push_back(reset);
  for (const std::string& b : a.buffers) ordered.push_back(g->FindValue(b));
  for (Value* v : std::vector<Value*>(g->inputs())) g->RemoveInput(v);
  for (Value* v : ordered) g->AddInput(v->name(), v->dtype(), v->shape());
  g->SetOutputs(outs);
  g->info().graph_name = "training";
  RETURN_IF_ERROR(ApplyRecompute(*g, spec.recompute, a.params).status());
  RETURN_IF_ERROR(ApplyAutocast(*g, spec.precision).status());
  RETURN_IF_ERROR(ApplyAutocast(*a.eval, spec.precision).status());
  if (spec.precision == Precision::kFp16) RETURN_IF_ERROR(AddLossScaleInput(*g, kLoss));
  // The backward's own shape arithmetic (Shape of static values) folds too, so the graph the
  // session and the partitioner see has none.
  RETURN_IF_ERROR(FoldConstants(*g, [](const Value* v) { return v->is_graph_input(); }));
  RETURN_IF_ERROR(graph::Verify(*g, /*require_types=*/true));
  a.training = std::move(g);
  a.optimizer = BuildOptimizer(params, oc, &a.state_suffixes);
  RETURN_IF_ERROR(graph::InferShapes(*a.optimizer));
  return a;
}

absl::Status SaveArtifacts(const TrainingArtifacts& a, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgument("cannot create directory '", dir, "': ", ec.message());
  RETURN_IF_ERROR(onnx_ext::SaveModel(*a.training, dir + "/training_model.onnx"));
  RETURN_IF_ERROR(onnx_ext::SaveModel(*a.eval, dir + "/eval_model.onnx"));
  return onnx_ext::SaveModel(*a.optimizer, dir + "/optimizer_model.onnx");
}

}  // namespace cleave::trainer
