// Single-node evaluation with heap-allocated outputs (runtime/).
#include "runtime/constant_evaluator.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "runtime/executor_step.h"

namespace cleave::runtime {

namespace {

class HeapContext : public providers::KernelContext {
 public:
  HeapContext(const graph::Node& n, ThreadPool* pool) : node_(n), pool_(pool) {
    for (const graph::Value* v : n.inputs()) {
      if (v && v->initializer()) inputs_.push_back(v->initializer()->view());
      else inputs_.emplace_back();
      has_.push_back(v != nullptr);
    }
    outputs_.resize(n.num_outputs());
    views_.resize(n.num_outputs());
  }
  int num_inputs() const override { return static_cast<int>(inputs_.size()); }
  int num_outputs() const override { return static_cast<int>(outputs_.size()); }
  const TensorView* input(int i) const override {
    return i < static_cast<int>(inputs_.size()) && has_[i] ? &inputs_[i] : nullptr;
  }
  TensorView* Output(int i, std::span<const int64_t> dims) override {
    if (i >= num_outputs() || !node_.output(i)) return nullptr;
    const DataType dtype = node_.output(i)->dtype();
    outputs_[i] = Tensor::TryAllocate(dtype, std::vector<int64_t>(dims.begin(), dims.end()));
    if (!outputs_[i].defined()) {
      if (error_.ok()) error_ = HostOutputError(node_, i, dtype, dims);
      return nullptr;
    }
    views_[i] = outputs_[i].view();
    return &views_[i];
  }
  void* Scratch(size_t bytes) override {
    Tensor t = Tensor::TryAllocate(DataType::kUInt8, {static_cast<int64_t>(bytes)});
    if (!t.defined()) {
      if (error_.ok())
        error_ = absl::ResourceExhaustedError(absl::StrCat("scratch of ", bytes, " bytes: the host allocation failed"));
      return nullptr;
    }
    scratch_.push_back(std::move(t));
    return scratch_.back().raw();
  }
  ThreadPool* thread_pool() const override { return pool_; }
  std::vector<Tensor> TakeOutputs() { return std::move(outputs_); }
  // The first output or scratch that could not be had (it explains whatever the kernel said).
  const absl::Status& allocation_error() const { return error_; }

 private:
  const graph::Node& node_;
  ThreadPool* pool_;
  std::vector<TensorView> inputs_;
  std::vector<bool> has_;
  std::vector<Tensor> outputs_;
  std::vector<TensorView> views_;
  std::vector<Tensor> scratch_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<std::vector<Tensor>> EvaluateNode(const graph::Graph& g, const graph::Node& node,
                                                 const providers::ExecutionProvider& cpu) {
  ASSIGN_OR_RETURN(graph::ResolvedOp op, graph::ResolveNode(g, node));
  std::string why;
  const providers::KernelDef* def = cpu.registry().Find(node, op.version, &why);
  if (!def) return Unimplemented(node.Describe(), ": ", why);
  ASSIGN_OR_RETURN(std::unique_ptr<providers::OpKernel> kernel, def->create(node, op.version));
  HeapContext ctx(node, cpu.thread_pool());
  absl::Status s = kernel->Compute(ctx);
  if (!ctx.allocation_error().ok()) s = ctx.allocation_error();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(node.Describe(), ": ", s.message()));
  return ctx.TakeOutputs();
}

graph::ConstantEvaluator MakeConstantEvaluator(const graph::Graph& g,
                                               const providers::ExecutionProvider& cpu) {
  return [&g, &cpu](const graph::Node& n) { return EvaluateNode(g, n, cpu); };
}

}  // namespace cleave::runtime
