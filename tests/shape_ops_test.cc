// Op tests for the shape and data-movement ops (tests/), run through OpTester on the CPU
// provider. Expected values are written out by hand or, for the larger permutations, made
// by a naive index-by-index formula that shares nothing with the kernels' strided copies.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

using graph::Attribute;
using I64 = std::vector<int64_t>;

template <typename T = float>
std::vector<T> Iota(int64_t n, T start = T(0)) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

// y[i_0..i_{r-1}] = x[j] with j_{perm[k]} = i_k, computed one element at a time.
template <typename T>
std::vector<T> NaiveTranspose(const std::vector<T>& x, const I64& dims, const I64& perm) {
  const int r = static_cast<int>(dims.size());
  I64 out_dims(r), x_strides(r, 1);
  for (int k = r - 2; k >= 0; --k) x_strides[k] = x_strides[k + 1] * dims[k + 1];
  for (int k = 0; k < r; ++k) out_dims[k] = dims[perm[k]];
  std::vector<T> y(x.size());
  for (int64_t lin = 0; lin < static_cast<int64_t>(y.size()); ++lin) {
    int64_t rest = lin, src = 0;
    for (int k = r - 1; k >= 0; --k) {
      src += (rest % out_dims[k]) * x_strides[perm[k]];
      rest /= out_dims[k];
    }
    y[lin] = x[src];
  }
  return y;
}

I64 Permuted(const I64& dims, const I64& perm) {
  I64 out;
  for (int64_t p : perm) out.push_back(dims[p]);
  return out;
}

// ---- Reshape, Flatten, Squeeze, Unsqueeze, Identity ---------------------------------------

TEST(ShapeReshapeTest, MinusOneIsInferred) {
  OpTester("Reshape", 13).Input<float>("x", {2, 3, 4}, Iota(24))
      .Input<int64_t>("shape", {2}, {4, -1})
      .Output<float>("y", {4, 6}, Iota(24)).Run();
}

TEST(ShapeReshapeTest, ZeroCopiesTheInputDim) {
  OpTester("Reshape", 13).Input<float>("x", {2, 3, 4}, Iota(24))
      .Input<int64_t>("shape", {2}, {0, -1}).AsInitializer()
      .Output<float>("y", {2, 12}, Iota(24)).Run();
  // Version 14 without allowzero keeps the copying meaning.
  OpTester("Reshape", 14).Input<int64_t>("x", {2, 3}, Iota<int64_t>(6))
      .Input<int64_t>("shape", {3}, {0, 3, 1})
      .Output<int64_t>("y", {2, 3, 1}, Iota<int64_t>(6)).Run();
}

TEST(ShapeReshapeTest, AllowZeroMakesZeroLiteral) {
  // allowzero=1: a 0 in shape is a zero-sized dim, so an empty [0, 3] becomes [3, 0].
  OpTester("Reshape", 14).Attr("allowzero", int64_t{1})
      .Input<float>("x", {0, 3}, {})
      .Input<int64_t>("shape", {2}, {3, 0})
      .Output<float>("y", {3, 0}, {}).Run();
  // With allowzero=0 the same shape copies dim 1 (3) and the element counts disagree.
  OpTester("Reshape", 14).Input<float>("x", {0, 3}, {})
      .Input<int64_t>("shape", {2}, {3, 0})
      .Output<float>("y", {3, 0}, {})
      .ExpectFailure("to [3,3]").Run();
}

TEST(ShapeReshapeTest, MismatchNamesBothElementCounts) {
  OpTester("Reshape", 13).Input<float>("x", {2, 3}, Iota(6))
      .Input<int64_t>("shape", {2}, {4, 2})
      .Output<float>("y", {4, 2}, Iota(8))
      .ExpectFailure("(6 elements) to [4,2] (8 elements)").Run();
  OpTester("Reshape", 13).Input<float>("x", {2, 3}, Iota(6))
      .Input<int64_t>("shape", {2}, {4, -1})
      .Output<float>("y", {4, 2}, Iota(8))
      .ExpectFailure("do not divide 6").Run();
}

TEST(ShapeReshapeTest, ShapeLongerThanMaxRankIsAnError) {
  OpTester("Reshape", 13).Input<float>("x", {2}, Iota(2))
      .Input<int64_t>("shape", {9}, {1, 1, 1, 1, 1, 1, 1, 1, 2})
      .Output<float>("y", {2}, Iota(2)).ExpectFailure("9 values, expected at most 8").Run();
}

TEST(ShapeFlattenTest, Axes) {
  OpTester("Flatten", 13).Attr("axis", int64_t{2}).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<float>("y", {6, 4}, Iota(24)).Run();
  OpTester("Flatten", 13).Attr("axis", int64_t{0}).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<float>("y", {1, 24}, Iota(24)).Run();
  OpTester("Flatten", 13).Attr("axis", int64_t{-1}).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<float>("y", {6, 4}, Iota(24)).Run();
  OpTester("Flatten", 13).Input<float>("x", {2, 3, 4}, Iota(24))  // default axis 1
      .Output<float>("y", {2, 12}, Iota(24)).Run();
}

TEST(ShapeSqueezeTest, AttributeBeforeVersion13) {
  OpTester("Squeeze", 11).Attr("axes", I64{0, -2}).Input<float>("x", {1, 3, 1, 2}, Iota(6))
      .Output<float>("y", {3, 2}, Iota(6)).Run();
}

TEST(ShapeSqueezeTest, InputFromVersion13) {
  OpTester("Squeeze", 13).Input<float>("x", {3, 1, 2}, Iota(6))
      .Input<int64_t>("axes", {1}, {-2})
      .Output<float>("y", {3, 2}, Iota(6)).Run();
  // Without axes every size-1 dim goes.
  OpTester("Squeeze", 13).Input<float>("x", {1, 3, 1, 2, 1}, Iota(6))
      .Output<float>("y", {3, 2}, Iota(6)).Run();
}

TEST(ShapeSqueezeTest, NonUnitAxisIsAnError) {
  OpTester("Squeeze", 13).Input<float>("x", {3, 2}, Iota(6))
      .Input<int64_t>("axes", {1}, {0})
      .Output<float>("y", {2}, Iota(2))
      .ExpectFailure("its size is 3, expected 1").Run();
}

TEST(ShapeUnsqueezeTest, AttributeAndInput) {
  OpTester("Unsqueeze", 11).Attr("axes", I64{0, 3}).Input<float>("x", {2, 3}, Iota(6))
      .Output<float>("y", {1, 2, 3, 1}, Iota(6)).Run();
  // Negative axes count back from the output rank (3 here): -1 appends.
  OpTester("Unsqueeze", 13).Input<float>("x", {2, 3}, Iota(6))
      .Input<int64_t>("axes", {1}, {-1})
      .Output<float>("y", {2, 3, 1}, Iota(6)).Run();
  OpTester("Unsqueeze", 13).Input<bool>("x", {2}, {true, false})
      .Input<int64_t>("axes", {2}, {1, 0}).AsInitializer()
      .Output<bool>("y", {1, 1, 2}, {true, false}).Run();
}

TEST(ShapeIdentityTest, CopiesEveryFixedSizeType) {
  OpTester("Identity", 16).Input<int64_t>("x", {3}, {5, -6, 7})
      .Output<int64_t>("y", {3}, {5, -6, 7}).Run();
  OpTester("Identity", 16).Input<double>("x", {2}, {0.5, -1e300})
      .Output<double>("y", {2}, {0.5, -1e300}).Run();
}

// ---- Transpose -----------------------------------------------------------------------------

template <typename T = float>
void CheckTranspose(const I64& dims, const I64& perm) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<T> x = Iota<T>(n);
  OpTester t("Transpose", 13);
  if (!perm.empty()) t.Attr("perm", perm);
  I64 p = perm;
  if (p.empty())
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) p.push_back(k);
  t.Input<T>("x", dims, x);
  t.Output<T>("y", Permuted(dims, p), NaiveTranspose(x, dims, p));
  t.Run();
}

TEST(ShapeTransposeTest, DefaultReversesAxes) {
  // [2,3] -> [3,2] written out: x = [[0,1,2],[3,4,5]].
  OpTester("Transpose", 13).Input<float>("x", {2, 3}, Iota(6))
      .Output<float>("y", {3, 2}, {0, 3, 1, 4, 2, 5}).Run();
  CheckTranspose({2, 3, 4}, {});
}

TEST(ShapeTransposeTest, AllPermutationsOfRank3) {
  I64 perm = {0, 1, 2};
  do {
    CheckTranspose({2, 3, 4}, perm);
  } while (std::next_permutation(perm.begin(), perm.end()));
}

TEST(ShapeTransposeTest, AttentionHeadsAndBack) {
  // [B,T,H,d] -> [B,H,T,d] and back, large enough to run in parallel.
  CheckTranspose({2, 33, 4, 16}, {0, 2, 1, 3});
  CheckTranspose({2, 4, 33, 16}, {0, 2, 1, 3});
  // Keys transposed for Q.K^T: [B,H,T,d] -> [B,H,d,T] moves the innermost axis.
  CheckTranspose({2, 3, 37, 16}, {0, 1, 3, 2});
}

TEST(ShapeTransposeTest, TiledMatrixWithRaggedEdges) {
  CheckTranspose({67, 45}, {1, 0});
  CheckTranspose({3, 1, 70, 1, 33}, {4, 1, 2, 3, 0});
  // Every element size goes through the tiled path: 8, 4 (int32) and 1 bytes.
  CheckTranspose<int64_t>({33, 10}, {1, 0});
  CheckTranspose<int32_t>({2, 9, 35}, {0, 2, 1});
  CheckTranspose<int8_t>({5, 7, 3}, {2, 1, 0});
}

TEST(ShapeTransposeTest, ByteAndHalfTypes) {
  OpTester("Transpose", 13).Input<int8_t>("x", {2, 3}, {1, 2, 3, 4, 5, -6})
      .Output<int8_t>("y", {3, 2}, {1, 4, 2, 5, 3, -6}).Run();
  // float16 moves as raw 16-bit words: 1, 2, 3, 4 in IEEE half.
  Tensor x(DataType::kFloat16, {2, 2});
  const uint16_t h[4] = {0x3C00, 0x4000, 0x4200, 0x4400};
  for (int i = 0; i < 4; ++i) x.data<uint16_t>()[i] = h[i];
  Tensor y(DataType::kFloat16, {2, 2});
  const uint16_t ht[4] = {0x3C00, 0x4200, 0x4000, 0x4400};
  for (int i = 0; i < 4; ++i) y.data<uint16_t>()[i] = ht[i];
  OpTester("Transpose", 13).InputTensor("x", x).OutputTensor("y", y).Run();
}

// ---- Concat, Split -------------------------------------------------------------------------

TEST(ShapeConcatTest, Axis1AndNegativeAxis) {
  // [[0,1],[2,3]] ++ [[10,11,12],[13,14,15]] along axis 1.
  std::vector<float> want = {0, 1, 10, 11, 12, 2, 3, 13, 14, 15};
  OpTester("Concat", 13).Attr("axis", int64_t{1})
      .Input<float>("a", {2, 2}, Iota(4)).Input<float>("b", {2, 3}, Iota(6, 10.f))
      .Output<float>("y", {2, 5}, want).Run();
  OpTester("Concat", 13).Attr("axis", int64_t{-1})
      .Input<float>("a", {2, 2}, Iota(4)).Input<float>("b", {2, 3}, Iota(6, 10.f))
      .Output<float>("y", {2, 5}, want).Run();
}

TEST(ShapeConcatTest, Axis0WithEmptyInputAndInt64) {
  OpTester("Concat", 11).Attr("axis", int64_t{0})
      .Input<int64_t>("a", {2}, {1, 2}).Input<int64_t>("b", {0}, {})
      .Input<int64_t>("c", {3}, {3, 4, 5})
      .Output<int64_t>("y", {5}, {1, 2, 3, 4, 5}).Run();
}

TEST(ShapeConcatTest, MismatchedDimIsAnError) {
  OpTester("Concat", 13).Attr("axis", int64_t{0})
      .Input<float>("a", {1, 2}, Iota(2)).Input<float>("b", {1, 3}, Iota(3))
      .Output<float>("y", {2, 2}, Iota(4))
      .ExpectFailure("dim 1").Run();
}

TEST(ShapeConcatTest, MoreInputsThanMaxRankAlongInnerAxis) {
  // Ten [2, k+1] inputs, input k filled with 100 * k + j; row r of the output is every
  // input's row r in turn. Ten inputs is more than any fixed per-rank array would hold.
  OpTester t("Concat", 13);
  t.Attr("axis", int64_t{1});
  std::vector<float> want;
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 10; ++k)
      for (int j = 0; j <= k; ++j) want.push_back(100.f * k + r * (k + 1) + j);
  for (int k = 0; k < 10; ++k)
    t.Input<float>(absl::StrCat("x", k), {2, k + 1}, Iota(2 * (k + 1), 100.f * k));
  t.Output<float>("y", {2, 55}, want).Run();
}

TEST(ShapeSplitTest, MoreOutputsThanMaxRankAlongInnerAxis) {
  // [2, 10] split into ten [2, 1] columns: output k is column k.
  OpTester t("Split", 18);
  t.Attr("axis", int64_t{1}).Attr("num_outputs", int64_t{10}).Input<float>("x", {2, 10}, Iota(20));
  for (int k = 0; k < 10; ++k)
    t.Output<float>(absl::StrCat("y", k), {2, 1}, {float(k), float(10 + k)});
  t.Run();
}

TEST(ShapeSplitTest, AttributeSizesVersion11) {
  // [[0,1,2],[3,4,5]] split [1,2] along axis 1.
  OpTester("Split", 11).Attr("axis", int64_t{1}).Attr("split", I64{1, 2})
      .Input<float>("x", {2, 3}, Iota(6))
      .Output<float>("a", {2, 1}, {0, 3}).Output<float>("b", {2, 2}, {1, 2, 4, 5}).Run();
}

TEST(ShapeSplitTest, InputSizesVersion13) {
  OpTester("Split", 13).Input<float>("x", {6}, Iota(6))
      .Input<int64_t>("split", {2}, {2, 4})
      .Output<float>("a", {2}, {0, 1}).Output<float>("b", {4}, {2, 3, 4, 5}).Run();
  // No sizes: equal parts.
  OpTester("Split", 13).Attr("axis", int64_t{-1}).Input<float>("x", {2, 4}, Iota(8))
      .Output<float>("a", {2, 2}, {0, 1, 4, 5}).Output<float>("b", {2, 2}, {2, 3, 6, 7}).Run();
  // Zero-sized parts are allowed.
  OpTester("Split", 13).Input<float>("x", {3}, Iota(3))
      .Input<int64_t>("split", {2}, {0, 3})
      .Output<float>("a", {0}, {}).Output<float>("b", {3}, {0, 1, 2}).Run();
}

TEST(ShapeSplitTest, NumOutputsVersion18LastChunkSmaller) {
  // 7 over 3 outputs: ceil(7/3) = 3, so [3, 3, 1].
  OpTester("Split", 18).Attr("num_outputs", int64_t{3}).Input<float>("x", {7}, Iota(7))
      .Output<float>("a", {3}, {0, 1, 2}).Output<float>("b", {3}, {3, 4, 5})
      .Output<float>("c", {1}, {6}).Run();
}

TEST(ShapeSplitTest, SizesThatDoNotCoverTheAxisAreAnError) {
  OpTester("Split", 13).Input<float>("x", {6}, Iota(6))
      .Input<int64_t>("split", {2}, {2, 3})
      .Output<float>("a", {2}, {0, 1}).Output<float>("b", {3}, {2, 3, 4})
      .ExpectFailure("sum to 5").Run();
}

// ---- Slice ---------------------------------------------------------------------------------

TEST(ShapeSliceTest, AttributesVersion1) {
  // x = [[0,1,2,3],[4,5,6,7]]; x[0:1, 1:3] = [[1,2]].
  OpTester("Slice", 9).Attr("starts", I64{0, 1}).Attr("ends", I64{1, 3})
      .Input<float>("x", {2, 4}, Iota(8)).Output<float>("y", {1, 2}, {1, 2}).Run();
  OpTester("Slice", 9).Attr("starts", I64{1}).Attr("ends", I64{1000}).Attr("axes", I64{1})
      .Input<float>("x", {2, 4}, Iota(8)).Output<float>("y", {2, 3}, {1, 2, 3, 5, 6, 7}).Run();
}

TEST(ShapeSliceTest, NegativeStepsClampToTheEnds) {
  // x[-1:-1000:-2] on 0..9 = 9, 7, 5, 3, 1 (end clamps to -1: through index 0).
  OpTester("Slice", 13).Input<float>("x", {10}, Iota(10))
      .Input<int64_t>("starts", {1}, {-1}).Input<int64_t>("ends", {1}, {-1000})
      .Input<int64_t>("axes", {1}, {0}).Input<int64_t>("steps", {1}, {-2})
      .Output<float>("y", {5}, {9, 7, 5, 3, 1}).Run();
  // Start beyond the end clamps to the last index: x[100:5:-1] = 9, 8, 7, 6.
  OpTester("Slice", 13).Input<int32_t>("x", {10}, Iota<int32_t>(10))
      .Input<int64_t>("starts", {1}, {100}).Input<int64_t>("ends", {1}, {5})
      .Input<int64_t>("axes", {1}, {0}).Input<int64_t>("steps", {1}, {-1})
      .Output<int32_t>("y", {4}, {9, 8, 7, 6}).Run();
}

TEST(ShapeSliceTest, OmittedAxesWithSteps) {
  // x = 3x4 of 0..11; x[0:3:2, 3:0:-1] = rows 0, 2 and columns 3, 2, 1.
  OpTester("Slice", 13).Input<float>("x", {3, 4}, Iota(12))
      .Input<int64_t>("starts", {2}, {0, 3}).Input<int64_t>("ends", {2}, {3, 0})
      .OmittedInput().Input<int64_t>("steps", {2}, {2, -1})
      .Output<float>("y", {2, 3}, {3, 2, 1, 11, 10, 9}).Run();
}

TEST(ShapeSliceTest, OutOfRangeStartGivesEmpty) {
  OpTester("Slice", 13).Input<float>("x", {2, 3}, Iota(6))
      .Input<int64_t>("starts", {1}, {10}).Input<int64_t>("ends", {1}, {20})
      .Input<int32_t>("axes", {1}, {-1})
      .Output<float>("y", {2, 0}, {}).Run();
}

TEST(ShapeSliceTest, ZeroStepIsAnError) {
  OpTester("Slice", 13).Input<float>("x", {4}, Iota(4))
      .Input<int64_t>("starts", {1}, {0}).Input<int64_t>("ends", {1}, {4})
      .Input<int64_t>("axes", {1}, {0}).Input<int64_t>("steps", {1}, {0})
      .Output<float>("y", {4}, Iota(4)).ExpectFailure("expected non-zero").Run();
}

// ---- Expand, Gather ------------------------------------------------------------------------

TEST(ShapeExpandTest, BroadcastsBothWays) {
  // [3,1] with shape [2,1,4] -> [2,3,4]: each row value repeated 4 times, twice.
  std::vector<float> want;
  for (int b = 0; b < 2; ++b)
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) want.push_back(static_cast<float>(r));
  OpTester("Expand", 13).Input<float>("x", {3, 1}, Iota(3))
      .Input<int64_t>("shape", {3}, {2, 1, 4})
      .Output<float>("y", {2, 3, 4}, want).Run();
  // A shorter shape keeps the input's larger dims.
  OpTester("Expand", 8).Input<int32_t>("x", {2, 2}, {1, 2, 3, 4})
      .Input<int64_t>("shape", {1}, {1})
      .Output<int32_t>("y", {2, 2}, {1, 2, 3, 4}).Run();
  OpTester("Expand", 13).Input<float>("x", {3}, Iota(3))
      .Input<int64_t>("shape", {2}, {2, 2})
      .Output<float>("y", {2, 2}, Iota(4)).ExpectFailure("cannot broadcast").Run();
}

TEST(ShapeGatherTest, EmbeddingLookupWithNegativeIndices) {
  // Table rows r = [3r, 3r+1, 3r+2]; indices [[0,3],[-1,1]] pick rows 0, 3, 3, 1.
  OpTester("Gather", 13).Input<float>("table", {4, 3}, Iota(12))
      .Input<int64_t>("ids", {2, 2}, {0, 3, -1, 1})
      .Output<float>("y", {2, 2, 3}, {0, 1, 2, 9, 10, 11, 9, 10, 11, 3, 4, 5}).Run();
}

TEST(ShapeGatherTest, InnerAxisWithInt32AndScalarIndices) {
  // x = [[0,1,2],[3,4,5]], gather columns [2,-3] along axis 1.
  OpTester("Gather", 13).Attr("axis", int64_t{1}).Input<float>("x", {2, 3}, Iota(6))
      .Input<int32_t>("idx", {2}, {2, -3})
      .Output<float>("y", {2, 2}, {2, 0, 5, 3}).Run();
  // A scalar index drops the axis.
  OpTester("Gather", 11).Attr("axis", int64_t{0}).Input<int64_t>("x", {2, 3}, Iota<int64_t>(6))
      .Input<int64_t>("idx", {}, {1})
      .Output<int64_t>("y", {3}, {3, 4, 5}).Run();
}

TEST(ShapeGatherTest, OutOfRangeNamesIndexAndBound) {
  OpTester("Gather", 13).Input<float>("x", {4, 2}, Iota(8))
      .Input<int64_t>("idx", {2}, {1, 4})
      .Output<float>("y", {2, 2}, Iota(4))
      .ExpectFailure("index 4 (element 1 of indices) is out of range for axis 0 of size 4").Run();
  OpTester("Gather", 13).Input<float>("x", {4, 2}, Iota(8))
      .Input<int64_t>("idx", {1}, {-5})
      .Output<float>("y", {1, 2}, Iota(2)).ExpectFailure("index -5").Run();
}

// ---- Shape, ConstantOfShape, Range, Constant -----------------------------------------------

TEST(ShapeShapeTest, StartAndEndFromVersion15) {
  OpTester("Shape", 13).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<int64_t>("y", {3}, {2, 3, 4}).Run();
  OpTester("Shape", 15).Attr("start", int64_t{1}).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<int64_t>("y", {2}, {3, 4}).Run();
  OpTester("Shape", 15).Attr("end", int64_t{-1}).Input<float>("x", {2, 3, 4}, Iota(24))
      .Output<int64_t>("y", {2}, {2, 3}).Run();
  // Out-of-range start/end clamp to [0, rank].
  OpTester("Shape", 15).Attr("start", int64_t{-10}).Attr("end", int64_t{10})
      .Input<float>("x", {2, 3, 4}, Iota(24)).Output<int64_t>("y", {3}, {2, 3, 4}).Run();
}

TEST(ShapeConstantOfShapeTest, DefaultAndValue) {
  OpTester("ConstantOfShape", 9).Input<int64_t>("shape", {2}, {2, 3})
      .Output<float>("y", {2, 3}, std::vector<float>(6, 0.f)).Run();
  OpTester("ConstantOfShape", 20)
      .Attr("value", Attribute::TensorValue(Tensor::FromVector<int64_t>({7}, {1})))
      .Input<int64_t>("shape", {3}, {1, 2, 2})
      .Output<int64_t>("y", {1, 2, 2}, std::vector<int64_t>(4, 7)).Run();
  // An empty shape makes a scalar.
  OpTester("ConstantOfShape", 9)
      .Attr("value", Attribute::TensorValue(Tensor::FromVector<float>({1.5f}, {1})))
      .Input<int64_t>("shape", {0}, {})
      .Output<float>("y", {}, {1.5f}).Run();
}

TEST(ShapeRangeTest, FloatAndIntCounts) {
  // ceil((2 - 1) / 0.3) = ceil(3.33) = 4 elements: 1 + i * 0.3.
  OpTester("Range", 11).Input<float>("start", {}, {1.f}).Input<float>("limit", {}, {2.f})
      .Input<float>("delta", {}, {0.3f})
      .Output<float>("y", {4}, {1.f, 1.3f, 1.6f, 1.9f}).Run();
  // ceil((4 - 10) / -3) = 2: 10, 7.
  OpTester("Range", 11).Input<int32_t>("start", {}, {10}).Input<int32_t>("limit", {}, {4})
      .Input<int32_t>("delta", {}, {-3})
      .Output<int32_t>("y", {2}, {10, 7}).Run();
  // A range pointing the wrong way is empty.
  OpTester("Range", 11).Input<int64_t>("start", {}, {5}).Input<int64_t>("limit", {}, {1})
      .Input<int64_t>("delta", {}, {1})
      .Output<int64_t>("y", {0}, {}).Run();
  OpTester("Range", 11).Input<double>("start", {}, {0.0}).Input<double>("limit", {}, {1.0})
      .Input<double>("delta", {}, {0.25})
      .Output<double>("y", {4}, {0.0, 0.25, 0.5, 0.75}).Run();
}

TEST(ShapeConstantTest, EveryAttributeForm) {
  OpTester("Constant", 13)
      .Attr("value", Attribute::TensorValue(Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2})))
      .Output<int32_t>("y", {2, 2}, {1, 2, 3, 4}).Run();
  OpTester("Constant", 13).Attr("value_float", 2.5f).Output<float>("y", {}, {2.5f}).Run();
  OpTester("Constant", 13).Attr("value_floats", Attribute::Floats({1.f, -2.f}))
      .Output<float>("y", {2}, {1.f, -2.f}).Run();
  OpTester("Constant", 13).Attr("value_int", int64_t{-7}).Output<int64_t>("y", {}, {-7}).Run();
  OpTester("Constant", 13).Attr("value_ints", I64{4, 5, 6})
      .Output<int64_t>("y", {3}, {4, 5, 6}).Run();
}

TEST(ShapeConstantTest, StringFormIsNotSupported) {
  OpTester("Constant", 13).Attr("value_string", std::string("hi"))
      .UncheckedOutput("y").ExpectFailure("string Constants are not supported").Run();
}

// GatherElements reads one element per index (torch.gather); ScatterElements writes or combines
// one per index, duplicates combined in order; a bad index is an error naming it, and nothing
// is written.
TEST(ElementIndexing, GatherAndScatterElements) {
  OpTester("GatherElements", 13).Attr("axis", int64_t{1})
      .Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("i", {2, 2}, {2, -3, 1, 1})
      .Output<float>("y", {2, 2}, {3, 1, 5, 5}).Run();
  OpTester("GatherElements", 13).Input<int64_t>("x", {2, 2}, {7, 8, 9, 10}).Input<int32_t>("i", {1, 2}, {1, 0})
      .Output<int64_t>("y", {1, 2}, {9, 8}).Run();
  OpTester("GatherElements", 13).Input<float>("x", {2, 2}, {1, 2, 3, 4}).Input<int64_t>("i", {1, 2}, {0, 2})
      .UncheckedOutput("y").ExpectFailure("index 2 at position 1 is outside [-2, 2)").Run();
  OpTester("GatherElements", 13).Input<float>("x", {2, 2}, {1, 2, 3, 4}).Input<int64_t>("i", {1, 3}, {0, 0, 0})
      .UncheckedOutput("y").ExpectFailure("exceed the data").Run();
  OpTester("ScatterElements", 18).Attr("axis", int64_t{1}).Attr("reduction", std::string("add"))
      .Input<float>("x", {2, 3}, {1, 1, 1, 1, 1, 1}).Input<int64_t>("i", {2, 2}, {0, 0, 2, -1})
      .Input<float>("u", {2, 2}, {5, 6, 7, 8}).Output<float>("y", {2, 3}, {12, 1, 1, 1, 1, 16}).Run();
  OpTester("ScatterElements", 18).Attr("reduction", std::string("max"))
      .Input<int32_t>("x", {3}, {4, 4, 4}).Input<int64_t>("i", {3}, {1, 1, 2}).Input<int32_t>("u", {3}, {9, 2, 1})
      .Output<int32_t>("y", {3}, {4, 9, 4}).Run();
  OpTester("ScatterElements", 18).Attr("reduction", std::string("mul"))
      .Input<double>("x", {2}, {2, 3}).Input<int64_t>("i", {2}, {0, 0}).Input<double>("u", {2}, {5, 7})
      .Output<double>("y", {2}, {70, 3}).Run();
  OpTester("ScatterElements", 13).Input<float>("x", {3}, {0, 0, 0}).Input<int64_t>("i", {2}, {0, 3})
      .Input<float>("u", {2}, {1, 2}).UncheckedOutput("y").ExpectFailure("index 3 at position 1").Run();
  OpTester("ScatterElements", 18).Attr("reduction", std::string("avg"))
      .Input<float>("x", {3}, {0, 0, 0}).Input<int64_t>("i", {1}, {0}).Input<float>("u", {1}, {1})
      .UncheckedOutput("y").ExpectFailure("expected reduction none, add, mul, max or min").Run();
  OpTester("ScatterElements", 13).Input<float>("x", {3}, {0, 0, 0}).Input<int64_t>("i", {2}, {0, 1})
      .Input<float>("u", {1}, {1}).UncheckedOutput("y").ExpectFailure("expected updates of the indices' shape").Run();
}

// GatherND and ScatterND: tuples addressing elements or whole slices, negative coordinates,
// batch_dims, reductions combining repeated tuples in order, and the errors naming the tuple.
TEST(NdIndexing, GatherAndScatterNd) {
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7};  // [2, 2, 2]
  OpTester("GatherND", 13).Input<float>("x", {2, 2, 2}, x).Input<int64_t>("i", {2, 3}, {0, 1, 1, -1, 0, 0})
      .Output<float>("y", {2}, {3, 4}).Run();
  OpTester("GatherND", 13).Input<float>("x", {2, 2, 2}, x).Input<int64_t>("i", {3, 1}, {1, 0, 1})
      .Output<float>("y", {3, 2, 2}, {4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}).Run();
  // batch_dims 1: each batch's own rows (a sequence model's last token per sequence).
  OpTester("GatherND", 13).Attr("batch_dims", int64_t{1}).Input<float>("x", {2, 2, 2}, x)
      .Input<int64_t>("i", {2, 1}, {1, 0}).Output<float>("y", {2, 2}, {2, 3, 4, 5}).Run();
  OpTester("GatherND", 13).Input<float>("x", {2, 2, 2}, x).Input<int64_t>("i", {2, 2}, {0, 1, 1, 2})
      .UncheckedOutput("y").ExpectFailure("index 2 (coordinate 1 of tuple 1) is outside [-2, 2)").Run();
  OpTester("GatherND", 13).Input<float>("x", {2, 2}, {1, 2, 3, 4}).Input<int64_t>("i", {1, 3}, {0, 0, 0})
      .UncheckedOutput("y").ExpectFailure("the indices' last dim is 3; expected 1 to 2 coordinates").Run();
  OpTester("ScatterND", 16).Input<float>("x", {4}, {1, 1, 1, 1}).Input<int64_t>("i", {2, 1}, {3, -3})
      .Input<float>("u", {2}, {9, 8}).Output<float>("y", {4}, {1, 8, 1, 9}).Run();
  OpTester("ScatterND", 16).Attr("reduction", std::string("add")).Input<float>("x", {2, 2}, {1, 1, 1, 1})
      .Input<int64_t>("i", {3, 1}, {1, 1, 0}).Input<float>("u", {3, 2}, {1, 2, 3, 4, 5, 6})
      .Output<float>("y", {2, 2}, {6, 7, 5, 7}).Run();
  OpTester("ScatterND", 18).Attr("reduction", std::string("max")).Input<int64_t>("x", {3}, {4, 4, 4})
      .Input<int64_t>("i", {3, 1}, {1, 1, 2}).Input<int64_t>("u", {3}, {9, 2, 1})
      .Output<int64_t>("y", {3}, {4, 9, 4}).Run();
  OpTester("ScatterND", 16).Input<float>("x", {4}, {0, 0, 0, 0}).Input<int64_t>("i", {2, 1}, {0, 1})
      .Input<float>("u", {3}, {1, 2, 3}).UncheckedOutput("y").ExpectFailure("expected updates [2]").Run();
  OpTester("ScatterND", 16).Input<float>("x", {4}, {0, 0, 0, 0}).Input<int64_t>("i", {2, 1}, {0, 4})
      .Input<float>("u", {2}, {1, 2}).UncheckedOutput("y").ExpectFailure("index 4 (coordinate 0 of tuple 1)").Run();
}

// Pad in every mode (reflect does not repeat the edge; wrap starts over), cropping with a
// negative pad, padding named axes; Tile, zero repeats included; and their bad inputs.
TEST(PadAndTile, ModesCropsAxesAndErrors) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // [2, 3]
  OpTester("Pad", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("p", {4}, {0, 1, 0, 2})
      .Input<float>("v", {}, {9}).Output<float>("y", {2, 6}, {9, 1, 2, 3, 9, 9, 9, 4, 5, 6, 9, 9}).Run();
  OpTester("Pad", 13).Attr("mode", std::string("reflect")).Input<float>("x", {2, 3}, x)
      .Input<int64_t>("p", {4}, {0, 2, 0, 2}).Output<float>("y", {2, 7}, {3, 2, 1, 2, 3, 2, 1, 6, 5, 4, 5, 6, 5, 4}).Run();
  OpTester("Pad", 13).Attr("mode", std::string("edge")).Input<float>("x", {2, 3}, x)
      .Input<int64_t>("p", {4}, {1, 1, 0, 0}).Output<float>("y", {3, 4}, {1, 1, 2, 3, 1, 1, 2, 3, 4, 4, 5, 6}).Run();
  OpTester("Pad", 19).Attr("mode", std::string("wrap")).Input<float>("x", {2, 3}, x)
      .Input<int64_t>("p", {4}, {1, 0, 0, 4}).Output<float>("y", {3, 7}, {4, 5, 6, 4, 5, 6, 4, 1, 2, 3, 1, 2, 3, 1,
                                                                         4, 5, 6, 4, 5, 6, 4}).Run();
  OpTester("Pad", 18).Input<int32_t>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("p", {2}, {-1, 1})
      .OmittedInput().Input<int64_t>("axes", {1}, {-1}).Output<int32_t>("y", {2, 3}, {2, 3, 0, 5, 6, 0}).Run();
  OpTester("Pad", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("p", {2}, {1, 1})
      .UncheckedOutput("y").ExpectFailure("expected 4 pads").Run();
  OpTester("Pad", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("p", {4}, {0, -4, 0, 0})
      .UncheckedOutput("y").ExpectFailure("below 0").Run();
  OpTester("Pad", 13).Attr("mode", std::string("wrap")).Input<float>("x", {2, 3}, x)
      .Input<int64_t>("p", {4}, {0, 1, 0, 0}).UncheckedOutput("y").ExpectFailure("expected mode constant, reflect, edge").Run();
  OpTester("Pad", 13).Input<float>("x", {}, {3}).Input<int64_t>("p", {0}, {}).Output<float>("y", {}, {3}).Run();
  OpTester("Tile", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("r", {2}, {2, 1})
      .Output<float>("y", {4, 3}, {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6}).Run();
  OpTester("Tile", 13).Input<int64_t>("x", {1, 2}, {7, 8}).Input<int64_t>("r", {2}, {2, 3})
      .Output<int64_t>("y", {2, 6}, {7, 8, 7, 8, 7, 8, 7, 8, 7, 8, 7, 8}).Run();
  OpTester("Tile", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("r", {2}, {0, 2})
      .Output<float>("y", {0, 6}, {}).Run();
  OpTester("Tile", 13).Input<float>("x", {2, 3}, x).Input<int64_t>("r", {1}, {2})
      .UncheckedOutput("y").ExpectFailure("expected 2 repeats").Run();
}

// NonZero lists coordinates in row-major order; a float's -0 counts as zero, a bfloat16's too.
// Compress keeps the slices whose condition is true, a short condition leaving the rest out.
TEST(Selection, NonZeroAndCompress) {
  OpTester("NonZero", 13)
      .Input<float>("x", {2, 3}, {0.f, 2.f, -0.f, 1.f, 0.f, -3.f})
      .Output<int64_t>("y", {2, 3}, {0, 1, 1, 1, 0, 2})
      .Run();
  Tensor h(DataType::kBFloat16, {4});
  for (int i = 0; i < 4; ++i) h.data<uint16_t>()[i] = FloatToBFloat16(std::vector<float>{-0.f, 0.5f, 0.f, -2.f}[i]);
  OpTester("NonZero", 13).InputTensor("x", h).Output<int64_t>("y", {1, 2}, {1, 3}).Run();
  OpTester("NonZero", 13).Input<bool>("x", {2, 2}, {false, false, false, false}).Output<int64_t>("y", {2, 0}, {}).Run();
  const std::vector<int32_t> x = {1, 2, 3, 4, 5, 6};
  OpTester("Compress", 11).Attr("axis", int64_t{-1})
      .Input<int32_t>("x", {2, 3}, x).Input<bool>("c", {2}, {false, true})
      .Output<int32_t>("y", {2, 1}, {2, 5}).Run();
  OpTester("Compress", 11)
      .Input<int32_t>("x", {2, 3}, x).Input<bool>("c", {6}, {true, false, false, true, true, false})
      .Output<int32_t>("y", {3}, {1, 4, 5}).Run();
  OpTester("Compress", 11).Attr("axis", int64_t{0})
      .Input<int32_t>("x", {2, 3}, x).Input<bool>("c", {3}, {false, true, true})
      .UncheckedOutput("y").ExpectFailure("condition is true at 2, past the 2 slices along axis 0").Run();
}

// NonMaxSuppression beyond the ONNX backend suite's cases: a NaN score never ranks, equal scores
// keep the lower index first, boxes with no area suppress nothing, and mismatched scores are
// refused naming what was expected.
TEST(Selection, NonMaxSuppressionTiesNaNAndEmptyBoxes) {
  OpTester("NonMaxSuppression", 11)
      .Input<float>("boxes", {1, 4, 4}, {0, 0, 1, 1, 0, 0, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f, 0, 0.1f, 1, 1.1f})
      .Input<float>("scores", {1, 1, 4}, {0.5f, 0.5f, 0.9f, NAN})
      .Input<int64_t>("max", {1}, {10})
      .Input<float>("iou", {1}, {0.5f})
      .Output<int64_t>("selected", {2, 3}, {0, 0, 2, 0, 0, 0})
      .Run();
  OpTester("NonMaxSuppression", 11)
      .Input<float>("boxes", {1, 3, 4}, std::vector<float>(12, 0.f))
      .Input<float>("scores", {1, 2, 2}, std::vector<float>(4, 0.f))
      .UncheckedOutput("selected")
      .ExpectFailure("expected scores [1, classes, 3] for boxes [1,3,4], got [1,2,2]")
      .Run();
}

// Unique beyond the ONNX backend suite's cases: -0 and 0 are one value, NaNs sort last as one,
// and int64 slices along an axis in order of first occurrence.
TEST(Selection, UniqueZerosNaNAndInt64Slices) {
  OpTester("Unique", 11)
      .Input<float>("x", {6}, {NAN, 0.f, 2.f, -0.f, NAN, -1.f})
      .Output<float>("y", {4}, {-1.f, 0.f, 2.f, NAN})
      .Output<int64_t>("indices", {4}, {5, 1, 2, 0})
      .Output<int64_t>("inverse", {6}, {3, 1, 2, 1, 3, 0})
      .Output<int64_t>("counts", {4}, {1, 2, 1, 2})
      .Run();
  OpTester("Unique", 11)
      .Attr("axis", int64_t{1})
      .Attr("sorted", int64_t{0})
      .Input<int64_t>("x", {2, 4}, {int64_t{1} << 60, 3, int64_t{1} << 60, 3, 5, 6, 5, 6})
      .Output<int64_t>("y", {2, 2}, {int64_t{1} << 60, 3, 5, 6})
      .Output<int64_t>("indices", {2}, {0, 1})
      .Output<int64_t>("inverse", {4}, {0, 1, 0, 1})
      .Output<int64_t>("counts", {2}, {2, 2})
      .Run();
}

// Det over a batch: a matrix whose first pivot is zero (a row swap flips the sign), a singular
// one, and a 1 x 1; a non-square input is refused.
TEST(Linalg, DetPivotsAndBatches) {
  OpTester("Det", 11)
      .Input<double>("x", {3, 2, 2}, {0, 2, 3, 4, 1, 2, 2, 4, -5, 0, 0, 0.5})
      .Output<double>("y", {3}, {-6, 0, -2.5})
      .Run();
  OpTester("Det", 11)
      .Input<float>("x", {3, 3}, {2, -1, 0, -1, 2, -1, 0, -1, 2})
      .Output<float>("y", {}, {4})
      .Run();
  OpTester("Det", 11)
      .Input<float>("x", {2, 3}, std::vector<float>(6, 1.f))
      .UncheckedOutput("y")
      .ExpectFailure("expected square matrices [..., M, M]")
      .Run();
}

}  // namespace
}  // namespace cleave::testing
