// CPU kernels whose scratch memory cannot be had (tests/). A kernel asks its context for
// scratch (widened bf16 / fp16 operands, a reduction's partial sums, an unread output it must
// still compute through); when the host is out of memory the context hands back null and
// records why. Each kernel here must then return an error instead of writing through null,
// and, given scratch, compute the same node without one.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/tensor.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/kernel.h"
#include "tests/nn_test_util.h"

namespace cleave {
namespace {

// A context over one node's inputs: outputs on the heap, scratch from the heap or (when
// `scratch` is false) never, as an executor whose allocation failed hands out.
class TestContext : public providers::KernelContext {
 public:
  TestContext(const graph::Node& node, const std::vector<Tensor>& inputs, bool scratch, ThreadPool* pool)
      : node_(node), inputs_(inputs), scratch_(scratch), pool_(pool) {
    for (const Tensor& t : inputs_) views_.push_back(t.defined() ? t.view() : TensorView());
    outputs_.resize(node.num_outputs());
    output_views_.resize(node.num_outputs());
  }
  int num_inputs() const override { return node_.num_inputs(); }
  int num_outputs() const override { return node_.num_outputs(); }
  const TensorView* input(int i) const override {
    return i < static_cast<int>(inputs_.size()) && inputs_[i].defined() ? &views_[i] : nullptr;
  }
  TensorView* Output(int i, std::span<const int64_t> dims) override {
    if (!node_.output(i)) return nullptr;
    outputs_[i] = Tensor(node_.output(i)->dtype(), std::vector<int64_t>(dims.begin(), dims.end()));
    output_views_[i] = outputs_[i].view();
    return &output_views_[i];
  }
  void* Scratch(size_t bytes) override {
    ++scratch_asked;
    if (!scratch_) return nullptr;
    blocks_.push_back(TryAllocateAligned(bytes + 64, /*zero=*/false));
    return blocks_.back().get();
  }
  ThreadPool* thread_pool() const override { return pool_; }
  uint64_t run_seed() const override { return 7; }

  int scratch_asked = 0;

 private:
  const graph::Node& node_;
  const std::vector<Tensor>& inputs_;
  bool scratch_;
  ThreadPool* pool_;
  std::vector<TensorView> views_;
  std::vector<Tensor> outputs_;
  std::vector<TensorView> output_views_;
  std::vector<std::shared_ptr<void>> blocks_;
};

struct Case {
  std::string name, op, domain;
  int opset;
  std::vector<Tensor> inputs;  // undefined: an omitted optional input
  int outputs;
  std::vector<int> omitted_outputs;
  std::vector<std::pair<std::string, graph::Attribute>> attrs;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Values in [-1, 1) of `dtype` (float32, float64, bf16 or fp16).
Tensor Floats(DataType dtype, std::vector<int64_t> dims, uint32_t seed) {
  const std::vector<double> v = testing::Values(testing::Numel(dims), seed);
  if (dtype == DataType::kFloat64) return Tensor::FromVector<double>(v, dims);
  Tensor f = Tensor::FromVector<float>(testing::Cast<float>(v), dims);
  if (dtype == DataType::kFloat32) return f;
  Tensor low(dtype, dims);
  kernels::cpu::Cast(f.view(), low.view(), nullptr);
  return low;
}

Tensor Labels(int64_t n) { return Tensor::FromVector<int64_t>(std::vector<int64_t>(n, 1), {n}); }

std::vector<Case> Cases() {
  using graph::Attribute;
  const DataType f32 = DataType::kFloat32, f64 = DataType::kFloat64, bf16 = DataType::kBFloat16,
                 f16 = DataType::kFloat16;
  const std::string c = graph::kCleaveDomain;
  std::vector<Case> cases;
  cases.push_back({"DropoutWithOnlyItsMaskRead", "Dropout", "", 13,
                   {Floats(f32, {4, 8}, 1), Tensor::Scalar<float>(0.5f), Tensor::Scalar<bool>(true)}, 2, {0}, {}});
  cases.push_back({"CrossEntropyMean", "SoftmaxCrossEntropyLoss", "", 13, {Floats(f32, {4, 5}, 2), Labels(4)}, 1, {}, {}});
  cases.push_back({"CrossEntropyWithOnlyLogProbRead", "SoftmaxCrossEntropyLoss", "", 13,
                   {Floats(f32, {4, 5}, 3), Labels(4)}, 2, {0}, {{"reduction", Attribute::String("none")}}});
  cases.push_back({"CrossEntropyGradOfFloat64Scores", "SoftmaxCrossEntropyLossGrad", c, 1,
                   {Tensor::Scalar<double>(1.0), Floats(f64, {4, 5}, 4), Labels(4)}, 1, {},
                   {{"from_scores", Attribute::Int(1)}}});
  cases.push_back({"CrossEntropyGradWithOnlyTheLossRead", "SoftmaxCrossEntropyLossGrad", c, 1,
                   {Tensor::Scalar<float>(1.f), Floats(f32, {4, 5}, 5), Labels(4)}, 2, {0},
                   {{"from_scores", Attribute::Int(1)}}});
  cases.push_back({"CrossEntropyGradOfBf16Scores", "SoftmaxCrossEntropyLossGrad", c, 1,
                   {Tensor::Scalar<float>(1.f), Floats(bf16, {4, 5, 2}, 6), Tensor(DataType::kInt64, {4, 2})}, 1, {},
                   {{"from_scores", Attribute::Int(1)}}});
  cases.push_back({"LayerNormWithABroadcastScale", "LayerNormalization", "", 17,
                   {Floats(f32, {2, 3, 4}, 7), Floats(f32, {4}, 8), Floats(f32, {4}, 9)}, 1, {},
                   {{"axis", Attribute::Int(1)}}});
  cases.push_back({"SkipLayerNormOfABf16SkipWithItsSumUnread", "SkipLayerNormalization", c, 1,
                   {Floats(f32, {2, 3, 4}, 10), Floats(bf16, {2, 3, 4}, 11), Floats(f32, {4}, 12), Floats(f32, {4}, 13)},
                   1, {}, {}});
  cases.push_back({"LayerNormGradWithABroadcastScale", "LayerNormalizationGrad", c, 1,
                   {Floats(f32, {2, 3, 4}, 14), Floats(f32, {2, 3, 4}, 15), Floats(f32, {4}, 16),
                    Floats(f32, {2, 1, 1}, 17), Tensor::FromVector<float>({1.f, 1.f}, {2, 1, 1})},
                   3, {}, {{"axis", Attribute::Int(1)}}});
  cases.push_back({"MatMulBf16RoundedToBf16", "MatMulBf16", c, 1, {Floats(bf16, {4, 8}, 18), Floats(bf16, {8, 6}, 19)},
                   1, {}, {{"to", Attribute::Int(static_cast<int64_t>(bf16))}}});
  cases.push_back({"MatMulF16", "MatMulF16", c, 1, {Floats(f16, {4, 8}, 20), Floats(f16, {8, 6}, 21)}, 1, {}, {}});
  cases.push_back({"Concat", "Concat", "", 13, {Floats(f32, {2, 3}, 22), Floats(f32, {1, 3}, 23)}, 1, {},
                   {{"axis", Attribute::Int(0)}}});
  cases.push_back({"Split", "Split", "", 13, {Floats(f32, {4, 3}, 24)}, 2, {}, {{"axis", Attribute::Int(0)}}});
  cases.push_back({"AttentionInFp16", "Attention", c, 1,
                   {Floats(f16, {1, 2, 4, 8}, 25), Floats(f16, {1, 2, 4, 8}, 26), Floats(f16, {1, 2, 4, 8}, 27)}, 1, {},
                   {{"scale", Attribute::Float(0.35f)}}});
  cases.push_back({"AttentionGradInFp16", "AttentionGrad", c, 1,
                   {Floats(f16, {1, 2, 4, 8}, 28), Floats(f16, {1, 2, 4, 8}, 29), Floats(f16, {1, 2, 4, 8}, 30),
                    Floats(f16, {1, 2, 4, 8}, 31), Floats(f16, {1, 2, 4, 8}, 32), Floats(f32, {1, 2, 4}, 33)},
                   3, {}, {{"scale", Attribute::Float(0.35f)}}});
  cases.push_back({"GatherElementsOffsets", "GatherElements", "", 13,
                   {Floats(f32, {2, 3}, 36), Tensor::FromVector<int64_t>({0, 2, 1, 1}, {2, 2})}, 1, {},
                   {{"axis", Attribute::Int(1)}}});
  cases.push_back({"AddInBf16", "Add", "", 14, {Floats(bf16, {3, 4}, 34), Floats(bf16, {3, 4}, 35)}, 1, {}, {}});
  return cases;
}

class KernelScratch : public ::testing::TestWithParam<Case> {};

TEST_P(KernelScratch, IsAnErrorWhenItCannotBeHadAndComputesWhenItCan) {
  const Case& k = GetParam();
  graph::Graph g;
  g.opset_imports()[""] = k.domain.empty() ? k.opset : 17;
  if (!k.domain.empty()) g.opset_imports()[k.domain] = k.opset;
  std::vector<graph::Value*> ins, outs;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    const Tensor& t = k.inputs[i];
    ins.push_back(t.defined() ? g.AddInput("in" + std::to_string(i), t.dtype(), Shape::FromDims(t.dims())) : nullptr);
  }
  for (int i = 0; i < k.outputs; ++i) {
    const bool omitted = std::find(k.omitted_outputs.begin(), k.omitted_outputs.end(), i) != k.omitted_outputs.end();
    outs.push_back(omitted ? nullptr : g.GetOrCreateValue("out" + std::to_string(i)));
  }
  graph::Node* node = g.AddNode(k.op, ins, outs, k.name, k.domain);
  for (const auto& [name, a] : k.attrs) node->SetAttr(name, a);
  ASSERT_TRUE(graph::InferNode(g, *node).ok()) << graph::InferNode(g, *node);

  providers::CpuExecutionProvider cpu(2);
  std::string why;
  const providers::KernelDef* def = cpu.registry().Find(*node, k.opset, &why);
  ASSERT_NE(def, nullptr) << why;
  absl::StatusOr<std::unique_ptr<providers::OpKernel>> kernel = def->create(*node, k.opset);
  ASSERT_TRUE(kernel.ok()) << kernel.status();

  TestContext with(*node, k.inputs, /*scratch=*/true, cpu.thread_pool());
  const absl::Status ok = (*kernel)->Compute(with);
  EXPECT_TRUE(ok.ok()) << ok;
  ASSERT_GT(with.scratch_asked, 0) << "the case does not reach the kernel's scratch";

  TestContext without(*node, k.inputs, /*scratch=*/false, cpu.thread_pool());
  const absl::Status failed = (*kernel)->Compute(without);
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_NE(failed.message().find("scratch"), std::string::npos) << failed;
}

// A count of elements whose bytes overflow size_t asks for more than any memory holds, never
// for the few bytes the wrapped product would be.
TEST(KernelScratchBytes, CountsThatOverflowAskForTooMuch) {
  struct Recorder : providers::KernelContext {
    int num_inputs() const override { return 0; }
    int num_outputs() const override { return 0; }
    const TensorView* input(int) const override { return nullptr; }
    TensorView* Output(int, std::span<const int64_t>) override { return nullptr; }
    void* Scratch(size_t bytes) override {
      asked = bytes;
      return nullptr;
    }
    ThreadPool* thread_pool() const override { return nullptr; }
    size_t asked = 0;
  } ctx;
  EXPECT_EQ(ctx.ScratchOf<double>(int64_t{1} << 61), nullptr);  // 2^64 bytes: wraps to 0
  EXPECT_GE(ctx.asked, static_cast<size_t>(PTRDIFF_MAX) / 2);
  EXPECT_EQ(ctx.ScratchOf<float>(-5), nullptr);
  EXPECT_GE(ctx.asked, static_cast<size_t>(PTRDIFF_MAX) / 2);
  ctx.ScratchOf<float>(10);
  EXPECT_EQ(ctx.asked, 40u);
}

INSTANTIATE_TEST_SUITE_P(CpuKernels, KernelScratch, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace cleave
