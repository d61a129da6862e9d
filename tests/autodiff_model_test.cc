// Autodiff on a whole exported model: the tiny GPT with a cross-entropy loss attached to its
// logits gives the loss and every parameter gradient that PyTorch computes
// (models/tiny_gpt/make_grad_golden.py wrote the golden files). The graph is used as exported,
// Constant nodes and shape arithmetic included, with only the batch and sequence fixed.
#include <filesystem>

#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "tests/op_tester.h"
#include "trainer/autodiff.h"

namespace cleave::trainer {
namespace {

using graph::Value;

std::string Dir() { return std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt"; }

Tensor Load(const std::string& path) {
  auto t = onnx_ext::LoadTensorFile(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->second : Tensor();
}

TEST(TinyGptAutodiff, LossAndEveryGradientMatchPyTorch) {
  auto loaded = onnx_ext::LoadModel(Dir() + "/model.onnx");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  graph::Graph& g = **loaded;
  // Training runs at fixed shapes: batch 2, sequence 64.
  g.inputs()[0]->set_shape(Shape::FromDims({2, 64}));
  Value* labels = g.AddInput("labels", DataType::kInt64, Shape::FromDims({2, 64}));
  // cross_entropy over the vocab: SoftmaxCrossEntropyLoss wants classes on axis 1.
  Value* logits = g.outputs()[0];
  Value* by_class = g.GetOrCreateValue("logits_by_class");
  graph::Node* t = g.AddNode("Transpose", {logits}, {by_class}, "loss/transpose");
  t->SetAttr("perm", graph::Attribute::Ints({0, 2, 1}));
  Value* loss = g.GetOrCreateValue("loss");
  Value* log_prob = g.GetOrCreateValue("log_prob");
  graph::Node* sce = g.AddNode("SoftmaxCrossEntropyLoss", {by_class, labels}, {loss, log_prob}, "loss");
  sce->SetAttr("reduction", graph::Attribute::String("mean"));
  ASSERT_TRUE(graph::InferShapes(g).ok());

  std::vector<Value*> params;
  for (Value* v : g.Initializers())
    if (IsFloat(v->dtype())) params.push_back(v);
  ASSERT_EQ(params.size(), 28u);
  auto grads = BuildBackward(g, loss, params);
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<Value*> outs = {loss};
  for (Value* p : params) outs.push_back(grads->at(p->name()));
  g.SetOutputs(outs);

  SessionOptions plain;
  plain.optimize = false;
  auto s = InferenceSession::FromGraph(std::move(*loaded), plain);
  ASSERT_TRUE(s.ok()) << s.status();
  std::string golden = Dir() + "/grad_golden";
  auto out = (*s)->Run({{"input_ids", Load(Dir() + "/test_data_set_0/input_0.pb")},
                        {"labels", Load(golden + "/labels.pb")}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(testing::CompareTensors((*out)[0], Load(golden + "/loss.pb"), 1e-6, 1e-5), "");
  for (size_t i = 0; i < params.size(); ++i) {
    std::string name = params[i]->name() + "_grad";
    // fp32 sums in a different order than PyTorch; measured max abs error 1.2e-7.
    EXPECT_EQ(testing::CompareTensors((*out)[i + 1], Load(golden + "/" + name + ".pb"), 1e-6, 1e-4), "")
        << name;
  }
}

}  // namespace
}  // namespace cleave::trainer
