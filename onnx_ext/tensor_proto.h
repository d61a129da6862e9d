// TensorProto <-> Tensor conversion (onnx_ext/, internal: includes protobuf headers).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "base/tensor.h"
#include "onnx/onnx_pb.h"

namespace cleave::onnx_ext {

// `base_dir` resolves external data; `what` names the tensor in errors.
absl::StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& p, const std::string& base_dir,
                                       const std::string& what);
void TensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* p);

}  // namespace cleave::onnx_ext
