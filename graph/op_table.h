// The op table (graph/): one row per operator cleave knows, giving its domain, the ONNX
// versions it has had, the first of those cleave implements, its arity, its shape and type
// inference, and whether autodiff must have a gradient rule for it. Kernels live in
// providers/ and register against these rows; a test fails if a row lacks a CPU kernel.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/graph.h"

namespace cleave::graph {

// absl::StrCat here does not take std::string_view, so names are std::string / char*.
inline constexpr char kCleaveDomain[] = "ai.cleave";
// The newest default-domain opset whose op versions this table records.
constexpr int kMaxKnownOpset = 22;

// Where a normalisation gradient's statistics, optional dX_add input and optional dX_low output
// sit: LayerNormalizationGrad(dY, X, scale, mean, inv_std_dev[, dX_add]) -> dX, dScale,
// dBias[, dX_low]; RMSNormalizationGrad(dY, X, scale, inv_std_dev[, dX_add]) -> dX,
// dScale[, dX_low] (no mean, no dBias). Zeros for any other node.
struct NormGradSlots {
  int inv_std = 0, dx_add = 0, dx_low = 0;
  bool rms = false;
};
inline NormGradSlots NormGradSlotsOf(const Node& n) {
  if (n.domain() != kCleaveDomain) return {};
  if (n.op_type() == "LayerNormalizationGrad") return {4, 5, 3, false};
  if (n.op_type() == "RMSNormalizationGrad") return {3, 4, 2, true};
  return {};
}

// The attributes of the ONNX activations that have them, with ONNX's defaults: alpha of
// LeakyRelu (0.01), Elu, Celu and ThresholdedRelu (1), Selu's alpha and gamma, HardSigmoid's
// alpha (0.2) and beta (0.5); 0 where the op has no such attribute. One reading for the
// kernels of every provider and the gradient rules.
struct ActivationAttrs {
  float alpha = 0.f, beta = 0.f, gamma = 0.f;
};
ActivationAttrs ActivationAttrsOf(const Node& n);

// Input i of `n` when its value is known at build time: an initializer, or the tensor of a
// Constant node (exporters emit those until constant folding turns them into initializers).
const Tensor* ConstantInput(const Node& n, int i);

// What an inference function sees: the node, its resolved op version, and the types,
// shapes and (when known) constant values of its inputs.
class InferContext {
 public:
  InferContext(Node& node, int version) : node_(node), version_(version) {}
  Node& node() const { return node_; }
  int version() const { return version_; }
  int num_inputs() const { return node_.num_inputs(); }
  int num_outputs() const { return node_.num_outputs(); }
  bool has_input(int i) const { return node_.input(i) != nullptr; }
  bool has_output(int i) const { return node_.output(i) != nullptr; }
  DataType input_dtype(int i) const { return node_.input(i)->dtype(); }
  const Shape& input_shape(int i) const { return node_.input(i)->shape(); }
  // The input's value when it is an initializer or a Constant node's tensor, else nullptr.
  const Tensor* input_constant(int i) const { return ConstantInput(node_, i); }
  void SetOutput(int i, DataType t, Shape s) const;

  template <typename... Args>
  absl::Status Error(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat(node_.Describe(), ": ", args...));
  }

 private:
  Node& node_;
  int version_;
};

using InferFn = absl::Status (*)(InferContext&);

struct OpDef {
  std::string domain;
  std::string name;
  // Every since_version the op has had in its domain, ascending.
  std::vector<int> versions;
  // The oldest of `versions` whose semantics cleave implements.
  int first_supported;
  int min_inputs, max_inputs;  // max -1: variadic
  int min_outputs, max_outputs;
  InferFn infer;
  bool differentiable;
  // Every session rewrites the op into other ops of the table before placing the graph
  // (graph/passes/decomposition.cc), so no provider has a kernel for it and autodiff sees
  // only what it became.
  bool decomposed = false;
};

const std::vector<OpDef>& AllOps();
const OpDef* FindOp(const std::string& domain, const std::string& name);

// The op version a model's opset import selects for `def` (the newest since_version not
// above `opset`), or an error saying what is supported when cleave lacks it.
absl::StatusOr<int> ResolveVersion(const OpDef& def, int64_t opset);

// Resolves the node's op and version against the graph's opset imports.
struct ResolvedOp {
  const OpDef* def;
  int version;
};
absl::StatusOr<ResolvedOp> ResolveNode(const Graph& g, const Node& n);

// Runs inference over the whole graph in topological order, filling every value's dtype
// and shape. Inputs must already carry theirs. Errors name the node.
absl::Status InferShapes(Graph& g);
// Infers one node (used by passes that add nodes).
absl::Status InferNode(const Graph& g, Node& n);

}  // namespace cleave::graph
