// The CUDA provider's products through cuBLASLt against the CPU kernels (labelled gpu, skipped
// without a device): MatMul shapes and broadcasting, FusedMatMul's bias and GELU epilogues, and
// mixed precision's MatMulBf16 / MatMulF16 with their bias, low-precision results, accumulation
// into a gradient buffer and bias gradients.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/text_format.h"
#include "gtest/gtest.h"
#include "providers/cuda/cuda_matmul.h"
#include "runtime/inference_session.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, MatMulShapes) {
  REQUIRE_CUDA();
  // Batch folded into M; strided batches; a broadcast batch; a 1-D operand.
  ExpectSame("input a: float32[2,3,64]\ninput b: float32[64,40]\ny = MatMul(a, b)\noutput y\n",
             {{"a", Random({2, 3, 64}, 9)}, {"b", Random({64, 40}, 10)}}, 1e-4, 1e-5, "MatMul");
  ExpectSame("input a: float32[2,3,64]\ninput b: float32[2,64,40]\ny = MatMul(a, b)\noutput y\n",
             {{"a", Random({2, 3, 64}, 11)}, {"b", Random({2, 64, 40}, 12)}}, 1e-4, 1e-5, "MatMul");
  ExpectSame("input a: float32[2,1,3,16]\ninput b: float32[4,16,8]\ny = MatMul(a, b)\noutput y\n",
             {{"a", Random({2, 1, 3, 16}, 13)}, {"b", Random({4, 16, 8}, 14)}}, 1e-4, 1e-5, "MatMul");
  ExpectSame("input a: float32[5,16]\ninput b: float32[16]\ny = MatMul(a, b)\noutput y\n",
             {{"a", Random({5, 16}, 15)}, {"b", Random({16}, 16)}}, 1e-4, 1e-5, "MatMul");
  // A transposed batch with one B: each A^T is its own product (the batch cannot fold into M).
  for (int trans_b : {0, 1})
    ExpectSame(absl::StrCat("input a: float32[2,64,3]\ninput b: float32", trans_b ? "[40,64]" : "[64,40]",
                            "\ny = ai.cleave.FusedMatMul(a, b) {transA = 1, transB = ", trans_b, "}\noutput y\n"),
               {{"a", Random({2, 64, 3}, 57)},
                {"b", Random(trans_b ? std::vector<int64_t>{40, 64} : std::vector<int64_t>{64, 40}, 58)}},
               1e-4, 1e-5, "FusedMatMul");
}

TEST(CudaProvider, FusedMatMulEpilogues) {
  REQUIRE_CUDA();
  for (const char* act : {"", "gelu", "gelu_tanh"})
    for (int trans_b : {0, 1}) {
      const std::string b_dims = trans_b ? "[48,32]" : "[32,48]";
      ExpectSame(absl::StrCat("input a: float32[4,6,32]\ninput b: float32", b_dims,
                              "\ninput bias: float32[48]\ny = ai.cleave.FusedMatMul(a, b, bias) {transB = ", trans_b,
                              ", activation = \"", act, "\"}\noutput y\n"),
                 {{"a", Random({4, 6, 32}, 17)}, {"b", Random(trans_b ? std::vector<int64_t>{48, 32}
                                                                      : std::vector<int64_t>{32, 48}, 18)},
                  {"bias", Random({48}, 19)}},
                 1e-4, 1e-4, "FusedMatMul");
    }
}

TEST(CudaProvider, Bf16MatMulTracksFp32) {
  REQUIRE_CUDA();
  // bf16 storage, fp32 accumulation: within bf16 rounding of the fp32 product.
  ExpectSame(R"(
    input a: float32[8,256]
    input b: float32[256,64]
    ha = Cast(a) {to = 16}
    hb = Cast(b) {to = 16}
    h = MatMul(ha, hb)
    y = Cast(h) {to = 1}
    output y
  )",
             {{"a", Random({8, 256}, 20)}, {"b", Random({256, 64}, 21)}}, 0.5, 2e-2, "MatMul",
             "input a: float32[8,256]\ninput b: float32[256,64]\ny = MatMul(a, b)\noutput y\n");
}

TEST(CudaProvider, LowPrecisionProductsGiveFloat32) {
  REQUIRE_CUDA();
  // MatMulBf16 / MatMulF16 (mixed precision's products): low-precision operands, a float32
  // result; the CPU computes the same exact products of the rounded values in fp32.
  for (const auto& [op, to] : {std::pair{"MatMulBf16", 16}, std::pair{"MatMulF16", 10}})
    for (int trans_b : {0, 1})
      ExpectSame(absl::StrCat("input a: float32[2,8,256]\ninput b: float32", trans_b ? "[64,256]" : "[256,64]",
                              "\nha = Cast(a) {to = ", to, "}\nhb = Cast(b) {to = ", to, "}\ny = ai.cleave.", op,
                              "(ha, hb) {transB = ", trans_b, "}\noutput y\n"),
                 {{"a", Random({2, 8, 256}, 40)},
                  {"b", Random(trans_b ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{256, 64}, 41)}},
                 1e-3, 1e-3, op);
  // With a layer's float32 bias, applied in cuBLASLt's epilogue.
  for (const auto& [op, to] : {std::pair{"MatMulBf16", 16}, std::pair{"MatMulF16", 10}})
    ExpectSame(absl::StrCat("input a: float32[2,8,256]\ninput b: float32[64,256]\ninput c: float32[64]\n",
                            "ha = Cast(a) {to = ", to, "}\nhb = Cast(b) {to = ", to, "}\ny = ai.cleave.", op,
                            "(ha, hb, c) {transB = 1}\noutput y\n"),
               {{"a", Random({2, 8, 256}, 42)}, {"b", Random({64, 256}, 43)}, {"c", Random({64}, 44)}}, 1e-3, 1e-3,
               op);
  // With `to`: the result in the operands' type, the bias of that type added before the one
  // rounding (mixed precision's activations); the two may differ by that rounding.
  for (const auto& [op, to] : {std::pair{"MatMulBf16", 16}, std::pair{"MatMulF16", 10}})
    ExpectSame(absl::StrCat("input a: float32[2,8,256]\ninput b: float32[64,256]\ninput c: float32[64]\n",
                            "ha = Cast(a) {to = ", to, "}\nhb = Cast(b) {to = ", to, "}\nhc = Cast(c) {to = ", to,
                            "}\nhy = ai.cleave.", op, "(ha, hb, hc) {transB = 1, to = ", to,
                            "}\ny = Cast(hy) {to = 1}\noutput y\n"),
               {{"a", Random({2, 8, 256}, 45)}, {"b", Random({64, 256}, 46)}, {"c", Random({64}, 47)}}, 1e-2,
               to == 16 ? 8e-3 : 1e-3, op);
}

// A weight gradient accumulated in its product (GradientAccumulationFusion): the buffer added
// in cuBLASLt's epilogue (beta = 1), or the product alone on reset.
TEST(CudaProvider, LowPrecisionProductAccumulatesIntoItsBuffer) {
  const char* text = R"(
    input a: float32[64,96]
    input b: float32[64,80]
    input acc: float32[96,80]
    input reset: bool[]
    ha = Cast(a) {to = 16}
    hb = Cast(b) {to = 16}
    y = ai.cleave.MatMulBf16(ha, hb, _, acc, reset) {transA = 1}
    output y
  )";
  // The reference runs on any machine.
  for (bool reset : {false, true}) {
    Tensor flag(DataType::kBool, {});
    flag.data<bool>()[0] = reset;
    const Feeds feeds = {{"a", Random({64, 96}, 90)}, {"b", Random({64, 80}, 91)}, {"acc", Random({96, 80}, 92)},
                         {"reset", flag}};
    SessionOptions o;
    o.optimize = false;
    auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(text), o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE((*cpu)->Run(feeds).ok());
    if (!CudaUnusable().empty()) continue;
    ExpectSame(text, feeds, 1e-3, 1e-3, "MatMulBf16");
  }
  REQUIRE_CUDA();
}

// The padded head's weight gradient (ClassPadding): a product that forms only op(A)'s first
// rows, with transA reading A's first columns where they lie (the padded scores' gradient, whose
// row pitch is wider than the rows kept), accumulating into its buffer or not; without transA, a
// prefix of A's rows.
TEST(CudaProvider, LowPrecisionProductFormsOnlyTheFirstRows) {
  REQUIRE_CUDA();
  for (bool accumulate : {false, true}) {
    const std::string cols = absl::StrCat(R"(
      input g: float32[96,136]
      input x: float32[96,80]
      input acc: float32[129,80]
      input reset: bool[]
      hg = Cast(g) {to = 16}
      hx = Cast(x) {to = 16}
      y = ai.cleave.MatMulBf16(hg, hx)", accumulate ? ", _, acc, reset" : "", R"() {transA = 1, rows = 129}
      output y
    )");
    Tensor flag(DataType::kBool, {});
    flag.data<bool>()[0] = false;
    ExpectSame(cols, {{"g", Random({96, 136}, 96)}, {"x", Random({96, 80}, 97)}, {"acc", Random({129, 80}, 98)},
                      {"reset", flag}},
               1e-3, 1e-3, "MatMulBf16");
  }
  const char* prefix = R"(
    input a: float32[136,96]
    input b: float32[96,80]
    ha = Cast(a) {to = 16}
    hb = Cast(b) {to = 16}
    y = ai.cleave.MatMulBf16(ha, hb) {rows = 129}
    output y
  )";
  ExpectSame(prefix, {{"a", Random({136, 96}, 99)}, {"b", Random({96, 80}, 100)}}, 1e-3, 1e-3, "MatMulBf16");
}

// A weight gradient's product that also forms its layer's bias gradient (BiasGradientFusion's
// dbias), summing A [K, M] (transA; cuBLASLt's BGRADB) or B [K, N] (BGRADA), with and without
// the accumulation buffer; the CPU sums the same bf16 values in float32.
TEST(CudaProvider, LowPrecisionProductFormsTheBiasGradient) {
  REQUIRE_CUDA();
  auto run = [](int64_t K) {
    for (bool accumulate : {false, true}) {
      const std::string a_side = absl::StrCat(R"(
        input g: float32[)", K, R"(,96]
        input x: float32[)", K, R"(,80]
        input acc: float32[96,80]
        input reset: bool[]
        hg = Cast(g) {to = 16}
        hx = Cast(x) {to = 16}
        y, db = ai.cleave.MatMulBf16(hg, hx)", accumulate ? ", _, acc, reset" : "", R"() {transA = 1, dbias_operand = 0}
        output y
        output db
      )");
      const std::string b_side = absl::StrCat(R"(
        input g: float32[)", K, R"(,96]
        input x: float32[)", K, R"(,80]
        hg = Cast(g) {to = 16}
        hx = Cast(x) {to = 16}
        y, db = ai.cleave.MatMulBf16(hx, hg) {transA = 1}
        output y
        output db
      )");
      Tensor flag(DataType::kBool, {});
      flag.data<bool>()[0] = false;
      const Feeds feeds = {{"g", Random({K, 96}, 93)}, {"x", Random({K, 80}, 94)}, {"acc", Random({96, 80}, 95)},
                           {"reset", flag}};
      ExpectSame(a_side, feeds, 1e-3, 1e-3, "MatMulBf16");
      if (!accumulate) ExpectSame(b_side, {feeds[0], feeds[1]}, 1e-3, 1e-3, "MatMulBf16");
    }
  };
  run(300);
  // For gpu-check's summary: whether this library formed them in the epilogue.
  const int64_t refused = providers::RefusedBiasGradientEpilogues();
  std::printf("cuBLASLt bias-gradient epilogue: %s\n",
              refused == 0 ? "formed in the weight-gradient products"
                           : absl::StrCat("refused for ", refused, " product shapes (summed by the provider)").c_str());
#ifdef CLEAVE_CUDA_EMULATED_DEVICE
  // A library without the epilogue for the shape, refusing it at the heuristic or only at the
  // call: the product alone, then the provider's column sums (another K each time, so that no
  // plan of an earlier run is reused).
  int64_t before = refused;
  for (const auto& [refusal, K] : {std::pair{cuda_emu::EpilogueRefusal::kAtHeuristic, 200},
                                   std::pair{cuda_emu::EpilogueRefusal::kAtCall, 250}}) {
    cuda_emu::SetBiasGradientEpilogueRefusal(refusal);
    run(K);
    cuda_emu::SetBiasGradientEpilogueRefusal(cuda_emu::EpilogueRefusal::kNone);
    EXPECT_GT(providers::RefusedBiasGradientEpilogues(), before) << K << ": the refusal was seen and remembered";
    before = providers::RefusedBiasGradientEpilogues();
  }
#endif
}

}  // namespace
}  // namespace cleave
