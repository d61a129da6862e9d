// Memory plan: overlapping lifetimes never share bytes; disjoint ones reuse them; a session's
// view ops share their input's bytes, which live as long as the view.
#include "runtime/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"

namespace cleave::runtime {
namespace {

using cleave::InferenceSession;
using cleave::SessionOptions;
using cleave::Tensor;

bool Overlap(const BufferRequest& a, int64_t oa, const BufferRequest& b, int64_t ob) {
  bool live = !(a.last_step < b.first_step || b.last_step < a.first_step);
  bool bytes = oa < ob + b.bytes && ob < oa + a.bytes;
  return live && bytes;
}

TEST(MemoryPlan, ChainReusesMemory) {
  // a -> b -> c -> d: each buffer dies when the next is made, so two slots suffice.
  std::vector<BufferRequest> r = {{1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 4}};
  MemoryPlan p = PlanMemory(r);
  EXPECT_LE(p.arena_bytes, 2 * 1024);
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = i + 1; j < r.size(); ++j) EXPECT_FALSE(Overlap(r[i], p.offsets[i], r[j], p.offsets[j]));
}

TEST(MemoryPlan, RandomIntervalsNeverCollide) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BufferRequest> r;
    int64_t total = 0;
    for (int i = 0; i < 40; ++i) {
      int a = static_cast<int>(rng() % 30), len = static_cast<int>(rng() % 10);
      r.push_back({static_cast<int64_t>(1 + rng() % 5000), a, a + len});
      total += (r.back().bytes + 63) / 64 * 64;
    }
    MemoryPlan p = PlanMemory(r);
    EXPECT_LE(p.arena_bytes, total);
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_EQ(p.offsets[i] % 64, 0);
      for (size_t j = i + 1; j < r.size(); ++j)
        ASSERT_FALSE(Overlap(r[i], p.offsets[i], r[j], p.offsets[j])) << i << " vs " << j;
    }
  }
}

// View ops (Reshape here) share their input's bytes in a session: the arena holds no copy,
// and the viewed buffer lives until the view's last use, so the work allocated after the
// Reshape never takes its bytes (run after run, on the memory plan).
TEST(ExecutorViews, ReshapeSharesItsInputsBytesAndKeepsThemAlive) {
  auto g = graph::ParseGraph(R"(
    input x: float32[256]
    init shape: int64[2] = 16 16
    r = Relu(x)
    s = Reshape(r, shape)
    a = Sigmoid(x)
    b = Sigmoid(a)
    t = Reshape(b, shape)
    y = Add(s, t)
    output y
  )");
  ASSERT_TRUE(g.ok()) << g.status();
  SessionOptions o;
  o.optimize = false;
  auto session = InferenceSession::FromGraph(std::move(*g), o);
  ASSERT_TRUE(session.ok()) << session.status();
  Tensor x(DataType::kFloat32, {256});
  for (int i = 0; i < 256; ++i) x.data<float>()[i] = 0.05f * static_cast<float>(i) - 6.f;
  for (int run = 0; run < 3; ++run) {
    auto out = (*session)->Run({{"x", x}});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ((*out)[0].dims(), (std::vector<int64_t>{16, 16}));
    for (int i = 0; i < 256; ++i) {
      const float v = x.data<float>()[i];
      const float want = std::max(v, 0.f) + 1.f / (1.f + std::exp(-1.f / (1.f + std::exp(-v))));
      ASSERT_NEAR((*out)[0].data<float>()[i], want, 1e-6) << "run " << run << " at " << i;
    }
  }
  // The bytes: Relu -> Reshape -> Relu keeps one 1 KiB buffer in the arena, where a copying
  // Reshape would hold its input and its output at once.
  auto chain = graph::ParseGraph(R"(
    input x: float32[256]
    init shape: int64[2] = 16 16
    r = Relu(x)
    s = Reshape(r, shape)
    y = Relu(s)
    output y
  )");
  ASSERT_TRUE(chain.ok()) << chain.status();
  auto c = InferenceSession::FromGraph(std::move(*chain), o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int run = 0; run < 2; ++run) ASSERT_TRUE((*c)->Run({{"x", x}}).ok());
  EXPECT_EQ((*c)->stats().arena_bytes, 1024);
}

}  // namespace
}  // namespace cleave::runtime
