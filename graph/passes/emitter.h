// What the op decompositions share (graph/passes/decomposition.cc, einsum_decomposition.cc):
// an emitter that adds the nodes replacing one node, inferring each as it is added, and the
// constants and Reshape targets they build.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/graph.h"
#include "graph/op_table.h"

namespace cleave::graph::decompose {

// Adds the nodes that replace one node, each inferred as it is added.
class Emitter {
 public:
  Emitter(Graph* g, const Node& n)
      : g_(g), base_(n.name().empty() ? n.op_type() : n.name()), opset_(g->OpsetFor("")) {}

  absl::StatusOr<Value*> Add(const std::string& op, const std::vector<Value*>& inputs,
                             const std::map<std::string, Attribute>& attrs = {}) {
    Value* out = g_->CreateUniqueValue(absl::StrCat(base_, "/", op));
    Node* m = g_->AddNode(op, inputs, {out}, g_->UniqueName(absl::StrCat(base_, "/", op)));
    for (const auto& [k, a] : attrs) m->SetAttr(k, a);
    RETURN_IF_ERROR(InferNode(*g_, *m));
    made_.insert(out);
    return out;
  }
  // A node of `outputs` outputs.
  absl::StatusOr<std::vector<Value*>> AddN(const std::string& op, const std::vector<Value*>& inputs, int outputs,
                                           const std::map<std::string, Attribute>& attrs = {});
  // Splits x along `axis` into parts of `sizes` (an input from version 13, before it an
  // attribute).
  absl::StatusOr<std::vector<Value*>> Split(Value* x, int64_t axis, const std::vector<int64_t>& sizes);
  // Bounds x to [-bound, bound] (Clip's bounds are inputs from version 11, before it attributes).
  absl::StatusOr<Value*> ClipSymmetric(Value* x, float bound);
  Value* Ints(const std::vector<int64_t>& v) {
    return g_->AddInitializer(g_->UniqueName(base_ + "/shape"),
                              Tensor::FromVector<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  Value* Filled(DataType t, int64_t n, float value);
  // An initializer holding `t`, named after `hint`.
  Value* Constant(const std::string& hint, Tensor t) { return g_->AddInitializer(g_->UniqueName(hint), std::move(t)); }
  // Ones on the diagonal of axes p and q (both n), zeros elsewhere, every other axis 1.
  Value* Eye(DataType t, int rank, int p, int q, int64_t n);
  // A 0-D constant of type t.
  Value* Scalar(DataType t, double v);
  absl::StatusOr<Value*> Reshape(Value* x, const std::vector<int64_t>& target) { return Add("Reshape", {x, Ints(target)}); }
  // Unsqueeze and Squeeze take their axes as an input from version 13.
  absl::StatusOr<Value*> Unsqueeze(Value* x, const std::vector<int64_t>& axes) { return Axes("Unsqueeze", x, axes); }
  absl::StatusOr<Value*> Squeeze(Value* x, const std::vector<int64_t>& axes) { return Axes("Squeeze", x, axes); }
  absl::StatusOr<Value*> Cast(Value* x, DataType to) {
    if (x->dtype() == to) return x;
    return Add("Cast", {x}, {{"to", Attribute::Int(static_cast<int64_t>(to))}});
  }
  absl::StatusOr<Value*> Transpose(Value* x, const std::vector<int64_t>& perm) {
    bool identity = true;
    for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
    if (identity) return x;
    return Add("Transpose", {x}, {{"perm", Attribute::Ints(perm)}});
  }
  absl::StatusOr<Value*> Axes(const std::string& op, Value* x, const std::vector<int64_t>& axes) {
    if (opset_ >= 13) return Add(op, {x, Ints(axes)});
    return Add(op, {x}, {{"axes", Attribute::Ints(axes)}});
  }
  // Sums over `axes`, dropping them unless `keepdims`.
  absl::StatusOr<Value*> ReduceSum(Value* x, const std::vector<int64_t>& axes, bool keepdims = false) {
    if (axes.empty()) return x;
    return Reduce("ReduceSum", x, axes, keepdims);
  }
  // A reduction over `axes` (an input from version 13 for ReduceSum, 18 for the others).
  absl::StatusOr<Value*> Reduce(const std::string& op, Value* x, const std::vector<int64_t>& axes, bool keepdims) {
    const Attribute keep = Attribute::Int(keepdims);
    if (opset_ >= (op == "ReduceSum" ? 13 : 18)) return Add(op, {x, Ints(axes)}, {{"keepdims", keep}});
    return Add(op, {x}, {{"axes", Attribute::Ints(axes)}, {"keepdims", keep}});
  }
  // Makes `v` the replaced node's output `out`: its producer (added here) writes `out`, or an
  // Identity copies v there when v is not one of ours or other nodes read it. Dims the replaced
  // node's inference knew (from constant inputs) and the rewrite's cannot see stay known.
  absl::Status Finish(Value* v, Value* out);

 private:
  Graph* g_;
  std::string base_;
  int64_t opset_;
  std::set<const Value*> made_;
};

// Sets element i of t (of any fixed-size type) to v, converted as a C++ cast converts it.
void SetElement(Tensor& t, int64_t i, double v);

// A Reshape target from sizes that may be unknown: at most one unknown size becomes -1;
// more is an error naming `node` and saying what (`what`) had them.
absl::StatusOr<std::vector<int64_t>> Target(const std::string& node, const std::vector<std::optional<int64_t>>& sizes,
                                            const std::string& what);

// Dim `axis` of v's shape when static.
std::optional<int64_t> StaticDim(const Value* v, int axis);

// Einsum into Transposes, ReduceSums, Reshapes and broadcasting MatMuls (einsum_decomposition.cc).
absl::Status DecomposeEinsum(Graph* g, Node* n);

// QuantizeLinear and DequantizeLinear as float arithmetic and Casts (quantize_decomposition.cc).
absl::Status DecomposeQuantize(Graph* g, Node* n, int version);
absl::Status DecomposeDynamicQuantize(Graph* g, Node* n);

// Index arithmetic from the input's shape (layout_decomposition.cc).
absl::Status DecomposeCenterCropPad(Graph* g, Node* n);
absl::Status DecomposeReverseSequence(Graph* g, Node* n);
absl::Status DecomposeMaxUnpool(Graph* g, Node* n);
absl::Status DecomposeAffineGrid(Graph* g, Node* n);
absl::Status DecomposeCol2Im(Graph* g, Node* n);

// RNN, GRU and LSTM unrolled over their sequence (rnn_decomposition.cc).
absl::Status DecomposeRecurrent(Graph* g, Node* n, int version);

}  // namespace cleave::graph::decompose
