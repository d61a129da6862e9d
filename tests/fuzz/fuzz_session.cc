// libFuzzer target for inference sessions (tests/fuzz/): a model that loads and whose shapes
// infer within a small budget goes through a session's optimiser (constant folding, the
// fusions, the layout passes, memory planning), and when every input's shape is known, one run
// on deterministic small inputs. Each step either succeeds or returns a Status; nothing may
// crash, hang or abort.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "graph/op_table.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"

namespace {

// A model this large is legitimate, but its folding and run measure memory bandwidth, not
// robustness: inputs whose known values or initializers exceed this are skipped.
constexpr int64_t kMaxElements = int64_t{1} << 16;
constexpr int64_t kMaxTotalElements = int64_t{1} << 20;

// Symbolic dims are fixed to this for the run.
constexpr int64_t kFreeDim = 2;

// Element i of a fed tensor: small values of both signs, so that index inputs stay mostly in
// range and float inputs exercise the kernels' arithmetic.
void Fill(cleave::Tensor& t) {
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case cleave::DataType::kFloat32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
      break;
    case cleave::DataType::kInt64:
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i % 3;
      break;
    case cleave::DataType::kInt32:
      for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
      break;
    case cleave::DataType::kBool:
      for (int64_t i = 0; i < n; ++i) t.data<bool>()[i] = i % 2 == 0;
      break;
    default:
      if (t.nbytes() > 0) std::memset(t.raw(), 0, t.nbytes());
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto g = onnx_ext::LoadModelFromBytes(bytes, "", "fuzz input");
  if (!g.ok()) return 0;
  std::map<std::string, int64_t> free_dims;
  for (const graph::Value* in : (*g)->inputs())
    for (const Dim& d : in->shape().dims())
      if (!d.symbol.empty()) free_dims[d.symbol] = kFreeDim;
  if (!graph::InferShapes(**g).ok()) return 0;
  int64_t total = 0;
  for (const graph::Value* v : (*g)->AllValues()) {
    const int64_t n = v->is_initializer() ? v->initializer()->numel() : v->shape().NumElements();
    if (n > kMaxElements) return 0;
    if (n > 0) total += n;
  }
  if (total > kMaxTotalElements) return 0;

  SessionOptions options;
  options.intra_op_threads = 1;
  options.free_dimension_overrides = free_dims;
  auto session = InferenceSession::FromGraph(std::move(*g), options);
  if (!session.ok()) return 0;
  Feeds feeds;
  for (const IoInfo& in : (*session)->inputs()) {
    std::vector<int64_t> dims;
    if (!in.shape.has_rank() || ElementSize(in.dtype) == 0) return 0;
    for (const Dim& d : in.shape.dims()) {
      if (!d.is_static() || d.value > 64) return 0;
      dims.push_back(d.value);
    }
    Tensor t(in.dtype, dims);
    if (t.numel() > kMaxElements) return 0;
    Fill(t);
    feeds.emplace_back(in.name, std::move(t));
  }
  (void)(*session)->Run(feeds);
  return 0;
}
