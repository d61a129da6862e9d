// bf16 training on a device session (the stand-in device of cpu_kernel_device.h): the fusions
// device sessions run under mixed precision (attention, the residual add with its LayerNorm,
// the cross-entropy from the scores, the weight gradients' accumulation and bias gradients in
// their products, the residual gradient's bf16 copy, bf16 products the LayerNorms read, the
// vocabulary padding), each against the CPU session or the session with the pass off.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "onnx_ext/onnx_io.h"
#include "tests/cpu_kernel_device.h"
#include "tests/op_tester.h"
#include "tests/partition_test_util.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave {
namespace {

using testing::Bf16Session;
using testing::CpuKernelDevice;

// The bundled tiny GPT, trained at batch 2 x seq 16, on the stand-in device or the CPU.
class TinyGptBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = onnx_ext::LoadModel(std::string(CLEAVE_SOURCE_DIR) + "/models/tiny_gpt/model.onnx");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    spec_.dims = {{"batch", 2}, {"seq", 16}};
  }
  std::unique_ptr<graph::Graph> model_;
  trainer::TrainingSpec spec_;
  std::shared_ptr<CpuKernelDevice> device_ = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
};

// A bf16 step on a device session, with the fusions device sessions run (attention, the
// residual add with its LayerNorm writing bf16, the cross-entropy gradient from the scores with
// the loss folded in), tracks the CPU session's step; the CPU kernels compute both.
TEST_F(TinyGptBf16, Bf16TrainingWithTheDeviceFusionsTracksTheCpu) {
  spec_.optimizer.max_grad_norm = 1.0f;
  const Feeds feeds = testing::TokenBatch(16, 256);
  std::vector<float> losses[2];
  for (int on_device = 0; on_device < 2; ++on_device) {
    auto s = Bf16Session(*model_, spec_, on_device ? device_ : nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    if (on_device) {
      const graph::Graph* g = (*s)->training_graph();
      ASSERT_NE(g, nullptr);
      int skip_low = 0, loss_in_grad = 0, forward_loss = 0, transposes = 0, packed = 0, splits = 0;
      for (const auto& n : g->nodes()) {
        skip_low += n->op_type() == "SkipLayerNormalization" && n->output(0)->dtype() == DataType::kBFloat16;
        loss_in_grad += n->op_type() == "SoftmaxCrossEntropyLossGrad" && n->num_outputs() == 2 && n->output(1);
        forward_loss += n->op_type() == "SoftmaxCrossEntropyLoss";
        transposes += n->op_type() == "Transpose";
        if (n->op_type() == "SoftmaxCrossEntropyLossGrad") {
          EXPECT_EQ(n->input(1)->dtype(), DataType::kBFloat16) << "the logits product writes bf16";
        }
        packed += (n->op_type() == "Attention" || n->op_type() == "AttentionGrad") &&
                  n->AttrString("layout", "") == "bs3hd";
        splits += n->op_type() == "Split" || n->op_type() == "Concat";
      }
      EXPECT_EQ(skip_low, 4) << "ln2 of both layers, ln1 of the second, ln_f";
      EXPECT_EQ(loss_in_grad, 1);
      EXPECT_EQ(forward_loss, 0);
      EXPECT_EQ(packed, 4) << "both layers' Attention and AttentionGrad read the q/k/v product itself";
      EXPECT_EQ(transposes, 0) << "the attention layouts' 16 transposes are gone";
      EXPECT_EQ(splits, 0) << "the q/k/v Splits and the Concats of their gradients are gone";
    }
    for (int step = 0; step < 4; ++step) {
      auto loss = (*s)->TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE((*s)->OptimizerStep().ok());
      losses[on_device].push_back(*loss);
    }
  }
  // The first step's loss differs by the logits' bf16 rounding alone; later ones also carry
  // bf16's rounding of the gradient formed from the scores instead of the stored log_prob.
  EXPECT_NEAR(losses[1][0], losses[0][0], 1e-4 * losses[0][0]);
  EXPECT_NE(losses[1][0], losses[0][0]) << "the device session's logits are bf16";
  for (int step = 1; step < 4; ++step) EXPECT_NEAR(losses[1][step], losses[0][step], 2e-3 * losses[0][step]) << step;
}

// A second micro-batch: each token id t of `first` as (t * mul + add) % 256.
Feeds RemappedTokens(const Feeds& first, int64_t mul, int64_t add) {
  Feeds second;
  for (const auto& [name, t] : first) {
    Tensor c = t.Clone();
    for (int64_t i = 0; i < c.numel(); ++i) c.data<int64_t>()[i] = (c.data<int64_t>()[i] * mul + add) % 256;
    second.emplace_back(name, std::move(c));
  }
  return second;
}

// The weight gradients' products accumulate into their buffers themselves
// (GradientAccumulationFusion): 4 per layer, the bias-free bf16 weight products, and the tied
// head's; the embeddings' rows scatter into theirs (EmbeddingGradientAccumulation: the position
// table's buffer, and the token table's after the head's product). Two micro-batches per
// optimizer step, so the second adds to the first (the product's beta = 1, the scatter's base),
// and the steps track the CPU session's.
TEST_F(TinyGptBf16, WeightGradientsAccumulateInTheirProducts) {
  const Feeds first = testing::TokenBatch(16, 256);
  const Feeds second = RemappedTokens(first, 3, 11);
  std::vector<float> losses[2];
  for (int on_device = 0; on_device < 2; ++on_device) {
    auto s = Bf16Session(*model_, spec_, on_device ? device_ : nullptr);
    ASSERT_TRUE(s.ok()) << s.status();
    if (on_device) {
      int fused = 0, accumulators = 0, scatters = 0;
      for (const auto& n : (*s)->training_graph()->nodes()) {
        fused += n->op_type() == "MatMulBf16" && n->num_inputs() == 5 && n->input(3);
        accumulators += n->op_type() == "InPlaceAccumulator";
        scatters += n->op_type() == "GatherGrad" && n->num_inputs() >= 4 && n->input(3);
      }
      EXPECT_EQ(fused, 9) << "qkv, proj, fc and proj weights of both layers, and the tied head";
      EXPECT_EQ(scatters, 2) << "the token and position embeddings";
      EXPECT_EQ(accumulators, 18) << "the other parameters' gradients";
    }
    const int64_t in_place_before = (*s)->training_stats().bases_in_place;
    for (int step = 0; step < 3; ++step) {
      for (const Feeds* micro : std::array<const Feeds*, 2>{&first, &second}) {
        auto loss = (*s)->TrainStep(*micro);
        ASSERT_TRUE(loss.ok()) << loss.status();
        losses[on_device].push_back(*loss);
      }
      ASSERT_TRUE((*s)->OptimizerStep().ok());
    }
    // On the device the token table's base (the head's accumulated gradient) is written in the
    // bound accumulation buffer, where the scatter then adds the rows: once per micro-batch.
    EXPECT_EQ((*s)->training_stats().bases_in_place - in_place_before, on_device ? 6 : 0);
  }
  ASSERT_EQ(losses[0].size(), 6u);
  // Within 6e-5 here (bf16 logits and rounding); a second micro-batch that overwrote the first's
  // weight gradients would move the later losses by 2% to 8%.
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 5e-4 * losses[0][i]) << i;
  EXPECT_LT(losses[0][4], losses[0][0]) << "the steps train";
}

// Each linear layer's bias gradient is formed by its weight gradient's product
// (BiasGradientFusion): 4 per layer, the ReduceSums of the unfused graph gone but the position
// embedding's. Over two micro-batches the bias gradients accumulate to the unfused session's
// within bf16 rounding (the fused sums stay float32; the unfused ones round the fc and qkv sums
// to bf16, while the fused proj sums read the residual gradient's bf16 rounding the product
// reads), the weight gradients are the same bits, and the steps track the CPU session's.
TEST_F(TinyGptBf16, BiasGradientsFormInTheWeightGradientProducts) {
  const Feeds first = testing::TokenBatch(16, 256);
  const Feeds second = RemappedTokens(first, 5, 7);
  auto fused = Bf16Session(*model_, spec_, device_);
  auto unfused = Bf16Session(*model_, spec_, device_, {"BiasGradientFusion"});
  auto cpu = Bf16Session(*model_, spec_, nullptr);
  ASSERT_TRUE(fused.ok()) << fused.status();
  ASSERT_TRUE(unfused.ok()) << unfused.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto count = [](const trainer::TrainingSession& s, int* with_dbias, int* sums) {
    *with_dbias = *sums = 0;
    for (const auto& n : s.training_graph()->nodes()) {
      if (n->op_type() == "MatMulBf16" && n->num_outputs() > 1 && n->output(1)) {
        ++*with_dbias;
        EXPECT_EQ(n->AttrInt("dbias_operand", -1), 0) << "dW = dz^T x reads dz as A";
        EXPECT_EQ(n->output(1)->dtype(), DataType::kFloat32);
      }
      *sums += n->op_type() == "ReduceSum";
    }
  };
  // The residual gradients' bf16 roundings, written by the LayerNorm gradients that form them.
  auto low_outputs = [](const trainer::TrainingSession& s) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes())
      n += node->op_type() == "LayerNormalizationGrad" && node->num_outputs() > 3 && node->output(3);
    return n;
  };
  EXPECT_EQ(low_outputs(**fused), 4) << "ln_f's and three of the four block LayerNorms' (ln1 of block 0 has none)";
  int with_dbias = 0, sums = 0;
  count(**fused, &with_dbias, &sums);
  EXPECT_EQ(with_dbias, 8) << "qkv, proj, fc and proj of both layers";
  EXPECT_EQ(sums, 1) << "the position embedding's gradient still sums the batch";
  count(**unfused, &with_dbias, &sums);
  EXPECT_EQ(with_dbias, 0);
  EXPECT_EQ(sums, 9);

  std::vector<float> losses[2];
  for (int step = 0; step < 3; ++step) {
    for (const Feeds* micro : std::array<const Feeds*, 2>{&first, &second})
      for (auto* s : {&fused, &unfused, &cpu}) {
        auto loss = (**s)->TrainStep(*micro);
        ASSERT_TRUE(loss.ok()) << loss.status();
        if (s != &unfused) losses[s == &fused].push_back(*loss);
      }
    if (step == 0) {
      int biases = 0;
      for (const std::string& p : (*fused)->parameter_names()) {
        auto f = (*fused)->GetGradient(p);
        auto u = (*unfused)->GetGradient(p);
        ASSERT_TRUE(f.ok() && u.ok()) << p;
        ASSERT_EQ(f->dims(), u->dims()) << p;
        const bool linear_bias = p.find(".bias") != std::string::npos && p.find("ln") == std::string::npos;
        if (!linear_bias) {
          // The linear layers' weight gradients: the same products, bit for bit.
          const bool linear_weight = p.find(".weight") != std::string::npos && p.find("ln") == std::string::npos &&
                                     p.find("wte") == std::string::npos && p.find("wpe") == std::string::npos;
          if (linear_weight) {
            EXPECT_EQ(std::memcmp(f->data<float>(), u->data<float>(), f->nbytes()), 0) << p << ": same product";
          }
          continue;
        }
        ++biases;
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < f->numel(); ++i) {
          diff += std::pow(double(f->data<float>()[i]) - u->data<float>()[i], 2);
          norm += std::pow(double(u->data<float>()[i]), 2);
        }
        EXPECT_GT(norm, 0) << p;
        EXPECT_LT(std::sqrt(diff), 1e-2 * std::sqrt(norm)) << p << ": both micro-batches' bias gradient";
      }
      EXPECT_EQ(biases, 8);
    }
    for (auto* s : {&fused, &unfused, &cpu}) ASSERT_TRUE((**s)->OptimizerStep().ok());
  }
  ASSERT_EQ(losses[0].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 5e-4 * losses[0][i]) << i;
  EXPECT_LT(losses[0][4], losses[0][0]) << "the steps train";
}

// The residual gradients' bf16 roundings written by their LayerNorm gradients
// (LayerNormGradCastFusion) are the Casts' bits: the steps and the parameters they reach are
// the same as with the pass off, where the Casts stay.
TEST_F(TinyGptBf16, LayerNormGradientsWriteTheResidualGradientsRoundingExactly) {
  auto on = Bf16Session(*model_, spec_, device_);
  auto off = Bf16Session(*model_, spec_, device_, {"LayerNormGradCastFusion"});
  ASSERT_TRUE(on.ok() && off.ok()) << on.status() << off.status();
  auto casts = [](const trainer::TrainingSession& s) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes()) n += node->op_type() == "Cast";
    return n;
  };
  EXPECT_EQ(casts(**off) - casts(**on), 4);
  const Feeds feeds = testing::TokenBatch(16, 256);
  for (int step = 0; step < 3; ++step) {
    auto a = (*on)->TrainStep(feeds);
    auto b = (*off)->TrainStep(feeds);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    EXPECT_EQ(*a, *b) << step;
    ASSERT_TRUE((*on)->OptimizerStep().ok() && (*off)->OptimizerStep().ok());
  }
  for (const std::string& p : (*on)->parameter_names()) {
    auto a = (*on)->GetState(p);
    auto b = (*off)->GetState(p);
    ASSERT_TRUE(a.ok() && b.ok()) << p;
    EXPECT_EQ(std::memcmp(a->data<float>(), b->data<float>(), a->nbytes()), 0) << p;
  }
}

// The products the LayerNorms and their gradients read write bf16 (LowPrecisionNormInputs): the
// residual branches' last products (the skip of 4 SkipLayerNormalizations) and the products
// forming 5 LayerNorm gradients' dY, as PyTorch's autocast hands them on. The steps still track
// the CPU session's (which keeps them float32) within bf16 rounding, and those of the session
// without the pass.
TEST_F(TinyGptBf16, ProductsTheLayerNormsReadWriteBf16) {
  auto on = Bf16Session(*model_, spec_, device_);
  auto off = Bf16Session(*model_, spec_, device_, {"LowPrecisionNormInputs"});
  auto cpu = Bf16Session(*model_, spec_, nullptr);
  ASSERT_TRUE(on.ok() && off.ok() && cpu.ok()) << on.status() << off.status() << cpu.status();
  auto low_inputs = [](const trainer::TrainingSession& s, int* skips, int* dys) {
    *skips = *dys = 0;
    for (const auto& n : s.training_graph()->nodes()) {
      *skips += n->op_type() == "SkipLayerNormalization" && n->input(1)->dtype() == DataType::kBFloat16;
      *dys += n->op_type() == "LayerNormalizationGrad" && n->input(0)->dtype() == DataType::kBFloat16;
    }
  };
  int skips = 0, dys = 0;
  low_inputs(**on, &skips, &dys);
  EXPECT_EQ(skips, 4);
  EXPECT_EQ(dys, 5) << "ln_f, both ln2 and both ln1";
  low_inputs(**off, &skips, &dys);
  EXPECT_EQ(skips + dys, 0);
  const Feeds feeds = testing::TokenBatch(16, 256);
  std::vector<float> losses[3];
  for (int step = 0; step < 4; ++step)
    for (int k = 0; k < 3; ++k) {
      trainer::TrainingSession& s = ***(k == 0 ? &on : k == 1 ? &off : &cpu);
      auto loss = s.TrainStep(feeds);
      ASSERT_TRUE(loss.ok()) << loss.status();
      ASSERT_TRUE(s.OptimizerStep().ok());
      losses[k].push_back(*loss);
    }
  EXPECT_NE(losses[0][0], losses[1][0]) << "the proj outputs are rounded to bf16 in the first forward";
  for (int step = 0; step < 4; ++step) {
    EXPECT_NEAR(losses[0][step], losses[1][step], 2e-3 * losses[1][step]) << step;
    EXPECT_NEAR(losses[0][step], losses[2][step], 2e-3 * losses[2][step]) << step;
  }
  EXPECT_LT(losses[0][3], losses[0][0]) << "the steps train";
}

// Passes can be turned off by name (SessionOptions::disabled_optimizers, as ONNX Runtime's
// disabled_optimizers), and through CLEAVE_DISABLED_OPTIMIZERS; an unknown name is an error
// that lists the passes. Without the layout fusion the attention transposes stay, and the
// session still trains.
TEST_F(TinyGptBf16, DisabledOptimizersAreSkipped) {
  auto count = [](const trainer::TrainingSession& s, const char* op) {
    int n = 0;
    for (const auto& node : s.training_graph()->nodes()) n += node->op_type() == op;
    return n;
  };
  auto off = Bf16Session(*model_, spec_, device_, {"AttentionLayoutFusion", "GradientAccumulationFusion"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(count(**off, "Transpose"), 16);
  EXPECT_EQ(count(**off, "InPlaceAccumulator"), 27) << "one per parameter but the position embedding's";
  auto loss = (*off)->TrainStep(testing::TokenBatch(16, 256));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(std::isfinite(*loss));
  ASSERT_EQ(setenv("CLEAVE_DISABLED_OPTIMIZERS", "AttentionLayoutFusion", 1), 0);
  auto env = Bf16Session(*model_, spec_, device_);
  unsetenv("CLEAVE_DISABLED_OPTIMIZERS");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(count(**env, "Transpose"), 16);
  EXPECT_EQ(count(**env, "InPlaceAccumulator"), 18);
  auto bad = Bf16Session(*model_, spec_, device_, {"AttentionLayout"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("disabled optimizer 'AttentionLayout': no such pass"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(std::string(bad.status().message()).find("AttentionLayoutFusion"), std::string::npos) << bad.status();
}

// A small language model whose tied head has `vocab` classes, with seeded random weights: an
// embedding, a tanh layer and a LayerNorm, and the head h · wteᵀ.
std::unique_ptr<graph::Graph> TiedHeadLm(int64_t vocab) {
  const std::string text = absl::StrCat(R"(
    opset 17
    input input_ids: int64[batch,seq]
    init wte: float32[)", vocab, R"(,16] = fill 0
    init fc.w: float32[16,16] = fill 0
    init ln.w: float32[16] = fill 1
    init ln.b: float32[16] = fill 0
    x = Gather(wte, input_ids)
    h0 = MatMul(x, fc.w)
    h1 = Tanh(h0)
    h = LayerNormalization(h1, ln.w, ln.b) {axis = -1}
    wt = Transpose(wte) {perm = [1, 0]}
    logits = MatMul(h, wt)
    output logits
  )");
  auto g = graph::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << g.status();
  uint32_t state = 12345;
  for (const char* name : {"wte", "fc.w"}) {
    graph::Value* v = (*g)->FindValue(name);
    Tensor t(DataType::kFloat32, v->initializer()->dims());
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 1664525u + 1013904223u;
      t.data<float>()[i] = (static_cast<float>(state >> 8) / 16777216.f - 0.5f) * 0.5f;
    }
    (*g)->SetInitializer(v, std::move(t));
  }
  return std::move(*g);
}

// Under bf16, GPT-2's 50257 classes (and 1027) give the head's [N, V] scores rows that are not
// 16-byte aligned; a device session pads them (ClassPadding) to 50304 (and 1032): the padded
// weight, the -inf mask, and the gradient products over the padded scores' gradient, the weight
// gradient's forming only the real classes' rows.
// The steps train as the CPU session does, labels at both ends of the vocabulary included.
TEST(DevicePlacement, Bf16VocabularyPaddedToAlignedRowsTrainsAsTheCpu) {
  for (const auto& [vocab, padded] : std::vector<std::pair<int64_t, int64_t>>{{1027, 1032}, {50257, 50304}}) {
    SCOPED_TRACE(vocab);
    trainer::TrainingSpec spec;
    spec.dims = {{"batch", 2}, {"seq", 8}};
    spec.optimizer.max_grad_norm = 1.0f;
    Tensor ids(DataType::kInt64, {2, 8}), labels(DataType::kInt64, {2, 8});
    for (int64_t i = 0; i < 16; ++i) {
      ids.data<int64_t>()[i] = (i * 977 + 5) % vocab;
      labels.data<int64_t>()[i] = i == 0 ? vocab - 1 : i == 1 ? 0 : (i * 613 + 11) % vocab;
    }
    const Feeds feeds = {{"input_ids", ids}, {"labels", labels}};
    auto device = std::make_shared<CpuKernelDevice>(std::set<std::string>{});
    std::vector<float> losses[2];
    for (int on_device = 0; on_device < 2; ++on_device) {
      auto s = Bf16Session(*TiedHeadLm(vocab), spec, on_device ? device : nullptr);
      ASSERT_TRUE(s.ok()) << s.status();
      if (on_device) {
        const graph::Graph& g = *(*s)->training_graph();
        int padded_products = 0, real_rows = 0, short_rows = 0;
        for (const auto& n : g.nodes()) {
          const bool product = n->op_type() == "MatMulBf16";
          for (const graph::Value* v : n->inputs())
            short_rows += product && v && v->shape().rank() >= 1 && v->shape()[v->shape().rank() - 1].value == vocab;
          if (product && n->output(0)->shape().is_static()) {
            const Shape& y = n->output(0)->shape();
            padded_products += y[y.rank() - 1].value == padded || y[0].value == padded;
            short_rows += y[y.rank() - 1].value == vocab;
            if (n->AttrInt("rows", -1) == vocab) {
              ++real_rows;
              EXPECT_EQ(n->input(0)->shape()[1].value, padded) << "dW reads the padded gradient";
              EXPECT_EQ(y[0].value, vocab);
            }
          }
          if (n->op_type() == "Split") {
            EXPECT_NE(n->input(0)->shape()[0].value, padded) << n->name();
          }
          if (n->op_type() == "SoftmaxCrossEntropyLossGrad") {
            EXPECT_EQ(n->input(1)->shape()[1].value, padded) << n->name();
            EXPECT_EQ(n->input(1)->dtype(), DataType::kBFloat16) << n->name();
          }
        }
        EXPECT_EQ(padded_products, 1) << "the logits";
        EXPECT_EQ(real_rows, 1) << "dW = dyᵀ · h over the real classes";
        EXPECT_EQ(short_rows, 0) << "a bf16 product still reads or writes rows of " << vocab;
      }
      for (int step = 0; step < 4; ++step) {
        auto loss = (*s)->TrainStep(feeds);
        ASSERT_TRUE(loss.ok()) << loss.status();
        ASSERT_TRUE((*s)->OptimizerStep().ok());
        losses[on_device].push_back(*loss);
      }
    }
    // The device session's scores are bf16 (LowPrecisionScores), which moves the loss by up to
    // 8e-5 of itself here; that the padding itself changes nothing is checked exactly by
    // ClassPadding.PadsTheHeadToAlignedRowsAndComputesTheSame.
    for (int step = 0; step < 4; ++step) {
      EXPECT_TRUE(std::isfinite(losses[1][step]));
      EXPECT_NEAR(losses[1][step], losses[0][step], 3e-4 * losses[0][step]) << step;
    }
    EXPECT_LT(losses[0][3], losses[0][0]) << "the steps train";
  }
}

}  // namespace
}  // namespace cleave
