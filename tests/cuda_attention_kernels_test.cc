// CUDA attention tests (label gpu): ai.cleave.Attention and AttentionGrad on the device (cuDNN's
// fused attention where it takes the shape, the provider's own kernels otherwise) against the CPU
// kernels on the same graph: fp32 and bf16, causal and not, the products' layouts and an additive
// bias. Without a usable device (or driver) each test skips and says why.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "graph/op_table.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/cuda/cudnn_attention.h"
#include "runtime/inference_session.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, FusedAttentionForwardAndBackward) {
  REQUIRE_CUDA();
  // Causal with T = S, causal with fewer queries than keys, and full attention with a value
  // width unlike the key width; head dims of 64 and 80 (not a multiple of 32).
  const struct {
    std::vector<int64_t> q, k, v;
    int causal;
  } cases[] = {{{2, 3, 70, 64}, {2, 3, 70, 64}, {2, 3, 70, 64}, 1},
               {{1, 2, 33, 80}, {1, 2, 50, 80}, {1, 2, 50, 80}, 1},
               {{2, 2, 40, 64}, {2, 2, 45, 64}, {2, 2, 45, 48}, 0}};
  for (const auto& c : cases) {
    auto dims = [](const std::vector<int64_t>& d) { return absl::StrCat("[", absl::StrJoin(d, ","), "]"); };
    std::vector<int64_t> out = c.q;
    out.back() = c.v.back();
    const std::string text = absl::StrCat(
        "input q: float32", dims(c.q), "\ninput k: float32", dims(c.k), "\ninput v: float32", dims(c.v),
        "\ninput dy: float32", dims(out), "\ny, lse = ai.cleave.Attention(q, k, v) {scale = 0.125, causal = ", c.causal,
        "}\ndq, dk, dv = ai.cleave.AttentionGrad(dy, q, k, v, y, lse) {scale = 0.125, causal = ", c.causal,
        "}\noutput y\noutput lse\noutput dq\noutput dk\noutput dv\n");
    ExpectSame(text, {{"q", Random(c.q, 60)}, {"k", Random(c.k, 61)}, {"v", Random(c.v, 62)}, {"dy", Random(out, 63)}},
               1e-5, 1e-4, "Attention");
  }
}

// One graph as CUDA and the CPU run it: the float32 inputs `ins` (declared in `inputs`) are read
// as `<x>b` by `body`, whose outputs `outs` and lse are the graph's. With `low`, CUDA casts the
// inputs to bf16 and computes in bf16, while the CPU computes in float32 on the bf16-rounded
// values, and both round the outputs to bf16; without, both read the inputs as they are.
struct CudaCpuGraphs {
  std::string cuda, cpu;
  Feeds feeds;
  double tol = 0;
};

CudaCpuGraphs RoundedAlike(const std::string& inputs, const std::vector<const char*>& ins, const std::string& body,
                           const std::vector<const char*>& outs, bool low, Feeds feeds) {
  CudaCpuGraphs g{inputs, inputs, std::move(feeds), low ? 3e-2 : 1e-4};
  for (const char* x : ins) {
    if (low) {
      absl::StrAppend(&g.cuda, x, "b = Cast(", x, ") {to = 16}\n");
      absl::StrAppend(&g.cpu, x, "h = Cast(", x, ") {to = 16}\n", x, "b = Cast(", x, "h) {to = 1}\n");
    } else {
      absl::StrAppend(&g.cuda, x, "b = Identity(", x, ")\n");
      absl::StrAppend(&g.cpu, x, "b = Identity(", x, ")\n");
    }
  }
  absl::StrAppend(&g.cuda, body);
  absl::StrAppend(&g.cpu, body);
  for (const char* x : outs) {
    if (low) {
      absl::StrAppend(&g.cuda, x, "f = Cast(", x, ") {to = 1}\noutput ", x, "f\n");
      absl::StrAppend(&g.cpu, x, "h = Cast(", x, ") {to = 16}\n", x, "f = Cast(", x, "h) {to = 1}\noutput ", x, "f\n");
    } else {
      absl::StrAppend(&g.cuda, "output ", x, "\n");
      absl::StrAppend(&g.cpu, "output ", x, "\n");
    }
  }
  absl::StrAppend(&g.cuda, "output lse\n");
  absl::StrAppend(&g.cpu, "output lse\n");
  return g;
}

// Both graphs are well formed, and the CPU's runs, on any machine.
void ExpectReferenceRuns(const CudaCpuGraphs& g) {
  auto parsed = graph::ParseGraph(g.cuda);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(graph::InferShapes(**parsed).ok());
  SessionOptions o;
  o.optimize = false;
  auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(g.cpu), o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE((*cpu)->Run(g.feeds).ok());
}

// bf16 attention, forward and backward: cuDNN's fused attention where it takes the shape (head
// dims 64 and 80, causal with T = S and T < S aligned to the bottom right), the own kernel
// where it does not (a value width unlike the key width), against the CPU in fp32 on the
// bf16-rounded inputs, with the outputs rounded to bf16 as well.
TEST(CudaProvider, Bf16AttentionForwardAndBackward) {
  const struct {
    std::vector<int64_t> q, k, v;
    int causal;
  } cases[] = {{{2, 4, 128, 64}, {2, 4, 128, 64}, {2, 4, 128, 64}, 1},
               {{1, 2, 48, 80}, {1, 2, 96, 80}, {1, 2, 96, 80}, 1},
               {{2, 2, 40, 64}, {2, 2, 45, 64}, {2, 2, 45, 64}, 0},
               {{1, 2, 40, 64}, {1, 2, 45, 64}, {1, 2, 45, 32}, 0}};
  std::vector<CudaCpuGraphs> graphs;
  for (const auto& c : cases) {
    std::vector<int64_t> out = c.q;
    out.back() = c.v.back();
    const std::string attrs = absl::StrCat("{scale = 0.125, causal = ", c.causal, "}");
    graphs.push_back(RoundedAlike(
        absl::StrCat("input q: float32", DimsText(c.q), "\ninput k: float32", DimsText(c.k), "\ninput v: float32",
                     DimsText(c.v), "\ninput dy: float32", DimsText(out), "\n"),
        {"q", "k", "v", "dy"},
        absl::StrCat("y, lse = ai.cleave.Attention(qb, kb, vb) ", attrs,
                     "\ndq, dk, dv = ai.cleave.AttentionGrad(dyb, qb, kb, vb, y, lse) ", attrs, "\n"),
        {"y", "dq", "dk", "dv"}, true,
        {{"q", Random(c.q, 70)}, {"k", Random(c.k, 71)}, {"v", Random(c.v, 72)}, {"dy", Random(out, 73)}}));
    ExpectReferenceRuns(graphs.back());
  }
  REQUIRE_CUDA();
  {
    auto p = providers::CudaExecutionProvider::Create(0);
    ASSERT_TRUE(p.ok()) << p.status();
    auto* cuda = static_cast<providers::CudaExecutionProvider*>(p->get());
    std::printf("cuDNN fused attention: %s\n",
                cuda->cudnn_attention() ? "available" : cuda->cudnn_attention_unavailable().c_str());
  }
  for (const CudaCpuGraphs& g : graphs) ExpectSame(g.cuda, g.feeds, g.tol, g.tol, "Attention", g.cpu);
}

// Attention in the q/k/v products' own layout (layout "bshd": [B, T, H, D], and "bs3hd": the
// product itself, as AttentionLayoutFusion leaves a device session's attention), forward and
// backward: in fp32 through the own kernels, and in bf16 through cuDNN (head dim 64, causal with
// T = S and T < S), both reading and writing the layouts in place through their strides, against
// the CPU in fp32 on the bf16-rounded inputs.
TEST(CudaProvider, AttentionInTheProductsLayout) {
  const struct {
    std::vector<int64_t> q, k;
    int causal;
  } cases[] = {{{2, 128, 4, 64}, {2, 128, 4, 64}, 1}, {{1, 48, 3, 64}, {1, 96, 3, 64}, 1}, {{2, 40, 2, 64}, {2, 45, 2, 64}, 0}};
  std::vector<CudaCpuGraphs> graphs;
  for (const auto& c : cases) {
    for (bool low : {false, true}) {
      const std::string attrs = absl::StrCat("{scale = 0.125, causal = ", c.causal, ", layout = \"bshd\"}");
      graphs.push_back(RoundedAlike(
          absl::StrCat("input q: float32", DimsText(c.q), "\ninput k: float32", DimsText(c.k), "\ninput v: float32",
                       DimsText(c.k), "\ninput dy: float32", DimsText(c.q), "\n"),
          {"q", "k", "v", "dy"},
          absl::StrCat("y, lse = ai.cleave.Attention(qb, kb, vb) ", attrs,
                       "\ndq, dk, dv = ai.cleave.AttentionGrad(dyb, qb, kb, vb, y, lse) ", attrs, "\n"),
          {"y", "dq", "dk", "dv"}, low,
          {{"q", Random(c.q, 80)}, {"k", Random(c.k, 81)}, {"v", Random(c.k, 82)}, {"dy", Random(c.q, 83)}}));
      ExpectReferenceRuns(graphs.back());
    }
  }
  // Layout "bs3hd": q, k and v packed [B, T, 3, H, D] (the q/k/v product itself), cuDNN reading
  // them and writing dq, dk, dv through the packed strides.
  for (const auto& [qkv, causal] : {std::pair{std::vector<int64_t>{2, 128, 3, 4, 64}, 1},
                                    std::pair{std::vector<int64_t>{2, 40, 3, 2, 64}, 0}}) {
    for (bool low : {false, true}) {
      const std::vector<int64_t> out = {qkv[0], qkv[1], qkv[3], qkv[4]};
      const std::string attrs = absl::StrCat("{scale = 0.125, causal = ", causal, ", layout = \"bs3hd\"}");
      graphs.push_back(RoundedAlike(
          absl::StrCat("input qkv: float32", DimsText(qkv), "\ninput dy: float32", DimsText(out), "\n"), {"qkv", "dy"},
          absl::StrCat("y, lse = ai.cleave.Attention(qkvb) ", attrs,
                       "\ndqkv = ai.cleave.AttentionGrad(dyb, qkvb, _, _, y, lse) ", attrs, "\n"),
          {"y", "dqkv"}, low, {{"qkv", Random(qkv, 84)}, {"dy", Random(out, 85)}}));
      ExpectReferenceRuns(graphs.back());
    }
  }
  REQUIRE_CUDA();
  for (const CudaCpuGraphs& g : graphs) ExpectSame(g.cuda, g.feeds, g.tol, g.tol, "Attention", g.cpu);
}

// Attention with an additive bias (a padding mask [B, 1, 1, S] with -inf keys; a per-row bias
// [B, 1, T, S] one of whose rows is all -inf, under a causal mask with T < S; and the "bshd"
// layout), forward and backward with the scores' gradient (a learned bias'), in fp32 and with
// bf16 operands and a bf16 bias (cast to fp32 on the device), against the CPU. The backward
// forms the bias's gradient, so the own kernels run it; cuDNN may take the bf16 forwards of the
// first and third cases (no causal mask), the own kernels the second's (causal with T < S).
TEST(CudaProvider, AttentionWithABias) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    std::vector<int64_t> q, k, bias;
    int causal;
    const char* layout;
  } cases[] = {{{2, 3, 20, 32}, {2, 3, 20, 32}, {2, 1, 1, 20}, 0, "bhsd"},
               {{2, 3, 24, 32}, {2, 3, 30, 32}, {2, 1, 24, 30}, 1, "bhsd"},
               {{2, 20, 3, 32}, {2, 20, 3, 32}, {2, 1, 1, 20}, 0, "bshd"}};
  std::vector<CudaCpuGraphs> graphs;
  for (const auto& c : cases) {
    Tensor bias = Random(c.bias, 90);
    const int64_t S = c.bias.back(), rows = c.bias[2];
    for (int64_t b = 0; b < c.bias[0]; ++b)  // row b of the batch hides its last 3 b keys
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = S - 3 * b; j < S; ++j) bias.data<float>()[(b * rows + i) * S + j] = -inf;
    if (rows > 1)
      for (int64_t j = 0; j < S; ++j) bias.data<float>()[(rows + 5) * S + j] = -inf;  // row 5 of batch 1: nothing
    for (bool low : {false, true}) {
      const std::string attrs =
          absl::StrCat("{scale = 0.17, causal = ", c.causal, ", layout = \"", c.layout, "\"}");
      graphs.push_back(RoundedAlike(
          absl::StrCat("input q: float32", DimsText(c.q), "\ninput k: float32", DimsText(c.k), "\ninput v: float32",
                       DimsText(c.k), "\ninput dy: float32", DimsText(c.q), "\ninput m: float32", DimsText(c.bias),
                       "\n"),
          {"q", "k", "v", "dy", "m"},
          absl::StrCat("y, lse = ai.cleave.Attention(qb, kb, vb, mb) ", attrs,
                       "\ndq, dk, dv, dm = ai.cleave.AttentionGrad(dyb, qb, kb, vb, y, lse, mb) ", attrs, "\n"),
          {"y", "dq", "dk", "dv", "dm"}, low,
          {{"q", Random(c.q, 91)}, {"k", Random(c.k, 92)}, {"v", Random(c.k, 93)}, {"dy", Random(c.q, 94)},
           {"m", bias}}));
      ExpectReferenceRuns(graphs.back());
    }
  }
  REQUIRE_CUDA();
  for (const CudaCpuGraphs& g : graphs) ExpectSame(g.cuda, g.feeds, g.tol, g.tol, "Attention", g.cpu);
}

// bf16 attention with a bias and no bias gradient, forward and backward, the shapes cuDNN's
// fused attention takes with a bias: a padding mask [B, 1, 1, S] (BERT's, -inf keys), an
// ALiBi-like per-head bias [1, H, T, S] under a causal mask with T = S, and a padding mask in
// the "bshd" layout with causal, against the CPU in fp32 on the bf16-rounded inputs. Prints how
// many of the biased runs cuDNN took (it may refuse a case, and the own kernels run it).
TEST(CudaProvider, Bf16AttentionWithAPaddingMaskOrAlibiBias) {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    std::vector<int64_t> q, bias;
    int causal;
    const char* layout;
  } cases[] = {{{2, 4, 128, 64}, {2, 1, 1, 128}, 0, "bhsd"},
               {{2, 4, 128, 64}, {1, 4, 128, 128}, 1, "bhsd"},
               {{2, 128, 4, 64}, {2, 1, 1, 128}, 1, "bshd"}};
  std::vector<CudaCpuGraphs> graphs;
  for (const auto& c : cases) {
    Tensor bias(DataType::kFloat32, c.bias);
    const int64_t S = c.bias[3], rows = c.bias[2];
    float* m = bias.data<float>();
    if (c.bias[1] == 1) {  // padding: sequence b hides its last 16 b keys
      for (int64_t b = 0; b < c.bias[0]; ++b)
        for (int64_t j = 0; j < S; ++j) m[b * S + j] = j >= S - 16 * b ? -inf : 0.f;
    } else {  // ALiBi: head h's slope 2^-(h + 1) times the distance back to the key
      for (int64_t h = 0; h < c.bias[1]; ++h)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < S; ++j)
            m[(h * rows + i) * S + j] =
                -std::ldexp(1.f, -static_cast<int>(h) - 1) * static_cast<float>(std::abs(i - j));
    }
    const std::string attrs = absl::StrCat("{scale = 0.125, causal = ", c.causal, ", layout = \"", c.layout, "\"}");
    graphs.push_back(RoundedAlike(
        absl::StrCat("input q: float32", DimsText(c.q), "\ninput k: float32", DimsText(c.q), "\ninput v: float32",
                     DimsText(c.q), "\ninput dy: float32", DimsText(c.q), "\ninput m: float32", DimsText(c.bias), "\n"),
        {"q", "k", "v", "dy"},
        absl::StrCat("y, lse = ai.cleave.Attention(qb, kb, vb, m) ", attrs,
                     "\ndq, dk, dv = ai.cleave.AttentionGrad(dyb, qb, kb, vb, y, lse, m) ", attrs, "\n"),
        {"y", "dq", "dk", "dv"}, true,
        {{"q", Random(c.q, 95)}, {"k", Random(c.q, 96)}, {"v", Random(c.q, 97)}, {"dy", Random(c.q, 98)},
         {"m", bias}}));
    ExpectReferenceRuns(graphs.back());
  }
  REQUIRE_CUDA();
  const int64_t fwd = providers::CudnnAttention::BiasedRuns(false), bwd = providers::CudnnAttention::BiasedRuns(true);
  for (const CudaCpuGraphs& g : graphs) ExpectSame(g.cuda, g.feeds, g.tol, g.tol, "Attention", g.cpu);
  std::printf("cuDNN fused attention with a bias: %lld of 3 forwards, %lld of 3 backwards\n",
              static_cast<long long>(providers::CudnnAttention::BiasedRuns(false) - fwd),
              static_cast<long long>(providers::CudnnAttention::BiasedRuns(true) - bwd));
}

}  // namespace
}  // namespace cleave
