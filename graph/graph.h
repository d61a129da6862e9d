// The cleave IR (graph/): Values connected by Nodes inside a Graph.
// Invariants the verifier checks: every node input is a graph input, an initializer or
// another node's output; every value has at most one producer; names are unique; the
// node list can be ordered topologically. Nodes carry free-form metadata (role, grad_of)
// that later passes (autodiff, partitioner) read; ONNX keeps it in metadata_props.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "base/dtype.h"
#include "base/shape.h"
#include "base/tensor.h"
#include "graph/attribute.h"

namespace cleave::graph {

class Node;

class Value {
 public:
  const std::string& name() const { return name_; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  void set_dtype(DataType t) { dtype_ = t; }
  void set_shape(Shape s) { shape_ = std::move(s); }

  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  // (node, input index) pairs, in no particular order.
  const std::vector<std::pair<Node*, int>>& consumers() const { return consumers_; }

  bool is_initializer() const { return initializer_ != nullptr; }
  const Tensor* initializer() const { return initializer_.get(); }
  bool is_graph_input() const { return is_graph_input_; }
  bool is_graph_output() const { return is_graph_output_; }
  // For small int64 shape tensors (rank 0 or 1) that are not constants: their elements as
  // dims, when shape inference can tell (the Shape of a [batch, seq, 64] tensor is
  // {batch, seq, 64}); see graph/dims_value.h.
  const std::optional<std::vector<Dim>>& dims_value() const { return dims_value_; }
  void set_dims_value(std::optional<std::vector<Dim>> v) { dims_value_ = std::move(v); }
  // Where an initializer came from when it was stored outside the model file.
  const std::string& doc() const { return doc_; }
  void set_doc(std::string d) { doc_ = std::move(d); }

 private:
  friend class Graph;
  friend class Node;
  std::string name_;
  DataType dtype_ = DataType::kUndefined;
  Shape shape_;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  std::vector<std::pair<Node*, int>> consumers_;
  std::shared_ptr<Tensor> initializer_;
  bool is_graph_input_ = false;
  bool is_graph_output_ = false;
  std::optional<std::vector<Dim>> dims_value_;
  std::string doc_;
};

class Node {
 public:
  const std::string& name() const { return name_; }
  const std::string& op_type() const { return op_type_; }
  const std::string& domain() const { return domain_; }  // "" is the default ONNX domain
  // Missing optional inputs are nullptr.
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(int i) const { return i < static_cast<int>(inputs_.size()) ? inputs_[i] : nullptr; }
  Value* output(int i) const { return i < static_cast<int>(outputs_.size()) ? outputs_[i] : nullptr; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }

  const std::map<std::string, Attribute>& attributes() const { return attrs_; }
  bool HasAttr(const std::string& name) const { return attrs_.count(name) != 0; }
  const Attribute* FindAttr(const std::string& name) const;
  int64_t AttrInt(const std::string& name, int64_t dflt) const;
  float AttrFloat(const std::string& name, float dflt) const;
  std::string AttrString(const std::string& name, const std::string& dflt) const;
  std::vector<int64_t> AttrInts(const std::string& name, std::vector<int64_t> dflt = {}) const;
  std::vector<float> AttrFloats(const std::string& name, std::vector<float> dflt = {}) const;
  void SetAttr(const std::string& name, Attribute a) { attrs_[name] = std::move(a); }
  void RemoveAttr(const std::string& name) { attrs_.erase(name); }

  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& doc_string() const { return doc_; }
  void set_doc_string(std::string d) { doc_ = std::move(d); }

  // "Op 'name'" for error messages.
  std::string Describe() const;

 private:
  friend class Graph;
  std::string name_, op_type_, domain_, doc_;
  std::vector<Value*> inputs_, outputs_;
  std::map<std::string, Attribute> attrs_;
  std::map<std::string, std::string> metadata_;
};

struct ModelInfo {
  int64_t ir_version = 8;
  std::string producer_name = "cleave";
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
  std::string graph_name = "main";
  std::string graph_doc_string;
  std::vector<std::pair<std::string, std::string>> metadata_props;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  std::unique_ptr<Graph> Clone() const;

  // Values. Names are unique; GetOrCreate makes a fresh untyped value if absent.
  Value* FindValue(const std::string& name) const;
  Value* GetOrCreateValue(const std::string& name);
  // A new value with a name not yet used, starting from `hint`.
  Value* CreateUniqueValue(const std::string& hint);
  std::string UniqueName(const std::string& hint);

  Value* AddInput(const std::string& name, DataType t, Shape s);
  Value* AddInitializer(const std::string& name, Tensor t);
  void SetInitializer(Value* v, Tensor t);  // turns v into an initializer
  void ClearInitializer(Value* v) { v->initializer_.reset(); }
  void AddOutput(Value* v);
  void RemoveInput(Value* v);
  void ClearOutputs();
  void SetOutputs(std::vector<Value*> outs);

  // Nodes. inputs may contain nullptr for omitted optional inputs.
  Node* AddNode(const std::string& op_type, const std::vector<Value*>& inputs,
                const std::vector<Value*>& outputs, const std::string& name = "",
                const std::string& domain = "");
  void RemoveNode(Node* n);  // unlinks it from its values; the values stay
  // Replaces `n` by a node of its op, domain, name, attributes and metadata over other inputs
  // and outputs (an output's old producer, if any, loses it); `n` is gone afterwards.
  Node* RebuildNode(Node* n, std::vector<Value*> inputs, std::vector<Value*> outputs);
  void SetNodeInput(Node* n, int i, Value* v);
  // Makes `v` (which no node produces) output i of `n`, padding omitted optional outputs
  // before it with nullptr; a previous output i loses its producer.
  void SetNodeOutput(Node* n, int i, Value* v);
  // Points every consumer of `from` (and graph outputs) at `to`.
  void ReplaceAllUsesWith(Value* from, Value* to);
  // Drops values that nothing produces, consumes or exposes.
  void RemoveUnusedValues();

  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  std::vector<Value*> Initializers() const;  // sorted by name
  std::vector<Value*> AllValues() const;     // sorted by name

  // Nodes in a topological order (stable with respect to insertion), or an error naming
  // a node on a cycle.
  absl::StatusOr<std::vector<Node*>> TopologicalOrder() const;
  // Reorders nodes_ topologically.
  absl::Status SortTopologically();

  std::map<std::string, int64_t>& opset_imports() { return opsets_; }
  const std::map<std::string, int64_t>& opset_imports() const { return opsets_; }
  int64_t OpsetFor(const std::string& domain) const;  // -1 when not imported
  ModelInfo& info() { return info_; }
  const ModelInfo& info() const { return info_; }

 private:
  std::vector<std::unique_ptr<Node>> nodes_;
  std::unordered_map<std::string, std::unique_ptr<Value>> values_;
  std::vector<Value*> inputs_, outputs_;
  std::map<std::string, int64_t> opsets_;
  ModelInfo info_;
  int64_t name_counter_ = 0;
};

}  // namespace cleave::graph
