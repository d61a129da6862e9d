// Helpers of the CUDA provider tests (tests/): whether a device is usable (tests skip and say why
// without one), random feeds, and ExpectSame, which runs a graph on CUDA and on the CPU and
// compares every output.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/cuda/cuda_provider.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"

namespace cleave::cuda_testing {

// "" when device 0 is usable, else why not.
inline std::string CudaUnusable() {
  static const std::string why = [] {
    auto p = providers::CudaExecutionProvider::Create(0);
    return p.ok() ? std::string() : std::string(p.status().message());
  }();
  return why;
}
#define REQUIRE_CUDA()                                   \
  do {                                                   \
    const std::string why = CudaUnusable();              \
    if (!why.empty()) GTEST_SKIP() << why;               \
  } while (0)

inline Tensor Random(std::vector<int64_t> dims, unsigned seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DataType::kFloat32, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

inline Tensor Ids(std::vector<int64_t> dims, int64_t bound, unsigned seed) {
  std::mt19937 rng(seed);
  Tensor t(DataType::kInt64, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng() % bound);
  return t;
}

// A CUDA session of the graph `text`, unoptimised (the nodes as written).
inline absl::StatusOr<std::unique_ptr<InferenceSession>> CudaSession(const std::string& text) {
  auto g = graph::ParseGraph(text);
  if (!g.ok()) return g.status();
  SessionOptions o;
  o.optimize = false;
  o.device = DeviceChoice::kCuda;
  return InferenceSession::FromGraph(std::move(*g), o);
}

// Dims as the text format writes them: "[2,3,4]".
inline std::string DimsText(const std::vector<int64_t>& d) { return absl::StrCat("[", absl::StrJoin(d, ","), "]"); }

// Runs `cuda_text` on CUDA and `cpu_text` (the same graph by default) on the CPU, unoptimised,
// and compares every output. `op` must have run on CUDA (not fallen back).
// `edit`, when given, changes both graphs after parsing (attributes the text cannot write).
inline void ExpectSame(const std::string& cuda_text, const Feeds& feeds, double atol, double rtol, const std::string& op,
                const std::string& cpu_text = "", const std::function<void(graph::Graph&)>& edit = nullptr) {
  SessionOptions cpu_opts, cuda_opts;
  cpu_opts.optimize = cuda_opts.optimize = false;
  cuda_opts.device = DeviceChoice::kCuda;
  auto g_cuda = graph::ParseGraph(cuda_text);
  auto g_cpu = graph::ParseGraph(cpu_text.empty() ? cuda_text : cpu_text);
  ASSERT_TRUE(g_cuda.ok() && g_cpu.ok()) << g_cuda.status() << g_cpu.status();
  if (edit) {
    edit(**g_cuda);
    edit(**g_cpu);
  }
  auto cpu = InferenceSession::FromGraph(std::move(*g_cpu), cpu_opts);
  auto cuda = InferenceSession::FromGraph(std::move(*g_cuda), cuda_opts);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  // op "*": nothing may fall back (where the CPU has a kernel for every node too).
  if (op == "*") EXPECT_EQ((*cuda)->warning(), "") << "fell back: " << (*cuda)->warning();
  else EXPECT_EQ((*cuda)->warning().find(op), std::string::npos) << op << " fell back: " << (*cuda)->warning();
  EXPECT_GT((*cuda)->placement().count("CUDAExecutionProvider"), 0u);
  auto want = (*cpu)->Run(feeds);
  auto got = (*cuda)->Run(feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i)
    EXPECT_EQ(testing::CompareTensors((*got)[i], (*want)[i], atol, rtol), "") << op << " output " << i;
}

}  // namespace cleave::cuda_testing
