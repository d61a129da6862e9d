// ONNX <-> IR (onnx_ext/). The only layer that sees protobuf; this header keeps it out.
// Import keeps every name, initializer, opset import and metadata entry so that a model
// saved back is the same model. Initializers stored as external data are memory-mapped,
// which is also how models over 2 GB load (protobuf cannot hold them in one message).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "graph/graph.h"

namespace cleave::onnx_ext {

absl::StatusOr<std::unique_ptr<graph::Graph>> LoadModel(const std::string& path);
// `base_dir` resolves external-data locations ("" disallows external data).
absl::StatusOr<std::unique_ptr<graph::Graph>> LoadModelFromBytes(const std::string& bytes,
                                                                 const std::string& base_dir,
                                                                 const std::string& what);

struct SaveOptions {
  // Initializers of at least this many bytes go to `external_data_file` beside the model
  // when external data is on. It turns on by itself when the model would pass 2 GB.
  bool external_data = false;
  std::string external_data_file;  // default: <model file name>.data
  size_t external_threshold = 1024;
};
absl::Status SaveModel(const graph::Graph& g, const std::string& path, SaveOptions options = {});
absl::StatusOr<std::string> SerializeModel(const graph::Graph& g);

// Serialised onnx.TensorProto files, as in the ONNX backend test folders.
absl::StatusOr<std::pair<std::string, Tensor>> LoadTensorFile(const std::string& path);
absl::Status SaveTensorFile(const std::string& path, const std::string& name, const Tensor& t);

// Writes bytes atomically: a temporary file beside `path`, fsync, then rename.
absl::Status WriteFileAtomic(const std::string& path, const std::string& bytes);
// A whole file's bytes; empty when it cannot be read.
std::string ReadFileOrEmpty(const std::string& path);

}  // namespace cleave::onnx_ext
