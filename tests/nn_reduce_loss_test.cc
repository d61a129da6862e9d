// Op tests for reductions, SoftmaxCrossEntropyLoss, Dropout and Trilu, and shape-inference
// tests for the neural-network ops (tests/). Expected values are worked out by hand (noted
// beside them) or computed by naive loops written here from the ONNX definitions.
#include <cmath>
#include <limits>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "tests/nn_test_util.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

// ---- Reduce* -------------------------------------------------------------------------------

// Reduces x over `axes` (normalised) by op; returns the keepdims=1 dims in *kept_dims.
std::vector<double> NaiveReduce(const std::vector<double>& x, const I64& dims,
                                const std::set<int>& axes, const std::string& op, I64* kept_dims) {
  I64 od = dims;
  for (int a : axes) od[a] = 1;
  const int64_t on = Numel(od);
  const bool is_max = op == "ReduceMax", is_min = op == "ReduceMin", is_prod = op == "ReduceProd";
  std::vector<double> acc(on, is_max ? -INFINITY : is_min ? INFINITY : is_prod ? 1.0 : 0.0);
  std::vector<int64_t> count(on, 0);
  I64 idx(dims.size());
  for (int64_t i = 0; i < Numel(dims); ++i) {
    int64_t rest = i, o = 0;
    for (int k = static_cast<int>(dims.size()) - 1; k >= 0; --k) idx[k] = rest % dims[k], rest /= dims[k];
    for (size_t k = 0; k < dims.size(); ++k) o = o * od[k] + (axes.count(k) ? 0 : idx[k]);
    acc[o] = is_max ? std::max(acc[o], x[i]) : is_min ? std::min(acc[o], x[i]) : is_prod ? acc[o] * x[i] : acc[o] + x[i];
    ++count[o];
  }
  if (op == "ReduceMean")
    for (int64_t o = 0; o < on; ++o) acc[o] /= count[o];
  *kept_dims = od;
  return acc;
}

struct ReduceCase {
  std::string op;
  int opset;
  I64 dims;
  I64 axes;  // as given to the op (may be negative); empty: reduce all
  bool keepdims;
};
void PrintTo(const ReduceCase& c, std::ostream* os) {
  *os << c.op << "-" << c.opset << " X" << c.dims << " axes" << c.axes << " keepdims " << c.keepdims;
}

class NnReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(NnReduceTest, AllDtypesMatchNaive) {
  const ReduceCase& c = GetParam();
  const bool axes_input = c.opset >= (c.op == "ReduceSum" ? 13 : 18);
  std::set<int> axes;
  for (int64_t a : c.axes) axes.insert(static_cast<int>(a < 0 ? a + c.dims.size() : a));
  if (c.axes.empty())
    for (size_t k = 0; k < c.dims.size(); ++k) axes.insert(k);
  I64 od;
  for (int dtype = 0; dtype < 4; ++dtype) {
    const bool integral = dtype >= 2;
    std::vector<double> x = integral ? Ints(Numel(c.dims), 51) : Values(Numel(c.dims), 52);
    std::vector<double> y = NaiveReduce(x, c.dims, axes, c.op, &od);
    if (integral && c.op == "ReduceMean")
      for (double& v : y) v = std::trunc(v);  // numpy's mean cast back to int truncates
    if (!c.keepdims) {
      I64 dropped;
      for (size_t k = 0; k < c.dims.size(); ++k)
        if (!axes.count(k)) dropped.push_back(c.dims[k]);
      od = dropped;
    }
    OpTester t(c.op, c.opset);
    t.Attr("keepdims", int64_t{c.keepdims});
    if (!axes_input && !c.axes.empty()) t.Attr("axes", c.axes);
    if (dtype == 0) t.Input<float>("X", c.dims, Cast<float>(x));
    if (dtype == 1) t.Input<double>("X", c.dims, x);
    if (dtype == 2) t.Input<int32_t>("X", c.dims, Cast<int32_t>(x));
    if (dtype == 3) t.Input<int64_t>("X", c.dims, Cast<int64_t>(x));
    if (axes_input && !c.axes.empty()) t.Input<int64_t>("axes", {static_cast<int64_t>(c.axes.size())}, c.axes);
    if (dtype == 0) t.Output<float>("Y", od, Cast<float>(y));
    if (dtype == 1) t.Output<double>("Y", od, y).Tolerance(1e-12, 1e-12);
    if (dtype == 2) t.Output<int32_t>("Y", od, Cast<int32_t>(y));
    if (dtype == 3) t.Output<int64_t>("Y", od, Cast<int64_t>(y));
    SCOPED_TRACE(::testing::Message() << "dtype case " << dtype);
    t.Run();
  }
}

INSTANTIATE_TEST_SUITE_P(
    NnCases, NnReduceTest,
    ::testing::Values(ReduceCase{"ReduceSum", 13, {2, 3, 4}, {1}, false},     // axes input
                      ReduceCase{"ReduceSum", 11, {2, 3, 4}, {-1}, true},     // axes attribute
                      ReduceCase{"ReduceSum", 13, {3, 4}, {}, true},          // no axes: all
                      ReduceCase{"ReduceSum", 13, {600, 300}, {0}, false},    // column blocks
                      ReduceCase{"ReduceMean", 18, {3, 4, 5}, {0, 1}, true},  // leading axes
                      ReduceCase{"ReduceMean", 13, {2, 3, 4}, {1}, false},    // middle axis
                      ReduceCase{"ReduceMean", 18, {4, 1000}, {-1}, true},    // long rows
                      ReduceCase{"ReduceMax", 18, {2, 3, 4, 5}, {0, 2}, false},  // alternating
                      ReduceCase{"ReduceMax", 20, {2, 1, 3}, {1, 2}, true},   // size-1 axis
                      ReduceCase{"ReduceMin", 13, {4, 5, 6}, {-2}, true},
                      ReduceCase{"ReduceMin", 1, {3, 4}, {}, false},
                      // Products of at most 12 integers in [-4, 4] stay within int32.
                      ReduceCase{"ReduceProd", 18, {2, 3, 4}, {1}, false},
                      ReduceCase{"ReduceProd", 13, {3, 4, 5}, {0, 1}, true},  // axes attribute
                      ReduceCase{"ReduceProd", 18, {6, 300}, {0}, false},     // column blocks
                      ReduceCase{"ReduceProd", 11, {2, 3}, {}, true}));

// An integer product wraps as numpy's does (modulo 2^32 for int32); an empty one is 1.
TEST(NnReduceTest, ProductsWrapAndAnEmptyProductIsOne) {
  OpTester("ReduceProd", 18)
      .Input<int32_t>("X", {2, 2}, {65536, 65536, 65537, 65537})
      .Input<int64_t>("axes", {1}, {1})
      .Output<int32_t>("Y", {2, 1}, {0, 131073})  // 2^32 wraps to 0; (2^16 + 1)^2 to 2^17 + 1
      .Run();
  OpTester("ReduceProd", 18)
      .Input<float>("X", {2, 0, 3}, {})
      .Input<int64_t>("axes", {1}, {1})
      .Attr("keepdims", int64_t{0})
      .Output<float>("Y", {2, 3}, {1, 1, 1, 1, 1, 1})
      .Run();
}

TEST(NnReduceTest, NoopWithEmptyAxesIsIdentity) {
  OpTester("ReduceSum", 13).Attr("noop_with_empty_axes", int64_t{1})
      .Input<float>("X", {2, 2}, {1, 2, 3, 4}).Output<float>("Y", {2, 2}, {1, 2, 3, 4}).Run();
  // An empty axes tensor counts as no axes.
  OpTester("ReduceMean", 18).Attr("noop_with_empty_axes", int64_t{1})
      .Input<float>("X", {2, 2}, {1, 2, 3, 4}).Input<int64_t>("axes", {0}, {})
      .Output<float>("Y", {2, 2}, {1, 2, 3, 4}).Run();
}

TEST(NnReduceTest, ConstantAxesInputAndEmptySets) {
  // [[1,2],[3,4]] summed over axis 0 -> [4, 6], axes known at load.
  OpTester("ReduceSum", 13).Attr("keepdims", int64_t{0}).Input<float>("X", {2, 2}, {1, 2, 3, 4})
      .Input<int64_t>("axes", {1}, {0}).AsInitializer().Output<float>("Y", {2}, {4, 6}).Run();
  const float inf = std::numeric_limits<float>::infinity();
  auto empty = [](const std::string& op, float want) {
    OpTester(op, 18).Input<float>("X", {2, 0, 3}, {}).Input<int64_t>("axes", {1}, {1})
        .Output<float>("Y", {2, 1, 3}, std::vector<float>(6, want)).Run();
  };
  empty("ReduceMax", -inf);
  empty("ReduceMin", inf);
  empty("ReduceMean", NAN);
  OpTester("ReduceSum", 13).Input<float>("X", {2, 0, 3}, {}).Input<int64_t>("axes", {1}, {1})
      .Output<float>("Y", {2, 1, 3}, std::vector<float>(6, 0.f)).Run();
  // A non-reduced zero dim gives an empty output.
  OpTester("ReduceSum", 13).Input<float>("X", {2, 0, 3}, {}).Input<int64_t>("axes", {1}, {2})
      .Output<float>("Y", {2, 0, 1}, {}).Run();
}

TEST(NnReduceTest, BoolMaxIsAnyAndMinIsAll) {
  const std::vector<bool> x = {true, false, false, false, true, true};
  auto run = [&](const std::string& op, std::vector<bool> want) {
    OpTester t(op, 20);
    t.InputTensor("X", Tensor::FromVector<bool>(x, {3, 2}));
    t.Input<int64_t>("axes", {1}, {1}).Attr("keepdims", int64_t{0});
    t.OutputTensor("Y", Tensor::FromVector<bool>(want, {3})).Run();
  };
  run("ReduceMax", {true, false, true});
  run("ReduceMin", {false, false, true});
}

TEST(NnReduceTest, BadAxesFail) {
  OpTester("ReduceSum", 13).Input<float>("X", {2, 2}, {1, 2, 3, 4})
      .Input<int64_t>("axes", {2}, {1, -1}).UncheckedOutput("Y").ExpectFailure("more than once").Run();
  OpTester("ReduceMean", 13).Attr("axes", I64{2}).Input<float>("X", {2, 2}, {1, 2, 3, 4})
      .UncheckedOutput("Y").ExpectFailure("out of range").Run();
  OpTester("ReduceMean", 13).Input<float>("X", {2, 2}, {1, 2, 3, 4})
      .Input<int64_t>("axes", {1}, {1}).UncheckedOutput("Y").ExpectFailure("second input").Run();
}

// ---- ArgMax, ArgMin, CumSum -----------------------------------------------------------------

TEST(NnArgExtremeTest, TiesNanAndTheLastIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Ties: the first index, or the last with select_last_index.
  OpTester("ArgMax", 13).Attr("axis", int64_t{1}).Input<float>("x", {2, 4}, {1, 3, 3, 0, 5, 5, 5, -1})
      .Output<int64_t>("y", {2, 1}, {1, 0}).Run();
  OpTester("ArgMax", 13).Attr("axis", int64_t{1}).Attr("select_last_index", int64_t{1})
      .Input<float>("x", {2, 4}, {1, 3, 3, 0, 5, 5, 5, -1}).Output<int64_t>("y", {2, 1}, {2, 2}).Run();
  // A NaN is the extreme for both, as numpy's argmax and argmin take it.
  OpTester("ArgMax", 13).Attr("keepdims", int64_t{0}).Input<float>("x", {4}, {1, nan, 7, nan})
      .Output<int64_t>("y", {}, {1}).Run();
  OpTester("ArgMin", 13).Attr("keepdims", int64_t{0}).Attr("select_last_index", int64_t{1})
      .Input<float>("x", {4}, {1, nan, -7, nan}).Output<int64_t>("y", {}, {3}).Run();
  // Integers, over axis 0 with a negative axis naming it.
  OpTester("ArgMin", 13).Attr("axis", int64_t{-2}).Input<int32_t>("x", {3, 2}, {4, -1, 2, 6, 9, -5})
      .Output<int64_t>("y", {1, 2}, {1, 2}).Run();
  OpTester("ArgMax", 13).Attr("axis", int64_t{2}).Input<float>("x", {2, 2}, {1, 2, 3, 4})
      .UncheckedOutput("y").ExpectFailure("out of range").Run();
  OpTester("ArgMax", 13).Attr("axis", int64_t{1}).Input<float>("x", {2, 0}, {})
      .UncheckedOutput("y").ExpectFailure("no index to take").Run();
}

// TopK: the largest (or smallest) k along the axis, sorted, equal values by the lower index;
// NaN above every number (first when largest, last when smallest), as PyTorch's topk.
TEST(NnTopKTest, OrderTiesNanAxesAndVersions) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {3, 1, 3, 5, 1, 2, 2, 2, 2, 2};
  OpTester("TopK", 11).Input<float>("x", {2, 5}, x).Input<int64_t>("k", {1}, {3})
      .Output<float>("values", {2, 3}, {5, 3, 3, 2, 2, 2}).Output<int64_t>("indices", {2, 3}, {3, 0, 2, 0, 1, 2}).Run();
  OpTester("TopK", 11).Attr("largest", int64_t{0}).Input<float>("x", {2, 5}, x).Input<int64_t>("k", {1}, {3})
      .Output<float>("values", {2, 3}, {1, 1, 3, 2, 2, 2}).Output<int64_t>("indices", {2, 3}, {1, 4, 0, 0, 1, 2}).Run();
  OpTester("TopK", 11).Input<float>("x", {5}, {1, nan, 7, nan, -2}).Input<int64_t>("k", {1}, {3})
      .UncheckedOutput("values").Output<int64_t>("indices", {3}, {1, 3, 2}).Run();
  OpTester("TopK", 11).Attr("largest", int64_t{0}).Input<float>("x", {5}, {1, nan, 7, nan, -2})
      .Input<int64_t>("k", {1}, {4}).UncheckedOutput("values").Output<int64_t>("indices", {4}, {4, 0, 2, 1}).Run();
  // Along axis 0 (each column its own line), integers, and TopK 1's attribute k.
  OpTester("TopK", 10).Attr("axis", int64_t{0}).Input<int64_t>("x", {3, 2}, {4, -1, 2, 6, 9, -5})
      .Input<int64_t>("k", {1}, {2})
      .Output<int64_t>("values", {2, 2}, {9, 6, 4, -1}).Output<int64_t>("indices", {2, 2}, {2, 1, 0, 0}).Run();
  OpTester("TopK", 1).Attr("k", int64_t{1}).Input<float>("x", {2, 3}, {0, 2, 1, 7, 8, 9})
      .Output<float>("values", {2, 1}, {2, 9}).Output<int64_t>("indices", {2, 1}, {1, 2}).Run();
  // bf16 values are ordered by their value and copied as they are.
  Tensor h(DataType::kBFloat16, {4});
  const float hv[] = {0.5f, -3.f, 2.25f, 2.f};
  for (int i = 0; i < 4; ++i) h.data<uint16_t>()[i] = FloatToBFloat16(hv[i]);
  Tensor hw(DataType::kBFloat16, {2});
  hw.data<uint16_t>()[0] = FloatToBFloat16(2.25f);
  hw.data<uint16_t>()[1] = FloatToBFloat16(2.f);
  OpTester("TopK", 11).InputTensor("x", h).Input<int64_t>("k", {1}, {2}).OutputTensor("values", hw)
      .Output<int64_t>("indices", {2}, {2, 3}).Run();
  // k = 0 gives empty outputs; a k past the axis is refused with both numbers.
  OpTester("TopK", 11).Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("k", {1}, {0})
      .Output<float>("values", {2, 0}, {}).Output<int64_t>("indices", {2, 0}, {}).Run();
  OpTester("TopK", 11).Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("k", {1}, {4})
      .UncheckedOutput("values").UncheckedOutput("indices")
      .ExpectFailure("k is 4; expected 0 <= k <= 3 (axis 1 of [2,3])").Run();
  OpTester("TopK", 11).Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("k", {1}, {4}).AsInitializer()
      .UncheckedOutput("values").UncheckedOutput("indices")
      .ExpectFailure("k is 4, more than the 3 elements along axis 1 of [2,3]").Run();
  OpTester("TopK", 11).Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("k", {2}, {1, 2})
      .UncheckedOutput("values").UncheckedOutput("indices").ExpectFailure("expected K of shape [1]").Run();
}

TEST(NnCumSumTest, ExclusiveReverseIntegersAndBadAxes) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  OpTester("CumSum", 14).Input<float>("x", {2, 3}, x).Input<int64_t>("axis", {}, {1})
      .Output<float>("y", {2, 3}, {1, 3, 6, 4, 9, 15}).Run();
  OpTester("CumSum", 14).Attr("exclusive", int64_t{1}).Input<float>("x", {2, 3}, x).Input<int32_t>("axis", {}, {1})
      .Output<float>("y", {2, 3}, {0, 1, 3, 0, 4, 9}).Run();
  OpTester("CumSum", 14).Attr("reverse", int64_t{1}).Input<float>("x", {2, 3}, x).Input<int64_t>("axis", {1}, {0})
      .Output<float>("y", {2, 3}, {5, 7, 9, 4, 5, 6}).Run();
  OpTester("CumSum", 14).Attr("reverse", int64_t{1}).Attr("exclusive", int64_t{1})
      .Input<int64_t>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<int64_t>("axis", {}, {-1})
      .Output<int64_t>("y", {2, 3}, {5, 3, 0, 11, 6, 0}).Run();
  OpTester("CumSum", 14).Input<float>("x", {2, 3}, x).Input<int64_t>("axis", {}, {2})
      .UncheckedOutput("y").ExpectFailure("out of range").Run();
  OpTester("CumSum", 14).Input<float>("x", {2, 3}, x).Input<int64_t>("axis", {2}, {0, 1})
      .UncheckedOutput("y").ExpectFailure("one-element axis").Run();
}

// ---- SoftmaxCrossEntropyLoss ------------------------------------------------------------------

struct SceCase {
  I64 dims;  // scores [N, C, d...]
  std::string reduction;
  bool weights;
  std::optional<int64_t> ignore_index;
};
void PrintTo(const SceCase& c, std::ostream* os) {
  *os << "scores" << c.dims << " " << c.reduction << (c.weights ? " weighted" : "")
      << (c.ignore_index ? " ignore_index " + std::to_string(*c.ignore_index) : std::string());
}

// The reference loop of onnx/reference/ops/op_softmax_cross_entropy_loss.py.
std::vector<double> NaiveSce(const SceCase& c, const std::vector<double>& x, const std::vector<double>& labels,
                             const std::vector<double>& w, std::vector<double>* log_prob) {
  const int64_t N = c.dims[0], C = c.dims[1], D = Numel(c.dims) / (N * C);
  log_prob->assign(x.size(), 0);
  std::vector<double> loss(N * D), gw(N * D, 1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      double mx = -INFINITY, s = 0;
      for (int64_t k = 0; k < C; ++k) mx = std::max(mx, x[(n * C + k) * D + d]);
      for (int64_t k = 0; k < C; ++k) s += std::exp(x[(n * C + k) * D + d] - mx);
      for (int64_t k = 0; k < C; ++k) (*log_prob)[(n * C + k) * D + d] = x[(n * C + k) * D + d] - mx - std::log(s);
      const int64_t l = static_cast<int64_t>(labels[n * D + d]);
      const bool ignored = c.ignore_index && l == *c.ignore_index;
      gw[n * D + d] = ignored ? 0 : (c.weights ? w[l] : 1);
      loss[n * D + d] = ignored ? 0 : -(*log_prob)[(n * C + l) * D + d] * gw[n * D + d];
    }
  if (c.reduction == "none") return loss;
  double total = 0, wsum = 0;
  for (int64_t i = 0; i < N * D; ++i) total += loss[i], wsum += gw[i];
  if (c.reduction == "mean") total /= (c.weights || c.ignore_index) ? wsum : N * D;
  return {total};
}

class NnSceTest : public ::testing::TestWithParam<SceCase> {};

TEST_P(NnSceTest, MatchesReferenceLoop) {
  const SceCase& c = GetParam();
  const int64_t N = c.dims[0], C = c.dims[1], D = Numel(c.dims) / (N * C);
  std::vector<double> x = Values(Numel(c.dims), 61), w = Values(C, 62), labels = Ints(N * D, 63);
  for (double& v : x) v *= 4;
  for (double& v : w) v += 1.5;
  for (double& l : labels) l = std::fabs(l) < C ? std::fabs(l) : C - 1;
  if (c.ignore_index) labels[1] = static_cast<double>(*c.ignore_index);
  I64 label_dims = c.dims;
  label_dims.erase(label_dims.begin() + 1);
  std::vector<double> log_prob;
  std::vector<double> loss = NaiveSce(c, x, labels, w, &log_prob);
  const I64 loss_dims = c.reduction == "none" ? label_dims : I64{};
  for (bool f64 : {false, true}) {
    OpTester t("SoftmaxCrossEntropyLoss", 13);
    t.Attr("reduction", c.reduction);
    if (c.ignore_index) t.Attr("ignore_index", *c.ignore_index);
    if (f64) t.Input<double>("scores", c.dims, x);
    else t.Input<float>("scores", c.dims, Cast<float>(x));
    if (f64) t.Input<int64_t>("labels", label_dims, Cast<int64_t>(labels));
    else t.Input<int32_t>("labels", label_dims, Cast<int32_t>(labels));
    if (c.weights) {
      if (f64) t.Input<double>("weights", {C}, w);
      else t.Input<float>("weights", {C}, Cast<float>(w));
    }
    if (f64) t.Output<double>("loss", loss_dims, loss).Output<double>("log_prob", c.dims, log_prob).Tolerance(1e-12, 1e-12);
    else t.Output<float>("loss", loss_dims, Cast<float>(loss)).Output<float>("log_prob", c.dims, Cast<float>(log_prob));
    SCOPED_TRACE(::testing::Message() << "f64 " << f64);
    t.Run();
  }
}

INSTANTIATE_TEST_SUITE_P(
    NnCases, NnSceTest,
    ::testing::Values(SceCase{{3, 5}, "mean", false, std::nullopt},
                      SceCase{{3, 5}, "mean", true, std::nullopt},
                      SceCase{{4, 5}, "mean", false, int64_t{2}},     // mean over 3 kept rows
                      SceCase{{4, 5}, "mean", true, int64_t{-1}},     // weights of kept rows
                      SceCase{{2, 3, 2}, "none", true, int64_t{-100}},
                      SceCase{{2, 4, 2, 3}, "sum", false, std::nullopt},
                      SceCase{{2, 300, 3}, "mean", true, int64_t{0}}));

TEST(NnSceTest, HandValueAndBadLabel) {
  // -log softmax([1,2,3])[2] = log(1 + e^-1 + e^-2) = 0.40760596.
  OpTester("SoftmaxCrossEntropyLoss", 13).Input<float>("scores", {1, 3}, {1, 2, 3})
      .Input<int64_t>("labels", {1}, {2}).Output<float>("loss", {}, {0.40760596f}).Run();
  OpTester("SoftmaxCrossEntropyLoss", 13).Input<float>("scores", {1, 3}, {1, 2, 3})
      .Input<int64_t>("labels", {1}, {3}).UncheckedOutput("loss").ExpectFailure("outside [0, 3)").Run();
}

// ---- Dropout --------------------------------------------------------------------------------

Tensor Bools(int64_t n, bool v) { return Tensor::FromVector<bool>(std::vector<bool>(n, v), {n}); }

TEST(NnDropoutTest, InferenceIsIdentity) {
  const std::vector<float> x = {1, -2, 3, -4};
  OpTester("Dropout", 13).Attr("seed", int64_t{1}).Input<float>("x", {4}, x)
      .Output<float>("y", {4}, x).OutputTensor("mask", Bools(4, true)).Run();
  OpTester("Dropout", 13).Input<float>("x", {4}, x).Input<float>("ratio", {}, {0.9f})
      .InputTensor("training_mode", Tensor::Scalar<bool>(false))
      .Output<float>("y", {4}, x).OutputTensor("mask", Bools(4, true)).Run();
  OpTester("Dropout", 22).Input<float>("x", {4}, x).Input<float>("ratio", {}, {0.f})
      .InputTensor("training_mode", Tensor::Scalar<bool>(true))
      .Output<float>("y", {4}, x).OutputTensor("mask", Bools(4, true)).Run();
}

TEST(NnDropoutTest, SeededMaskFollowsNumpyRandomState) {
  // numpy.random.RandomState(0).uniform(0, 1, 8) = [0.549, 0.715, 0.603, 0.545, 0.424,
  // 0.646, 0.438, 0.892]; with ratio 0.5 the 5th and 7th are dropped, the rest scaled by 2.
  const std::vector<bool> mask = {true, true, true, true, false, true, false, true};
  OpTester("Dropout", 13).Attr("seed", int64_t{0}).Input<float>("x", {8}, std::vector<float>(8, 1.5f))
      .Input<float>("ratio", {}, {0.5f}).InputTensor("training_mode", Tensor::Scalar<bool>(true))
      .Output<float>("y", {8}, {3, 3, 3, 3, 0, 3, 0, 3})
      .OutputTensor("mask", Tensor::FromVector<bool>(mask, {8})).Run();
}

TEST(NnDropoutTest, SeedDeterminesMaskAndStatisticsHold) {
  const int64_t n = 100000;
  const float ratio = 0.3f;
  std::vector<double> xd = Values(n, 71);
  const std::vector<float> x = Cast<float>(xd);
  auto run = [&](int64_t seed) {
    return OpTester("Dropout", 13).Attr("seed", seed).Input<float>("x", {n}, x)
        .Input<float>("ratio", {}, {ratio}).InputTensor("training_mode", Tensor::Scalar<bool>(true))
        .UncheckedOutput("y").UncheckedOutput("mask").Run();
  };
  std::vector<Tensor> a = run(7), b = run(7), c = run(8);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  int64_t kept = 0, differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool m = a[1].data<bool>()[i];
    kept += m;
    differ += m != c[1].data<bool>()[i];
    ASSERT_EQ(m, b[1].data<bool>()[i]) << "same seed, different mask at " << i;
    ASSERT_EQ(a[0].data<float>()[i], b[0].data<float>()[i]);
    const float want = m ? x[i] * (1.f / (1.f - ratio)) : 0.f;
    ASSERT_NEAR(a[0].data<float>()[i], want, 1e-6) << "element " << i;
  }
  // Kept fraction ~ Binomial(n, 0.7) / n: sd = sqrt(0.21 / n) = 0.0014, so +-0.01 is 7 sd.
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);
  EXPECT_GT(differ, n / 10) << "seeds 7 and 8 gave nearly the same mask";
}

TEST(NnDropoutTest, RatioOfOneFails) {
  OpTester("Dropout", 13).Input<float>("x", {2}, {1, 2}).Input<float>("ratio", {}, {1.f})
      .InputTensor("training_mode", Tensor::Scalar<bool>(true)).UncheckedOutput("y")
      .ExpectFailure("ratio in [0, 1)").Run();
}

// ---- Trilu ------------------------------------------------------------------------------------

TEST(NnTriluTest, HandValues) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [3, 4]
  auto run = [&](int64_t upper, std::optional<int64_t> k, std::vector<float> want) {
    OpTester t("Trilu", 14);
    t.Attr("upper", upper).Input<float>("x", {3, 4}, x);
    if (k) t.Input<int64_t>("k", {}, {*k});
    t.Output<float>("y", {3, 4}, want).Run();
  };
  run(1, std::nullopt, {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});  // keep j >= i
  run(1, 1, {0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12});              // keep j >= i + 1
  run(0, -1, {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});             // keep j <= i - 1
  run(0, 1, {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});            // keep j <= i + 1
  run(1, 10, std::vector<float>(12, 0.f));
  run(1, -10, x);
  run(0, -10, std::vector<float>(12, 0.f));
}

TEST(NnTriluTest, BatchedAndOtherDtypes) {
  const I64 dims = {2, 3, 3};
  std::vector<double> x = Ints(18, 81);
  for (int64_t k : {-1, 0, 2}) {
    for (int64_t upper : {0, 1}) {
      std::vector<double> y(18);
      std::vector<bool> xb(18), yb(18);
      for (int64_t i = 0; i < 18; ++i) {
        const int64_t r = (i / 3) % 3, c = i % 3;
        const bool keep = upper ? c - r >= k : c - r <= k;
        y[i] = keep ? x[i] : 0;
        xb[i] = x[i] != 0;
        yb[i] = keep && xb[i];
      }
      OpTester("Trilu", 14).Attr("upper", upper).Input<int64_t>("x", dims, Cast<int64_t>(x))
          .Input<int64_t>("k", {}, {k}).Output<int64_t>("y", dims, Cast<int64_t>(y)).Run();
      OpTester("Trilu", 14).Attr("upper", upper).InputTensor("x", Tensor::FromVector<bool>(xb, dims))
          .Input<int64_t>("k", {}, {k}).OutputTensor("y", Tensor::FromVector<bool>(yb, dims)).Run();
    }
  }
}

// ---- Shape inference ---------------------------------------------------------------------------

// Infers a one-node graph and returns output `out`'s shape as text, or the error message.
std::string InferOne(const std::string& op, int opset, std::vector<Shape> in_shapes,
                     std::vector<DataType> in_types,
                     std::vector<std::pair<std::string, graph::Attribute>> attrs = {},
                     int num_outputs = 1, int out = 0, const std::string& domain = "",
                     std::optional<std::pair<int, Tensor>> constant = std::nullopt) {
  graph::Graph g;
  g.opset_imports()[""] = domain.empty() ? opset : 17;
  if (!domain.empty()) g.opset_imports()[domain] = opset;
  std::vector<graph::Value*> ins, outs;
  for (size_t i = 0; i < in_shapes.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (constant && constant->first == static_cast<int>(i)) ins.push_back(g.AddInitializer(name, constant->second));
    else ins.push_back(g.AddInput(name, in_types[i], in_shapes[i]));
  }
  for (int i = 0; i < num_outputs; ++i) outs.push_back(g.GetOrCreateValue("out" + std::to_string(i)));
  graph::Node* n = g.AddNode(op, ins, outs, "n", domain);
  for (auto& [name, a] : attrs) n->SetAttr(name, a);
  absl::Status s = graph::InferShapes(g);
  if (!s.ok()) return std::string(s.message());
  return absl::StrCat(DataTypeName(n->output(out)->dtype()), n->output(out)->shape().ToString());
}

Shape S(std::vector<Dim> d) { return Shape(std::move(d)); }
const DataType kF = DataType::kFloat32;
const DataType kI = DataType::kInt64;

TEST(NnInferenceTest, MatMulFamily) {
  const Dim b = Dim::Symbol("batch"), t = Dim::Symbol("seq");
  EXPECT_EQ(InferOne("MatMul", 13, {S({b, t, 768}), S({768, 3072})}, {kF, kF}), "float32[batch,seq,3072]");
  EXPECT_EQ(InferOne("MatMul", 13, {S({b, 12, t, 64}), S({b, 12, 64, t})}, {kF, kF}),
            "float32[batch,12,seq,seq]");
  EXPECT_EQ(InferOne("MatMul", 13, {S({5}), S({3, 5, 2})}, {kF, kF}), "float32[3,2]");
  EXPECT_EQ(InferOne("MatMul", 13, {Shape(), S({5, 2})}, {kF, kF}), "float32?");
  EXPECT_NE(InferOne("MatMul", 13, {S({2, 3}), S({4, 2})}, {kF, kF}).find("K = 3"), std::string::npos);
  EXPECT_EQ(InferOne("Gemm", 13, {S({7, b}), S({9, 7})}, {kF, kF},
                     {{"transA", graph::Attribute::Int(1)}, {"transB", graph::Attribute::Int(1)}}),
            "float32[batch,9]");
  EXPECT_NE(InferOne("Gemm", 13, {S({2, 3}), S({3, 4}), S({3})}, {kF, kF, kF}).find("does not broadcast"),
            std::string::npos);
  EXPECT_EQ(InferOne("FusedMatMul", 1, {S({b, t, 8}), S({6, 8}), S({6})}, {kF, kF, kF},
                     {{"transB", graph::Attribute::Int(1)}}, 1, 0, "ai.cleave"),
            "float32[batch,seq,6]");
}

TEST(NnInferenceTest, NormalisationReductionAndLoss) {
  const Dim b = Dim::Symbol("batch");
  EXPECT_EQ(InferOne("LayerNormalization", 17, {S({b, 4, 8}), S({8})}, {kF, kF}, {}, 3, 2),
            "float32[batch,4,1]");
  EXPECT_EQ(InferOne("LayerNormalization", 17, {S({b, 4, 8}), S({4, 8})}, {kF, kF},
                     {{"axis", graph::Attribute::Int(1)}}, 3, 1),
            "float32[batch,1,1]");
  EXPECT_NE(InferOne("Softmax", 11, {S({2, 3})}, {kF}, {{"axis", graph::Attribute::Int(2)}})
                .find("out of range"), std::string::npos);
  // Axes from a constant input, from an attribute, and unknown until run time.
  EXPECT_EQ(InferOne("ReduceMean", 18, {S({b, 4, 8}), S({1})}, {kF, kI},
                     {{"keepdims", graph::Attribute::Int(0)}}, 1, 0, "",
                     std::make_pair(1, Tensor::FromVector<int64_t>({-2}, {1}))),
            "float32[batch,8]");
  EXPECT_EQ(InferOne("ReduceMax", 13, {S({b, 4, 8})}, {kF}, {{"axes", graph::Attribute::Ints({0, 2})}}),
            "float32[1,4,1]");
  EXPECT_EQ(InferOne("ReduceSum", 13, {S({b, 1, 8}), S({1})}, {kF, kI}), "float32[?,1,?]");
  EXPECT_EQ(InferOne("ReduceSum", 13, {S({b, 1, 8}), S({1})}, {kF, kI},
                     {{"keepdims", graph::Attribute::Int(0)}}),
            "float32?");
  EXPECT_EQ(InferOne("SoftmaxCrossEntropyLoss", 13, {S({b, 10, 3}), S({b, 3})}, {kF, kI},
                     {{"reduction", graph::Attribute::String("none")}}, 2, 0),
            "float32[batch,3]");
  EXPECT_EQ(InferOne("SoftmaxCrossEntropyLoss", 13, {S({b, 10}), S({b})}, {kF, kI}, {}, 2, 1),
            "float32[batch,10]");
  EXPECT_EQ(InferOne("SoftmaxCrossEntropyLoss", 13, {S({b, 10}), S({b})}, {kF, kI}), "float32[]");
  EXPECT_NE(InferOne("SoftmaxCrossEntropyLoss", 13, {S({4, 10}), S({5})}, {kF, kI}).find("do not match"),
            std::string::npos);
  EXPECT_EQ(InferOne("Dropout", 13, {S({b, 4})}, {kF}, {}, 2, 1), "bool[batch,4]");
  EXPECT_NE(InferOne("Trilu", 14, {S({4})}, {kF}).find("rank >= 2"), std::string::npos);
}

}  // namespace
}  // namespace cleave::testing
