// Meshes, shardings and the simulated communicator: the building blocks of the partitioner
// and of multi-rank tests.
#include <thread>

#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "onnx_ext/cleave_schemas.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"
#include "partition/mesh.h"
#include "runtime/simulated_communicator.h"

namespace cleave {
namespace {

using partition::Mesh;
using partition::Sharding;

TEST(Mesh, ParsesAndMapsRanksWithTpInnermost) {
  auto m = Mesh::Parse("dp=2,pp=2,tp=2");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->world_size(), 8);
  EXPECT_EQ(m->ToString(), "dp=2,pp=2,tp=2");
  EXPECT_EQ(m->Coords(5), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m->Rank({1, 0, 1}), 5);
  EXPECT_EQ(m->Group(5, "tp"), (std::vector<int>{4, 5}));  // consecutive ranks
  EXPECT_EQ(m->Group(5, "pp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(m->Group(5, "dp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(m->Group(5, std::vector<std::string>{"dp", "tp"}), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(m->size("cp"), 1);
  EXPECT_EQ(m->Coord(6, "pp"), 1);
}

TEST(Mesh, BadSpecsAreRejectedWithTheReason) {
  auto expect = [](const std::string& spec, const std::string& needle) {
    auto m = Mesh::Parse(spec);
    ASSERT_FALSE(m.ok()) << spec;
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status();
  };
  expect("dp=2,xp=2", "unknown mesh axis 'xp'");
  expect("dp=2,dp=2", "appears twice");
  expect("tp=0", "size 0");
  expect("tp", "expected AXIS=SIZE");
  expect("", "names no axis");
}

TEST(Sharding, LocalShapesOffsetsAndDivisibility) {
  auto m = *Mesh::Parse("dp=2,tp=4");
  Sharding s{{{"dp"}, {}, {"tp"}}, {}};
  EXPECT_EQ(s.ToString(), "[dp,-,tp]");
  auto local = partition::LocalShape(m, "h", Shape::FromDims({8, 16, 64}), s);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->ToString(), "[4,16,16]");
  EXPECT_EQ(partition::ShardOffset(m, 6, s, 2, 64), 32);  // rank 6 = dp 1, tp 2
  EXPECT_EQ(partition::ShardOffset(m, 6, s, 0, 8), 4);
  Sharding both{{{"dp", "tp"}}, {"pp"}};
  auto bad = partition::ValidateSharding(m, "w", Shape::FromDims({16}), both);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("does not have"), std::string::npos) << bad;
  auto indivisible = partition::LocalShape(m, "wte.weight", Shape::FromDims({50257, 768}), Sharding{{{"tp"}, {}}, {}});
  ASSERT_FALSE(indivisible.ok());
  EXPECT_NE(indivisible.status().message().find("tensor 'wte.weight' dim 0 of size 50257"), std::string::npos)
      << indivisible.status();
  EXPECT_NE(indivisible.status().message().find("does not divide by tp = 4"), std::string::npos);
  Sharding twice{{{"tp"}, {"tp"}}, {}};
  EXPECT_FALSE(partition::ValidateSharding(m, "x", Shape::FromDims({4, 4}), twice).ok());
}

// Runs fn(rank, comm) on one thread per rank.
template <typename Fn>
void OnEveryRank(runtime::SimulatedWorld& w, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < w.world_size(); ++r) threads.emplace_back([&, r] { fn(r, w.rank(r)); });
  for (auto& t : threads) t.join();
}

TEST(SimulatedWorld, CollectivesComputeExactResults) {
  runtime::SimulatedWorld w(4);
  const std::vector<int> all = {0, 1, 2, 3};
  std::vector<std::vector<float>> reduced(4), gathered(4), scattered(4), exchanged(4), bcast(4);
  std::vector<absl::Status> errors(4);
  OnEveryRank(w, [&](int r, Communicator* c) {
    std::vector<float> x(8);
    for (int i = 0; i < 8; ++i) x[i] = static_cast<float>(r * 10 + i);
    std::vector<int64_t> d8 = {8}, d2 = {2}, d32 = {32};
    TensorView xv(x.data(), DataType::kFloat32, d8);
    reduced[r] = x;  // in place
    absl::Status s = c->AllReduce(xv, TensorView(reduced[r].data(), DataType::kFloat32, d8), ReduceOp::kSum, all);
    gathered[r].resize(32);
    if (s.ok()) s = c->AllGather(xv, TensorView(gathered[r].data(), DataType::kFloat32, d32), all);
    scattered[r].resize(2);
    if (s.ok()) s = c->ReduceScatter(xv, TensorView(scattered[r].data(), DataType::kFloat32, d2), ReduceOp::kSum, all);
    exchanged[r].resize(8);
    if (s.ok()) s = c->AllToAll(xv, TensorView(exchanged[r].data(), DataType::kFloat32, d8), all);
    bcast[r] = x;
    if (s.ok()) s = c->Broadcast(TensorView(bcast[r].data(), DataType::kFloat32, d8), 2, all);
    errors[r] = s;
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[r].ok()) << errors[r];
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(reduced[r][i], 60.0f + 4 * i);                     // sum over ranks of r*10 + i
      EXPECT_EQ(exchanged[r][i], (i / 2) * 10 + r * 2 + i % 2);    // chunk r of rank i/2
      EXPECT_EQ(bcast[r][i], 20.0f + i);
    }
    for (int i = 0; i < 32; ++i) EXPECT_EQ(gathered[r][i], (i / 8) * 10 + i % 8);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(scattered[r][i], 60.0f + 4 * (r * 2 + i));
  }
  EXPECT_EQ(w.bytes_sent(0), 5 * 32);  // five collectives of 8 floats each
}

TEST(SimulatedWorld, SubgroupsSendRecvAndMismatches) {
  runtime::SimulatedWorld w(4, std::chrono::milliseconds(300));
  std::vector<absl::Status> errors(4);
  std::vector<float> got(4, -1);
  OnEveryRank(w, [&](int r, Communicator* c) {
    std::vector<int64_t> d1 = {1};
    float v = static_cast<float>(r + 1);
    const std::vector<int> pair = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    absl::Status s = c->AllReduce(TensorView(&v, DataType::kFloat32, d1), TensorView(&v, DataType::kFloat32, d1),
                                  ReduceOp::kMax, pair);
    if (s.ok() && r % 2 == 0) s = c->Send(TensorView(&v, DataType::kFloat32, d1), r + 1, 7);
    if (s.ok() && r % 2 == 1) s = c->Recv(TensorView(&got[r], DataType::kFloat32, d1), r - 1, 7);
    got[r] = r % 2 == 1 ? got[r] : v;
    errors[r] = s;
  });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(errors[r].ok()) << errors[r];
  EXPECT_EQ(got, (std::vector<float>{2, 2, 4, 4}));

  // Rank 1 never joins: rank 0 gets a clear timeout instead of hanging.
  runtime::SimulatedWorld lonely(2, std::chrono::milliseconds(200));
  float v = 1;
  std::vector<int64_t> d1 = {1};
  const std::vector<int> both = {0, 1};
  absl::Status s = lonely.rank(0)->AllReduce(TensorView(&v, DataType::kFloat32, d1), TensorView(&v, DataType::kFloat32, d1),
                                             ReduceOp::kSum, both);
  ASSERT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("missing rank(s) [1]"), std::string::npos) << s;
  absl::Status r = lonely.rank(1)->Recv(TensorView(&v, DataType::kFloat32, d1), 0, 3);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded) << r;

  // Mismatched sizes are reported on both sides.
  runtime::SimulatedWorld mixed(2, std::chrono::milliseconds(500));
  std::vector<absl::Status> st(2);
  OnEveryRank(mixed, [&](int rank, Communicator* c) {
    std::vector<float> buf(4);
    std::vector<int64_t> d = {rank == 0 ? 4 : 2};
    st[rank] = c->AllReduce(TensorView(buf.data(), DataType::kFloat32, d), TensorView(buf.data(), DataType::kFloat32, d),
                            ReduceOp::kSum, both);
  });
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE((st[0].ok() ? st[1] : st[0]).message().find("float32[4]"), std::string::npos) << st[0] << st[1];
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// The ai.cleave collective kernels, one InferenceSession per rank, on a simulated world.
TEST(CollectiveKernels, GatherReduceScatterSendRecvAcrossRanks) {
  const char* text = R"(
    input x: float32[2,3]
    g = ai.cleave.AllGather(x) {group = [0, 1], axis = 1, mesh_axis = "tp"}
    r = ai.cleave.AllReduce(x) {group = [0, 1]}
    m = ai.cleave.AllReduce(x) {group = [0, 1], reduction = "max"}
    s = ai.cleave.ReduceScatter(g) {group = [0, 1], axis = 1}
    output g, r, m, s
  )";
  runtime::SimulatedWorld world(2);
  std::vector<std::vector<Tensor>> out(2);
  std::vector<absl::Status> status(2);
  std::vector<Tensor> xs;
  for (int r = 0; r < 2; ++r) {
    Tensor x(DataType::kFloat32, {2, 3});
    for (int i = 0; i < 6; ++i) x.data<float>()[i] = static_cast<float>(r * 100 + i);
    xs.push_back(x);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto g = graph::ParseGraph(text);
      if (!g.ok()) { status[r] = g.status(); return; }
      SessionOptions o;
      o.intra_op_threads = 1;
      o.communicator = world.rank(r);
      auto s = InferenceSession::FromGraph(std::move(*g), o);
      if (!s.ok()) { status[r] = s.status(); return; }
      auto res = (*s)->Run({{"x", xs[r]}});
      status[r] = res.status();
      if (res.ok()) out[r] = *res;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    const Tensor &g = out[r][0], &sum = out[r][1], &mx = out[r][2], &sc = out[r][3];
    EXPECT_EQ(g.dims(), (std::vector<int64_t>{2, 6}));
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 6; ++j)
        EXPECT_EQ(g.data<float>()[i * 6 + j], (j / 3) * 100 + i * 3 + j % 3);
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(sum.data<float>()[i], 100 + 2 * i);
      EXPECT_EQ(mx.data<float>()[i], 100 + i);
      EXPECT_EQ(sc.data<float>()[i], 2 * (r * 100 + i));  // this rank's columns, summed twice
    }
  }
  // Send / Recv between two sessions.
  const char* sender = "input x: float32[2,3]\nd = ai.cleave.Send(x) {peer = 1, tag = 4}\noutput d";
  const char* receiver = "y = ai.cleave.Recv() {peer = 0, tag = 4, shape = [2, 3], dtype = 1}\noutput y";
  Tensor received;
  threads.clear();
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto g = graph::ParseGraph(r == 0 ? sender : receiver);
      if (!g.ok()) { status[r] = g.status(); return; }
      SessionOptions o;
      o.communicator = world.rank(r);
      auto s = InferenceSession::FromGraph(std::move(*g), o);
      if (!s.ok()) { status[r] = s.status(); return; }
      auto res = r == 0 ? (*s)->Run({{"x", xs[0]}}) : (*s)->Run(Feeds{});
      status[r] = res.status();
      if (res.ok() && r == 1) received = (*res)[0];
    });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(testing::CompareTensors(received, xs[0], 0, 0), "");
  // The collectives pass the ONNX checker with the ai.cleave schemas.
  auto g = graph::ParseGraph(text);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(graph::InferShapes(**g).ok());
  EXPECT_TRUE(onnx_ext::CheckModel(**g).ok()) << onnx_ext::CheckModel(**g);
  // Without a communicator the session says what is missing.
  auto lone = InferenceSession::FromGraph(std::move(*g));
  ASSERT_TRUE(lone.ok());
  auto res = (*lone)->Run({{"x", xs[0]}});
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("needs a communicator"), std::string::npos) << res.status();
}

}  // namespace
}  // namespace cleave
