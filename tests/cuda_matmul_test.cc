// The CUDA provider's products through cuBLASLt against the CPU kernels (labelled gpu, skipped
// without a device): MatMul shapes and broadcasting, FusedMatMul's bias and GELU epilogues, and
// mixed precision's MatMulBf16 / MatMulF16 with their bias, low-precision results, accumulation
// into a gradient buffer, bias gradients and the tanh-GELU written or read in the epilogue.
#include <cuda_runtime_api.h>

#include <cmath>
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

double TanhGelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double TanhGeluDerivative(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// A device copy of host floats, freed at scope exit.
struct DeviceFloats {
  explicit DeviceFloats(const std::vector<float>& v) : n(v.size()) {
    EXPECT_EQ(cudaMalloc(&p, n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> Host() const {
    std::vector<float> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  float* f() const { return static_cast<float*>(p); }
  void* p = nullptr;
  size_t n;
};

// CudaMatMul's GELU-input epilogues on a batch that folds into one product: the forward writes
// y = tanh-GELU(A B + bias) and the GELU input, the backward dY W times GELU' at that input,
// each against the definition in double. A result row that is not a multiple of 8 elements
// runs nothing (the caller then does the work).
TEST(CudaProvider, ProductEpiloguesWriteAndReadTheGeluInput) {
  REQUIRE_CUDA();
  auto provider = providers::CudaExecutionProvider::Create(0);
  ASSERT_TRUE(provider.ok()) << provider.status();
  const auto& p = static_cast<const providers::CudaExecutionProvider&>(**provider);
  const int64_t B = 2, M = 6, K = 16, N = 24, rows = B * M;
  auto host = [](int64_t n, unsigned seed) {
    Tensor t = Random({n}, seed);
    return std::vector<float>(t.data<float>(), t.data<float>() + n);
  };
  const std::vector<float> a = host(rows * K, 61), w = host(K * N, 62), bias = host(N, 63), dy = host(rows * K, 64);
  DeviceFloats da(a), dw(w), dbias(bias), ddy(dy), y(std::vector<float>(rows * N, 7.f)),
      pre(std::vector<float>(rows * N, 7.f));
  const int64_t a_dims[3] = {B, M, K}, w_dims[2] = {K, N};
  auto fwd = kernels::cpu::PlanMatMul(a_dims, w_dims);
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  bool formed = false;
  absl::Status s = providers::CudaMatMul(p, *fwd, DataType::kFloat32, DataType::kFloat32, da.p, dw.p, y.p, dbias.p,
                                         true, nullptr, false, {}, 0, {pre.p, nullptr, &formed});
  ASSERT_TRUE(s.ok()) << s;
  // The backward's form: another [rows, K] x [K, N] product, dy W, times GELU' at `pre`.
  const int64_t g_dims[3] = {B, M, K}, wt_dims[2] = {K, N};
  auto bwd = kernels::cpu::PlanMatMul(g_dims, wt_dims);
  ASSERT_TRUE(bwd.ok());
  DeviceFloats dgrad(std::vector<float>(rows * N, 7.f));
  bool formed_bwd = false;
  if (formed) {
    s = providers::CudaMatMul(p, *bwd, DataType::kFloat32, DataType::kFloat32, ddy.p, dw.p, dgrad.p, nullptr, false,
                              nullptr, false, {}, 0, {nullptr, pre.p, &formed_bwd});
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(p.Synchronize("test").ok());
#ifdef CLEAVE_CUDA_EMULATED_DEVICE
  EXPECT_TRUE(formed && formed_bwd) << "the emulated library has both epilogues";
#endif
  std::printf("cuBLASLt GELU-input epilogues: %s\n",
              formed && formed_bwd ? "formed" : formed ? "GELU_AUX_BIAS formed, DGELU refused" : "refused");
  if (!formed) GTEST_SKIP() << "this library refuses the GELU_AUX_BIAS epilogue (the provider falls back)";
  const std::vector<float> got_y = y.Host(), got_pre = pre.Host(), got_dgrad = dgrad.Host();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double x = bias[n], g = 0;
      for (int64_t k = 0; k < K; ++k) {
        x += static_cast<double>(a[r * K + k]) * w[k * N + n];
        g += static_cast<double>(dy[r * K + k]) * w[k * N + n];
      }
      const size_t i = static_cast<size_t>(r * N + n);
      ASSERT_NEAR(got_pre[i], x, 1e-4 * (1 + std::fabs(x))) << r << "," << n;
      ASSERT_NEAR(got_y[i], TanhGelu(x), 1e-4 * (1 + std::fabs(x))) << r << "," << n;
      if (formed_bwd) {
        const double want = g * TanhGeluDerivative(got_pre[i]);
        ASSERT_NEAR(got_dgrad[i], want, 1e-4 * (1 + std::fabs(want))) << r << "," << n;
      }
    }
  // Rows of 20 elements: not the epilogue's; nothing runs.
  const int64_t w20_dims[2] = {K, 20};
  auto odd = kernels::cpu::PlanMatMul(a_dims, w20_dims);
  ASSERT_TRUE(odd.ok());
  DeviceFloats y20(std::vector<float>(rows * 20, 7.f)), pre20(std::vector<float>(rows * 20, 7.f));
  s = providers::CudaMatMul(p, *odd, DataType::kFloat32, DataType::kFloat32, da.p, dw.p, y20.p, dbias.p, true,
                            nullptr, false, {}, 0, {pre20.p, nullptr, &formed});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(formed);
  for (float v : y20.Host()) ASSERT_EQ(v, 7.f);
}

// MatMulBf16 / MatMulF16 with the tanh-GELU and its input (output 2), and with the GELU's
// gradient over that input (input 5), as GeluEpilogueFusion leaves an MLP: the same as the CPU's
// kernels within the low type's rounding, through the epilogue (width 64) and through the
// product and the own GELU kernels after it (the erf form; a width of 60; and, emulated, a
// library that refuses the epilogue at the heuristic or at the call).
TEST(CudaProvider, LowPrecisionProductFormsTheGeluAndItsGradient) {
  REQUIRE_CUDA();
  auto run = [](const char* op, const char* act, int64_t width, const char* to) {
    SCOPED_TRACE(absl::StrCat(op, " ", act, " width ", width, to));
    const int low = std::string(op) == "MatMulF16" ? 10 : 16;
    const std::string text = absl::StrCat(R"(
      input a: float32[2,24,32]
      input w1: float32[)", width, R"(,32]
      input b1: float32[)", width, R"(]
      input w2: float32[16,)", width, R"(]
      input dz: float32[2,24,16]
      ha = Cast(a) {to = )", low, R"(}
      hw1 = Cast(w1) {to = )", low, R"(}
      hb1 = Cast(b1) {to = )", to[0] ? low : 1, R"(}
      hw2 = Cast(w2) {to = )", low, R"(}
      hdz = Cast(dz) {to = )", low, R"(}
      y, _, x = ai.cleave.)", op, R"((ha, hw1, hb1) {transB = 1, activation = ")", act, "\"", to, R"(}
      dx = ai.cleave.)", op, R"((hdz, hw2, _, _, _, x) {activation_grad = ")", act, "\"", to, R"(}
      output y
      output x
      output dx
    )");
    const Feeds feeds = {{"a", Random({2, 24, 32}, 71)}, {"w1", Random({width, 32}, 72)}, {"b1", Random({width}, 73)},
                         {"w2", Random({16, width}, 74)}, {"dz", Random({2, 24, 16}, 75)}};
    const double tol = to[0] ? 1e-2 : 1e-3;
    ExpectSame(text, feeds, tol, tol, op);
  };
  const int64_t refused = providers::RefusedGeluAuxEpilogues();
  for (const char* op : {"MatMulBf16", "MatMulF16"})
    for (const char* to : {", to = 16", ""}) {
      const std::string to_low = std::string(op) == "MatMulF16" && to[0] ? ", to = 10" : to;
      run(op, "gelu_tanh", 64, to_low.c_str());
      run(op, "gelu", 64, to_low.c_str());
      run(op, "gelu_tanh", 60, to_low.c_str());
    }
#ifdef CLEAVE_CUDA_EMULATED_DEVICE
  EXPECT_EQ(providers::RefusedGeluAuxEpilogues(), refused) << "the emulated library has the epilogues";
  int64_t before = refused;
  for (const auto& [refusal, width] : {std::pair{cuda_emu::EpilogueRefusal::kAtHeuristic, 72},
                                       std::pair{cuda_emu::EpilogueRefusal::kAtCall, 80}}) {
    cuda_emu::SetGeluAuxEpilogueRefusal(refusal);
    run("MatMulBf16", "gelu_tanh", width, ", to = 16");
    cuda_emu::SetGeluAuxEpilogueRefusal(cuda_emu::EpilogueRefusal::kNone);
    EXPECT_GT(providers::RefusedGeluAuxEpilogues(), before) << width << ": the refusal was seen and remembered";
    before = providers::RefusedGeluAuxEpilogues();
  }
#else
  (void)refused;
#endif
}

// Gemm with every form of C: [N] in the product's epilogue, [M, N], [M, 1] and [1] after it
// with alpha and beta, none, beta 0 (C not read), both operands transposed; and in bf16 against
// the CPU's float32 Gemm of the same bf16 values, rounded once.
TEST(CudaProvider, GemmEveryFormOfC) {
  REQUIRE_CUDA();
  const Feeds feeds = {{"a", Random({6, 5}, 90)},  {"at", Random({5, 6}, 91)}, {"b", Random({5, 7}, 92)},
                       {"bt", Random({7, 5}, 93)}, {"cm", Random({6, 7}, 94)}, {"cn", Random({7}, 95)},
                       {"cr", Random({6, 1}, 96)}, {"cs", Random({1}, 97)}};
  const std::string inputs = R"(
    input a: float32[6,5]
    input at: float32[5,6]
    input b: float32[5,7]
    input bt: float32[7,5]
    input cm: float32[6,7]
    input cn: float32[7]
    input cr: float32[6,1]
    input cs: float32[1]
  )";
  ExpectSame(inputs + R"(
    y1 = Gemm(a, b, cn)
    y2 = Gemm(at, bt, cm) {transA = 1, transB = 1, alpha = 0.5, beta = 2.0}
    y3 = Gemm(a, bt, cr) {transB = 1, beta = -1.0}
    y4 = Gemm(a, b, cs) {alpha = 3.0}
    y5 = Gemm(a, b)
    y6 = Gemm(a, b, cm) {beta = 0.0}
    y7 = Gemm(at, b, cn) {transA = 1, alpha = 2.0}
    output y1
    output y2
    output y3
    output y4
    output y5
    output y6
    output y7
  )",
             feeds, 1e-5, 1e-5, "*");
  const std::string rounded = inputs + R"(
    ha = Cast(a) {to = 16}
    hb = Cast(b) {to = 16}
    hc = Cast(cn) {to = 16}
  )";
  ExpectSame(rounded + R"(
    hy = Gemm(ha, hb, hc)
    y = Cast(hy) {to = 1}
    output y
  )",
             feeds, 1e-6, 8e-3, "Gemm", rounded + R"(
    fa = Cast(ha) {to = 1}
    fb = Cast(hb) {to = 1}
    fc = Cast(hc) {to = 1}
    fy = Gemm(fa, fb, fc)
    hy = Cast(fy) {to = 16}
    y = Cast(hy) {to = 1}
    output y
  )");
}

}  // namespace
}  // namespace cleave
