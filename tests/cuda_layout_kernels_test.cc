// CUDA data-movement kernel tests (label gpu): Transpose and the views, Gather and GatherGrad along
// any axis, Expand and SliceGrad, the value makers ConstantOfShape, Range and Trilu, each against
// the CPU kernel on the same graph (Slice, Concat and Split are in cuda_kernels_test.cc), and the
// ops sessions decompose into those and products, with their gradients. Without a usable device
// (or driver) each test skips and says why.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "graph/op_table.h"
#include "graph/passes/pass.h"
#include "runtime/inference_session.h"
#include "tests/cuda_test_util.h"
#include "trainer/autodiff.h"

namespace cleave {
namespace {

using namespace cuda_testing;

TEST(CudaProvider, LayoutAndViews) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[2,3,4,5]
    init shape: int64[3] = 6 -1 5
    init axes: int64[1] = 1
    t = Transpose(x) {perm = [2, 0, 3, 1]}
    r = Reshape(x, shape)
    u = Unsqueeze(r, axes)
    s = Squeeze(u, axes)
    f = Flatten(x) {axis = 2}
    output t
    output u
    output s
    output f
  )",
             {{"x", Random({2, 3, 4, 5}, 42)}}, 0, 0, "Transpose");
  // Attention's layouts in bf16 (runs of 64 moved as 16-byte words); inner runs of 8 bytes (bf16
  // and int64 elements: 8-byte words), 4 bytes (bf16 pairs: 4-byte words) and 16 (float32); one
  // with dims of 1 and neighbours that merge, a plain copy, and one that moves the innermost dim
  // (element by element); all exact.
  ExpectSame(R"(
    input q: float32[8,1024,12,64]
    input a: float32[6,10,4]
    input c: float32[6,10,2]
    input b: float32[2,1,3,5,7]
    init ids: int64[2,3,2] = 1 2 3 4 5 6 7 8 9 10 11 12
    hq = Cast(q) {to = 16}
    ha = Cast(a) {to = 16}
    hc = Cast(c) {to = 16}
    t1 = Transpose(hq) {perm = [0, 2, 1, 3]}
    t2 = Transpose(t1) {perm = [0, 2, 1, 3]}
    t3 = Transpose(ha) {perm = [1, 0, 2]}
    t4 = Transpose(a) {perm = [1, 0, 2]}
    t5 = Transpose(b) {perm = [1, 0, 3, 4, 2]}
    t6 = Transpose(b) {perm = [1, 0, 2, 3, 4]}
    t7 = Transpose(b) {perm = [4, 2, 3, 1, 0]}
    t8 = Transpose(hc) {perm = [1, 0, 2]}
    t9 = Transpose(ids) {perm = [1, 0, 2]}
    w1 = Cast(t1) {to = 1}
    w2 = Cast(t2) {to = 1}
    w3 = Cast(t3) {to = 1}
    w8 = Cast(t8) {to = 1}
    output w1
    output w2
    output w3
    output t4
    output t5
    output t6
    output t7
    output w8
    output t9
  )",
             {{"q", Random({8, 1024, 12, 64}, 43)}, {"a", Random({6, 10, 4}, 44)}, {"c", Random({6, 10, 2}, 46)},
              {"b", Random({2, 1, 3, 5, 7}, 45)}},
             0, 0, "*");
}

// Gather along any axis with int64 or int32 indices (negative ones count from the end), a scalar
// index (BERT's pooler takes token 0 of the sequence axis), bf16 data, and GatherGrad along those
// axes (repeated indices accumulate).
TEST(CudaProvider, GatherAlongAnyAxisAndItsGradient) {
  REQUIRE_CUDA();
  Tensor ids = Tensor::FromVector<int64_t>({1, -1, 4, 1}, {2, 2});
  Tensor idx(DataType::kInt32, {3});
  const int32_t iv[3] = {3, 0, -4};
  for (int i = 0; i < 3; ++i) idx.data<int32_t>()[i] = iv[i];
  Tensor zero(DataType::kInt64, {});
  zero.data<int64_t>()[0] = 0;
  ExpectSame(R"(
    input data: float32[3,5,4]
    input ids: int64[2,2]
    input idx: int32[3]
    input zero: int64[]
    input dy1: float32[3,2,2,4]
    input dy2: float32[3,5,3]
    input dy3: float32[3,4]
    init shape: int64[3] = 3 5 4
    g1 = Gather(data, ids) {axis = 1}
    g2 = Gather(data, idx) {axis = -1}
    g3 = Gather(data, zero) {axis = 1}
    h = Cast(data) {to = 16}
    h4 = Gather(h, idx) {axis = 2}
    g4 = Cast(h4) {to = 1}
    d1 = ai.cleave.GatherGrad(shape, ids, dy1) {axis = 1}
    d2 = ai.cleave.GatherGrad(shape, idx, dy2) {axis = -1}
    d3 = ai.cleave.GatherGrad(shape, zero, dy3) {axis = 1}
    output g1
    output g2
    output g3
    output g4
    output d1
    output d2
    output d3
  )",
             {{"data", Random({3, 5, 4}, 70)}, {"ids", ids}, {"idx", idx}, {"zero", zero},
              {"dy1", Random({3, 2, 2, 4}, 71)}, {"dy2", Random({3, 5, 3}, 72)}, {"dy3", Random({3, 4}, 73)}},
             1e-6, 1e-6, "*");
}

// Expand, either side holding the larger dims (LLaMA's RMSNorm backward expands its mean's
// gradient), over float32, int64 and bf16; SliceGrad (rotary attention's slices), with steps
// of 1, 2 and -2, negative starts and ends, axes given and omitted: zeros with dY in the slice,
// exact. (Gradients are float32 or float64, as shape inference has them.)
TEST(CudaProvider, ExpandAndSliceGrad) {
  REQUIRE_CUDA();
  ExpectSame(R"(
    input x: float32[3,1]
    input y: float32[2,1,4]
    input n: int64[1,4]
    init s1: int64[3] = 2 3 4
    init s2: int64[2] = 3 1
    init s3: int64[1] = 5
    e1 = Expand(x, s1)
    e2 = Expand(y, s2)
    e3 = Expand(x, s3)
    e4 = Expand(n, s1)
    h = Cast(y) {to = 16}
    h5 = Expand(h, s1)
    e5 = Cast(h5) {to = 1}
    output e1
    output e2
    output e3
    output e4
    output e5
  )",
             {{"x", Random({3, 1}, 80)}, {"y", Random({2, 1, 4}, 81)},
              {"n", Tensor::FromVector<int64_t>({5, -6, 7, INT64_MAX}, {1, 4})}},
             0, 0, "*");
  // The slice of the Slice test above: [4, 6, 9] by starts (1, -1, 0), ends (3, -7, 6) on axes
  // (0, 2, 1) with steps (1, -2, 2) is [2, 3, 3]; and [0:2, 1:4, 2:5].
  const std::string slice_args = R"(
    input dy: float32[2,3,3]
    init shape: int64[3] = 4 6 9
    init starts: int64[3] = 1 -1 0
    init ends: int64[3] = 3 -7 6
    init axes: int64[3] = 0 2 1
    init steps: int64[3] = 1 -2 2
    init starts2: int64[3] = 0 1 2
    init ends2: int64[3] = 2 4 5
  )";
  ExpectSame(slice_args + R"(
    g1 = ai.cleave.SliceGrad(dy, shape, starts, ends, axes, steps)
    g2 = ai.cleave.SliceGrad(dy, shape, starts2, ends2)
    output g1
    output g2
  )",
             {{"dy", Random({2, 3, 3}, 82)}}, 0, 0, "*");
}

// ConstantOfShape (the default float zero, an int64, a bool and -inf values) of a shape fed at run
// time, Range over int64 (counting down) and float32, and Trilu of float32, bf16, int64 and bool
// matrices, upper and lower, with k fed or absent.
TEST(CudaProvider, ValueMakersConstantOfShapeRangeTrilu) {
  REQUIRE_CUDA();
  auto values = [](graph::Graph& g) {
    for (const auto& n : g.nodes()) {
      const std::string& out = n->output(0)->name();
      graph::Attribute a;
      a.type = graph::AttrType::kTensor;
      if (out == "c1") a.t = Tensor::FromVector<int64_t>({-3}, {1});
      else if (out == "c2") a.t = Tensor::FromVector<bool>({true}, {1});
      else if (out == "c3") a.t = Tensor::FromVector<float>({-INFINITY}, {1});
      else continue;
      n->SetAttr("value", a);
    }
  };
  ExpectSame(R"(
    input shape: int64[3]
    input start: int64[]
    input lim: int64[]
    input step: int64[]
    input fs: float32[]
    input fl: float32[]
    input fd: float32[]
    input x: float32[2,5,7]
    input k: int64[]
    input n: int64[3,4]
    c0 = ConstantOfShape(shape)
    c1 = ConstantOfShape(shape)
    c2 = ConstantOfShape(shape)
    c3 = ConstantOfShape(shape)
    r1 = Range(start, lim, step)
    r2 = Range(fs, fl, fd)
    t1 = Trilu(x, k)
    t2 = Trilu(x) {upper = 0}
    t3 = Trilu(n, k) {upper = 0}
    hx = Cast(x) {to = 16}
    h4 = Trilu(hx, k)
    t4 = Cast(h4) {to = 1}
    b = Cast(n) {to = 9}
    t5 = Trilu(b)
    output c0
    output c1
    output c2
    output c3
    output r1
    output r2
    output t1
    output t2
    output t3
    output t4
    output t5
  )",
             {{"shape", Tensor::FromVector<int64_t>({2, 3, 4}, {3})},
              {"start", Tensor::Scalar<int64_t>(10)},
              {"lim", Tensor::Scalar<int64_t>(-3)},
              {"step", Tensor::Scalar<int64_t>(-4)},
              {"fs", Tensor::Scalar<float>(0.5f)},
              {"fl", Tensor::Scalar<float>(3.1f)},
              {"fd", Tensor::Scalar<float>(0.3f)},
              {"x", Random({2, 5, 7}, 90)},
              {"k", Tensor::Scalar<int64_t>(-1)},
              {"n", Tensor::FromVector<int64_t>({1, -2, 3, 0, 5, 6, -7, 8, 9, 10, 0, 12}, {3, 4})}},
             0, 0, "*", "", values);
}

// An index out of range on the device is the run's error, as on the CPU: it names the node, the
// index, its position and the axis size; the next run with good indices is not affected.
TEST(CudaProvider, GatherIndexOutOfRangeIsAnError) {
  REQUIRE_CUDA();
  auto s = CudaSession(R"(
    input table: float32[10,4]
    input ids: int64[2,3]
    input dy: float32[2,3,4]
    init shape: int64[2] = 10 4
    emb: e = Gather(table, ids)
    grad: g = ai.cleave.GatherGrad(shape, ids, dy)
    output e
    output g
  )");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->warning(), "");
  const Tensor table = Random({10, 4}, 95), dy = Random({2, 3, 4}, 96);
  auto ids = [](std::vector<int64_t> v) { return Tensor::FromVector<int64_t>(v, {2, 3}); };
  auto bad = (*s)->Run({{"table", table}, {"ids", ids({1, 2, 3, 4, 12, 5})}, {"dy", dy}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  const std::string msg(bad.status().message());
  std::printf("the error: %s\n", msg.c_str());
  EXPECT_NE(msg.find("index 12 at position 4 is out of range for an axis of size 10: expected [-10, 9]"),
            std::string::npos)
      << msg;
  // It starts with the node at fault, not with the copy whose wait found it.
  EXPECT_TRUE(absl::StartsWith(msg, "Gather 'emb'") || absl::StartsWith(msg, "ai.cleave.GatherGrad 'grad'")) << msg;
  EXPECT_EQ(msg.find("Memcpy"), std::string::npos) << msg;
  auto good = (*s)->Run({{"table", table}, {"ids", ids({1, 2, 3, 4, -1, 5})}, {"dy", dy}});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)[0].data<float>()[4 * 4], table.data<float>()[9 * 4]);  // -1 is the last row
}

// Decomposes `g` as a session would, then appends loss = the sum over the outputs of y * r (r
// fixed) and outputs the loss's gradient with respect to every float input.
void WithGradients(graph::Graph& g) {
  graph::OpDecomposition decompose;
  ASSERT_TRUE(graph::RunPass(decompose, &g).ok());
  ASSERT_TRUE(graph::InferShapes(g).ok());
  graph::Value* loss = nullptr;
  unsigned seed = 60;
  for (graph::Value* y : std::vector<graph::Value*>(g.outputs())) {
    if (!IsFloat(y->dtype())) continue;
    ASSERT_TRUE(y->shape().is_static()) << y->name() << " is " << y->shape().ToString() << " after the rewrite";
    graph::Value* r = g.AddInitializer(g.UniqueName("r"), Random(y->shape().StaticDims(), ++seed));
    graph::Value* m = g.CreateUniqueValue("m");
    graph::Value* sum = g.CreateUniqueValue("sum");
    g.AddNode("Mul", {y, r}, {m});
    g.AddNode("ReduceSum", {m}, {sum})->SetAttr("keepdims", graph::Attribute::Int(0));
    if (loss) {
      graph::Value* total = g.CreateUniqueValue("total");
      g.AddNode("Add", {loss, sum}, {total});
      loss = total;
    } else {
      loss = sum;
    }
  }
  ASSERT_TRUE(graph::InferShapes(g).ok());
  std::vector<graph::Value*> inputs;
  for (graph::Value* v : g.inputs())
    if (IsFloat(v->dtype())) inputs.push_back(v);
  auto grads = trainer::BuildBackward(g, loss, inputs);
  ASSERT_TRUE(grads.ok()) << grads.status();
  for (graph::Value* v : inputs) g.AddOutput(grads->at(v->name()));
}

// Einsum (a batched product over broadcast ellipsis axes, a batch diagonal), GroupNormalization
// and DepthToSpace, then OneHot, Hardmax, Shrink, LRN, the Lp pools and normalisations, then LSTM
// and GRU, as every session decomposes them, with their gradients (autodiff over what they
// became): every node on CUDA, equal to the CPU.
TEST(CudaProvider, DecomposedOpsAndTheirGradients) {
  REQUIRE_CUDA();
  const std::string text = R"(
    opset 21
    input a: float32[2,3,4,5]
    input b: float32[3,5,6]
    input d: float32[2,4,4]
    input x: float32[2,8,3,3]
    input s: float32[8]
    input c: float32[8]
    e = Einsum(a, b) {equation = "...ij,...jk->...ik"}
    t = Einsum(d) {equation = "bii->bi"}
    n = GroupNormalization(x, s, c) {num_groups = 4}
    p = DepthToSpace(n) {blocksize = 2, mode = "CRD"}
    output e
    output t
    output p
  )";
  ExpectSame(text,
             {{"a", Random({2, 3, 4, 5}, 51)}, {"b", Random({3, 5, 6}, 52)}, {"d", Random({2, 4, 4}, 53)},
              {"x", Random({2, 8, 3, 3}, 54)}, {"s", Random({8}, 55)}, {"c", Random({8}, 56)}},
             1e-4, 1e-4, "*", "", WithGradients);
  // OneHot (a constant depth, negative indices), Hardmax, Shrink and LRN (whose gradient runs
  // through an AveragePool over the channels), LpPool, GlobalLpPool, MeanVarianceNormalization
  // and LpNormalization.
  Tensor ids(DataType::kInt64, {4, 5});
  for (int64_t k = 0; k < ids.numel(); ++k) ids.data<int64_t>()[k] = k % 9 - 4;
  ExpectSame(R"(
    opset 13
    input x: float32[2,6,3,3]
    input ids: int64[4,5]
    input h: float32[3,7]
    init depth: int64[] = 6
    init onoff: float32[2] = -1 2
    o = OneHot(ids, depth, onoff) {axis = 1}
    m = Hardmax(h) {axis = 1}
    k = Shrink(x) {lambd = 0.5, bias = 0.25}
    l = LRN(x) {size = 3, alpha = 0.01, bias = 2}
    q = LpPool(x) {kernel_shape = [2, 2], strides = [1, 2], pads = [0, 1, 1, 0], p = 3}
    gq = GlobalLpPool(x)
    mv = MeanVarianceNormalization(x)
    ln = LpNormalization(x) {axis = 1}
    output mv
    output ln
    output q
    output gq
    output o
    output m
    output k
    output l
  )",
             {{"x", Random({2, 6, 3, 3}, 57)}, {"ids", ids}, {"h", Random({3, 7}, 58)}}, 1e-4, 1e-4, "*", "",
             WithGradients);
  // CenterCropPad (a crop and a pad), ReverseSequence, MaxUnpool after a MaxPool, and a window.
  ExpectSame(R"(
    opset 18
    input x: float32[6,3,4]
    input lens: int64[3]
    input img: float32[2,3,4,4]
    init shape: int64[2] = 3 7
    init size: int64[] = 8
    c = CenterCropPad(x, shape) {axes = [0, 2]}
    r = ReverseSequence(x, lens)
    m, i = MaxPool(img) {kernel_shape = [2, 2], strides = [2, 2]}
    u = MaxUnpool(m, i) {kernel_shape = [2, 2], strides = [2, 2]}
    w = HannWindow(size)
    output c
    output r
    output u
    output w
  )",
             {{"x", Random({6, 3, 4}, 69)}, {"lens", Tensor::FromVector<int64_t>({6, 2, 5}, {3})},
              {"img", Random({2, 3, 4, 4}, 70)}},
             1e-5, 1e-5, "*", "", WithGradients);
  // LSTM (both directions, sequence_lens, peepholes) and GRU (linear_before_reset), unrolled
  // over the sequence, with the gradients of the inputs, weights and states.
  Tensor lens(DataType::kInt32, {3});
  lens.data<int32_t>()[0] = 4;
  lens.data<int32_t>()[1] = 1;
  lens.data<int32_t>()[2] = 3;
  ExpectSame(R"(
    opset 14
    input x: float32[4,3,5]
    input w: float32[2,24,5]
    input rw: float32[2,24,6]
    input b: float32[2,48]
    input lens: int32[3]
    input h0: float32[2,3,6]
    input c0: float32[2,3,6]
    input p: float32[2,18]
    input gw: float32[1,18,5]
    input gr: float32[1,18,6]
    input gb: float32[1,36]
    y, yh, yc = LSTM(x, w, rw, b, lens, h0, c0, p) {hidden_size = 6, direction = "bidirectional", clip = 2.5}
    g, gh = GRU(x, gw, gr, gb) {hidden_size = 6, linear_before_reset = 1, layout = 0}
    output y
    output yc
    output g
  )",
             {{"x", Random({4, 3, 5}, 59)}, {"w", Random({2, 24, 5}, 60)}, {"rw", Random({2, 24, 6}, 61)},
              {"b", Random({2, 48}, 62)}, {"lens", lens}, {"h0", Random({2, 3, 6}, 63)},
              {"c0", Random({2, 3, 6}, 64)}, {"p", Random({2, 18}, 65)}, {"gw", Random({1, 18, 5}, 66)},
              {"gr", Random({1, 18, 6}, 67)}, {"gb", Random({1, 36}, 68)}},
             1e-4, 1e-4, "*", "", WithGradients);
  // Col2Im (strided, dilated, padded; its block positions from image_shape and block_shape at
  // run time) and AffineGrid feeding GridSample: a spatial transformer.
  ExpectSame(R"(
    opset 20
    input cols: float32[2,12,12]
    input theta: float32[2,2,3]
    input img: float32[2,3,5,4]
    init image: int64[2] = 5 7
    init blk: int64[2] = 2 3
    init size: int64[4] = 2 3 4 6
    f = Col2Im(cols, image, blk) {strides = [2, 1], dilations = [1, 2], pads = [1, 0, 0, 1]}
    gr = AffineGrid(theta, size)
    s = GridSample(img, gr) {padding_mode = "border"}
    output f
    output s
  )",
             {{"cols", Random({2, 12, 12}, 71)}, {"theta", Random({2, 2, 3}, 72)}, {"img", Random({2, 3, 5, 4}, 73)}},
             1e-5, 1e-5, "*", "", WithGradients);
}

}  // namespace
}  // namespace cleave
