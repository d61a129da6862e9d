// libFuzzer target for the ONNX loader (tests/fuzz/): arbitrary bytes must either load or
// fail with a Status; a loaded graph then goes through shape inference and back to bytes.
// Nothing here may crash, hang or abort.
#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/op_table.h"
#include "onnx_ext/onnx_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto g = cleave::onnx_ext::LoadModelFromBytes(bytes, "", "fuzz input");
  if (!g.ok()) return 0;
  (void)cleave::graph::InferShapes(**g);
  (void)cleave::onnx_ext::SerializeModel(**g);
  return 0;
}
