// What the graph-pass tests share (fusion_test.cc, attention_fusion_test.cc,
// training_fusion_test.cc, llama_fusion_test.cc): random feeds, a rewritten graph run against its
// original, a pass run on a graph written as text, and the ops a graph holds.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "graph/text_format.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"

namespace cleave::graph {

// Uniform random values in [-2, 2) of the given dims.
inline Tensor Random(std::vector<int64_t> dims, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  Tensor t(DataType::kFloat32, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Random values in [-2 scale, 2 scale), rounded to bf16.
inline Tensor RandomBf16(std::vector<int64_t> dims, unsigned seed, float scale) {
  Tensor f = Random(dims, seed);
  Tensor t(DataType::kBFloat16, std::move(dims));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<uint16_t>()[i] = FloatToBFloat16(scale * f.data<float>()[i]);
  return t;
}

// Counts the nodes of each op type.
inline std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> ops;
  for (const auto& n : g.nodes()) ++ops[n->op_type()];
  return ops;
}

// The graph's ops in order, each as "domain.op" ("op" for ONNX's).
inline std::vector<std::string> OpNames(const Graph& g) {
  std::vector<std::string> ops;
  for (const auto& n : g.nodes()) ops.push_back((n->domain().empty() ? "" : n->domain() + ".") + n->op_type());
  return ops;
}

// Runs a rewritten graph and the original, unoptimised on one intra-op thread, on `feeds`
// and expects every output to agree within the tolerances.
inline void ExpectGraphsAgree(std::unique_ptr<Graph> rewritten, std::unique_ptr<Graph> original, const Feeds& feeds,
                       double atol, double rtol) {
  SessionOptions plain;
  plain.optimize = false;
  plain.intra_op_threads = 1;
  auto s1 = InferenceSession::FromGraph(std::move(rewritten), plain);
  auto s0 = InferenceSession::FromGraph(std::move(original), plain);
  ASSERT_TRUE(s1.ok() && s0.ok()) << s1.status() << s0.status();
  auto r1 = (*s1)->Run(feeds);
  auto r0 = (*s0)->Run(feeds);
  ASSERT_TRUE(r1.ok() && r0.ok()) << r1.status() << r0.status();
  ASSERT_EQ(r1->size(), r0->size());
  for (size_t i = 0; i < r0->size(); ++i) EXPECT_EQ(testing::CompareTensors((*r1)[i], (*r0)[i], atol, rtol), "") << i;
}

// `text` parsed, its shapes inferred, and `pass` (with DCE) run to a fixed point; null (and a
// test failure) where any of it fails.
inline std::unique_ptr<Graph> Rewritten(const std::string& text, Pass& pass) {
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::Status s = InferShapes(**g);
  DeadCodeElimination dce;
  if (s.ok()) s = RunToFixedPoint({&pass, &dce}, g->get());
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? std::move(*g) : nullptr;
}

// Whether one run of `pass` changes `text` (parsed, shapes inferred); a failure fails the test.
inline bool Changes(Pass& pass, const std::string& text) {
  auto g = ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok() || !InferShapes(**g).ok()) return true;
  auto changed = pass.Run(g->get());
  EXPECT_TRUE(changed.ok()) << changed.status();
  return !changed.ok() || *changed;
}

}  // namespace cleave::graph
