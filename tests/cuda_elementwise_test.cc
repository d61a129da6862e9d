// CUDA elementwise tests (label gpu): the arithmetic with broadcasting, the unary math and
// activations, comparisons and logic, Cast and CastLike among every number type, and the
// variadic ops, each against the CPU kernel on the same graph, in fp32, bf16 and fp16 where they
// apply (the other kernels' tests are listed in cuda_kernels_test.cc). Without a usable device
// (or driver) each test skips and says why.
#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/elementwise.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, AddKernelMatchesHost) {
  REQUIRE_CUDA();
  const int64_t n = 1 << 20;
  std::vector<float> a(n), b(n), c(n);
  for (int64_t i = 0; i < n; ++i) a[i] = 0.5f * i, b[i] = 1.0f - i;
  float *da, *db, *dc;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&da), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&db), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dc), n * 4), cudaSuccess);
  cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice);
  kernels::cuda::AddF32(da, db, dc, n, nullptr);
  ASSERT_EQ(cudaMemcpy(c.data(), dc, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << i;
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

TEST(CudaProvider, BinaryOpsWithBroadcasting) {
  REQUIRE_CUDA();
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min", "PRelu"}) {
    const std::string text = absl::StrCat("input a: float32[2,3,64]\ninput b: float32[3,1]\ny = ", op,
                                          "(a, b)\noutput y\n");
    ExpectSame(text, {{"a", Random({2, 3, 64}, 1)}, {"b", Random({3, 1}, 2, 0.5f, 2.f)}}, 1e-6, 1e-6, op);
  }
  ExpectSame("input a: float32[4,8]\ninput b: float32[4,8]\ny = Pow(a, b)\noutput y\n",
             {{"a", Random({4, 8}, 3, 0.1f, 2.f)}, {"b", Random({4, 8}, 4)}}, 1e-5, 1e-5, "Pow");
}

TEST(CudaProvider, UnaryOps) {
  REQUIRE_CUDA();
  for (const char* op : {"Relu", "Tanh", "Exp", "Neg", "Sigmoid", "Erf", "Abs"})
    ExpectSame(absl::StrCat("input x: float32[3,1000]\ny = ", op, "(x)\noutput y\n"), {{"x", Random({3, 1000}, 5)}},
               1e-6, 1e-5, op);
  ExpectSame("input x: float32[3,1000]\ny = Sqrt(x)\nz = Log(x)\nw = Reciprocal(x)\noutput y\noutput z\noutput w\n",
             {{"x", Random({3, 1000}, 6, 0.1f, 3.f)}}, 1e-6, 1e-5, "Sqrt");
  for (const char* approx : {"none", "tanh"})
    ExpectSame(absl::StrCat("input x: float32[3,1000]\ny = ai.cleave.Gelu(x) {approximate = \"", approx,
                            "\"}\noutput y\n"),
               {{"x", Random({3, 1000}, 7)}}, 1e-6, 1e-5, "Gelu");
}

// The math and activations beyond the transformer set against the CPU's, in float32 over a
// range that crosses every kink (and the steps of Floor, Ceil, Round and Sign), with the
// activations' attributes set; the inverse functions inside their domains.
TEST(CudaProvider, MoreMathAndActivations) {
  REQUIRE_CUDA();
  struct Case {
    const char* op;
    int opset;
    const char* attrs;
    float lo, hi;
  };
  const Case cases[] = {
      {"Tan", 13, "", -1.2f, 1.2f},      {"Asin", 13, "", -0.95f, 0.95f},   {"Acos", 13, "", -0.95f, 0.95f},
      {"Atan", 13, "", -5.f, 5.f},       {"Sinh", 13, "", -4.f, 4.f},       {"Cosh", 13, "", -4.f, 4.f},
      {"Asinh", 13, "", -5.f, 5.f},      {"Acosh", 13, "", 1.f, 6.f},       {"Atanh", 13, "", -0.95f, 0.95f},
      {"Softplus", 13, "", -30.f, 30.f}, {"Softsign", 13, "", -5.f, 5.f},   {"Mish", 18, "", -8.f, 8.f},
      {"Floor", 13, "", -4.f, 4.f},      {"Ceil", 13, "", -4.f, 4.f},       {"Round", 13, "", -4.f, 4.f},
      {"Sign", 13, "", -2.f, 2.f},       {"LeakyRelu", 16, " {alpha = 0.2}", -3.f, 3.f},
      {"Elu", 13, " {alpha = 0.5}", -3.f, 3.f},  {"Selu", 13, "", -3.f, 3.f},
      {"Celu", 13, " {alpha = 2.0}", -3.f, 3.f}, {"HardSigmoid", 13, " {alpha = 0.25, beta = 0.4}", -5.f, 5.f},
      {"HardSwish", 14, "", -5.f, 5.f},  {"ThresholdedRelu", 13, " {alpha = 0.5}", -2.f, 2.f},
  };
  for (const Case& c : cases)
    ExpectSame(absl::StrCat("opset ", c.opset, "\ninput x: float32[3,1000]\ny = ", c.op, "(x)", c.attrs, "\noutput y\n"),
               {{"x", Random({3, 1000}, 8, c.lo, c.hi)}}, 1e-6, 2e-5, c.op);
}

// Sin and Cos; Clip with both bounds fed, one, or none (opset 11 inputs), and the opset 6
// attributes; Max and Min of one, two or three broadcast inputs, float32 and int64; ReduceMin.
TEST(CudaProvider, SinCosClipVariadicMaxMinAndReduceMin) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[3,1000]
    input lo: float32[]
    input hi: float32[]
    input a: float32[4,1,5]
    input b: float32[3,1]
    input c: float32[5]
    input i: int64[2,3]
    input j: int64[3]
    s = Sin(x)
    o = Cos(x)
    c1 = Clip(x, lo, hi)
    c2 = Clip(x, _, hi)
    c3 = Clip(x)
    m3 = Max(a, b, c)
    n3 = Min(c, b, a)
    m2 = Max(b, c)
    m1 = Max(a)
    mi = Min(i, j, i)
    xi = Max(j, i)
    r = ReduceMin(x) {axes = [1], keepdims = 0}
    rr = ReduceMin(a) {keepdims = 1}
    output s
    output o
    output c1
    output c2
    output c3
    output m3
    output n3
    output m2
    output m1
    output mi
    output xi
    output r
    output rr
  )",
             {{"x", Random({3, 1000}, 60, -7.f, 7.f)},
              {"lo", Tensor::Scalar<float>(-1.25f)},
              {"hi", Tensor::Scalar<float>(0.75f)},
              {"a", Random({4, 1, 5}, 61)},
              {"b", Random({3, 1}, 62)},
              {"c", Random({5}, 63)},
              {"i", Tensor::FromVector<int64_t>({4, -9, 0, INT64_MAX, 2, -1}, {2, 3})},
              {"j", Tensor::FromVector<int64_t>({3, INT64_MIN, 1}, {3})}},
             1e-6, 1e-6, "*");
  ExpectSame(R"(
    opset 6
    input x: float32[3,100]
    y = Clip(x) {min = -0.5, max = 1.5}
    z = Clip(x) {max = 0.25}
    output y
    output z
  )",
             {{"x", Random({3, 100}, 64)}}, 0, 0, "*");
}

// Sum and Mean of any number of broadcast inputs, Mod in both modes (floats and integers, the
// divisor's sign or the dividend's, x mod 0), Xor, IsNaN, IsInf, and CastLike.
TEST(CudaProvider, SumMeanModXorFloatClassesAndCastLike) {
  REQUIRE_CUDA();
  Tensor x = Random({2, 3, 8}, 65, -6.f, 6.f);
  for (int k : {1, 9, 30}) x.data<float>()[k] = k == 1 ? NAN : k == 9 ? INFINITY : -INFINITY;
  ExpectSame(R"(
    input a: float32[4,1,5]
    input b: float32[3,1]
    input c: float32[5]
    input x: float32[2,3,8]
    input d: float32[8]
    input i: int64[6]
    input j: int64[6]
    input k: int32[6]
    input l: int32[6]
    input p: bool[2,3]
    input q: bool[3]
    s3 = Sum(a, b, c)
    s1 = Sum(c)
    m3 = Mean(c, b, a)
    m1 = Mean(b)
    fm = Mod(x, d) {fmod = 1}
    pm = Mod(x, d)
    im = Mod(i, j)
    if = Mod(i, j) {fmod = 1}
    km = Mod(k, l)
    xr = Xor(p, q)
    nan = IsNaN(x)
    inf = IsInf(x)
    pos = IsInf(x) {detect_negative = 0}
    neg = IsInf(x) {detect_positive = 0}
    ci = CastLike(x, i)
    cb = CastLike(i, x)
    output s3
    output s1
    output m3
    output m1
    output fm
    output pm
    output im
    output if
    output km
    output xr
    output nan
    output inf
    output pos
    output neg
    output ci
    output cb
  )",
             {{"a", Random({4, 1, 5}, 66)},
              {"b", Random({3, 1}, 67)},
              {"c", Random({5}, 68)},
              {"x", x},
              {"d", Tensor::FromVector<float>({1.5f, -2.f, 0.75f, -0.5f, 3.f, -3.f, 2.5f, 1.f}, {8})},
              {"i", Tensor::FromVector<int64_t>({7, -7, 7, -7, 5, INT64_MIN}, {6})},
              {"j", Tensor::FromVector<int64_t>({3, 3, -3, -3, 0, -1}, {6})},
              {"k", Tensor::FromVector<int32_t>({9, -9, 9, -9, 4, -4}, {6})},
              {"l", Tensor::FromVector<int32_t>({4, 4, -4, -4, 0, 5}, {6})},
              {"p", Tensor::FromVector<bool>({true, false, true, false, false, true}, {2, 3})},
              {"q", Tensor::FromVector<bool>({true, true, false}, {3})}},
             1e-6, 1e-6, "*");
}

// Arithmetic and comparisons over the 8- and 16-bit and unsigned integers (wrapping, x / 0 and
// x mod 0 are 0, unsigned division and remainder by the largest value), and float64 comparisons.
TEST(CudaProvider, NarrowAndUnsignedIntegerArithmeticAndComparisons) {
  REQUIRE_CUDA();
  Tensor u(DataType::kUInt64, {6}), v(DataType::kUInt64, {6}), w(DataType::kUInt16, {6}), z(DataType::kUInt16, {6});
  const uint64_t uv[6] = {0, 7, UINT64_MAX, uint64_t{1} << 63, 100, UINT64_MAX - 1};
  const uint64_t vv[6] = {3, 0, UINT64_MAX, 2, 7, UINT64_MAX};
  const uint16_t wv[6] = {65535, 300, 0, 1, 65535, 7};
  const uint16_t zv[6] = {65535, 0, 5, 65535, 2, 3};
  std::memcpy(u.raw(), uv, sizeof(uv));
  std::memcpy(v.raw(), vv, sizeof(vv));
  std::memcpy(w.raw(), wv, sizeof(wv));
  std::memcpy(z.raw(), zv, sizeof(zv));
  ExpectSame(R"(
    input p: uint8[6]
    input q: uint8[6]
    input s: int8[6]
    input t: int8[6]
    input u: uint64[6]
    input v: uint64[6]
    input w: uint16[6]
    input z: uint16[6]
    input d: float64[6]
    input e: float64[6]
    pa = Add(p, q)
    ps = Sub(p, q)
    pm = Mul(p, q)
    pd = Div(p, q)
    pr = Mod(p, q)
    sa = Add(s, t)
    sm = Mul(s, t)
    sd = Div(s, t)
    sr = Mod(s, t)
    sf = Mod(s, t) {fmod = 1}
    sx = Max(s, t)
    ud = Div(u, v)
    ur = Mod(u, v)
    um = Mul(u, v)
    un = Min(u, v)
    wm = Mul(w, z)
    wd = Div(w, z)
    pl = Less(p, q)
    ul = Greater(u, v)
    se = Equal(s, t)
    dl = LessOrEqual(d, e)
    de = Equal(d, e)
    output pa
    output ps
    output pm
    output pd
    output pr
    output sa
    output sm
    output sd
    output sr
    output sf
    output sx
    output ud
    output ur
    output um
    output un
    output wm
    output wd
    output pl
    output ul
    output se
    output dl
    output de
  )",
             {{"p", Tensor::FromVector<uint8_t>({200, 7, 0, 255, 13, 128}, {6})},
              {"q", Tensor::FromVector<uint8_t>({100, 0, 3, 255, 5, 2}, {6})},
              {"s", Tensor::FromVector<int8_t>({-128, 7, -7, 100, -100, 127}, {6})},
              {"t", Tensor::FromVector<int8_t>({-1, 0, 3, 100, -3, -2}, {6})},
              {"u", u}, {"v", v}, {"w", w}, {"z", z},
              {"d", Tensor::FromVector<double>({1.0, NAN, -0.0, 1e300, 2.5, -1.0}, {6})},
              {"e", Tensor::FromVector<double>({1.0000000000000002, NAN, 0.0, 1e300, 2.4, -2.0}, {6})}},
             0, 0, "*");
}

// The bitwise ops over signed and unsigned integers with broadcasting, BitwiseNot (decomposed to
// a Xor), and shifts by 0, by the width and past it (0), equal to the CPU's.
TEST(CudaProvider, BitwiseOpsAndShifts) {
  REQUIRE_CUDA();
  Tensor u(DataType::kUInt64, {5}), v(DataType::kUInt64, {5});
  const uint64_t uv[5] = {UINT64_MAX, 1, uint64_t{1} << 63, 12345, 0};
  const uint64_t vv[5] = {63, 64, 1, 0, 65};
  std::memcpy(u.raw(), uv, sizeof(uv));
  std::memcpy(v.raw(), vv, sizeof(vv));
  ExpectSame(R"(
    opset 18
    input s: int16[2,3]
    input t: int16[3]
    input p: uint8[5]
    input q: uint8[5]
    input u: uint64[5]
    input v: uint64[5]
    a = BitwiseAnd(s, t)
    o = BitwiseOr(s, t)
    x = BitwiseXor(s, t)
    n = BitwiseNot(s)
    m = BitwiseNot(p)
    pl = BitShift(p, q) {direction = "LEFT"}
    pr = BitShift(p, q) {direction = "RIGHT"}
    ul = BitShift(u, v) {direction = "LEFT"}
    ur = BitShift(u, v) {direction = "RIGHT"}
    output a
    output o
    output x
    output n
    output m
    output pl
    output pr
    output ul
    output ur
  )",
             {{"s", Tensor::FromVector<int16_t>({-1, 0x1234, -32768, 7, -300, 255}, {2, 3})},
              {"t", Tensor::FromVector<int16_t>({0x0f0f, -2, 1}, {3})},
              {"p", Tensor::FromVector<uint8_t>({0x81, 1, 255, 16, 3}, {5})},
              {"q", Tensor::FromVector<uint8_t>({1, 7, 8, 2, 0}, {5})},
              {"u", u}, {"v", v}},
             0, 0, "*");
}

// The random ops of a seeded node draw the CPU's numbers (one Philox key for both providers):
// normals and uniforms in float32, float64 and bfloat16, and Bernoulli into float, int32 and
// bool from float16 and float32 probabilities.
TEST(CudaProvider, SeededRandomOpsDrawTheCpusNumbers) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    opset 22
    input like: float32[33,17]
    input p: float32[33,17]
    n = RandomNormal() {shape = [1001], mean = 1.0, scale = 2.0, seed = 5.0}
    u = RandomUniform() {shape = [7, 9], low = -2.0, high = 2.0, dtype = 11, seed = 6.0}
    nl = RandomNormalLike(like) {dtype = 16, seed = 7.0}
    ul = RandomUniformLike(like) {seed = 8.0}
    ph = Cast(p) {to = 10}
    b = Bernoulli(ph) {seed = 9.0}
    bi = Bernoulli(p) {dtype = 6, seed = 10.0}
    bb = Bernoulli(p) {dtype = 9, seed = 11.0}
    output n
    output u
    output nl
    output ul
    output b
    output bi
    output bb
  )",
             {{"like", Random({33, 17}, 80)}, {"p", Random({33, 17}, 81, 0.f, 1.f)}}, 1e-6, 1e-6, "*");
}

// Pow with an exponent of another type than the base (PyTorch's exports raise a float to an
// int64 power): the exponent converted to the base's type on the device.
TEST(CudaProvider, PowWithAnIntegerOrFloat64Exponent) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[4,6]
    input e: int64[6]
    init two: int64[] = 2
    init three: int32[] = 3
    init half: float64[] = 0.5
    ax = Abs(x)
    p = Pow(x, e)
    s = Pow(x, two)
    c = Pow(x, three)
    r = Pow(ax, half)
    output p
    output s
    output c
    output r
  )",
             {{"x", Random({4, 6}, 69, -3.f, 3.f)}, {"e", Tensor::FromVector<int64_t>({0, 1, 2, 3, -1, -2}, {6})}},
             1e-6, 1e-6, "*");
}

TEST(CudaProvider, CastThroughBf16AndFp16) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[4,100]
    h = Cast(x) {to = 16}
    y = Cast(h) {to = 1}
    g = Cast(x) {to = 10}
    z = Cast(g) {to = 1}
    output y
    output z
  )",
             {{"x", Random({4, 100}, 8)}}, 0, 0, "Cast");
}

// Integer arithmetic, comparisons and logic (the vocabulary-parallel embedding's masks: ids
// against a shard's range, shifted into it), with broadcasting, and Slice. Nothing falls back.
TEST(CudaProvider, ComparisonsLogicIntegersAndSlice) {
  REQUIRE_CUDA();
  Tensor a(DataType::kInt64, {4, 5}), b(DataType::kInt64, {5});
  for (int64_t i = 0; i < 20; ++i) a.data<int64_t>()[i] = i % 7 - 3 + (i == 19 ? INT64_MIN + 3 : 0);
  const int64_t bv[5] = {2, -1, 0, 3, -3};  // a zero and a -1 divisor
  for (int i = 0; i < 5; ++i) b.data<int64_t>()[i] = bv[i];
  Tensor x = Random({4, 5}, 60), y = Random({4, 1}, 61);
  x.data<float>()[3] = NAN;  // compares false
  ExpectSame(R"(
    input a: int64[4,5]
    input b: int64[5]
    input x: float32[4,5]
    input y: float32[4,1]
    add = Add(a, b)
    sub = Sub(a, b)
    mul = Mul(a, b)
    div = Div(a, b)
    mx = Max(a, b)
    mn = Min(a, b)
    ge = GreaterOrEqual(a, b)
    lt = Less(a, b)
    eq = Equal(a, b)
    gt = Greater(x, y)
    le = LessOrEqual(x, y)
    both = And(ge, gt)
    either = Or(lt, le)
    one = Equal(ge, le)
    none = Not(eq)
    same = Equal(both, either)
    output add
    output sub
    output mul
    output div
    output mx
    output mn
    output ge
    output lt
    output eq
    output gt
    output le
    output both
    output either
    output one
    output none
    output same
  )",
             {{"a", a}, {"b", b}, {"x", x}, {"y", y}}, 0, 0, "*");
  // Slice: steps of 1, 2 and -1, negative starts and ends, axes given and omitted, int32 and
  // bf16 data.
  Tensor starts = Tensor::FromVector<int64_t>({1, -1, 0}, {3}), ends = Tensor::FromVector<int64_t>({3, -7, 6}, {3});
  Tensor axes = Tensor::FromVector<int64_t>({0, 2, 1}, {3}), steps = Tensor::FromVector<int64_t>({1, -2, 2}, {3});
  ExpectSame(R"(
    input x: float32[4,6,9]
    input starts: int64[3]
    input ends: int64[3]
    input axes: int64[3]
    input steps: int64[3]
    y = Slice(x, starts, ends, axes, steps)
    h = Cast(x) {to = 16}
    hs = Slice(h, starts, ends, axes, steps)
    z = Cast(hs) {to = 1}
    s2 = Slice(x, starts, ends)
    output y
    output z
    output s2
  )",
             {{"x", Random({4, 6, 9}, 62)}, {"starts", starts}, {"ends", ends}, {"axes", axes}, {"steps", steps}}, 0,
             0, "*");
}

// Cast between floats, integers and bool converts as the CPU does: float -> integer truncates
// toward zero and saturates (inf, 3e10 into int32, fp16's inf), NaN -> 0; integers wrap (int64 ->
// int32) and round once into bf16 / fp16 (2^24 + 2^16 + 1, INT64_MAX); anything -> bool tests != 0
// (NaN and -0 included); bool -> number is 0 / 1. All exact, and nothing falls back.
TEST(CudaProvider, CastAmongIntegersBoolAndFloats) {
  REQUIRE_CUDA();
  const std::vector<float> xv = {NAN, INFINITY, -INFINITY, 3e10f, -3e10f, 2.7f, -2.7f, -0.5f,
                                 0.f, -0.f, 1e20f, 2147483520.f, 0.25f, 65504.f, 70000.f, 1.f};
  // 2^24 + 2^16 + 1 rounds up into bf16 directly, but to even (down) through float's nearest.
  const std::vector<int64_t> av = {0, 1, -1, (int64_t{1} << 53) + 1, INT64_MIN, INT64_MAX, 3000000001, -5, 16842753};
  Tensor b(DataType::kInt32, {4}), c(DataType::kBool, {4});
  const int32_t bv[4] = {INT32_MIN, -1, 7, INT32_MAX};
  for (int i = 0; i < 4; ++i) {
    b.data<int32_t>()[i] = bv[i];
    c.data<bool>()[i] = i % 2 == 0;
  }
  ExpectSame(R"(
    input x: float32[2,8]
    input a: int64[9]
    input b: int32[4]
    input c: bool[4]
    x64 = Cast(x) {to = 7}
    x32 = Cast(x) {to = 6}
    xb = Cast(x) {to = 9}
    xh = Cast(x) {to = 16}
    xh64 = Cast(xh) {to = 7}
    xf = Cast(x) {to = 10}
    xf32 = Cast(xf) {to = 6}
    xfb = Cast(xf) {to = 9}
    a32f = Cast(a) {to = 1}
    ah = Cast(a) {to = 16}
    ahf = Cast(ah) {to = 1}
    af = Cast(a) {to = 10}
    aff = Cast(af) {to = 1}
    a32 = Cast(a) {to = 6}
    ab = Cast(a) {to = 9}
    b64 = Cast(b) {to = 7}
    bf = Cast(b) {to = 1}
    bb = Cast(b) {to = 9}
    cf = Cast(c) {to = 1}
    c64 = Cast(c) {to = 7}
    ch = Cast(c) {to = 16}
    chf = Cast(ch) {to = 1}
    c32 = Cast(c) {to = 6}
    output x64
    output x32
    output xb
    output xh64
    output xf32
    output xfb
    output a32f
    output ahf
    output aff
    output a32
    output ab
    output b64
    output bf
    output bb
    output cf
    output c64
    output chf
    output c32
  )",
             {{"x", Tensor::FromVector<float>(xv, {2, 8})}, {"a", Tensor::FromVector<int64_t>(av, {9})}, {"b", b},
              {"c", c}},
             0, 0, "*");
}

// Cast to and from float64 and the 8-, 16- and unsigned integers: float64 -> integers saturating
// (NaN -> 0), -> bf16 / fp16 rounding once; uint8 pixels to float; integers wrapping among
// themselves; uint64 beyond int64's range.
TEST(CudaProvider, CastAmongFloat64AndNarrowOrUnsignedIntegers) {
  REQUIRE_CUDA();
  const std::vector<double> dv = {NAN, INFINITY, -INFINITY, 3e10, -3e10, 2.7, -2.7, -0.5,
                                  300.0, -129.5, 65535.9, 1e300, 1.0000000596046448, 16842753.0, 0.1, -1.0};
  Tensor u(DataType::kUInt64, {4}), w(DataType::kInt16, {6});
  const uint64_t uv[4] = {0, 1, uint64_t{1} << 63, UINT64_MAX};
  const int16_t wv[6] = {-32768, -1, 0, 255, 256, 32767};
  std::memcpy(u.raw(), uv, sizeof(uv));
  std::memcpy(w.raw(), wv, sizeof(wv));
  ExpectSame(R"(
    input d: float64[16]
    input p: uint8[6]
    input s: int8[6]
    input u: uint64[4]
    input f: float32[6]
    input w: int16[6]
    di8 = Cast(d) {to = 3}
    du8 = Cast(d) {to = 2}
    di16 = Cast(d) {to = 5}
    du16 = Cast(d) {to = 4}
    di32 = Cast(d) {to = 6}
    du32 = Cast(d) {to = 12}
    di64 = Cast(d) {to = 7}
    du64 = Cast(d) {to = 13}
    df = Cast(d) {to = 1}
    dh = Cast(d) {to = 10}
    dbf = Cast(d) {to = 16}
    db = Cast(d) {to = 9}
    pf = Cast(p) {to = 1}
    pd = Cast(p) {to = 11}
    pi8 = Cast(p) {to = 3}
    si64 = Cast(s) {to = 7}
    su16 = Cast(s) {to = 4}
    sbf = Cast(s) {to = 16}
    uf = Cast(u) {to = 1}
    ud = Cast(u) {to = 11}
    ui64 = Cast(u) {to = 7}
    fu8 = Cast(f) {to = 2}
    fd = Cast(f) {to = 11}
    wu8 = Cast(w) {to = 2}
    wd = Cast(w) {to = 11}
    output di8
    output du8
    output di16
    output du16
    output di32
    output du32
    output di64
    output du64
    output df
    output dh
    output dbf
    output db
    output pf
    output pd
    output pi8
    output si64
    output su16
    output sbf
    output uf
    output ud
    output ui64
    output fu8
    output fd
    output wu8
    output wd
  )",
             {{"d", Tensor::FromVector<double>(dv, {16})},
              {"p", Tensor::FromVector<uint8_t>({0, 1, 127, 128, 200, 255}, {6})},
              {"s", Tensor::FromVector<int8_t>({-128, -1, 0, 1, 100, 127}, {6})},
              {"u", u},
              {"f", Tensor::FromVector<float>({-3.f, 0.9f, 255.5f, 256.f, NAN, 1e9f}, {6})},
              {"w", w}},
             0, 0, "*");
}

// The ops a mixed-precision graph runs in bf16 and fp16 between its products (the bias Add,
// GELU, its gradient, the bias gradient's sum) against the CPU's widening kernels, which compute
// them in float32 and round once, as the CUDA kernels do.
TEST(CudaProvider, LowPrecisionActivationOps) {
  REQUIRE_CUDA();
  for (int to : {16, 10})
    ExpectSame(absl::StrCat(R"(
      input x: float32[64,8,768]
      input dy: float32[64,8,768]
      input b: float32[768]
      init axes: int64[2] = 0 1
      init sizes: int64[3] = 256 256 256
      hx = Cast(x) {to = )", to, R"(}
      hdy = Cast(dy) {to = )", to, R"(}
      hb = Cast(b) {to = )", to, R"(}
      s = Add(hx, hb)
      g = ai.cleave.Gelu(s)
      dx = ai.cleave.GeluGrad(hdy, s)
      db = ReduceSum(dx, axes) {keepdims = 0}
      sp0, sp1, sp2 = Split(s, sizes) {axis = 2}
      wg = Cast(g) {to = 1}
      wdx = Cast(dx) {to = 1}
      wdb = Cast(db) {to = 1}
      wsp = Cast(sp1) {to = 1}
      output wg
      output wdx
      output wdb
      output wsp
    )"),
               {{"x", Random({64, 8, 768}, 48)}, {"dy", Random({64, 8, 768}, 49)}, {"b", Random({768}, 50)}},
               // One rounding of the result apart where the two compute in different orders.
               to == 16 ? 2e-2 : 2e-3, to == 16 ? 8e-3 : 1e-3, "*");
}

}  // namespace
}  // namespace cleave
