// Op tests for the elementwise ops (tests/): unary math, broadcasting binary ops, Max/Min,
// comparisons, logic, Pow, Where, Clip and Cast, run through OpTester on the CPU provider,
// plus their shape inference. Expected values are written by hand or computed here in
// double precision by plain formulas and a naive index-by-index broadcast.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "graph/graph.h"
#include "kernels/cpu/elementwise.h"
#include "graph/op_table.h"
#include "gtest/gtest.h"
#include "tests/op_tester.h"

namespace cleave::testing {
namespace {

using I64 = std::vector<int64_t>;
using F32 = std::vector<float>;

// n floats spread evenly over [lo, hi].
F32 Linspace(float lo, float hi, int64_t n) {
  F32 v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  return v;
}

template <typename T>
std::vector<T> MapRef(const std::vector<T>& x, const std::function<double(double)>& f) {
  std::vector<T> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<T>(f(static_cast<double>(x[i])));
  return y;
}

// Numpy broadcasting of a and b, one output element at a time: each output index is
// mapped back to each input by clamping broadcast dims to 0.
template <typename TO, typename TA, typename TB>
std::vector<TO> NaiveBroadcast(const std::vector<TA>& a, const I64& ad, const std::vector<TB>& b,
                               const I64& bd, I64* out_dims,
                               const std::function<TO(TA, TB)>& f) {
  const size_t r = std::max(ad.size(), bd.size());
  I64 pa(r - ad.size(), 1), pb(r - bd.size(), 1);
  pa.insert(pa.end(), ad.begin(), ad.end());
  pb.insert(pb.end(), bd.begin(), bd.end());
  out_dims->assign(r, 1);
  int64_t n = 1;
  for (size_t k = 0; k < r; ++k) n *= ((*out_dims)[k] = std::max(pa[k], pb[k]));
  std::vector<TO> out(n);
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rest = lin, ia = 0, ib = 0, sa = 1, sb = 1;
    for (int k = static_cast<int>(r) - 1; k >= 0; --k) {
      int64_t idx = rest % (*out_dims)[k];
      rest /= (*out_dims)[k];
      ia += (pa[k] == 1 ? 0 : idx) * sa;
      ib += (pb[k] == 1 ? 0 : idx) * sb;
      sa *= pa[k];
      sb *= pb[k];
    }
    out[lin] = f(a[ia], b[ib]);
  }
  return out;
}

// A tensor of a dtype without a C++ type in DataTypeOf (f16, bf16, int16, uint*).
template <typename S>
Tensor Raw(DataType t, I64 dims, const std::vector<S>& v) {
  Tensor x(t, std::move(dims));
  for (size_t i = 0; i < v.size(); ++i) x.data<S>()[i] = v[i];
  return x;
}

// ---- Unary --------------------------------------------------------------------------------

TEST(ElementwiseUnaryTest, SignOpsOnFloatAndInt) {
  OpTester("Abs", 13).Input<float>("x", {4}, {-1.5f, 0.f, 2.f, -0.f})
      .Output<float>("y", {4}, {1.5f, 0.f, 2.f, 0.f}).Run();
  OpTester("Abs", 13).Input<int32_t>("x", {3}, {-7, 0, 5}).Output<int32_t>("y", {3}, {7, 0, 5}).Run();
  OpTester("Neg", 13).Input<int64_t>("x", {3}, {-7, 0, 5}).Output<int64_t>("y", {3}, {7, 0, -5}).Run();
  OpTester("Neg", 13).Input<double>("x", {2}, {1.25, -3}).Output<double>("y", {2}, {-1.25, 3}).Run();
  OpTester("Relu", 14).Input<float>("x", {2, 2}, {-1.f, 0.5f, 3.f, -0.25f})
      .Output<float>("y", {2, 2}, {0.f, 0.5f, 3.f, 0.f}).Run();
  OpTester("Relu", 14).Input<int32_t>("x", {3}, {-4, 0, 9}).Output<int32_t>("y", {3}, {0, 0, 9}).Run();
}

TEST(ElementwiseUnaryTest, MathOpsMatchLibmInDouble) {
  const F32 x = {0.1f, 0.5f, 1.f, 2.f, 3.75f};
  struct Case {
    const char* op;
    double (*f)(double);
  };
  const Case cases[] = {
      {"Exp", [](double v) { return std::exp(v); }},
      {"Log", [](double v) { return std::log(v); }},
      {"Sqrt", [](double v) { return std::sqrt(v); }},
      {"Reciprocal", [](double v) { return 1 / v; }},
      {"Sin", [](double v) { return std::sin(v); }},
      {"Cos", [](double v) { return std::cos(v); }},
      {"Tanh", [](double v) { return std::tanh(v); }},
      {"Erf", [](double v) { return std::erf(v); }},
      {"Sigmoid", [](double v) { return 1 / (1 + std::exp(-v)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    OpTester(c.op, 13).Input<float>("x", {5}, x).Output<float>("y", {5}, MapRef(x, c.f)).Run();
    std::vector<double> xd(x.begin(), x.end());
    OpTester(c.op, 13).Input<double>("x", {5}, xd).Output<double>("y", {5}, MapRef(xd, c.f))
        .Tolerance(1e-12, 1e-12).Run();
  }
  // Hand-checked values: e^0 = 1, ln 1 = 0, sqrt 16 = 4, sigmoid 0 = 1/2, erf 0 = 0.
  OpTester("Exp", 13).Input<float>("x", {1}, {0.f}).Output<float>("y", {1}, {1.f}).Run();
  OpTester("Log", 13).Input<float>("x", {1}, {1.f}).Output<float>("y", {1}, {0.f}).Run();
  OpTester("Sqrt", 13).Input<float>("x", {1}, {16.f}).Output<float>("y", {1}, {4.f}).Run();
  OpTester("Sigmoid", 13).Input<float>("x", {1}, {0.f}).Output<float>("y", {1}, {0.5f}).Run();
}

// The math and activations beyond the transformer set, in float32 and float64, against the
// ONNX definitions written out here (signs, both sides of every kink, and the attributes).
TEST(ElementwiseUnaryTest, ActivationsAndMathFollowTheOnnxDefinitions) {
  const std::vector<double> xd = {-3.5, -1.25, -0.5, 0.0, 0.3, 0.75, 2.5, 4.0};
  struct Case {
    const char* op;
    int opset;
    double (*f)(double);
    std::vector<std::pair<std::string, graph::Attribute>> attrs;
    std::vector<double> x;
  };
  const std::vector<double> unit = {-0.9, -0.5, 0.0, 0.25, 0.8};
  const Case cases[] = {
      {"Tan", 13, [](double v) { return std::tan(v); }, {}, {-1.2, -0.3, 0.0, 0.7, 1.4}},
      {"Asin", 13, [](double v) { return std::asin(v); }, {}, unit},
      {"Acos", 13, [](double v) { return std::acos(v); }, {}, unit},
      {"Atan", 13, [](double v) { return std::atan(v); }, {}, xd},
      {"Sinh", 13, [](double v) { return (std::exp(v) - std::exp(-v)) / 2; }, {}, xd},
      {"Cosh", 13, [](double v) { return (std::exp(v) + std::exp(-v)) / 2; }, {}, xd},
      {"Asinh", 13, [](double v) { return std::log(v + std::sqrt(v * v + 1)); }, {}, xd},
      {"Acosh", 13, [](double v) { return std::log(v + std::sqrt(v * v - 1)); }, {}, {1.0, 1.5, 3.0, 10.0}},
      {"Atanh", 13, [](double v) { return 0.5 * std::log((1 + v) / (1 - v)); }, {}, unit},
      {"Softplus", 13, [](double v) { return std::log(1 + std::exp(v)); }, {}, xd},
      {"Softsign", 13, [](double v) { return v / (1 + std::fabs(v)); }, {}, xd},
      {"Mish", 18, [](double v) { return v * std::tanh(std::log(1 + std::exp(v))); }, {}, xd},
      {"Floor", 13, [](double v) { return std::floor(v); }, {}, xd},
      {"Ceil", 13, [](double v) { return std::ceil(v); }, {}, xd},
      {"LeakyRelu", 16, [](double v) { return v < 0 ? 0.2 * v : v; }, {{"alpha", graph::Attribute::Float(0.2f)}}, xd},
      {"LeakyRelu", 16, [](double v) { return v < 0 ? 0.01 * v : v; }, {}, xd},
      {"Elu", 13, [](double v) { return v < 0 ? 0.5 * (std::exp(v) - 1) : v; }, {{"alpha", graph::Attribute::Float(0.5f)}},
       xd},
      {"Selu", 13,
       [](double v) {
         const double alpha = 1.67326319217681884765625, gamma = 1.05070102214813232421875;
         return v > 0 ? gamma * v : gamma * alpha * (std::exp(v) - 1);
       },
       {}, xd},
      {"Celu", 13, [](double v) { return std::max(0.0, v) + std::min(0.0, 2 * (std::exp(v / 2) - 1)); },
       {{"alpha", graph::Attribute::Float(2.f)}}, xd},
      {"HardSigmoid", 13, [](double v) { return std::max(0.0, std::min(1.0, 0.25 * v + 0.4)); },
       {{"alpha", graph::Attribute::Float(0.25f)}, {"beta", graph::Attribute::Float(0.4f)}}, xd},
      {"HardSwish", 14, [](double v) { return v * std::max(0.0, std::min(1.0, v / 6 + 0.5)); }, {},
       {-4.0, -3.0, -1.0, 0.0, 1.5, 3.0, 3.5}},
      {"ThresholdedRelu", 13, [](double v) { return v > 0.75 ? v : 0.0; }, {{"alpha", graph::Attribute::Float(0.75f)}},
       xd},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    // Attributes are float32: compare the float64 path at float32-rounded attribute precision.
    OpTester d(c.op, c.opset);
    OpTester f(c.op, c.opset);
    for (const auto& [name, a] : c.attrs) {
      d.Attr(name, a);
      f.Attr(name, a);
    }
    const int64_t n = static_cast<int64_t>(c.x.size());
    d.Input<double>("x", {n}, c.x).Output<double>("y", {n}, MapRef(c.x, c.f)).Tolerance(1e-7, 1e-7).Run();
    const F32 xf(c.x.begin(), c.x.end());
    f.Input<float>("x", {n}, xf).Output<float>("y", {n}, MapRef(xf, c.f)).Run();
  }
  // Round takes halves to even; Sign keeps 0 and NaN and works on integers, unsigned ones too.
  OpTester("Round", 11).Input<float>("x", {6}, {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.6f})
      .Output<float>("y", {6}, {-2.f, -2.f, -0.f, 0.f, 2.f, 3.f}).Run();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  OpTester("Sign", 13).Input<float>("x", {4}, {-3.f, 0.f, 0.25f, nan}).Output<float>("y", {4}, {-1.f, 0.f, 1.f, nan}).Run();
  OpTester("Sign", 13).Input<int32_t>("x", {3}, {-7, 0, 5}).Output<int32_t>("y", {3}, {-1, 0, 1}).Run();
  OpTester("Sign", 13).Input<uint8_t>("x", {3}, {0, 1, 200}).Output<uint8_t>("y", {3}, {0, 1, 1}).Run();
  // Celu with alpha 0 divides by it: rejected when the session loads, naming the node.
  OpTester("Celu", 12).Attr("alpha", 0.f).Input<float>("x", {1}, {1.f}).Output<float>("y", {1}, {1.f})
      .ExpectFailure("expected a non-zero alpha").Run();
}

// Mod takes the divisor's sign (fmod 0) or the dividend's (fmod 1); an integer remainder by 0
// is 0 and INT_MIN % -1 does not trap. Sum and Mean fold any number of broadcast inputs (one
// input is itself). Xor, IsNaN and IsInf write bool.
TEST(ElementwiseBinaryTest, ModSumMeanXorAndFloatClasses) {
  OpTester("Mod", 13).Input<int32_t>("a", {4}, {7, -7, 7, -7}).Input<int32_t>("b", {4}, {3, 3, -3, -3})
      .Output<int32_t>("c", {4}, {1, 2, -2, -1}).Run();
  OpTester("Mod", 13).Attr("fmod", int64_t{1}).Input<int32_t>("a", {4}, {7, -7, 7, -7})
      .Input<int32_t>("b", {4}, {3, 3, -3, -3}).Output<int32_t>("c", {4}, {1, -1, 1, -1}).Run();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  OpTester("Mod", 13).Input<int64_t>("a", {3}, {5, kMin, 9}).Input<int64_t>("b", {3}, {0, -1, 4})
      .Output<int64_t>("c", {3}, {0, 0, 1}).Run();
  OpTester("Mod", 13).Attr("fmod", int64_t{1}).Input<float>("a", {3}, {5.5f, -5.5f, 2.f})
      .Input<float>("b", {1}, {2.f}).Output<float>("c", {3}, {1.5f, -1.5f, 0.f}).Run();
  OpTester("Mod", 13).Attr("fmod", int64_t{2}).Input<float>("a", {1}, {1.f}).Input<float>("b", {1}, {2.f})
      .UncheckedOutput("c").ExpectFailure("expected fmod 0 or 1").Run();
  OpTester("Sum", 13).Input<float>("a", {2, 2}, {1, 2, 3, 4}).Input<float>("b", {2}, {10, 20})
      .Input<float>("c", {2, 1}, {100, 200}).Output<float>("y", {2, 2}, {111, 122, 213, 224}).Run();
  OpTester("Sum", 13).Input<double>("a", {2}, {1.5, -2}).Output<double>("y", {2}, {1.5, -2}).Run();
  OpTester("Mean", 13).Input<float>("a", {2}, {1, 2}).Input<float>("b", {2}, {3, 5}).Input<float>("c", {1}, {2})
      .Output<float>("y", {2}, {2, 3}).Run();
  OpTester("Xor", 7).InputTensor("a", Tensor::FromVector<bool>({true, true, false, false}, {4}))
      .InputTensor("b", Tensor::FromVector<bool>({true, false, true, false}, {4}))
      .OutputTensor("c", Tensor::FromVector<bool>({false, true, true, false}, {4})).Run();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v = {1.f, inf, -inf, nan};
  OpTester("IsNaN", 13).Input<float>("x", {4}, v)
      .OutputTensor("y", Tensor::FromVector<bool>({false, false, false, true}, {4})).Run();
  OpTester("IsInf", 10).Input<float>("x", {4}, v)
      .OutputTensor("y", Tensor::FromVector<bool>({false, true, true, false}, {4})).Run();
  OpTester("IsInf", 10).Attr("detect_positive", int64_t{0}).Input<float>("x", {4}, v)
      .OutputTensor("y", Tensor::FromVector<bool>({false, false, true, false}, {4})).Run();
}

// Size counts the elements (an int64 scalar); CastLike casts to the type of its second input.
TEST(ElementwiseUnaryTest, SizeAndCastLike) {
  OpTester("Size", 13).Input<float>("x", {2, 3, 4}, F32(24, 1.f)).Output<int64_t>("n", {}, {24}).Run();
  OpTester("Size", 13).Input<int64_t>("x", {0, 5}, {}).Output<int64_t>("n", {}, {0}).Run();
  OpTester("CastLike", 15).Input<float>("x", {3}, {1.5f, -2.75f, 3.f}).Input<int32_t>("like", {1}, {0})
      .Output<int32_t>("y", {3}, {1, -2, 3}).Run();
  OpTester("CastLike", 15).Input<int64_t>("x", {2}, {7, -1}).Input<double>("like", {0}, {})
      .Output<double>("y", {2}, {7.0, -1.0}).Run();
}

double GeluRef(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }
double GeluTanhRef(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

// Large inputs take the vectorised fp32 paths over several threads; they must agree with
// the double-precision definitions everywhere in a wide range, including the tails.
TEST(ElementwiseUnaryTest, VectorisedPathsMatchDoubleReference) {
  const F32 x = Linspace(-12.f, 12.f, 50001);
  struct Case {
    const char* op;
    int opset;
    const char* approximate;
    double (*f)(double);
  };
  const Case cases[] = {
      {"Exp", 13, nullptr, [](double v) { return std::exp(v); }},
      {"Tanh", 13, nullptr, [](double v) { return std::tanh(v); }},
      {"Erf", 13, nullptr, [](double v) { return std::erf(v); }},
      {"Sigmoid", 13, nullptr, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"Gelu", 20, "none", GeluRef},
      {"Gelu", 20, "tanh", GeluTanhRef},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.op) + (c.approximate ? c.approximate : ""));
    OpTester t(c.op, c.opset);
    if (c.approximate) t.Attr("approximate", std::string(c.approximate));
    // A few float ulps relative, plus 1e-7 absolute for the cancelling GELU tails.
    t.Input<float>("x", {50001}, x).Output<float>("y", {50001}, MapRef(x, c.f))
        .Tolerance(1e-7, 1e-6).Run();
  }
}

TEST(ElementwiseUnaryTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  OpTester("Exp", 13).Input<float>("x", {4}, {-inf, inf, 100.f, -200.f})
      .Output<float>("y", {4}, {0.f, inf, inf, 0.f}).Run();
  OpTester("Tanh", 13).Input<float>("x", {3}, {-inf, inf, nan})
      .Output<float>("y", {3}, {-1.f, 1.f, nan}).Run();
  OpTester("Gelu", 20).Input<float>("x", {3}, {-inf, inf, nan})
      .Output<float>("y", {3}, {0.f, inf, nan}).Run();
}

TEST(ElementwiseUnaryTest, GeluForms) {
  const F32 x = {-3.f, -1.f, -0.25f, 0.f, 0.5f, 2.f};
  OpTester("Gelu", 20).Input<float>("x", {6}, x).Output<float>("y", {6}, MapRef(x, GeluRef)).Run();
  OpTester("Gelu", 20).Attr("approximate", std::string("tanh")).Input<float>("x", {6}, x)
      .Output<float>("y", {6}, MapRef(x, GeluTanhRef)).Run();
  OpTester("Gelu", 1, "ai.cleave").Input<float>("x", {2, 3}, x)
      .Output<float>("y", {2, 3}, MapRef(x, GeluRef)).Run();
  OpTester("Gelu", 20).Attr("approximate", std::string("fast")).Input<float>("x", {6}, x)
      .Output<float>("y", {6}, x).ExpectFailure("approximate").Run();
}

TEST(ElementwiseUnaryTest, NotAndDtypeErrors) {
  OpTester("Not", 1).Input<bool>("x", {2, 2}, {true, false, false, true})
      .Output<bool>("y", {2, 2}, {false, true, true, false}).Run();
  // Exp is defined on float types only: inference names the node and the dtype.
  OpTester("Exp", 13).Input<int32_t>("x", {1}, {1}).Output<int32_t>("y", {1}, {3})
      .ExpectFailure("Exp 'node': input 0 'x' has dtype int32").Run();
}

// ---- Binary arithmetic and broadcasting ----------------------------------------------------

// Runs op on a and b and compares with the naive broadcast of f.
template <typename T>
void CheckBroadcast(const char* op, const std::vector<T>& a, const I64& ad,
                    const std::vector<T>& b, const I64& bd, std::function<T(T, T)> f) {
  I64 od;
  std::vector<T> want = NaiveBroadcast<T, T, T>(a, ad, b, bd, &od, f);
  OpTester t(op, 14);
  t.Input<T>("a", ad, a);  // separate statements: chained calls on dependent args need
  t.Input<T>("b", bd, b);  // `.template` at every step
  t.Output<T>("c", od, want);
  t.Run();
}

TEST(ElementwiseBinaryTest, BroadcastPatterns) {
  auto add = [](float x, float y) { return x + y; };
  auto sub = [](float x, float y) { return x - y; };
  F32 m = {1, 2, 3, 4, 5, 6};  // [2, 3]
  // By hand: same shape, scalar, row ([2,3] + [3]) and column ([2,3] + [2,1]).
  OpTester("Add", 14).Input<float>("a", {2, 3}, m).Input<float>("b", {2, 3}, m)
      .Output<float>("c", {2, 3}, {2, 4, 6, 8, 10, 12}).Run();
  OpTester("Mul", 14).Input<float>("a", {2, 3}, m).Input<float>("b", {}, {10})
      .Output<float>("c", {2, 3}, {10, 20, 30, 40, 50, 60}).Run();
  OpTester("Add", 14).Input<float>("a", {2, 3}, m).Input<float>("b", {3}, {10, 20, 30})
      .Output<float>("c", {2, 3}, {11, 22, 33, 14, 25, 36}).Run();
  OpTester("Sub", 14).Input<float>("a", {2, 3}, m).Input<float>("b", {2, 1}, {1, 4})
      .Output<float>("c", {2, 3}, {0, 1, 2, 0, 1, 2}).Run();
  // Both sides broadcast: [3,1] x [1,4] -> [3,4]; scalar on the left.
  OpTester("Mul", 14).Input<float>("a", {3, 1}, {1, 2, 3}).Input<float>("b", {1, 4}, {1, 10, 100, 1000})
      .Output<float>("c", {3, 4}, {1, 10, 100, 1000, 2, 20, 200, 2000, 3, 30, 300, 3000}).Run();
  OpTester("Div", 14).Input<float>("a", {}, {12}).Input<float>("b", {3}, {1, 4, -3})
      .Output<float>("c", {3}, {12, 3, -4}).Run();
  // Mixed patterns in higher rank, checked against the naive broadcast.
  CheckBroadcast<float>("Add", Linspace(-1, 1, 6), {2, 1, 3}, Linspace(0, 3, 4), {1, 4, 1}, add);
  CheckBroadcast<float>("Sub", Linspace(-1, 1, 30), {5, 1, 6, 1}, Linspace(0, 3, 24),
                        {4, 1, 6}, sub);
  CheckBroadcast<float>("Add", Linspace(0, 1, 12), {1, 3, 1, 4}, Linspace(0, 5, 10), {2, 1, 5, 1},
                        add);
}

// Big enough to be split over threads in every pattern: same shape, row (bias add),
// column and a mixed 3-D broadcast.
TEST(ElementwiseBinaryTest, LargeBroadcastsAcrossThreads) {
  auto add = [](float x, float y) { return x + y; };
  auto mul = [](float x, float y) { return x * y; };
  CheckBroadcast<float>("Add", Linspace(-5, 5, 40000), {200, 200}, Linspace(0, 1, 40000),
                        {200, 200}, add);
  CheckBroadcast<float>("Add", Linspace(-5, 5, 77 * 768), {77, 768}, Linspace(0, 1, 768), {768},
                        add);
  CheckBroadcast<float>("Mul", Linspace(-5, 5, 300 * 129), {300, 129}, Linspace(0, 1, 300),
                        {300, 1}, mul);
  CheckBroadcast<float>("Mul", Linspace(-5, 5, 8 * 130), {8, 1, 130}, Linspace(0, 1, 50 * 130),
                        {50, 130}, mul);
}

TEST(ElementwiseBinaryTest, IntegerArithmetic) {
  OpTester("Add", 14).Input<int32_t>("a", {3}, {1, -2, 3}).Input<int32_t>("b", {1}, {10})
      .Output<int32_t>("c", {3}, {11, 8, 13}).Run();
  OpTester("Sub", 14).Input<int64_t>("a", {2, 2}, {5, 6, 7, 8}).Input<int64_t>("b", {2}, {1, 10})
      .Output<int64_t>("c", {2, 2}, {4, -4, 6, -2}).Run();
  OpTester("Mul", 14).Input<int64_t>("a", {2}, {int64_t{1} << 40, -3})
      .Input<int64_t>("b", {2}, {4, 5}).Output<int64_t>("c", {2}, {int64_t{1} << 42, -15}).Run();
  // Integer division truncates toward zero (ONNX divides in float and casts back).
  OpTester("Div", 14).Input<int32_t>("a", {4}, {7, -7, 7, -7}).Input<int32_t>("b", {4}, {2, 2, -2, -2})
      .Output<int32_t>("c", {4}, {3, -3, -3, 3}).Run();
  // uint8 wraps modulo 256.
  OpTester("Add", 14).Input<uint8_t>("a", {2}, {250, 3}).Input<uint8_t>("b", {2}, {10, 4})
      .Output<uint8_t>("c", {2}, {4, 7}).Run();
  OpTester("Sub", 14).Input<uint8_t>("a", {1}, {3}).Input<uint8_t>("b", {1}, {5})
      .Output<uint8_t>("c", {1}, {254}).Run();
  // int16 wraps too; x / 0 is 0 and MIN / -1 wraps to MIN (both undefined in ONNX).
  OpTester("Add", 14).InputTensor("a", Raw<int16_t>(DataType::kInt16, {2}, {32767, -5}))
      .InputTensor("b", Raw<int16_t>(DataType::kInt16, {2}, {1, 5}))
      .OutputTensor("c", Raw<int16_t>(DataType::kInt16, {2}, {-32768, 0})).Run();
  const int32_t kMin = std::numeric_limits<int32_t>::min();
  OpTester("Div", 14).Input<int32_t>("a", {2}, {7, kMin}).Input<int32_t>("b", {2}, {0, -1})
      .Output<int32_t>("c", {2}, {0, kMin}).Run();
  OpTester("Mul", 14).Input<double>("a", {2}, {1.5, -2}).Input<double>("b", {}, {4})
      .Output<double>("c", {2}, {6, -8}).Run();
}

TEST(ElementwiseBinaryTest, IncompatibleBroadcastFailsAtLoad) {
  OpTester("Add", 14).Input<float>("a", {2, 3}, F32(6)).Input<float>("b", {4}, F32(4))
      .Output<float>("c", {2, 3}, F32(6)).ExpectFailure("Add 'node': cannot broadcast").Run();
  OpTester("Add", 14).Input<float>("a", {2}, F32(2)).Input<int32_t>("b", {2}, {1, 2})
      .Output<float>("c", {2}, F32(2)).ExpectFailure("expected inputs of one dtype").Run();
}

// ---- Max, Min ------------------------------------------------------------------------------

TEST(ElementwiseMaxMinTest, VariadicWithBroadcast) {
  OpTester("Max", 13).Input<float>("a", {3}, {1, 5, 3}).Input<float>("b", {2, 1}, {2, 4})
      .Input<float>("c", {}, {3.5f}).Output<float>("y", {2, 3}, {3.5f, 5, 3.5f, 4, 5, 4}).Run();
  OpTester("Min", 13).Input<float>("a", {3}, {1, 5, 3}).Input<float>("b", {2, 1}, {2, 4})
      .Input<float>("c", {}, {3.5f}).Output<float>("y", {2, 3}, {1, 2, 2, 1, 3.5f, 3}).Run();
  OpTester("Max", 13).Input<float>("a", {2}, {-1, 7}).Output<float>("y", {2}, {-1, 7}).Run();
  OpTester("Min", 13).Input<int64_t>("a", {3}, {4, -9, 2}).Input<int64_t>("b", {3}, {3, 0, 8})
      .Output<int64_t>("y", {3}, {3, -9, 2}).Run();
  OpTester("Max", 13).Input<uint8_t>("a", {2}, {200, 3}).Input<uint8_t>("b", {2}, {100, 250})
      .Output<uint8_t>("y", {2}, {200, 250}).Run();
  // NaN in either operand propagates, as numpy.maximum does.
  const float nan = std::nanf("");
  OpTester("Max", 13).Input<float>("a", {2}, {nan, 1}).Input<float>("b", {2}, {1, nan})
      .Output<float>("y", {2}, {nan, nan}).Run();
}

// ---- Comparisons and logic -----------------------------------------------------------------

TEST(ElementwiseCompareTest, AllComparisonsWithBroadcast) {
  const F32 a = {1, 2, 3, 4, 5, 6};
  const F32 b = {2, 5};  // [2, 1]
  struct Case {
    const char* op;
    int opset;
    std::function<bool(float, float)> f;
  };
  const Case cases[] = {{"Equal", 13, [](float x, float y) { return x == y; }},
                        {"Less", 13, [](float x, float y) { return x < y; }},
                        {"Greater", 13, [](float x, float y) { return x > y; }},
                        {"LessOrEqual", 16, [](float x, float y) { return x <= y; }},
                        {"GreaterOrEqual", 16, [](float x, float y) { return x >= y; }}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    I64 od;
    std::vector<bool> want = NaiveBroadcast<bool, float, float>(a, {2, 3}, b, {2, 1}, &od, c.f);
    OpTester(c.op, c.opset).Input<float>("a", {2, 3}, a).Input<float>("b", {2, 1}, b)
        .Output<bool>("y", od, want).Run();
  }
  // By hand: [1,2,3 | 4,5,6] < [2 | 5] is [T,F,F | T,F,F].
  OpTester("Less", 13).Input<float>("a", {2, 3}, a).Input<float>("b", {2, 1}, b)
      .Output<bool>("y", {2, 3}, {true, false, false, true, false, false}).Run();
  OpTester("Equal", 13).Input<int64_t>("a", {3}, {1, 2, 3}).Input<int64_t>("b", {}, {2})
      .Output<bool>("y", {3}, {false, true, false}).Run();
  OpTester("Equal", 13).Input<bool>("a", {2}, {true, false}).Input<bool>("b", {2, 1}, {true, false})
      .Output<bool>("y", {2, 2}, {true, false, false, true}).Run();
  OpTester("Greater", 13).Input<int32_t>("a", {2}, {-1, 9}).Input<int32_t>("b", {2}, {-2, 9})
      .Output<bool>("y", {2}, {true, false}).Run();
}

TEST(ElementwiseLogicTest, AndOrWithBroadcast) {
  const std::vector<bool> a = {true, true, false, false};  // [2, 2]
  OpTester("And", 7).Input<bool>("a", {2, 2}, a).Input<bool>("b", {2}, {true, false})
      .Output<bool>("y", {2, 2}, {true, false, false, false}).Run();
  OpTester("Or", 7).Input<bool>("a", {2, 2}, a).Input<bool>("b", {2}, {true, false})
      .Output<bool>("y", {2, 2}, {true, true, true, false}).Run();
  OpTester("And", 7).Input<float>("a", {1}, {1}).Input<float>("b", {1}, {1})
      .Output<bool>("y", {1}, {true}).ExpectFailure("has dtype float32").Run();
}

// ---- Pow -----------------------------------------------------------------------------------

TEST(ElementwisePowTest, TypesAndFastPaths) {
  const F32 x = {-2.f, -0.5f, 0.f, 1.5f, 3.f};
  auto pow2 = MapRef(x, [](double v) { return v * v; });
  auto pow3 = MapRef(x, [](double v) { return v * v * v; });
  OpTester("Pow", 15).Input<float>("x", {5}, x).Input<float>("e", {}, {2.f})
      .Output<float>("y", {5}, pow2).Run();
  OpTester("Pow", 15).Input<float>("x", {5}, x).Input<float>("e", {}, {3.f}).AsInitializer()
      .Output<float>("y", {5}, pow3).Run();
  OpTester("Pow", 15).Input<float>("x", {2, 2}, {1, 2, 3, 4}).Input<float>("e", {2}, {0.5f, -1.f})
      .Output<float>("y", {2, 2}, {1.f, 0.5f, std::sqrt(3.f), 0.25f}).Run();
  // Exponent of another type: float base, int64 exponent; result keeps the base type.
  OpTester("Pow", 15).Input<float>("x", {3}, {2, -3, 0.5f}).Input<int64_t>("e", {3}, {10, 3, -2})
      .Output<float>("y", {3}, {1024, -27, 4}).Run();
  // Integer bases: exact powers; a float exponent truncates the real result.
  OpTester("Pow", 15).Input<int64_t>("x", {4}, {3, -2, 10, 7}).Input<int64_t>("e", {4}, {4, 3, 12, 0})
      .Output<int64_t>("y", {4}, {81, -8, 1000000000000, 1}).Run();
  OpTester("Pow", 15).Input<int32_t>("x", {3}, {4, 2, 9}).Input<float>("e", {3}, {0.5f, -1.f, 2.f})
      .Output<int32_t>("y", {3}, {2, 0, 81}).Run();
}

// ---- Where ---------------------------------------------------------------------------------

TEST(ElementwiseWhereTest, SelectsWithBroadcast) {
  OpTester("Where", 16).Input<bool>("c", {2, 2}, {true, false, false, true})
      .Input<float>("x", {2, 2}, {1, 2, 3, 4}).Input<float>("y", {2, 2}, {-1, -2, -3, -4})
      .Output<float>("z", {2, 2}, {1, -2, -3, 4}).Run();
  // Attention-mask style: cond [1,3] over x [2,3], y a scalar fill value.
  OpTester("Where", 16).Input<bool>("c", {1, 3}, {true, true, false})
      .Input<float>("x", {2, 3}, {1, 2, 3, 4, 5, 6}).Input<float>("y", {}, {-1e9f})
      .Output<float>("z", {2, 3}, {1, 2, -1e9f, 4, 5, -1e9f}).Run();
  // All three broadcast: c [2,1], x [1,3], y [3] -> [2,3].
  OpTester("Where", 16).Input<bool>("c", {2, 1}, {false, true})
      .Input<int64_t>("x", {1, 3}, {1, 2, 3}).Input<int64_t>("y", {3}, {7, 8, 9})
      .Output<int64_t>("z", {2, 3}, {7, 8, 9, 1, 2, 3}).Run();
  OpTester("Where", 9).Input<bool>("c", {3}, {true, false, true})
      .Input<bool>("x", {3}, {false, false, false}).Input<bool>("y", {3}, {true, true, true})
      .Output<bool>("z", {3}, {false, true, false}).Run();
  OpTester("Where", 16).Input<float>("c", {1}, {1}).Input<float>("x", {1}, {1})
      .Input<float>("y", {1}, {1}).Output<float>("z", {1}, {1}).ExpectFailure("has dtype float32").Run();
}

// ---- Clip ----------------------------------------------------------------------------------

TEST(ElementwiseClipTest, BoundsAsInputsAndAttributes) {
  const F32 x = {-3, -1, 0, 2, 5};
  OpTester("Clip", 13).Input<float>("x", {5}, x).Input<float>("lo", {}, {-1.5f})
      .Input<float>("hi", {}, {2.5f}).Output<float>("y", {5}, {-1.5f, -1, 0, 2, 2.5f}).Run();
  // min omitted: only the upper bound applies.
  OpTester("Clip", 13).Input<float>("x", {5}, x).OmittedInput().Input<float>("hi", {}, {1.f})
      .Output<float>("y", {5}, {-3, -1, 0, 1, 1}).Run();
  // max omitted (trailing), and no bounds at all.
  OpTester("Clip", 12).Input<float>("x", {5}, x).Input<float>("lo", {}, {0.f})
      .Output<float>("y", {5}, {0, 0, 0, 2, 5}).Run();
  OpTester("Clip", 11).Input<float>("x", {5}, x).Output<float>("y", {5}, x).Run();
  // Version 6: float attributes.
  OpTester("Clip", 6).Attr("min", -2.f).Attr("max", 3.f).Input<float>("x", {5}, x)
      .Output<float>("y", {5}, {-2, -1, 0, 2, 3}).Run();
  OpTester("Clip", 13).Input<int8_t>("x", {4}, {-128, -5, 5, 127}).Input<int8_t>("lo", {}, {-10})
      .Input<int8_t>("hi", {}, {10}).Output<int8_t>("y", {4}, {-10, -5, 5, 10}).Run();
  // min > max sends everything to max (numpy.clip); NaN passes through.
  const float nan = std::nanf("");
  OpTester("Clip", 13).Input<float>("x", {3}, {-5, nan, 5}).Input<float>("lo", {}, {2.f})
      .Input<float>("hi", {}, {1.f}).Output<float>("y", {3}, {1, nan, 1}).Run();
  OpTester("Clip", 13).Input<float>("x", {2}, {1, 2}).Input<float>("lo", {2}, {0, 0})
      .Output<float>("y", {2}, {1, 2}).ExpectFailure("expected a scalar for input 1").Run();
}

// ---- Cast ----------------------------------------------------------------------------------

int64_t To(DataType t) { return static_cast<int64_t>(t); }

TEST(ElementwiseCastTest, NumericConversions) {
  const float nan = std::nanf("");
  // float -> int truncates toward zero; NaN becomes 0 (ONNX leaves it undefined).
  OpTester("Cast", 13).Attr("to", To(DataType::kInt32))
      .Input<float>("x", {5}, {-2.7f, 2.7f, -0.5f, 100.f, nan})
      .Output<int32_t>("y", {5}, {-2, 2, 0, 100, 0}).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kBool)).Input<float>("x", {4}, {0.f, -0.f, 0.1f, nan})
      .Output<bool>("y", {4}, {false, false, true, true}).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat32)).Input<bool>("x", {2}, {true, false})
      .Output<float>("y", {2}, {1.f, 0.f}).Run();
  OpTester("Cast", 19).Attr("to", To(DataType::kFloat32))
      .Input<int64_t>("x", {3}, {-3, 16777217, int64_t{1} << 40})
      .Output<float>("y", {3}, {-3.f, 16777216.f, 1099511627776.f}).Tolerance(0, 0).Run();
  // Integer narrowing wraps: 200 -> -56, 300 -> 44 (two's complement).
  OpTester("Cast", 13).Attr("to", To(DataType::kInt8)).Input<int32_t>("x", {3}, {200, 300, -1})
      .Output<int8_t>("y", {3}, {-56, 44, -1}).Run();
  OpTester("Cast", 21).Attr("to", To(DataType::kUInt8)).Input<int64_t>("x", {2}, {255, 256})
      .Output<uint8_t>("y", {2}, {255, 0}).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat64)).Input<float>("x", {2}, {0.1f, -3.f})
      .Output<double>("y", {2}, {static_cast<double>(0.1f), -3.0}).Tolerance(0, 0).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat32)).Input<float>("x", {2}, {1.f, 2.f})
      .Output<float>("y", {2}, {1.f, 2.f}).Run();
}

// Half and bfloat16 bit patterns for 1 + k * 2^-e, worked out by hand. f16 keeps 10
// mantissa bits and bf16 7, so 1 + 2^-11 (f16) and 1 + 2^-8 (bf16) are exact ties that
// round to the even neighbour 1.0, while 1 + 3 * 2^-11 (f16) rounds up to 1 + 2^-9.
TEST(ElementwiseCastTest, HalfPrecisionRoundsToNearestEven) {
  const float t16 = 1.f + std::ldexp(1.f, -11), u16 = 1.f + 3 * std::ldexp(1.f, -11);
  const float t8 = 1.f + std::ldexp(1.f, -8), u8 = 1.f + 3 * std::ldexp(1.f, -8);
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat16))
      .Input<float>("x", {5}, {t16, u16, -2.f, 65520.f, 1e-8f})
      .OutputTensor("y", Raw<uint16_t>(DataType::kFloat16, {5},
                                       {0x3c00, 0x3c02, 0xc000, 0x7c00, 0x0000}))
      .Tolerance(0, 0).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kBFloat16)).Input<float>("x", {3}, {t8, u8, -2.f})
      .OutputTensor("y", Raw<uint16_t>(DataType::kBFloat16, {3}, {0x3f80, 0x3f82, 0xc000}))
      .Tolerance(0, 0).Run();
  // Back to float is exact.
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat32))
      .InputTensor("x", Raw<uint16_t>(DataType::kFloat16, {3}, {0x3c02, 0xc000, 0x0001}))
      .Output<float>("y", {3}, {1.f + std::ldexp(1.f, -9), -2.f, std::ldexp(1.f, -24)})
      .Tolerance(0, 0).Run();
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat32))
      .InputTensor("x", Raw<uint16_t>(DataType::kBFloat16, {2}, {0x3f82, 0x4049}))
      .Output<float>("y", {2}, {1.f + std::ldexp(1.f, -6), 3.140625f}).Tolerance(0, 0).Run();
  // f64 -> f16 rounds once: 1 + 2^-11 + 2^-40 is just above the tie, so it rounds up to
  // 1 + 2^-10, where rounding through float (which drops the 2^-40) would give 1.0.
  OpTester("Cast", 13).Attr("to", To(DataType::kFloat16))
      .Input<double>("x", {1}, {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)})
      .OutputTensor("y", Raw<uint16_t>(DataType::kFloat16, {1}, {0x3c01})).Tolerance(0, 0).Run();
  // Round trip f32 -> bf16 -> f32 loses the low mantissa bits as rounding says.
  OpTester("Cast", 13).Attr("to", To(DataType::kBFloat16))
      .InputTensor("x", Raw<uint16_t>(DataType::kFloat16, {1}, {0x3c02}))
      .OutputTensor("y", Raw<uint16_t>(DataType::kBFloat16, {1}, {0x3f80})).Tolerance(0, 0).Run();
}

// Bulk fp16 <-> float32 casts (eight at a time where the CPU has F16C) give what the scalar
// conversions give, element for element: all 65536 fp16 values to float32 and back, and floats
// across fp16's whole range (normal, subnormal, ties, overflow to inf, zeros of both signs), on
// a pool of 2 and in lengths that leave a scalar tail. A NaN stays a NaN.
TEST(ElementwiseCastTest, BulkHalfConversionsMatchTheScalarOnes) {
  ThreadPool pool(2);
  const int64_t n = 65536 + 5;
  std::vector<uint16_t> halves(n);
  for (int64_t i = 0; i < n; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(n);
  kernels::cpu::Cast(TensorView(halves.data(), DataType::kFloat16, std::vector<int64_t>{n}),
                     TensorView(widened.data(), DataType::kFloat32, std::vector<int64_t>{n}), &pool);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = HalfToFloat(halves[i]);
    differ += std::isnan(want) ? !std::isnan(widened[i]) : std::memcmp(&want, &widened[i], 4) != 0;
  }
  EXPECT_EQ(differ, 0) << "of the fp16 values widened";
  std::vector<float> floats;
  for (float f : widened) floats.push_back(f);
  for (int e = -30; e <= 17; ++e)
    for (int m = 0; m < 4096; m += 7) {
      const float f = std::ldexp(1.f + m / 4096.f, e);  // between fp16 values, ties among them
      floats.push_back(f);
      floats.push_back(-f);
    }
  for (float f : {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 1e30f, std::numeric_limits<float>::infinity(),
                  std::ldexp(1.f, -25), std::ldexp(1.5f, -25), std::ldexp(1.f, -24)})
    floats.push_back(f);
  floats.push_back(1.f);  // an odd length: a scalar tail
  const int64_t m = static_cast<int64_t>(floats.size());
  std::vector<uint16_t> narrowed(m);
  kernels::cpu::Cast(TensorView(floats.data(), DataType::kFloat32, std::vector<int64_t>{m}),
                     TensorView(narrowed.data(), DataType::kFloat16, std::vector<int64_t>{m}), &pool);
  differ = 0;
  for (int64_t i = 0; i < m; ++i) {
    const uint16_t want = FloatToHalf(floats[i]);
    const bool nan = (want & 0x7c00) == 0x7c00 && (want & 0x3ff);
    differ += nan ? !((narrowed[i] & 0x7c00) == 0x7c00 && (narrowed[i] & 0x3ff)) : narrowed[i] != want;
  }
  EXPECT_EQ(differ, 0) << "of " << m << " floats narrowed";
}

TEST(ElementwiseCastTest, BulkBf16ConversionsMatchTheScalarOnes) {
  ThreadPool pool(2);
  const int64_t n = 65536 + 5;  // every bf16 value, then a scalar tail
  std::vector<uint16_t> bf16s(n);
  for (int64_t i = 0; i < n; ++i) bf16s[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(n);
  kernels::cpu::Cast(TensorView(bf16s.data(), DataType::kBFloat16, std::vector<int64_t>{n}),
                     TensorView(widened.data(), DataType::kFloat32, std::vector<int64_t>{n}), &pool);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = BFloat16ToFloat(bf16s[i]);
    differ += std::memcmp(&want, &widened[i], 4) != 0;  // exact, NaN payloads too
  }
  EXPECT_EQ(differ, 0) << "of the bf16 values widened";
  // Those values, and floats between them: ties to even either way, subnormals, the largest
  // finite values (rounding up to infinity), signed zeros, infinities and NaNs with payloads
  // below bf16's bits.
  std::vector<float> floats(widened.begin(), widened.end());
  for (int e = -140; e <= 127; e += 3)
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x18000u, 0x1u, 0xffffu}) {
      const float f = std::ldexp(1.f, e);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      for (uint32_t v : {u | low, (u | low) ^ 0x80000000u}) {
        float g;
        std::memcpy(&g, &v, 4);
        floats.push_back(g);
      }
    }
  for (uint32_t bits : {0x7f7fffffu, 0x7f7f8000u, 0x7f800001u, 0xff800100u, 0x7fc00000u, 0x00000001u, 0x80008000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    floats.push_back(f);
  }
  floats.push_back(1.f);
  const int64_t m = static_cast<int64_t>(floats.size());
  std::vector<uint16_t> narrowed(m);
  kernels::cpu::Cast(TensorView(floats.data(), DataType::kFloat32, std::vector<int64_t>{m}),
                     TensorView(narrowed.data(), DataType::kBFloat16, std::vector<int64_t>{m}), &pool);
  differ = 0;
  for (int64_t i = 0; i < m; ++i) differ += narrowed[i] != FloatToBFloat16(floats[i]);
  EXPECT_EQ(differ, 0) << "of " << m << " floats narrowed";
}

TEST(ElementwiseCastTest, UnsupportedTargets) {
  OpTester("Cast", 21).Attr("to", int64_t{17}).Input<float>("x", {1}, {1.f})
      .Output<float>("y", {1}, {1.f}).ExpectFailure("Cast to element type 17 is not supported").Run();
  OpTester("Cast", 13).Input<float>("x", {1}, {1.f}).Output<float>("y", {1}, {1.f})
      .ExpectFailure("expected an int attribute 'to'").Run();
}

// ---- Shape inference -----------------------------------------------------------------------

// The integers' bitwise ops with broadcasting, BitwiseNot, and shifts: logical for unsigned
// types, 0 once the shift reaches the width.
TEST(ElementwiseBitwiseTest, AndOrXorNotAndShifts) {
  const std::vector<int32_t> a = {-1, 0x0ff0, -2147483647 - 1, 12}, b = {0x00ff, -16};
  OpTester("BitwiseAnd", 18).Input<int32_t>("a", {2, 2}, a).Input<int32_t>("b", {2}, b)
      .Output<int32_t>("y", {2, 2}, {0x00ff, 0x0ff0, 0, 0}).Run();
  OpTester("BitwiseOr", 18).Input<int32_t>("a", {2, 2}, a).Input<int32_t>("b", {2}, b)
      .Output<int32_t>("y", {2, 2}, {-1, -16, -2147483647 - 1 + 0xff, -4}).Run();
  OpTester("BitwiseXor", 18).Input<int32_t>("a", {2, 2}, a).Input<int32_t>("b", {2}, b)
      .Output<int32_t>("y", {2, 2}, {~0x00ff, 0x0ff0 ^ -16, (-2147483647 - 1) ^ 0xff, 12 ^ -16}).Run();
  OpTester("BitwiseNot", 18).Input<uint8_t>("a", {3}, {0, 0x0f, 255}).Output<uint8_t>("y", {3}, {255, 0xf0, 0}).Run();
  OpTester("BitwiseNot", 18).Input<int64_t>("a", {2}, {0, -5}).Output<int64_t>("y", {2}, {-1, 4}).Run();
  OpTester("BitShift", 11).Attr("direction", std::string("LEFT"))
      .Input<uint8_t>("x", {5}, {1, 0x81, 1, 1, 3}).Input<uint8_t>("s", {5}, {7, 1, 8, 200, 0})
      .Output<uint8_t>("y", {5}, {128, 2, 0, 0, 3}).Run();
  OpTester("BitShift", 11).Attr("direction", std::string("RIGHT"))
      .Input<uint16_t>("x", {3}, {0x8000, 0xffff, 5}).Input<uint16_t>("s", {1}, {15})
      .Output<uint16_t>("y", {3}, {1, 1, 0}).Run();
  OpTester("BitShift", 11).Attr("direction", std::string("UP"))
      .Input<uint8_t>("x", {1}, {1}).Input<uint8_t>("s", {1}, {1})
      .Output<uint8_t>("y", {1}, {2})
      .ExpectFailure("direction 'UP' is neither LEFT nor RIGHT").Run();
  OpTester("BitwiseAnd", 18).Input<float>("a", {1}, {1}).Input<float>("b", {1}, {1})
      .Output<float>("y", {1}, {1})
      .ExpectFailure("float32").Run();
}

TEST(ElementwiseInferenceTest, KeepsSymbolicDims) {
  graph::Graph g;
  g.opset_imports()[""] = 17;
  Shape bt({Dim::Symbol("batch"), Dim(1), Dim(8)});
  graph::Value* x = g.AddInput("x", DataType::kFloat32, bt);
  graph::Value* b = g.AddInput("b", DataType::kFloat32, Shape::FromDims({4, 8}));
  graph::Value* c = g.AddInput("c", DataType::kBool, Shape());
  graph::Value* sum = g.GetOrCreateValue("sum");
  graph::Value* less = g.GetOrCreateValue("less");
  graph::Value* sel = g.GetOrCreateValue("sel");
  graph::Value* cast = g.GetOrCreateValue("cast");
  g.AddNode("Add", {x, b}, {sum}, "add");
  g.AddNode("Less", {x, b}, {less}, "less");
  g.AddNode("Where", {c, x, b}, {sel}, "where");
  graph::Node* n = g.AddNode("Cast", {sum}, {cast}, "cast");
  n->SetAttr("to", graph::Attribute::Int(To(DataType::kFloat16)));
  ASSERT_TRUE(graph::InferShapes(g).ok());
  EXPECT_EQ(sum->shape().ToString(), "[batch,4,8]");
  EXPECT_EQ(sum->dtype(), DataType::kFloat32);
  EXPECT_EQ(less->dtype(), DataType::kBool);
  EXPECT_EQ(less->shape().ToString(), "[batch,4,8]");
  EXPECT_FALSE(sel->shape().has_rank());  // c has unknown rank
  EXPECT_EQ(cast->dtype(), DataType::kFloat16);
  EXPECT_EQ(cast->shape().ToString(), "[batch,4,8]");
}

}  // namespace
}  // namespace cleave::testing
