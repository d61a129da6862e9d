// Pad, Tile, CumSum, ArgMax / ArgMin, TopK, GatherElements, ScatterElements, GatherND, ScatterND and the norm and log-sum
// reductions on the CUDA provider against the CPU's (gpu label): every mode and attribute,
// integer and float data, duplicate scatter indices in each reduction, and an index out of range
// named at the run.
#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/cuda_test_util.h"

namespace cleave {
namespace {

using cuda_testing::CudaUnusable;
using cuda_testing::ExpectSame;
using cuda_testing::Ids;
using cuda_testing::Random;

Tensor Int64s(std::vector<int64_t> dims, std::vector<int64_t> values) {
  Tensor t(DataType::kInt64, std::move(dims));
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

TEST(CudaProvider, PadInEveryModeAndTile) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    opset 19
    input x: float32[3,4,5]
    input i: int64[2,3]
    init pads: int64[6] = 1 0 2 2 1 1
    init crop: int64[6] = 0 -1 1 -1 0 -2
    init v: float32[] = 1.5
    init iv: int64[] = -7
    init axes: int64[2] = -1 0
    init two: int64[4] = 2 3 2 1
    init ipads: int64[4] = 1 2 0 3
    c = Pad(x, pads, v)
    z = Pad(x, crop)
    r = Pad(x, pads) {mode = "reflect"}
    e = Pad(x, pads) {mode = "edge"}
    w = Pad(x, pads) {mode = "wrap"}
    a = Pad(x, two, _, axes) {mode = "reflect"}
    n = Pad(i, ipads, iv)
    output c
    output z
    output r
    output e
    output w
    output a
    output n
  )",
             {{"x", Random({3, 4, 5}, 1)}, {"i", Ids({2, 3}, 100, 2)}}, 0, 0, "*");
  ExpectSame(R"(
    input x: float32[2,3,4]
    input i: int64[5]
    input h: float32[3,2]
    init reps: int64[3] = 2 1 3
    init ireps: int64[1] = 3
    init hreps: int64[2] = 2 2
    t = Tile(x, reps)
    u = Tile(i, ireps)
    hb = Cast(h) {to = 16}
    th = Tile(hb, hreps)
    v = Cast(th) {to = 1}
    output t
    output u
    output v
  )",
             {{"x", Random({2, 3, 4}, 3)}, {"i", Ids({5}, 100, 4)}, {"h", Random({3, 2}, 5)}}, 0, 0, "Tile",
             R"(
    input x: float32[2,3,4]
    input i: int64[5]
    input h: float32[3,2]
    init reps: int64[3] = 2 1 3
    init ireps: int64[1] = 3
    init hreps: int64[2] = 2 2
    t = Tile(x, reps)
    u = Tile(i, ireps)
    hb = Cast(h) {to = 16}
    hf = Cast(hb) {to = 1}
    v = Tile(hf, hreps)
    output t
    output u
    output v
  )");
}

TEST(CudaProvider, CumSumForwardReversedAndExclusive) {
  REQUIRE_CUDA();
  // int64 sums that wrap past the largest value, as numpy's.
  Tensor big = Int64s({2, 3}, {INT64_MAX - 1, 5, -3, 2, INT64_MAX, 9});
  ExpectSame(R"(
    input x: float32[4,50,3]
    input i: int64[2,3]
    input j: int32[3,7]
    init a1: int64[] = 1
    init am: int32[1] = -1
    init a0: int64[] = 0
    s = CumSum(x, a1)
    r = CumSum(x, a1) {reverse = 1}
    e = CumSum(x, am) {exclusive = 1}
    re = CumSum(x, a0) {exclusive = 1, reverse = 1}
    si = CumSum(i, a0)
    sj = CumSum(j, am) {reverse = 1}
    output s
    output r
    output e
    output re
    output si
    output sj
  )",
             {{"x", Random({4, 50, 3}, 6)}, {"i", big}, {"j", [] {
                Tensor t(DataType::kInt32, {3, 7});
                for (int k = 0; k < 21; ++k) t.data<int32_t>()[k] = (k % 2 ? 1 : -1) * (1 << 30) + k;
                return t;
              }()}},
             0, 0, "CumSum");
}

// Pad's gradient in reflect (past the dim's size, and a dim of one), edge and wrap mode, and in
// constant mode: each element the sum of the dY elements that read it, in the CPU's order; and
// bf16 against the CPU on the rounded operands.
TEST(CudaProvider, PadGradInEveryMode) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input a: float32[9,3,15]
    input b: float32[4,9]
    input c: float32[4,5]
    init pa: int64[6] = 2 0 5 4 1 6
    init pb: int64[4] = 2 3 1 1
    init pc: int64[4] = 3 0 0 2
    ra = ai.cleave.PadGrad(a, pa) {mode = "reflect"}
    rb = ai.cleave.PadGrad(b, pb) {mode = "reflect"}
    ea = ai.cleave.PadGrad(a, pa) {mode = "edge"}
    wa = ai.cleave.PadGrad(a, pa) {mode = "wrap"}
    cc = ai.cleave.PadGrad(c, pc) {mode = "constant"}
    output ra
    output rb
    output ea
    output wa
    output cc
  )",
             {{"a", Random({9, 3, 15}, 30)}, {"b", Random({4, 9}, 31)}, {"c", Random({4, 5}, 32)}}, 0, 0, "*");
  ExpectSame(R"(
    input a: float32[9,3,15]
    init pa: int64[6] = 2 0 5 4 1 6
    ha = Cast(a) {to = 16}
    hr = ai.cleave.PadGrad(ha, pa) {mode = "reflect"}
    r = Cast(hr) {to = 1}
    output r
  )",
             {{"a", Random({9, 3, 15}, 33)}}, 1e-2, 1e-2, "*", R"(
    input a: float32[9,3,15]
    init pa: int64[6] = 2 0 5 4 1 6
    ha = Cast(a) {to = 16}
    fa = Cast(ha) {to = 1}
    fr = ai.cleave.PadGrad(fa, pa) {mode = "reflect"}
    hr = Cast(fr) {to = 16}
    r = Cast(hr) {to = 1}
    output r
  )");
}

TEST(CudaProvider, ArgMaxArgMinTiesAndNaN) {
  REQUIRE_CUDA();
  // Ties (rounded values) and NaNs along both axes.
  Tensor x = Random({6, 40}, 7);
  for (int64_t k = 0; k < x.numel(); ++k) x.data<float>()[k] = std::round(x.data<float>()[k] * 2.f);
  x.data<float>()[1 * 40 + 3] = std::nanf("");
  x.data<float>()[1 * 40 + 30] = std::nanf("");
  x.data<float>()[4 * 40 + 0] = std::nanf("");
  ExpectSame(R"(
    input x: float32[6,40]
    input i: int32[3,4,5]
    a = ArgMax(x) {axis = 1}
    b = ArgMin(x) {axis = 1, select_last_index = 1, keepdims = 0}
    c = ArgMax(x) {axis = 0, select_last_index = 1}
    d = ArgMin(x) {axis = -2, keepdims = 0}
    e = ArgMax(i) {axis = 1, keepdims = 0}
    f = ArgMin(i) {axis = 2, select_last_index = 1}
    output a
    output b
    output c
    output d
    output e
    output f
  )",
             {{"x", x}, {"i", [] {
                Tensor t(DataType::kInt32, {3, 4, 5});
                for (int k = 0; k < 60; ++k) t.data<int32_t>()[k] = (k * 7) % 5;
                return t;
              }()}},
             0, 0, "ArgM");
  // Long rows (a block per row on the device): many ties, NaNs early and late in row 1, an
  // int64 row whose extremes repeat; the first or last index each.
  Tensor y = Random({3, 5000}, 8);
  for (int64_t k = 0; k < y.numel(); ++k) y.data<float>()[k] = std::round(y.data<float>()[k] * 3.f);
  y.data<float>()[5000 + 17] = std::nanf("");
  y.data<float>()[5000 + 4321] = std::nanf("");
  Tensor j(DataType::kInt64, {2, 3000});
  for (int64_t k = 0; k < j.numel(); ++k) j.data<int64_t>()[k] = (k * 7919) % 1000 - 500;
  ExpectSame(R"(
    input y: float32[3,5000]
    input j: int64[2,3000]
    a = ArgMax(y) {axis = 1}
    b = ArgMax(y) {axis = -1, select_last_index = 1}
    c = ArgMin(y) {axis = 1, keepdims = 0}
    d = ArgMin(y) {axis = 1, select_last_index = 1}
    e = ArgMax(j) {axis = 1}
    f = ArgMin(j) {axis = 1, select_last_index = 1}
    output a
    output b
    output c
    output d
    output e
    output f
  )",
             {{"y", y}, {"j", j}}, 0, 0, "ArgM");
}

// TopK against the CPU: a router's short lines (a warp per line), long lines (a block scanning
// 5000 elements per round), a middle axis, the smallest, ties and NaNs, int64, bf16; and its
// gradient, a scatter into zeros.
TEST(CudaProvider, TopKTiesNaNAxesTypesAndItsGradient) {
  REQUIRE_CUDA();
  Tensor router = Random({64, 8}, 9);
  Tensor y = Random({3, 5000}, 10);
  for (int64_t k = 0; k < y.numel(); ++k) y.data<float>()[k] = std::round(y.data<float>()[k] * 3.f);  // ties
  y.data<float>()[5000 + 17] = std::nanf("");
  y.data<float>()[5000 + 4321] = std::nanf("");
  Tensor m = Random({4, 300, 3}, 11);
  m.data<float>()[7] = std::nanf("");
  Tensor j(DataType::kInt64, {2, 3000});
  for (int64_t k = 0; k < j.numel(); ++k) j.data<int64_t>()[k] = (k * 7919) % 1000 - 500;
  ExpectSame(R"(
    opset 11
    input router: float32[64,8]
    input y: float32[3,5000]
    input m: float32[4,300,3]
    input j: int64[2,3000]
    init two: int64[1] = 2
    init fifty: int64[1] = 50
    init five: int64[1] = 5
    rv, ri = TopK(router, two)
    yv, yi = TopK(y, fifty)
    sv, si = TopK(y, fifty) {largest = 0}
    mv, mi = TopK(m, five) {axis = 1}
    jv, ji = TopK(j, five) {axis = -1, largest = 0}
    hb = Cast(m) {to = 16}
    hv, hi = TopK(hb, five) {axis = 1}
    hf = Cast(hv) {to = 1}
    output rv
    output ri
    output yv
    output yi
    output sv
    output si
    output mv
    output mi
    output jv
    output ji
    output hf
    output hi
  )",
             {{"router", router}, {"y", y}, {"m", m}, {"j", j}}, 0, 0, "TopK");
  // The gradient: dY scattered to where the values came from, zeros elsewhere.
  ExpectSame(R"(
    opset 11
    input m: float32[4,300,3]
    input dv: float32[4,5,3]
    init five: int64[1] = 5
    init zeros: float32[4,300,3] = fill 0
    mv, mi = TopK(m, five) {axis = 1}
    dm = ScatterElements(zeros, mi, dv) {axis = 1}
    output dm
  )",
             {{"m", m}, {"dv", Random({4, 5, 3}, 12)}}, 0, 0, "*");
}

// GatherND and ScatterND against the CPU: element and slice tuples, negative coordinates,
// batch_dims, int64 data, every reduction over repeated tuples (in tuple order, as the CPU);
// then a coordinate out of range, reported at the run naming the node.
TEST(CudaProvider, GatherNdAndScatterNdInEveryReduction) {
  REQUIRE_CUDA();
  const Tensor pairs = Int64s({5, 2}, {0, 1, 2, -1, 1, 3, 0, 1, -3, 0});
  const Tensor rows = Int64s({6, 1}, {1, 0, 2, 1, -1, 1});
  const Tensor last = Int64s({3, 1}, {3, 0, -2});
  Tensor ints(DataType::kInt64, {3, 4});
  for (int k = 0; k < 12; ++k) ints.data<int64_t>()[k] = k * 7 % 5;
  ExpectSame(R"(
    opset 18
    input x: float32[3,4,6]
    input pairs: int64[5,2]
    input rows: int64[6,1]
    input last: int64[3,1]
    input ints: int64[3,4]
    input u: float32[6,4,6]
    input ui: int64[6,4]
    a = GatherND(x, pairs)
    b = GatherND(x, rows)
    c = GatherND(x, last) {batch_dims = 1}
    d = GatherND(ints, rows)
    e = ScatterND(x, rows, u) {reduction = "add"}
    f = ScatterND(x, rows, u) {reduction = "mul"}
    g = ScatterND(x, rows, u) {reduction = "max"}
    h = ScatterND(ints, rows, ui) {reduction = "min"}
    output a
    output b
    output c
    output d
    output e
    output f
    output g
    output h
  )",
             {{"x", Random({3, 4, 6}, 21)}, {"pairs", pairs}, {"rows", rows}, {"last", last}, {"ints", ints},
              {"u", Random({6, 4, 6}, 22)}, {"ui", [] {
                Tensor t(DataType::kInt64, {6, 4});
                for (int k = 0; k < 24; ++k) t.data<int64_t>()[k] = k * 5 % 7 - 3;
                return t;
              }()}},
             1e-6, 1e-6, "*");
  // Without a reduction, on distinct tuples (repeats write in no set order).
  const Tensor distinct = Int64s({2, 2}, {2, 3, 0, -1});
  ExpectSame(R"(
    opset 16
    input x: float32[3,4,6]
    input i: int64[2,2]
    input u: float32[2,6]
    y = ScatterND(x, i, u)
    output y
  )",
             {{"x", Random({3, 4, 6}, 23)}, {"i", distinct}, {"u", Random({2, 6}, 24)}}, 0, 0, "*");
  auto s = cuda_testing::CudaSession(R"(
    opset 16
    input x: float32[3,4]
    input i: int64[2,2]
    nd: y = GatherND(x, i)
    output y
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  auto run = (*s)->Run({{"x", Random({3, 4}, 25)}, {"i", Int64s({2, 2}, {1, 1, 2, 4})}});
  ASSERT_FALSE(run.ok());
  const std::string msg(run.status().message());
  EXPECT_TRUE(absl::StartsWith(msg, "GatherND 'nd'")) << msg;
  EXPECT_NE(msg.find("index 4"), std::string::npos) << msg;
}

TEST(CudaProvider, GatherElementsAndScatterElementsInEveryReduction) {
  REQUIRE_CUDA();
  // Indices with duplicates and negative entries along axis 1 of [3, 5, 4] data.
  Tensor idx(DataType::kInt64, {3, 6, 4});
  for (int64_t k = 0; k < idx.numel(); ++k) idx.data<int64_t>()[k] = (k * 7) % 10 - 5;
  Tensor idx32(DataType::kInt32, {2, 3});
  for (int k = 0; k < 6; ++k) idx32.data<int32_t>()[k] = (k * 5) % 4;
  ExpectSame(R"(
    opset 18
    input x: float32[3,5,4]
    input idx: int64[3,6,4]
    input u: float32[3,6,4]
    input i: int64[2,4]
    input idx32: int32[2,3]
    g = GatherElements(x, idx) {axis = 1}
    h = GatherElements(i, idx32) {axis = -1}
    s = ScatterElements(x, idx, u) {axis = 1, reduction = "add"}
    m = ScatterElements(x, idx, u) {axis = 1, reduction = "mul"}
    mx = ScatterElements(x, idx, u) {axis = 1, reduction = "max"}
    mn = ScatterElements(x, idx, u) {axis = 1, reduction = "min"}
    idx32c = Cast(idx32) {to = 7}
    k = ScatterElements(i, idx32, idx32c) {axis = 1, reduction = "add"}
    output g
    output h
    output s
    output m
    output mx
    output mn
    output k
  )",
             {{"x", Random({3, 5, 4}, 8)}, {"idx", idx}, {"u", Random({3, 6, 4}, 9)}, {"i", Ids({2, 4}, 1000, 10)},
              {"idx32", idx32}},
             1e-6, 1e-6, "*");
  // Without a reduction, distinct indices (a permutation along axis 0) so that the result does
  // not depend on which duplicate lands last.
  ExpectSame(R"(
    input x: float32[4,3]
    init p: int64[4,3] = 3 0 1 1 3 2 0 2 3 2 1 0
    input u: float32[4,3]
    s = ScatterElements(x, p, u) {axis = 0}
    output s
  )",
             {{"x", Random({4, 3}, 11)}, {"u", Random({4, 3}, 12)}}, 0, 0, "ScatterElements");
}

// The norms, log-sums and products over each layout the reduction kernels take (trailing axes,
// leading axes into columns, axes between, everything), LogSumExp of values that would overflow
// exp, and noop_with_empty_axes' identity (SumSquare's squares).
TEST(CudaProvider, NormAndLogSumReductions) {
  REQUIRE_CUDA();
  for (const char* op : {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd"}) {
    const bool positive = std::string(op) == "ReduceLogSum";
    const bool product = std::string(op) == "ReduceProd";  // factors near 1 keep 2100 of them finite
    ExpectSame(absl::StrCat(R"(
      opset 18
      input x: float32[6,50,7]
      input big: float32[3,40]
      init last: int64[1] = -1
      init first: int64[1] = 0
      init mid: int64[1] = 1
      init none: int64[0] =
      a = )", op, R"((x, last) {keepdims = 0}
      b = )", op, R"((x, first)
      c = )", op, R"((x, mid) {keepdims = 0}
      d = )", op, R"((x)
      e = )", op, R"((big, last)
      f = )", op, R"((x, none) {noop_with_empty_axes = 1}
      output a
      output b
      output c
      output d
      output e
      output f
    )"),
               {{"x", Random({6, 50, 7}, 20, product ? 0.9f : positive ? 0.1f : -2.f, product ? 1.1f : 2.f)},
                {"big", Random({3, 40}, 21, product ? -1.2f : positive ? 1.f : -90.f, product ? 1.2f : 90.f)}},
               1e-5, 1e-5, op);
  }
  // bf16 in and out: the same sums rounded once.
  ExpectSame(R"(
    opset 13
    input x: float32[4,300]
    hx = Cast(x) {to = 16}
    hl = ReduceL2(hx) {axes = [1]}
    hs = ReduceLogSumExp(hx) {axes = [0], keepdims = 0}
    l = Cast(hl) {to = 1}
    s = Cast(hs) {to = 1}
    output l
    output s
  )",
             {{"x", Random({4, 300}, 22)}}, 1e-3, 8e-3, "*",
             R"(
    opset 13
    input x: float32[4,300]
    hx = Cast(x) {to = 16}
    fx = Cast(hx) {to = 1}
    fl = ReduceL2(fx) {axes = [1]}
    fs = ReduceLogSumExp(fx) {axes = [0], keepdims = 0}
    hl = Cast(fl) {to = 16}
    hs = Cast(fs) {to = 16}
    l = Cast(hl) {to = 1}
    s = Cast(hs) {to = 1}
    output l
    output s
  )");
}

TEST(CudaProvider, GatherElementsIndexOutOfRangeNamesTheNode) {
  REQUIRE_CUDA();
  auto s = cuda_testing::CudaSession(R"(
    input x: float32[2,3]
    input idx: int64[2,2]
    g = GatherElements(x, idx) {axis = 1}
    output g
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Run({{"x", Random({2, 3}, 1)}, {"idx", Int64s({2, 2}, {0, 1, 3, 2})}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("GatherElements"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("3"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace cleave
