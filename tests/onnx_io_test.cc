// ONNX import/export: round trips, external data, models over 2 GB, and bad files.
#include <filesystem>
#include <fstream>

#include "graph/graph.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "tests/scoped_temp_dir.h"
#include "tests/test_graphs.h"

namespace cleave::onnx_ext {
namespace {

namespace fs = std::filesystem;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(OnnxIo, RoundTripKeepsNamesInitializersOpsetsAndMetadata) {
  auto g = testing::MakeMlp();
  g->opset_imports()["ai.cleave"] = 1;
  g->info().producer_name = "unit-test";
  g->info().metadata_props.emplace_back("author", "cleave");
  const testing::ScopedTempDir tmp("roundtrip");
  const std::string& dir = tmp.path();
  ASSERT_TRUE(SaveModel(*g, dir + "/m.onnx").ok());
  auto back = LoadModel(dir + "/m.onnx");
  ASSERT_TRUE(back.ok()) << back.status();
  const graph::Graph& h = **back;
  EXPECT_EQ(h.opset_imports().at(""), 17);
  EXPECT_EQ(h.opset_imports().at("ai.cleave"), 1);
  EXPECT_EQ(h.info().producer_name, "unit-test");
  ASSERT_EQ(h.info().metadata_props.size(), 1u);
  EXPECT_EQ(h.info().metadata_props[0].second, "cleave");
  ASSERT_EQ(h.nodes().size(), 3u);
  EXPECT_EQ(h.nodes()[1]->name(), "bias");
  const Tensor* w = h.FindValue("w")->initializer();
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(w->data<float>()[9], 1.f);
  EXPECT_EQ(h.inputs()[0]->shape()[0].symbol, "batch");
}

TEST(OnnxIo, ExternalDataRoundTrip) {
  auto g = testing::MakeMlp();
  const testing::ScopedTempDir tmp("external");
  const std::string& dir = tmp.path();
  SaveOptions opts;
  opts.external_data = true;
  opts.external_threshold = 16;
  ASSERT_TRUE(SaveModel(*g, dir + "/m.onnx", opts).ok());
  EXPECT_TRUE(fs::exists(dir + "/m.onnx.data"));
  auto back = LoadModel(dir + "/m.onnx");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FLOAT_EQ((*back)->FindValue("b")->initializer()->data<float>()[1], -10.f);
  // A missing data file is named in the error.
  fs::remove(dir + "/m.onnx.data");
  auto missing = LoadModel(dir + "/m.onnx");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(Message(missing.status()).find("m.onnx.data"), std::string::npos) << missing.status();
  EXPECT_NE(Message(missing.status()).find("initializer 'w'"), std::string::npos) << missing.status();
}

TEST(OnnxIo, TruncatedAndForeignFilesFailClearly) {
  auto g = testing::MakeMlp();
  const testing::ScopedTempDir tmp("truncated");
  const std::string& dir = tmp.path();
  ASSERT_TRUE(SaveModel(*g, dir + "/m.onnx").ok());
  std::ifstream in(dir + "/m.onnx", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto cut = LoadModelFromBytes(bytes.substr(0, bytes.size() / 2), dir, "half.onnx");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(Message(cut.status()).find("half.onnx"), std::string::npos);
  EXPECT_NE(Message(cut.status()).find("truncated"), std::string::npos) << cut.status();
  auto text = LoadModelFromBytes("hello, this is not a model", dir, "text.onnx");
  ASSERT_FALSE(text.ok());
  EXPECT_NE(Message(text.status()).find("text.onnx"), std::string::npos);
  auto nofile = LoadModel(dir + "/absent.onnx");
  ASSERT_FALSE(nofile.ok());
  EXPECT_NE(Message(nofile.status()).find("absent.onnx"), std::string::npos);
}

TEST(OnnxIo, NodeInputThatDoesNotExistIsNamed) {
  graph::Graph g;
  g.opset_imports()[""] = 17;
  auto* x = g.AddInput("x", DataType::kFloat32, Shape::FromDims({2}));
  auto* ghost = g.GetOrCreateValue("ghost");
  auto* y = g.GetOrCreateValue("y");
  g.AddNode("Add", {x, ghost}, {y}, "adder");
  g.AddOutput(y);
  const testing::ScopedTempDir tmp("ghost");
  const std::string& dir = tmp.path();
  ASSERT_TRUE(SaveModel(g, dir + "/m.onnx").ok());
  auto back = LoadModel(dir + "/m.onnx");
  ASSERT_FALSE(back.ok());
  std::string m = Message(back.status());
  EXPECT_NE(m.find("Add 'adder'"), std::string::npos) << m;
  EXPECT_NE(m.find("'ghost'"), std::string::npos) << m;
}

TEST(OnnxIo, TensorFileRoundTrip) {
  const testing::ScopedTempDir tmp("tensor");
  const std::string& dir = tmp.path();
  Tensor t = Tensor::FromVector<int64_t>({1, -2, 3}, {3});
  ASSERT_TRUE(SaveTensorFile(dir + "/t.pb", "ids", t).ok());
  auto back = LoadTensorFile(dir + "/t.pb");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->first, "ids");
  EXPECT_EQ(back->second.ToInt64Vector(), (std::vector<int64_t>{1, -2, 3}));
}

// A model whose weights exceed protobuf's 2 GB limit saves with external data on its own and
// loads back through a memory map.
TEST(OnnxIo, ModelOver2GBUsesExternalData) {
  const int64_t n = (int64_t{1} << 31) + 4096;  // bytes, just over 2 GiB
  graph::Graph g;
  g.opset_imports()[""] = 17;
  Tensor big = Tensor::Uninitialized(DataType::kUInt8, {n});
  std::memset(big.raw(), 0, static_cast<size_t>(n));
  big.data<uint8_t>()[n - 1] = 42;
  auto* w = g.AddInitializer("big", std::move(big));
  auto* y = g.GetOrCreateValue("y");
  g.AddNode("Identity", {w}, {y}, "id");
  g.AddOutput(y);
  const testing::ScopedTempDir tmp("large");
  const std::string& dir = tmp.path();
  ASSERT_TRUE(SaveModel(g, dir + "/big.onnx").ok());
  EXPECT_GT(fs::file_size(dir + "/big.onnx.data"), static_cast<uintmax_t>(n) - 1);
  EXPECT_LT(fs::file_size(dir + "/big.onnx"), 1u << 20);
  auto back = LoadModel(dir + "/big.onnx");
  ASSERT_TRUE(back.ok()) << back.status();
  const Tensor* t = (*back)->FindValue("big")->initializer();
  ASSERT_EQ(t->numel(), n);
  EXPECT_EQ(t->data<uint8_t>()[n - 1], 42);
}

}  // namespace
}  // namespace cleave::onnx_ext
