// ModelProto -> Graph (onnx_ext/). Reads with a 2 GB+ byte limit, converts value infos,
// initializers (external data mapped), nodes and attributes, and checks that every node
// input exists so a broken model fails here with the node named, not later in a kernel.
#include <fstream>
#include <map>
#include <set>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "onnx_ext/onnx_io.h"
#include "onnx_ext/tensor_proto.h"

namespace cleave::onnx_ext {

namespace {

using graph::Attribute;
using graph::Graph;

absl::StatusOr<std::pair<DataType, Shape>> ConvertType(const onnx::TypeProto& type,
                                                       const std::string& what) {
  if (!type.has_tensor_type())
    return Unimplemented(what, ": only tensor types are supported (sequences, maps and optionals "
                               "are not)");
  const auto& tt = type.tensor_type();
  DataType dtype = DataTypeFromInt(tt.elem_type());
  if (dtype == DataType::kUndefined && tt.elem_type() != 0)
    return Unimplemented(what, ": element type ", tt.elem_type(),
                         " (float8, int4 and similar) is not supported");
  Shape shape;
  if (tt.has_shape()) {
    std::vector<Dim> dims;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value()) dims.emplace_back(d.dim_value());
      else if (d.has_dim_param() && !d.dim_param().empty()) dims.push_back(Dim::Symbol(d.dim_param()));
      else dims.emplace_back();
    }
    shape = Shape(std::move(dims));
  }
  return std::make_pair(dtype, shape);
}

absl::StatusOr<Attribute> ConvertAttribute(const onnx::AttributeProto& a, const std::string& base_dir,
                                           const std::string& what) {
  if (!a.ref_attr_name().empty())
    return Unimplemented(what, ": attribute '", a.name(), "' refers to a function attribute");
  switch (a.type()) {
    case onnx::AttributeProto::INT: return Attribute::Int(a.i());
    case onnx::AttributeProto::FLOAT: return Attribute::Float(a.f());
    case onnx::AttributeProto::STRING: return Attribute::String(a.s());
    case onnx::AttributeProto::INTS: return Attribute::Ints({a.ints().begin(), a.ints().end()});
    case onnx::AttributeProto::FLOATS: return Attribute::Floats({a.floats().begin(), a.floats().end()});
    case onnx::AttributeProto::STRINGS:
      return Attribute::Strings({a.strings().begin(), a.strings().end()});
    case onnx::AttributeProto::TENSOR: {
      ASSIGN_OR_RETURN(Tensor t, TensorFromProto(a.t(), base_dir,
                                                 absl::StrCat(what, " attribute '", a.name(), "'")));
      return Attribute::TensorValue(std::move(t));
    }
    case onnx::AttributeProto::GRAPH: case onnx::AttributeProto::GRAPHS: {
      Attribute g;
      g.type = graph::AttrType::kGraph;  // kept as a marker: no kernel takes subgraphs
      return g;
    }
    default:
      return Unimplemented(what, ": attribute '", a.name(), "' has unsupported type ",
                           static_cast<int>(a.type()));
  }
}

absl::Status ImportNodes(const onnx::GraphProto& gp, const std::string& base_dir, Graph& g) {
  std::map<std::string, int> op_counts;
  std::vector<std::string> missing;
  // Values defined so far: inputs, initializers, and outputs of every node (ONNX does not
  // require nodes in order, so collect all outputs first).
  std::set<std::string> defined;
  for (const auto& v : gp.input()) defined.insert(v.name());
  for (const auto& t : gp.initializer()) defined.insert(t.name());
  for (const auto& n : gp.node())
    for (const auto& o : n.output()) defined.insert(o);
  for (const auto& np : gp.node()) {
    std::string name = np.name();
    if (name.empty()) name = absl::StrCat(np.op_type(), "_", op_counts[np.op_type()]++);
    std::string what = absl::StrCat(np.op_type(), " '", name, "'");
    std::vector<graph::Value*> ins, outs;
    for (const auto& in : np.input()) {
      if (in.empty()) {
        ins.push_back(nullptr);
        continue;
      }
      if (!defined.count(in))
        missing.push_back(absl::StrCat(what, ": input '", in,
                                       "' is not a graph input, an initializer or any node's output"));
      ins.push_back(g.GetOrCreateValue(in));
    }
    for (const auto& out : np.output()) outs.push_back(out.empty() ? nullptr : g.GetOrCreateValue(out));
    for (graph::Value* o : outs)
      if (o && o->producer())
        return InvalidArgument(what, ": output '", o->name(), "' is already produced by ",
                               o->producer()->Describe());
    graph::Node* n = g.AddNode(np.op_type(), ins, outs, name, np.domain());
    n->set_doc_string(np.doc_string());
    for (const auto& a : np.attribute()) {
      ASSIGN_OR_RETURN(Attribute attr, ConvertAttribute(a, base_dir, what));
      n->SetAttr(a.name(), std::move(attr));
    }
  }
  if (!missing.empty()) return InvalidArgument(absl::StrJoin(missing, "\n"));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> ConvertModel(const onnx::ModelProto& m,
                                                    const std::string& base_dir) {
  if (!m.has_graph()) return InvalidArgument("model has no graph");
  auto g = std::make_unique<Graph>();
  auto& info = g->info();
  info.ir_version = m.ir_version();
  info.producer_name = m.producer_name();
  info.producer_version = m.producer_version();
  info.domain = m.domain();
  info.model_version = m.model_version();
  info.doc_string = m.doc_string();
  info.graph_name = m.graph().name();
  info.graph_doc_string = m.graph().doc_string();
  for (const auto& kv : m.metadata_props()) info.metadata_props.emplace_back(kv.key(), kv.value());
  for (const auto& op : m.opset_import())
    g->opset_imports()[op.domain() == "ai.onnx" ? "" : op.domain()] = op.version();
  if (m.opset_import_size() == 0) g->opset_imports()[""] = 1;  // IR < 3 implied opset 1

  const onnx::GraphProto& gp = m.graph();
  if (gp.sparse_initializer_size() > 0)
    return Unimplemented("sparse initializers are not supported ('",
                         gp.sparse_initializer(0).values().name(), "')");
  for (const auto& t : gp.initializer()) {
    ASSIGN_OR_RETURN(Tensor tensor, TensorFromProto(t, base_dir, absl::StrCat("initializer '", t.name(), "'")));
    g->AddInitializer(t.name(), std::move(tensor));
  }
  for (const auto& vi : gp.input()) {
    graph::Value* v = g->FindValue(vi.name());
    if (v && v->is_initializer()) continue;  // old IR lists initializers as inputs too
    ASSIGN_OR_RETURN(auto type, ConvertType(vi.type(), absl::StrCat("graph input '", vi.name(), "'")));
    g->AddInput(vi.name(), type.first, type.second);
  }
  RETURN_IF_ERROR(ImportNodes(gp, base_dir, *g));
  for (const auto& vi : gp.value_info()) {
    graph::Value* v = g->FindValue(vi.name());
    if (!v || v->is_initializer() || !vi.type().has_tensor_type()) continue;
    auto type = ConvertType(vi.type(), vi.name());
    if (type.ok()) {
      v->set_dtype(type->first);
      v->set_shape(type->second);
    }
  }
  for (const auto& vi : gp.output()) {
    graph::Value* v = g->FindValue(vi.name());
    if (!v) return InvalidArgument("graph output '", vi.name(), "' is not produced by any node");
    if (vi.type().has_tensor_type() && !v->is_initializer() && !v->is_graph_input()) {
      auto type = ConvertType(vi.type(), vi.name());
      if (type.ok()) {
        v->set_dtype(type->first);
        v->set_shape(type->second);
      }
    }
    g->AddOutput(v);
  }
  RETURN_IF_ERROR(g->SortTopologically());
  return g;
}

absl::Status ParseModel(const std::string& bytes, onnx::ModelProto* m, const std::string& what) {
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream in(&raw);
  in.SetTotalBytesLimit(INT32_MAX);
  if (!m->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    return InvalidArgument(what, ": not a valid ONNX model (protobuf parsing failed after ",
                           in.CurrentPosition(), " of ", bytes.size(),
                           " bytes; the file is truncated or not an ONNX ModelProto)");
  if (m->ir_version() <= 0 && !m->has_graph())
    return InvalidArgument(what, ": not an ONNX model (no ir_version and no graph)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<graph::Graph>> LoadModelFromBytes(const std::string& bytes,
                                                                 const std::string& base_dir,
                                                                 const std::string& what) {
  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    return InvalidArgument(what, ": ", bytes.size(),
                           " bytes; a single ONNX protobuf cannot exceed 2 GB, store the "
                           "weights as external data");
  onnx::ModelProto m;
  RETURN_IF_ERROR(ParseModel(bytes, &m, what));
  auto g = ConvertModel(m, base_dir);
  if (!g.ok()) return absl::Status(g.status().code(), absl::StrCat(what, ": ", g.status().message()));
  return g;
}

absl::StatusOr<std::unique_ptr<graph::Graph>> LoadModel(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open model file '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string dir = std::filesystem::path(path).parent_path().string();
  return LoadModelFromBytes(ss.str(), dir.empty() ? "." : dir, path);
}

absl::StatusOr<std::pair<std::string, Tensor>> LoadTensorFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound("cannot open tensor file '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  onnx::TensorProto p;
  if (!p.ParseFromString(ss.str()))
    return InvalidArgument(path, ": not a serialized onnx.TensorProto");
  std::string dir = std::filesystem::path(path).parent_path().string();
  ASSIGN_OR_RETURN(Tensor t, TensorFromProto(p, dir, path));
  return std::make_pair(p.name(), std::move(t));
}

}  // namespace cleave::onnx_ext
