// Graph -> ModelProto (onnx_ext/). Writes every initializer as raw_data, or to one external
// data file when asked or when the model would not fit a 2 GB protobuf. All files are written
// atomically so a failed save never leaves a half-written model over a good one.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "onnx_ext/onnx_io.h"
#include "onnx_ext/tensor_proto.h"

namespace cleave::onnx_ext {

namespace {

using graph::AttrType;

void SetValueInfo(const graph::Value* v, onnx::ValueInfoProto* vi) {
  vi->set_name(v->name());
  if (v->dtype() == DataType::kUndefined) return;
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int>(v->dtype()));
  if (!v->shape().has_rank()) return;
  auto* shape = tt->mutable_shape();
  for (const Dim& d : v->shape().dims()) {
    auto* dim = shape->add_dim();
    if (d.is_static()) dim->set_dim_value(d.value);
    else if (!d.symbol.empty()) dim->set_dim_param(d.symbol);
  }
}

void SetAttribute(const std::string& name, const graph::Attribute& a, onnx::AttributeProto* p) {
  p->set_name(name);
  switch (a.type) {
    case AttrType::kInt: p->set_type(onnx::AttributeProto::INT); p->set_i(a.i); break;
    case AttrType::kFloat: p->set_type(onnx::AttributeProto::FLOAT); p->set_f(a.f); break;
    case AttrType::kString: p->set_type(onnx::AttributeProto::STRING); p->set_s(a.s); break;
    case AttrType::kInts:
      p->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : a.ints) p->add_ints(v);
      break;
    case AttrType::kFloats:
      p->set_type(onnx::AttributeProto::FLOATS);
      for (float v : a.floats) p->add_floats(v);
      break;
    case AttrType::kStrings:
      p->set_type(onnx::AttributeProto::STRINGS);
      for (const auto& v : a.strings) p->add_strings(v);
      break;
    case AttrType::kTensor:
      p->set_type(onnx::AttributeProto::TENSOR);
      TensorToProto(a.t, "", p->mutable_t());
      break;
    case AttrType::kGraph: p->set_type(onnx::AttributeProto::GRAPH); break;
  }
}

void BuildModel(const graph::Graph& g, onnx::ModelProto* m) {
  const auto& info = g.info();
  m->set_ir_version(info.ir_version);
  m->set_producer_name(info.producer_name);
  m->set_producer_version(info.producer_version);
  m->set_domain(info.domain);
  m->set_model_version(info.model_version);
  m->set_doc_string(info.doc_string);
  for (const auto& [k, v] : info.metadata_props) {
    auto* e = m->add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  }
  for (const auto& [domain, version] : g.opset_imports()) {
    auto* op = m->add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  auto* gp = m->mutable_graph();
  gp->set_name(info.graph_name);
  gp->set_doc_string(info.graph_doc_string);
  for (const graph::Value* v : g.inputs()) SetValueInfo(v, gp->add_input());
  for (const graph::Value* v : g.outputs()) SetValueInfo(v, gp->add_output());
  for (const graph::Value* v : g.Initializers())
    TensorToProto(*v->initializer(), v->name(), gp->add_initializer());
  for (const auto& n : g.nodes()) {
    auto* np = gp->add_node();
    np->set_name(n->name());
    np->set_op_type(n->op_type());
    np->set_domain(n->domain());
    if (!n->doc_string().empty()) np->set_doc_string(n->doc_string());
    for (const graph::Value* v : n->inputs()) np->add_input(v ? v->name() : "");
    for (const graph::Value* v : n->outputs()) {
      np->add_output(v ? v->name() : "");
      if (v && !v->is_graph_output() && v->dtype() != DataType::kUndefined)
        SetValueInfo(v, gp->add_value_info());
    }
    for (const auto& [name, a] : n->attributes()) SetAttribute(name, a, np->add_attribute());
  }
}

// Moves initializers of at least `threshold` bytes into `data_path`, written atomically.
absl::Status ExternaliseInitializers(onnx::ModelProto* m, const std::string& data_path,
                                     const std::string& location, size_t threshold) {
  std::string blob;
  for (auto& t : *m->mutable_graph()->mutable_initializer()) {
    if (t.raw_data().size() < threshold) continue;
    size_t offset = (blob.size() + 63) / 64 * 64;  // aligned so loaders may map it directly
    blob.resize(offset, '\0');
    blob += t.raw_data();
    t.clear_raw_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const std::string& k, const std::string& v) {
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", location);
    add("offset", std::to_string(offset));
    add("length", std::to_string(blob.size() - offset));
  }
  return WriteFileAtomic(data_path, blob);
}

}  // namespace

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes) {
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot write '", tmp, "'"));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("short write to '", tmp, "'"));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot flush '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeModel(const graph::Graph& g) {
  onnx::ModelProto m;
  BuildModel(g, &m);
  if (m.ByteSizeLong() > static_cast<size_t>(INT32_MAX))
    return InvalidArgument("model is ", m.ByteSizeLong(),
                           " bytes; over 2 GB it must be saved with external data");
  return m.SerializeAsString();
}

absl::Status SaveModel(const graph::Graph& g, const std::string& path, SaveOptions options) {
  onnx::ModelProto m;
  BuildModel(g, &m);
  if (m.ByteSizeLong() > static_cast<size_t>(INT32_MAX) - (1 << 20)) options.external_data = true;
  if (options.external_data) {
    std::string location = options.external_data_file.empty()
                               ? std::filesystem::path(path).filename().string() + ".data"
                               : options.external_data_file;
    std::string dir = std::filesystem::path(path).parent_path().string();
    std::string data_path = dir.empty() ? location : dir + "/" + location;
    RETURN_IF_ERROR(ExternaliseInitializers(&m, data_path, location, options.external_threshold));
  }
  return WriteFileAtomic(path, m.SerializeAsString());
}

absl::Status SaveTensorFile(const std::string& path, const std::string& name, const Tensor& t) {
  onnx::TensorProto p;
  TensorToProto(t, name, &p);
  return WriteFileAtomic(path, p.SerializeAsString());
}

}  // namespace cleave::onnx_ext
