// CUDA tests (label gpu) of the kernels behind LLaMA's fused ops: RMSNormalization, its gradient,
// SkipRMSNormalization, SwiGLU and RotaryEmbedding with their gradients, against the CPU kernels
// on the same graph (LayerNormalization's are in cuda_kernels_test.cc). Without a usable device
// (or driver) each test skips and says why.
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/inference_session.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, RMSNormForwardAndBackward) {
  REQUIRE_CUDA();
  // Widths under, at and over one block's threads; one row, and many.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 7}, {33, 256}, {64, 768}, {5, 1500}}) {
    SCOPED_TRACE(absl::StrCat(rows, "x", cols));
    const std::string dims = absl::StrCat("[", rows, ",", cols, "]"), vec = absl::StrCat("[", cols, "]");
    ExpectSame(absl::StrCat("input dy: float32", dims, "\ninput x: float32", dims, "\ninput g: float32", vec, R"(
      y, inv = ai.cleave.RMSNormalization(x, g) {axis = -1, epsilon = 0.000001}
      dx, dg = ai.cleave.RMSNormalizationGrad(dy, x, g, inv) {axis = -1}
      output y
      output inv
      output dx
      output dg
    )"),
               {{"dy", Random({rows, cols}, 61)}, {"x", Random({rows, cols}, 62)}, {"g", Random({cols}, 63)}}, 1e-5,
               1e-4, "RMSNormalization");
  }
  // The residual stream's gradient folded in (dX_add), a bf16 / fp16 dY read as float32, and dX
  // also written rounded to the low type (dX_low).
  const std::string inputs = R"(
    input dy: float32[64,768]
    input x: float32[64,768]
    input r: float32[64,768]
    input g: float32[768]
    y, inv = ai.cleave.RMSNormalization(x, g)
  )";
  const Feeds feeds = {{"dy", Random({64, 768}, 64)}, {"x", Random({64, 768}, 65)}, {"r", Random({64, 768}, 66)},
                       {"g", Random({768}, 67)}};
  for (int to : {16, 10}) {
    ExpectSame(absl::StrCat(inputs, "hdy = Cast(dy) {to = ", to, R"(}
      dx, dg = ai.cleave.RMSNormalizationGrad(hdy, x, g, inv, r)
      output dx
      output dg
    )"),
               feeds, 1e-5, 1e-4, "RMSNormalizationGrad");
    ExpectSame(absl::StrCat(inputs, "dx, dg, dl = ai.cleave.RMSNormalizationGrad(dy, x, g, inv, r) {low_to = ", to,
                            R"(}
      w = Cast(dl) {to = 1}
      output dx
      output dg
      output w
    )"),
               feeds, 1e-5, to == 16 ? 8e-3 : 1e-3, "RMSNormalizationGrad");
  }
}

// The residual add fused in (SkipRMSNormalization): y, inv_std_dev and the sum; y also written
// in bf16 / fp16 (`to`, one rounding of the float32 value, which may fall either side of a
// rounding boundary on the two devices), and a bf16 / fp16 skip added to the float32 x as float32.
TEST(CudaProvider, SkipRMSNorm) {
  REQUIRE_CUDA();
  const Feeds feeds = {{"x", Random({3, 5, 768}, 92)}, {"r", Random({3, 5, 768}, 93)}, {"g", Random({768}, 94)}};
  const std::string inputs = R"(
    input x: float32[3,5,768]
    input r: float32[3,5,768]
    input g: float32[768]
  )";
  ExpectSame(inputs + R"(
    y, inv, sum = ai.cleave.SkipRMSNormalization(x, r, g) {epsilon = 1e-6}
    output y
    output inv
    output sum
  )",
             feeds, 1e-5, 1e-4, "SkipRMSNormalization");
  for (int to : {16, 10}) {
    ExpectSame(inputs + absl::StrCat("hy, inv, sum = ai.cleave.SkipRMSNormalization(x, r, g) {to = ", to, R"(}
      y = Cast(hy) {to = 1}
      output y
      output inv
      output sum
    )"),
               feeds, to == 16 ? 1e-2 : 1e-3, to == 16 ? 8e-3 : 1e-3, "SkipRMSNormalization");
    ExpectSame(inputs + absl::StrCat("hr = Cast(r) {to = ", to, R"(}
      y, inv, sum = ai.cleave.SkipRMSNormalization(x, hr, g)
      output y
      output inv
      output sum
    )"),
               feeds, 1e-5, 1e-4, "SkipRMSNormalization");
  }
}

// silu(gate) * up and both gradients in float32; and in bf16 / fp16, where the CUDA kernel
// computes in float32 and rounds once, against the CPU's float32 op on the same rounded operands
// with its result rounded once.
TEST(CudaProvider, SwiGluForwardAndBackward) {
  REQUIRE_CUDA();
  for (int64_t n : {int64_t{7}, int64_t{4096 * 3 + 5}}) {
    SCOPED_TRACE(n);
    const std::string dims = absl::StrCat("[", n, "]");
    ExpectSame(absl::StrCat("input dy: float32", dims, "\ninput g: float32", dims, "\ninput u: float32", dims, R"(
      y = ai.cleave.SwiGLU(g, u)
      dg, du = ai.cleave.SwiGLUGrad(dy, g, u)
      output y
      output dg
      output du
    )"),
               {{"dy", Random({n}, 95)}, {"g", Random({n}, 96)}, {"u", Random({n}, 97)}}, 1e-5, 1e-5, "SwiGLU");
  }
  for (int to : {16, 10}) {
    const std::string inputs = absl::StrCat(R"(
      input g: float32[64,300]
      input u: float32[64,300]
      hg = Cast(g) {to = )", to, R"(}
      hu = Cast(u) {to = )", to, "}\n");
    const std::string cuda = inputs + R"(
      hy = ai.cleave.SwiGLU(hg, hu)
      y = Cast(hy) {to = 1}
      output y
    )";
    const std::string cpu = inputs + absl::StrCat(R"(
      wg = Cast(hg) {to = 1}
      wu = Cast(hu) {to = 1}
      y32 = ai.cleave.SwiGLU(wg, wu)
      hy = Cast(y32) {to = )", to, R"(}
      y = Cast(hy) {to = 1}
      output y
    )");
    ExpectSame(cuda, {{"g", Random({64, 300}, 98)}, {"u", Random({64, 300}, 99)}}, 1e-2, to == 16 ? 8e-3 : 1e-3,
               "SwiGLU", cpu);
  }
}

// The rotary embedding and its gradient over tables of [T, D] (heads first), [B, T, 1, D] (the
// products' layout) and one column [T, 1], against the CPU.
TEST(CudaProvider, RotaryEmbeddingForwardAndBackward) {
  REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> x, table;
  };
  for (const Case& c : {Case{{2, 3, 5, 16}, {5, 16}}, Case{{2, 5, 3, 64}, {2, 5, 1, 64}}, Case{{4, 7, 6}, {7, 1}}}) {
    const std::string x = DimsText(c.x), t = DimsText(c.table);
    SCOPED_TRACE(x + " " + t);
    ExpectSame(absl::StrCat("input x: float32", x, "\ninput dy: float32", x, "\ninput c: float32", t,
                            "\ninput s: float32", t, R"(
      y = ai.cleave.RotaryEmbedding(x, c, s)
      dx = ai.cleave.RotaryEmbeddingGrad(dy, c, s)
      output y
      output dx
    )"),
               {{"x", Random(c.x, 101)}, {"dy", Random(c.x, 102)}, {"c", Random(c.table, 103)},
                {"s", Random(c.table, 104)}},
               1e-5, 1e-5, "RotaryEmbedding");
  }
}

}  // namespace
}  // namespace cleave
