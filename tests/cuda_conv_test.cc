// Conv, ConvTranspose and their gradients on the CUDA provider against the CPU's (gpu label):
// every layout of the lowering (one image or several per product, groups, depthwise, 1 to 3 spatial dims,
// strides, dilations, padding), bf16 and fp16 against the CPU on the rounded operands, and a
// chunk budget small enough that the images are lowered a few at a time. The pools and their
// gradients, BatchNormalization and its gradient in both modes, and InstanceNormalization and its
// gradient, and Resize and its gradient, against the CPU's in float32,
// and in bf16 and fp16 against the CPU on rounded operands.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using cuda_testing::CudaUnusable;
using cuda_testing::DimsText;
using cuda_testing::ExpectSame;
using cuda_testing::Random;

// `h<name>` = <name> cast to `type` (float32 1, bfloat16 16, float16 10); with `rounded`, the
// CPU reference's view of that: <name> rounded to `type` and widened back to float32.
std::string CastIn(const std::string& name, int type, bool rounded) {
  if (!rounded) return absl::StrCat("h", name, " = Cast(", name, ") {to = ", type, "}\n");
  return absl::StrCat(name, "_r = Cast(", name, ") {to = ", type, "}\nh", name, " = Cast(", name, "_r) {to = 1}\n");
}

// <name> = `h<name>` widened to float32; with `rounded`, rounded to `type` first.
std::string CastOut(const std::string& name, int type, bool rounded) {
  if (!rounded) return absl::StrCat(name, " = Cast(h", name, ") {to = 1}\n");
  return absl::StrCat(name, "_r = Cast(h", name, ") {to = ", type, "}\n", name, " = Cast(", name, "_r) {to = 1}\n");
}

struct ConvCase {
  std::vector<int64_t> x, w;
  bool bias;
  std::string attrs;
  bool transposed = false;  // ConvTranspose and ai.cleave.ConvTransposeGrad
};

const ConvCase kCases[] = {
    {{3, 4, 7, 6}, {6, 4, 3, 3}, true, "pads = [1, 1, 1, 1], strides = [2, 1]"},
    {{2, 4, 5, 4}, {6, 2, 3, 2}, false, "group = 2, pads = [1, 0, 1, 1]"},
    {{2, 3, 6, 6}, {3, 1, 3, 3}, true, "group = 3, dilations = [2, 2], pads = [2, 2, 2, 2]"},
    {{2, 3, 9}, {4, 3, 3}, true, "strides = [2], pads = [1, 2], dilations = [2]"},
    {{1, 2, 3, 4, 3}, {2, 2, 2, 2, 2}, false, "pads = [0, 1, 0, 1, 0, 1]"},
    {{2, 2, 5, 6}, {3, 2, 3, 3}, true, "auto_pad = \"SAME_UPPER\", strides = [2, 2]"},
    {{2, 3, 16, 16}, {8, 3, 4, 4}, true, "strides = [4, 4]"},  // a ViT patch embedding
    {{4, 5, 3, 3}, {7, 5, 1, 1}, true, ""},                      // a pointwise conv
};

// ConvTranspose: W [C, M / group, kernel...].
const ConvCase kTransposedCases[] = {
    {{2, 4, 3, 3}, {4, 3, 3, 3}, true, "strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]", true},
    {{1, 4, 3, 2}, {4, 3, 2, 3}, false, "group = 2, strides = [2, 1]", true},
    {{3, 3, 4}, {3, 2, 3}, true, "strides = [3], pads = [1, 2], dilations = [2], output_padding = [1]", true},
    {{2, 2, 3, 2}, {2, 3, 3, 3}, true, "auto_pad = \"SAME_LOWER\", strides = [2, 2]", true},
    {{1, 2, 3, 3}, {2, 1, 3, 3}, true, "strides = [3, 2], output_shape = [10, 8]", true},
    {{1, 2, 2, 3, 2}, {2, 2, 2, 2, 2}, false, "strides = [2, 2, 2]", true},
    {{2, 8, 4, 4}, {8, 3, 4, 4}, true, "strides = [4, 4]", true},  // a patch un-embedding
};

const char* OpOf(const ConvCase& c) { return c.transposed ? "ConvTranspose" : "Conv"; }

std::string Attrs(const ConvCase& c) { return c.attrs.empty() ? "" : absl::StrCat(" {", c.attrs, "}"); }

// Y's dims, from the CPU's forward.
std::vector<int64_t> OutDims(const ConvCase& c) {
  const std::string text = absl::StrCat("input x: float32", DimsText(c.x), "\ninput w: float32", DimsText(c.w),
                                        "\ny = ", OpOf(c), "(x, w)", Attrs(c), "\noutput y\n");
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(text), SessionOptions{});
  if (!s.ok()) return {};
  auto y = (*s)->Run({{"x", Random(c.x, 1)}, {"w", Random(c.w, 2)}});
  if (!y.ok()) return {};
  const Tensor& t = (*y)[0];
  return std::vector<int64_t>(t.dims().begin(), t.dims().end());
}

// The bias's length: Y's channels.
int64_t BiasDim(const ConvCase& c) { return c.transposed ? OutDims(c).at(1) : c.w[0]; }

// y = Conv(x, w[, b]) (or ConvTranspose) and the three gradients of a fed dY, every operand cast to `type`
// (float32: 1, bfloat16: 16, float16: 10) around the ops and back to float32. With `rounded`,
// the CPU's reference of that: the float32 ops on operands rounded to `type` (the casts there
// and back), their results rounded the same way.
std::string ConvGraph(const ConvCase& c, int type, bool rounded = false) {
  auto in = [&](const std::string& name) { return CastIn(name, type, rounded); };
  auto out = [&](const std::string& name) { return CastOut(name, type, rounded); };
  std::string g = absl::StrCat("input x: float32", DimsText(c.x), "\ninput w: float32", DimsText(c.w),
                               "\ninput dy: float32", DimsText(OutDims(c)), "\n");
  if (c.bias) absl::StrAppend(&g, "input b: float32[", BiasDim(c), "]\n", in("b"));
  absl::StrAppend(&g, in("x"), in("w"), in("dy"), "hy = ", OpOf(c), "(hx, hw", c.bias ? ", hb" : "", ")", Attrs(c),
                  "\n", "hdx, hdw, hdb = ai.cleave.", OpOf(c), "Grad(hdy, hx, hw)", Attrs(c), "\n", out("y"), out("dx"),
                  out("dw"),
                  out("db"), "output y\noutput dx\noutput dw\noutput db\n");
  return g;
}

Feeds ConvFeeds(const ConvCase& c, unsigned seed) {
  Feeds f = {{"x", Random(c.x, seed)}, {"w", Random(c.w, seed + 1, -0.5f, 0.5f)}, {"dy", Random(OutDims(c), seed + 3)}};
  if (c.bias) f.push_back({"b", Random({BiasDim(c)}, seed + 2)});
  return f;
}

void ExpectCasesInFloat32(std::span<const ConvCase> cases, unsigned seed) {
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(ConvGraph(c, 1));
    ExpectSame(ConvGraph(c, 1), ConvFeeds(c, seed += 4), 1e-4, 1e-4, OpOf(c));
  }
}

void ExpectCasesInBf16AndFp16(std::span<const ConvCase> cases, unsigned seed) {
  for (int type : {16, 10})
    for (const ConvCase& c : cases) {
      SCOPED_TRACE(ConvGraph(c, type));
      // Both sides multiply the same rounded operands and sum in float32, and round the
      // results once; they differ in the order of the sums, and a result that lands near a
      // rounding boundary may round the other way: one unit in the last place (bf16 2^-8).
      ExpectSame(ConvGraph(c, type), ConvFeeds(c, seed += 4), 1e-3, type == 16 ? 8e-3 : 1e-3, OpOf(c),
                 ConvGraph(c, type, /*rounded=*/true));
    }
}

TEST(CudaProvider, ConvAndItsGradientInFloat32) {
  REQUIRE_CUDA();
  ExpectCasesInFloat32(kCases, 100);
}

TEST(CudaProvider, ConvAndItsGradientInBf16AndFp16) {
  REQUIRE_CUDA();
  ExpectCasesInBf16AndFp16(kCases, 200);
}

// ConvTranspose runs as the Conv gradient's col2im (with the bias), its gradients as the Conv's
// forward and weight gradient: every case above in reverse, output_padding and an output_shape
// beyond the formula's extent among them.
TEST(CudaProvider, ConvTransposeAndItsGradientInFloat32) {
  REQUIRE_CUDA();
  ExpectCasesInFloat32(kTransposedCases, 400);
}

TEST(CudaProvider, ConvTransposeAndItsGradientInBf16AndFp16) {
  REQUIRE_CUDA();
  ExpectCasesInBf16AndFp16(kTransposedCases, 500);
}

// The run on `provider` (a small conv_chunk_bytes) equals the run on the default provider.
void ExpectChunkedEqualsWhole(const ConvCase& c, std::unique_ptr<providers::ExecutionProvider> provider) {
  const Feeds feeds = ConvFeeds(c, 300);
  SessionOptions chunked, whole;
  chunked.optimize = whole.optimize = false;
  chunked.device = whole.device = DeviceChoice::kCuda;
  chunked.device_provider = std::shared_ptr<providers::ExecutionProvider>(std::move(provider));
  auto a = InferenceSession::FromGraph(*graph::ParseGraph(ConvGraph(c, 1)), chunked);
  auto b = InferenceSession::FromGraph(*graph::ParseGraph(ConvGraph(c, 1)), whole);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto got = (*a)->Run(feeds);
  auto want = (*b)->Run(feeds);
  ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
  for (size_t i = 0; i < got->size(); ++i)
    EXPECT_EQ(testing::CompareTensors((*got)[i], (*want)[i], 1e-5, 1e-5), "") << "output " << i;
}

// A chunk budget of a few images' scratch: the forward lowers the five images four and one at a
// time, the gradient two, two and one, dW summed over the chunks; the results are the
// one-chunk run's.
TEST(CudaProvider, ConvInChunksOfImages) {
  REQUIRE_CUDA();
  // Per image, [5, 4, 6, 6] x [6, 4, 3, 3] takes 6 KB of the forward's scratch, 11 KB of the
  // gradient's. The ConvTranspose of [5, 6, 6, 6] by [6, 4, 3, 3] is that Conv reversed: its
  // forward is chunked as the Conv's input gradient, its dX as the Conv's forward.
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "ConvTranspose" : "Conv");
    providers::CudaProviderOptions small;
    small.conv_chunk_bytes = 25000;
    auto provider = providers::CudaExecutionProvider::Create(0, small);
    ASSERT_TRUE(provider.ok()) << provider.status();
    const ConvCase c = transposed ? ConvCase{{5, 6, 6, 6}, {6, 4, 3, 3}, true, "pads = [1, 1, 1, 1]", true}
                                  : ConvCase{{5, 4, 6, 6}, {6, 4, 3, 3}, true, "pads = [1, 1, 1, 1]"};
    ExpectChunkedEqualsWhole(c, std::move(*provider));
  }
}

TEST(CudaProvider, ConvRejectsMismatchedShapesNamingTheNode) {
  REQUIRE_CUDA();
  auto s = cuda_testing::CudaSession(R"(
    input x: float32[1,c,5,5]
    input w: float32[6,k,3,3]
    y = Conv(x, w)
    output y
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Run({{"x", Random({1, 4, 5, 5}, 1)}, {"w", Random({6, 3, 3, 3}, 2)}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Conv"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("C / group = 4, got 3"), std::string::npos) << r.status();
}

struct PoolCase {
  std::string op;
  std::vector<int64_t> x;
  std::string attrs;
};

const PoolCase kPoolCases[] = {
    {"MaxPool", {2, 3, 7, 6}, "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]"},
    {"MaxPool", {2, 3, 9, 8}, "kernel_shape = [2, 3], strides = [2, 2], dilations = [2, 1], ceil_mode = 1"},
    {"MaxPool", {1, 2, 4, 5, 3}, "kernel_shape = [2, 2, 2], auto_pad = \"SAME_UPPER\""},
    {"MaxPool", {3, 2, 11}, "kernel_shape = [3], strides = [2], pads = [1, 2]"},
    {"AveragePool", {2, 3, 7, 6}, "kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], count_include_pad = 1"},
    {"AveragePool", {2, 2, 5, 5}, "kernel_shape = [2, 2], strides = [2, 2], ceil_mode = 1"},
    {"AveragePool", {1, 3, 6, 7}, "kernel_shape = [3, 2], dilations = [2, 2], auto_pad = \"SAME_LOWER\""},
    {"GlobalAveragePool", {2, 5, 4, 3}, ""},
    {"GlobalMaxPool", {2, 5, 4, 3}, ""},
};

// The pool's output dims, from the CPU's forward.
std::vector<int64_t> PoolOutDims(const PoolCase& c) {
  const std::string text = absl::StrCat("opset 19\ninput x: float32", DimsText(c.x), "\ny = ", c.op, "(x)",
                                        c.attrs.empty() ? "" : absl::StrCat(" {", c.attrs, "}"), "\noutput y\n");
  auto s = InferenceSession::FromGraph(*graph::ParseGraph(text), SessionOptions{});
  if (!s.ok()) return {};
  auto y = (*s)->Run({{"x", Random(c.x, 1)}});
  if (!y.ok()) return {};
  return std::vector<int64_t>((*y)[0].dims().begin(), (*y)[0].dims().end());
}

// y = pool(x) (with MaxPool's Indices) and dx from a fed dY by the pool's gradient op, the float
// operands cast to `type` around the ops; with `rounded`, the CPU's float32 reference on operands
// and results rounded to `type`.
std::string PoolGraph(const PoolCase& c, int type, bool rounded = false) {
  const bool max = c.op.find("Max") != std::string::npos;
  const std::string attrs = c.attrs.empty() ? "" : absl::StrCat(" {", c.attrs, "}");
  std::string grad_attrs = c.attrs;
  if (c.op.rfind("Global", 0) == 0) grad_attrs = "global = 1";
  auto in = [&](const std::string& name) { return CastIn(name, type, rounded); };
  auto out = [&](const std::string& name) { return CastOut(name, type, rounded); };
  std::string g = absl::StrCat("opset 19\ninput x: float32", DimsText(c.x), "\ninput dy: float32",
                               DimsText(PoolOutDims(c)), "\n", in("x"), in("dy"));
  if (c.op == "MaxPool") absl::StrAppend(&g, "hy, idx = MaxPool(hx)", attrs, "\n");
  else absl::StrAppend(&g, "hy = ", c.op, "(hx)", attrs, "\n");
  if (max) {
    absl::StrAppend(&g, "hdx = ai.cleave.MaxPoolGrad(hdy, hx) {", grad_attrs, "}\n");
  } else {
    absl::StrAppend(&g, "xs = Shape(hx)\nhdx = ai.cleave.AveragePoolGrad(hdy, xs) {", grad_attrs, "}\n");
  }
  absl::StrAppend(&g, out("y"), out("dx"), "output y\noutput dx\n", c.op == "MaxPool" ? "output idx\n" : "");
  return g;
}

TEST(CudaProvider, PoolsAndTheirGradientsInFloat32) {
  REQUIRE_CUDA();
  unsigned seed = 400;
  for (const PoolCase& c : kPoolCases) {
    SCOPED_TRACE(PoolGraph(c, 1));
    ExpectSame(PoolGraph(c, 1), {{"x", Random(c.x, ++seed)}, {"dy", Random(PoolOutDims(c), ++seed)}}, 1e-6, 1e-5, "*");
  }
}

TEST(CudaProvider, PoolsAndTheirGradientsInBf16AndFp16) {
  REQUIRE_CUDA();
  unsigned seed = 500;
  for (int type : {16, 10})
    for (const PoolCase& c : kPoolCases) {
      SCOPED_TRACE(PoolGraph(c, type));
      // Both sides pick among, and sum, the same rounded operands in float32 in one order, and
      // round once: MaxPool's choice (ties to the first tap) and its indices agree exactly.
      ExpectSame(PoolGraph(c, type), {{"x", Random(c.x, ++seed)}, {"dy", Random(PoolOutDims(c), ++seed)}}, 1e-6, 1e-6,
                 c.op, PoolGraph(c, type, /*rounded=*/true));
    }
}

TEST(CudaProvider, PoolGradientRejectsADyOfTheWrongShapeNamingTheNode) {
  REQUIRE_CUDA();
  auto s = cuda_testing::CudaSession(R"(
    input dy: float32[1,2,h,w]
    input x: float32[1,2,6,6]
    dx = ai.cleave.MaxPoolGrad(dy, x) {kernel_shape = [2, 2], strides = [2, 2]}
    output dx
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Run({{"dy", Random({1, 2, 2, 3}, 1)}, {"x", Random({1, 2, 6, 6}, 2)}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MaxPoolGrad"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("expected dY [1,2,3,3]"), std::string::npos) << r.status();
}

// BatchNormalization and its gradient: X cast to `type` (float32 1, bf16 16, fp16 10), the
// per-channel operands float32 (as mixed precision keeps them); with `rounded`, the CPU's float32
// reference on X and dY rounded to `type` and the results rounded the same way.
std::string BatchNormGraph(const std::vector<int64_t>& x, bool training, int type, bool rounded = false) {
  const std::string c = absl::StrCat("[", x[1], "]");
  auto in = [&](const std::string& name) { return CastIn(name, type, rounded); };
  auto out = [&](const std::string& name) { return CastOut(name, type, rounded); };
  const std::string mode = training ? "training_mode = 1, momentum = 0.8, epsilon = 0.01" : "epsilon = 0.01";
  std::string g = absl::StrCat("opset 15\ninput x: float32", DimsText(x), "\ninput dy: float32", DimsText(x),
                               "\ninput scale: float32", c, "\ninput b: float32", c, "\ninput mean: float32", c,
                               "\ninput var: float32", c, "\n", in("x"), in("dy"));
  absl::StrAppend(&g, training ? "hy, rm, rv" : "hy", " = BatchNormalization(hx, scale, b, mean, var) {", mode, "}\n",
                  "hdx, ds, db = ai.cleave.BatchNormalizationGrad(hdy, hx, scale, mean, var) {", mode, "}\n",
                  out("y"), out("dx"), "output y\noutput dx\noutput ds\noutput db\n",
                  training ? "output rm\noutput rv\n" : "");
  return g;
}

Feeds BatchNormFeeds(const std::vector<int64_t>& x, unsigned seed) {
  const std::vector<int64_t> c = {x[1]};
  return {{"x", Random(x, seed, -2.f, 3.f)}, {"dy", Random(x, seed + 1)}, {"scale", Random(c, seed + 2)},
          {"b", Random(c, seed + 3)},        {"mean", Random(c, seed + 4)}, {"var", Random(c, seed + 5, 0.5f, 2.f)}};
}

const std::vector<int64_t> kBatchNormShapes[] = {{4, 6, 5, 3}, {8, 5}, {2, 3, 2, 3, 4}, {1, 4, 300}};

TEST(CudaProvider, BatchNormalizationAndItsGradientInFloat32) {
  REQUIRE_CUDA();
  unsigned seed = 600;
  for (bool training : {true, false})
    for (const auto& x : kBatchNormShapes) {
      SCOPED_TRACE(BatchNormGraph(x, training, 1));
      // The CPU sums in double, the device in float32.
      ExpectSame(BatchNormGraph(x, training, 1), BatchNormFeeds(x, seed += 6), 1e-4, 1e-4, "*");
    }
}

TEST(CudaProvider, BatchNormalizationOfBf16AndFp16WithFloat32Statistics) {
  REQUIRE_CUDA();
  unsigned seed = 700;
  for (int type : {16, 10})
    for (bool training : {true, false})
      for (const auto& x : kBatchNormShapes) {
        SCOPED_TRACE(BatchNormGraph(x, training, type));
        // One rounding of a result computed in float32 (device) or double (CPU): a unit in the last
        // place where the two land either side of a rounding boundary (bf16 2^-8), and dX's
        // cancellation in training mode (M dY - sum(dY) - xhat sum(dY xhat)) in absolute terms.
        ExpectSame(BatchNormGraph(x, training, type), BatchNormFeeds(x, seed += 6), 2e-2, type == 16 ? 8e-3 : 1e-3,
                   "BatchNormalization", BatchNormGraph(x, training, type, /*rounded=*/true));
      }
}

// InstanceNormalization and its gradient, as BatchNormGraph: X and dY cast to `type`, scale and
// B float32.
std::string InstanceNormGraph(const std::vector<int64_t>& x, int type, bool rounded = false) {
  const std::string c = absl::StrCat("[", x[1], "]");
  auto in = [&](const std::string& name) { return CastIn(name, type, rounded); };
  auto out = [&](const std::string& name) { return CastOut(name, type, rounded); };
  std::string g = absl::StrCat("input x: float32", DimsText(x), "\ninput dy: float32", DimsText(x),
                               "\ninput scale: float32", c, "\ninput b: float32", c, "\n", in("x"), in("dy"));
  absl::StrAppend(&g, "hy = InstanceNormalization(hx, scale, b) {epsilon = 0.01}\n",
                  "hdx, ds, db = ai.cleave.InstanceNormalizationGrad(hdy, hx, scale) {epsilon = 0.01}\n", out("y"),
                  out("dx"), "output y\noutput dx\noutput ds\noutput db\n");
  return g;
}

Feeds InstanceNormFeeds(const std::vector<int64_t>& x, unsigned seed) {
  Feeds f = BatchNormFeeds(x, seed);
  f.resize(4);  // x, dy, scale, b
  return f;
}

const std::vector<int64_t> kInstanceNormShapes[] = {{4, 6, 5, 3}, {2, 3, 2, 3, 4}, {1, 4, 300}, {3, 2, 1}};

// Each image's channel normalised by its own statistics: the batch-norm kernels over the N * C
// planes, scale and B repeating every C planes, dScale and dB added over the images.
TEST(CudaProvider, InstanceNormalizationAndItsGradient) {
  REQUIRE_CUDA();
  unsigned seed = 800;
  for (const auto& x : kInstanceNormShapes) {
    SCOPED_TRACE(InstanceNormGraph(x, 1));
    ExpectSame(InstanceNormGraph(x, 1), InstanceNormFeeds(x, seed += 6), 1e-4, 1e-4, "*");
  }
  for (int type : {16, 10})
    for (const auto& x : kInstanceNormShapes) {
      SCOPED_TRACE(InstanceNormGraph(x, type));
      ExpectSame(InstanceNormGraph(x, type), InstanceNormFeeds(x, seed += 6), 2e-2, type == 16 ? 8e-3 : 1e-3,
                 "InstanceNormalization", InstanceNormGraph(x, type, /*rounded=*/true));
    }
}

// Resize and its gradient against the CPU's: nearest, linear and cubic, upsampling and
// downsampling (with antialias), several coordinate modes, sizes and axes, a roi with
// extrapolated positions; each resized dim one pass (two or three passes here), the gradient
// their adjoints.
TEST(CudaProvider, ResizeAndItsGradient) {
  REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> x;
    const char* inputs;  // the constants and the Resize's inputs after X
    const char* attrs;
  };
  const Case cases[] = {
      {{2, 3, 5, 4}, "init s: float32[4] = 1 1 2 2\n|_, s", "mode = \"linear\""},
      {{1, 2, 7, 9}, "init s: float32[4] = 1 1 0.5 0.75\n|_, s", "mode = \"linear\", coordinate_transformation_mode = \"align_corners\""},
      {{2, 2, 3, 3}, "init z: int64[4] = 2 2 7 5\n|_, _, z", "mode = \"nearest\", nearest_mode = \"round_prefer_ceil\", coordinate_transformation_mode = \"asymmetric\""},
      {{2, 3, 4, 5}, "init s: float32[2] = 3 0.6\n|_, s", "axes = [1, 3], mode = \"linear\", coordinate_transformation_mode = \"pytorch_half_pixel\""},
      {{1, 1, 4, 4}, "init r: float32[8] = 0 0 0.4 0.6 1 1 1.2 1.7\ninit s: float32[4] = 1 1 1.5 1.25\n|r, s", "mode = \"linear\", coordinate_transformation_mode = \"tf_crop_and_resize\", extrapolation_value = 10"},
      {{2, 2, 5, 4}, "init s: float32[4] = 1 1 1.6 2\n|_, s", "mode = \"cubic\""},
      {{1, 2, 9, 8}, "init z: int64[4] = 1 2 4 3\n|_, _, z", "mode = \"cubic\", antialias = 1, exclude_outside = 1"},
      {{1, 1, 7, 6}, "init s: float32[4] = 1 1 0.5 0.7\n|_, s", "mode = \"linear\", antialias = 1, coordinate_transformation_mode = \"half_pixel_symmetric\""},
  };
  unsigned seed = 900;
  for (const Case& c : cases) {
    const std::string inputs = c.inputs;
    const size_t bar = inputs.find('|');
    const std::string constants = inputs.substr(0, bar), args = inputs.substr(bar + 1);
    // Y's dims from the CPU, to feed a dY.
    const std::string fwd = absl::StrCat("opset 18\ninput x: float32", DimsText(c.x), "\n", constants,
                                         "y = Resize(x, ", args, ") {", c.attrs, "}\noutput y\n");
    auto cpu = InferenceSession::FromGraph(*graph::ParseGraph(fwd), SessionOptions{});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto y = (*cpu)->Run({{"x", Random(c.x, seed)}});
    ASSERT_TRUE(y.ok()) << y.status();
    const std::vector<int64_t> ydims((*y)[0].dims().begin(), (*y)[0].dims().end());
    const std::string text = absl::StrCat(
        "opset 18\ninput x: float32", DimsText(c.x), "\ninput dy: float32", DimsText(ydims), "\n", constants,
        "init shape: int64[", c.x.size(), "] =", absl::StrJoin(c.x, " ", [](std::string* o, int64_t v) {
          absl::StrAppend(o, " ", v);
        }),
        "\ny = Resize(x, ", args, ") {", c.attrs, "}\ndx = ai.cleave.ResizeGrad(dy, shape, ", args, ") {", c.attrs,
        "}\noutput y\noutput dx\n");
    SCOPED_TRACE(text);
    ExpectSame(text, {{"x", Random(c.x, seed)}, {"dy", Random(ydims, seed + 1)}}, 1e-5, 1e-5, "*");
    seed += 2;
  }
}

// GridSample and its gradient (dX and dGrid) against the CPU's: every mode and padding, 1-D to
// 3-D, coordinates to 1.4 past the borders (the grid scaled in the graph); X, the grid and dY
// cast to `type`, the CPU reference computing in float32 from the rounded values.
std::string GridSampleGraph(const std::vector<int64_t>& x, const std::vector<int64_t>& grid, const std::string& attrs,
                            int type, bool rounded = false) {
  std::vector<int64_t> y = {x[0], x[1]};
  y.insert(y.end(), grid.begin() + 1, grid.end() - 1);
  auto in = [&](const std::string& name) { return CastIn(name, type, rounded); };
  auto out = [&](const std::string& name) { return CastOut(name, type, rounded); };
  return absl::StrCat("opset 20\ninput x: float32", DimsText(x), "\ninput u: float32", DimsText(grid),
                      "\ninput dy: float32", DimsText(y), "\ninit k: float32[] = 1.4\ng = Mul(u, k)\n", in("x"),
                      in("g"), in("dy"), "hy = GridSample(hx, hg) {", attrs, "}\n",
                      "hdx, hdg = ai.cleave.GridSampleGrad(hdy, hx, hg) {", attrs, "}\n", out("y"), out("dx"),
                      out("dg"), "output y\noutput dx\noutput dg\n");
}

TEST(CudaProvider, GridSampleAndItsGradient) {
  REQUIRE_CUDA();
  struct Case {
    std::vector<int64_t> x, grid;
    const char* attrs;
  };
  const Case cases[] = {
      {{2, 3, 5, 4}, {2, 3, 4, 2}, "mode = \"linear\""},
      {{1, 2, 4, 5}, {1, 3, 3, 2}, "mode = \"cubic\", padding_mode = \"reflection\", align_corners = 1"},
      {{2, 2, 4, 4}, {2, 2, 5, 2}, "mode = \"nearest\", padding_mode = \"border\""},
      {{1, 3, 3, 4, 2}, {1, 2, 2, 3, 3}, "mode = \"linear\", padding_mode = \"border\", align_corners = 1"},
      {{2, 2, 6}, {2, 5, 1}, "mode = \"cubic\", padding_mode = \"zeros\""},
      {{1, 2, 2, 3, 3}, {1, 3, 2, 2, 3}, "mode = \"nearest\", padding_mode = \"reflection\""},
  };
  unsigned seed = 950;
  for (const Case& c : cases) {
    std::vector<int64_t> y = {c.x[0], c.x[1]};
    y.insert(y.end(), c.grid.begin() + 1, c.grid.end() - 1);
    const Feeds feeds = {{"x", Random(c.x, seed)}, {"u", Random(c.grid, seed + 1)}, {"dy", Random(y, seed + 2)}};
    seed += 3;
    SCOPED_TRACE(GridSampleGraph(c.x, c.grid, c.attrs, 1));
    // dX sums in another order on the device (atomics).
    ExpectSame(GridSampleGraph(c.x, c.grid, c.attrs, 1), feeds, 1e-5, 1e-5, "GridSample");
    for (int type : {16, 10})
      ExpectSame(GridSampleGraph(c.x, c.grid, c.attrs, type), feeds, 3e-2, type == 16 ? 1e-2 : 2e-3, "GridSample",
                 GridSampleGraph(c.x, c.grid, c.attrs, type, /*rounded=*/true));
  }
}

}  // namespace
}  // namespace cleave
