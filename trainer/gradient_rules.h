// The gradient-rule table (trainer/): one rule per differentiable op. A rule reads the
// forward node and the gradients of its outputs, emits backward nodes through GradBuilder and
// sets the gradients of its inputs. Rules are written with the forward op set where they
// can be; Gather, Slice, SoftmaxCrossEntropyLoss, Softmax, LogSoftmax, LayerNormalization and
// Gelu emit ai.cleave gradient ops (GatherGrad, SliceGrad, SoftmaxCrossEntropyLossGrad,
// SoftmaxGrad, LogSoftmaxGrad, LayerNormalizationGrad, GeluGrad), which a provider must
// also run.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "graph/graph.h"

namespace cleave::trainer {

class GradBuilder {
 public:
  // `depends`: the values that depend on what the gradients are taken with respect to (null:
  // every input may need its gradient).
  GradBuilder(graph::Graph& g, graph::Node& fwd, int version,
              std::vector<graph::Value*> output_grads,
              const std::unordered_set<const graph::Value*>* depends = nullptr)
      : g_(g), fwd_(fwd), version_(version), dy_(std::move(output_grads)), depends_(depends) {}

  graph::Node& fwd() const { return fwd_; }
  int fwd_version() const { return version_; }
  // Whether the graph's opset takes axes as inputs (ReduceSum, Unsqueeze from 13).
  bool g_opset13() const { return g_.OpsetFor("") >= 13; }
  graph::Value* x(int i) const { return fwd_.input(i); }
  // Whether input i's gradient is wanted: it is present and depends on what the gradients are
  // taken with respect to. A rule may skip work for an input that does not.
  bool NeedsGrad(int i) const {
    const graph::Value* v = i < fwd_.num_inputs() ? fwd_.input(i) : nullptr;
    return v && (!depends_ || depends_->count(v));
  }
  graph::Value* y(int i) const { return fwd_.output(i); }
  // Gradient of output i, or nullptr when no gradient flows into it.
  graph::Value* dy(int i = 0) const { return i < static_cast<int>(dy_.size()) ? dy_[i] : nullptr; }
  // Output i of the forward node, added to the node (named `<output 0>/<suffix>`) when it
  // lacks it: for rules that read an optional output the forward computes anyway, such as
  // LayerNormalization's Mean and InvStdDev.
  graph::Value* ForwardOutput(int i, const std::string& suffix);

  // Emits a backward node with one output; its attributes follow. "ai.cleave.Op" names an op
  // of cleave's domain.
  graph::Value* Op(const std::string& op, std::vector<graph::Value*> inputs,
                   std::vector<std::pair<std::string, graph::Attribute>> attrs = {});
  // Emits a backward node with `outputs` outputs.
  std::vector<graph::Value*> OpN(const std::string& op, std::vector<graph::Value*> inputs,
                                 int outputs,
                                 std::vector<std::pair<std::string, graph::Attribute>> attrs = {});
  // A scalar constant of `like`'s dtype.
  graph::Value* Const(double v, const graph::Value* like);
  graph::Value* Ints(const std::vector<int64_t>& v);
  // v's shape as an int64 tensor: a constant where it is static (which the partitioner rewrites
  // to each rank's local shape), else Shape(v).
  graph::Value* ShapeOf(graph::Value* v);
  // A zero tensor with `like`'s dtype and (static) shape.
  graph::Value* Zeros(const graph::Value* like);
  int64_t graph_opset() const { return g_.OpsetFor(""); }
  // ReduceSum / ReduceMean over `axes` and Unsqueeze at `axes`, in the form the graph's opset
  // takes (axes as an input from opset 13, 18 for ReduceMean; as an attribute before).
  graph::Value* ReduceSum(graph::Value* v, const std::vector<int64_t>& axes, bool keepdims);
  graph::Value* ReduceMean(graph::Value* v, const std::vector<int64_t>& axes);  // keepdims
  graph::Value* Unsqueeze(graph::Value* v, const std::vector<int64_t>& axes);
  // v with its last two axes swapped.
  graph::Value* TransposeLast2(graph::Value* v);
  // Sums dx over the axes along which x was broadcast to `full`, back to x's shape.
  absl::StatusOr<graph::Value*> ReduceTo(graph::Value* dx, const graph::Value* x);

  void SetGrad(int input, graph::Value* dx);
  const std::vector<graph::Value*>& input_grads() const { return dx_; }
  absl::Status Error(const std::string& what) const;
  // The first failure of shape inference on an emitted node, if any.
  const absl::Status& status() const { return status_; }

 private:
  graph::Graph& g_;
  graph::Node& fwd_;
  int version_;
  std::vector<graph::Value*> dy_;
  std::vector<graph::Value*> dx_;
  const std::unordered_set<const graph::Value*>* depends_;
  absl::Status status_;
};

using GradRule = absl::Status (*)(GradBuilder& b);
// The rule for an op, or nullptr.
GradRule FindGradRule(const std::string& domain, const std::string& op);
std::vector<std::string> OpsWithGradRules();

}  // namespace cleave::trainer
