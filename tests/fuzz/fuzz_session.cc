// libFuzzer target for inference sessions (tests/fuzz/): a model that loads and whose shapes
// infer within a small budget goes through a session's optimiser (constant folding, the
// fusions, the layout passes, memory planning), and when every input's shape is known, one run
// on deterministic small inputs. Each step either succeeds or returns a Status; nothing may
// crash, hang or abort.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  auto g = onnx_ext::LoadModelFromBytes(std::string(reinterpret_cast<const char*>(data), size), "", "fuzz input");
  if (!g.ok()) return 0;
  SessionOptions options;
  options.intra_op_threads = 1;
  options.free_dimension_overrides = fuzz::FreeDims(**g);
  if (!fuzz::WithinBudget(**g)) return 0;
  auto session = InferenceSession::FromGraph(std::move(*g), options);
  if (!session.ok()) return 0;
  Feeds feeds;
  for (const IoInfo& in : (*session)->inputs()) {
    Tensor t;
    if (!fuzz::MakeInput(in.dtype, in.shape, &t)) return 0;
    feeds.emplace_back(in.name, std::move(t));
  }
  (void)(*session)->Run(feeds);
  return 0;
}
