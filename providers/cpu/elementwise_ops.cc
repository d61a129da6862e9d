// CPU kernels for elementwise ops (providers/cpu/): they adapt graph nodes to the
// functions of kernels/cpu/elementwise.h. Attributes are parsed when the kernel is made;
// Compute only computes output dims, asks for the output and calls the kernel function.
// Dtype claims here are exactly what kernels/cpu/elementwise.h implements.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/elementwise.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

namespace kc = kernels::cpu;
using DT = DataType;

const std::vector<DT> kFloatTypes = {DT::kFloat32, DT::kFloat64};
const std::vector<DT> kSignedTypes = {DT::kFloat32, DT::kFloat64, DT::kInt8,
                                      DT::kInt16,   DT::kInt32,   DT::kInt64};
const std::vector<DT> kNumericTypes = {DT::kFloat32, DT::kFloat64, DT::kInt8,   DT::kInt16,
                                       DT::kInt32,   DT::kInt64,   DT::kUInt8,  DT::kUInt16,
                                       DT::kUInt32,  DT::kUInt64};
const std::vector<DT> kIntegerTypes = {DT::kInt8,  DT::kInt16,  DT::kInt32,  DT::kInt64,
                                       DT::kUInt8, DT::kUInt16, DT::kUInt32, DT::kUInt64};
const std::vector<DT> kPowBaseTypes = {DT::kFloat32, DT::kFloat64, DT::kInt32, DT::kInt64};
const std::vector<DT> kBoolType = {DT::kBool};

std::vector<DT> With(std::vector<DT> a, const std::vector<DT>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
// Cast and Where take every fixed-size type cleave stores.
const std::vector<DT> kAllTypes = With(kNumericTypes, {DT::kFloat16, DT::kBFloat16, DT::kBool});

class UnaryKernel : public OpKernel {
 public:
  explicit UnaryKernel(kc::UnaryOp op) : op_(op) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = ctx.input(0);
    if (TensorView* y = ctx.Output(0, x->dim_span())) kc::Unary(op_, *x, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  kc::UnaryOp op_;
};

// Output dims of inputs broadcast together, or an error naming the node (shapes only
// known at run time can still disagree).
absl::Status BroadcastOrError(const std::string& node, std::span<const TensorView* const> ins,
                              int64_t dims[kMaxRank], int* rank) {
  *rank = kc::BroadcastOutputDims(ins, dims);
  if (*rank >= 0) return absl::OkStatus();
  std::string shapes;
  for (const TensorView* t : ins)
    absl::StrAppend(&shapes, shapes.empty() ? "" : " and ", DimsToString(t->dims, t->rank));
  return InvalidArgument(node, ": cannot broadcast input shapes ", shapes);
}

class BinaryKernel : public OpKernel {
 public:
  BinaryKernel(kc::BinaryOp op, const graph::Node& n) : op_(op), node_(n.Describe()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* ins[2] = {ctx.input(0), ctx.input(1)};
    int64_t dims[kMaxRank];
    int rank;
    RETURN_IF_ERROR(BroadcastOrError(node_, ins, dims, &rank));
    TensorView* out = ctx.Output(0, std::span<const int64_t>(dims, rank));
    if (out) kc::Binary(op_, *ins[0], *ins[1], *out, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  kc::BinaryOp op_;
  std::string node_;
};

// Mod: the remainder with the divisor's sign, or with fmod = 1 the dividend's (C's fmod).
absl::StatusOr<std::unique_ptr<OpKernel>> CreateMod(const graph::Node& n, int) {
  const int64_t fmod = n.AttrInt("fmod", 0);
  if (fmod != 0 && fmod != 1) return InvalidArgument(n.Describe(), ": expected fmod 0 or 1, got ", fmod);
  return std::unique_ptr<OpKernel>(new BinaryKernel(fmod ? kc::BinaryOp::kFmod : kc::BinaryOp::kMod, n));
}

// BitShift: direction LEFT or RIGHT (checked by shape inference).
absl::StatusOr<std::unique_ptr<OpKernel>> CreateBitShift(const graph::Node& n, int) {
  const bool left = n.AttrString("direction", "") == "LEFT";
  return std::unique_ptr<OpKernel>(new BinaryKernel(left ? kc::BinaryOp::kShiftLeft : kc::BinaryOp::kShiftRight, n));
}

// IsNaN, and IsInf (detect_positive, detect_negative): bool of x's shape.
class FloatClassKernel : public OpKernel {
 public:
  FloatClassKernel(const graph::Node& n, int)
      : nan_(n.op_type() == "IsNaN"),
        positive_(n.AttrInt("detect_positive", 1) != 0),
        negative_(n.AttrInt("detect_negative", 1) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (x.dtype == DT::kFloat64) Run<double>(x, *y);
    else Run<float>(x, *y);
    return absl::OkStatus();
  }

 private:
  template <typename T>
  void Run(const TensorView& x, TensorView& y) const {
    const T* p = x.as<T>();
    bool* out = y.as<bool>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const T v = p[i];
      out[i] = nan_ ? std::isnan(v) : std::isinf(v) && (v > 0 ? positive_ : negative_);
    }
  }
  bool nan_, positive_, negative_;
};

class PowKernel : public OpKernel {
 public:
  PowKernel(const graph::Node& n, int) : node_(n.Describe()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* ins[2] = {ctx.input(0), ctx.input(1)};
    int64_t dims[kMaxRank];
    int rank;
    RETURN_IF_ERROR(BroadcastOrError(node_, ins, dims, &rank));
    TensorView* out = ctx.Output(0, std::span<const int64_t>(dims, rank));
    if (out) kc::Pow(*ins[0], *ins[1], *out, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  std::string node_;
};

// Max and Min of any number of inputs: out = op(in0, in1), then out = op(out, in_k).
// A single input is op(in0, in0), its own value.
// Max, Min and Sum over any number of inputs, broadcast together; Mean is Sum / n.
class VariadicKernel : public OpKernel {
 public:
  VariadicKernel(kc::BinaryOp op, const graph::Node& n) : op_(op), mean_(n.op_type() == "Mean"), node_(n.Describe()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const int n = ctx.num_inputs();
    // Fold the broadcast over the inputs pairwise: no per-run allocation for any n.
    TensorView acc = *ctx.input(0);
    for (int i = 1; i < n; ++i) {
      const TensorView* pair[2] = {&acc, ctx.input(i)};
      int64_t dims[kMaxRank];
      int rank;
      RETURN_IF_ERROR(BroadcastOrError(node_, pair, dims, &rank));
      acc.rank = rank;
      std::copy(dims, dims + rank, acc.dims);
    }
    TensorView* out = ctx.Output(0, acc.dim_span());
    if (!out) return absl::OkStatus();
    const TensorView* in0 = ctx.input(0);
    if (n == 1) {  // the input itself (not op(x, x): Sum would double it)
      if (in0->nbytes()) std::memcpy(out->data, in0->data, in0->nbytes());
      return absl::OkStatus();
    }
    kc::Binary(op_, *in0, *ctx.input(1), *out, ctx.thread_pool());
    for (int i = 2; i < n; ++i) kc::Binary(op_, *out, *ctx.input(i), *out, ctx.thread_pool());
    if (mean_) {
      if (out->dtype == DT::kFloat64) Scale<double>(*out, n);
      else Scale<float>(*out, n);
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  static void Scale(TensorView& t, int n) {
    T* p = t.as<T>();
    const T inv = T(1) / static_cast<T>(n);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= inv;
  }

  kc::BinaryOp op_;
  bool mean_;
  std::string node_;
};

class WhereKernel : public OpKernel {
 public:
  WhereKernel(const graph::Node& n, int) : node_(n.Describe()) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* ins[3] = {ctx.input(0), ctx.input(1), ctx.input(2)};
    int64_t dims[kMaxRank];
    int rank;
    RETURN_IF_ERROR(BroadcastOrError(node_, ins, dims, &rank));
    TensorView* out = ctx.Output(0, std::span<const int64_t>(dims, rank));
    if (out) kc::Where(*ins[0], *ins[1], *ins[2], *out, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  std::string node_;
};

// Clip: bounds are float attributes before version 11 (float types only), optional
// one-element inputs of the data's dtype from version 11.
class ClipKernel : public OpKernel {
 public:
  ClipKernel(const graph::Node& n, int version)
      : node_(n.Describe()), from_inputs_(version >= 11) {
    constexpr float kMax = std::numeric_limits<float>::max();
    lo_f_ = n.AttrFloat("min", -kMax);
    hi_f_ = n.AttrFloat("max", kMax);
    lo_d_ = lo_f_;
    hi_d_ = hi_f_;
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = ctx.input(0);
    const void* lo;
    const void* hi;
    if (from_inputs_) {
      RETURN_IF_ERROR(Bound(ctx, 1, "min", &lo));
      RETURN_IF_ERROR(Bound(ctx, 2, "max", &hi));
    } else {
      bool f32 = x->dtype == DataType::kFloat32;
      lo = f32 ? static_cast<const void*>(&lo_f_) : &lo_d_;
      hi = f32 ? static_cast<const void*>(&hi_f_) : &hi_d_;
    }
    if (TensorView* y = ctx.Output(0, x->dim_span())) kc::Clip(*x, lo, hi, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  absl::Status Bound(KernelContext& ctx, int i, const char* what, const void** p) const {
    const TensorView* t = i < ctx.num_inputs() ? ctx.input(i) : nullptr;
    *p = t ? t->data : nullptr;
    if (t && t->numel() != 1)
      return InvalidArgument(node_, ": expected one element for ", what, ", got shape ",
                             DimsToString(t->dims, t->rank));
    return absl::OkStatus();
  }

  std::string node_;
  bool from_inputs_;
  float lo_f_, hi_f_;
  double lo_d_, hi_d_;
};

class CastKernel : public OpKernel {
 public:
  CastKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = ctx.input(0);
    if (TensorView* y = ctx.Output(0, x->dim_span())) kc::Cast(*x, *y, ctx.thread_pool());
    return absl::OkStatus();
  }
};

// Gelu's `approximate` attribute picks the exact (erf) or the tanh form.
absl::StatusOr<std::unique_ptr<OpKernel>> CreateGelu(const graph::Node& n, int) {
  std::string approx = n.AttrString("approximate", "none");
  if (approx != "none" && approx != "tanh")
    return InvalidArgument(n.Describe(), ": expected attribute approximate to be \"none\" or ",
                           "\"tanh\", got \"", approx, "\"");
  return std::unique_ptr<OpKernel>(
      new UnaryKernel(approx == "tanh" ? kc::UnaryOp::kGeluTanh : kc::UnaryOp::kGelu));
}

// The activations with attributes (LeakyRelu, Elu, Selu, Celu, HardSigmoid, HardSwish,
// ThresholdedRelu), their defaults as ONNX gives them.
class ActivationKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    using A = kc::ActivationOp;
    const std::string& op = n.op_type();
    const graph::ActivationAttrs a = graph::ActivationAttrsOf(n);
    kc::ActivationParams p;
    p.alpha = a.alpha;
    p.beta = a.beta;
    p.gamma = a.gamma;
    if (op == "LeakyRelu") p.op = A::kLeakyRelu;
    else if (op == "Elu") p.op = A::kElu;
    else if (op == "Selu") p.op = A::kSelu;
    else if (op == "Celu") p.op = A::kCelu;
    else if (op == "HardSigmoid") p.op = A::kHardSigmoid;
    else if (op == "HardSwish") p.op = A::kHardSwish;
    else if (op == "ThresholdedRelu") p.op = A::kThresholdedRelu;
    else return InvalidArgument(n.Describe(), ": not an activation with attributes");
    if (p.op == A::kCelu && p.alpha == 0) return InvalidArgument(n.Describe(), ": expected a non-zero alpha, got 0");
    return std::unique_ptr<OpKernel>(new ActivationKernel(p));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = ctx.input(0);
    if (TensorView* y = ctx.Output(0, x->dim_span())) kc::ApplyActivation(p_, *x, *y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  explicit ActivationKernel(kc::ActivationParams p) : p_(p) {}
  kc::ActivationParams p_;
};

KernelFactory UnaryFactory(kc::UnaryOp op) {
  return [op](const graph::Node&, int) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new UnaryKernel(op));
  };
}

template <typename K>
KernelFactory OpFactory(kc::BinaryOp op) {
  return [op](const graph::Node& n, int) -> absl::StatusOr<std::unique_ptr<OpKernel>> {
    return std::unique_ptr<OpKernel>(new K(op, n));
  };
}

// The first version the op table says cleave implements, so the two never disagree.
int FirstVersion(std::string_view domain, std::string_view op) {
  const graph::OpDef* def = graph::FindOp(std::string(domain), std::string(op));
  CLEAVE_CHECK(def != nullptr);
  return def->first_supported;
}

KernelDef Def(std::string_view domain, std::string_view op, SupportsFn supports,
              KernelFactory create) {
  return KernelDef{std::string(domain), std::string(op), FirstVersion(domain, op), 1 << 30,
                   std::move(supports), std::move(create)};
}

}  // namespace

void RegisterElementwiseKernels(KernelRegistry& r) {
  using U = kc::UnaryOp;
  struct UnaryRow {
    const char* op;
    U fn;
    const std::vector<DT>* types;
  };
  const UnaryRow unary[] = {
      {"Abs", U::kAbs, &kNumericTypes},        {"Neg", U::kNeg, &kSignedTypes},
      {"Relu", U::kRelu, &kSignedTypes},       {"Exp", U::kExp, &kFloatTypes},
      {"Log", U::kLog, &kFloatTypes},          {"Sqrt", U::kSqrt, &kFloatTypes},
      {"Reciprocal", U::kReciprocal, &kFloatTypes}, {"Sin", U::kSin, &kFloatTypes},
      {"Cos", U::kCos, &kFloatTypes},          {"Tanh", U::kTanh, &kFloatTypes},
      {"Erf", U::kErf, &kFloatTypes},          {"Sigmoid", U::kSigmoid, &kFloatTypes},
      {"Not", U::kNot, &kBoolType},            {"Sign", U::kSign, &kNumericTypes},
      {"Tan", U::kTan, &kFloatTypes},          {"Asin", U::kAsin, &kFloatTypes},
      {"Acos", U::kAcos, &kFloatTypes},        {"Atan", U::kAtan, &kFloatTypes},
      {"Sinh", U::kSinh, &kFloatTypes},        {"Cosh", U::kCosh, &kFloatTypes},
      {"Asinh", U::kAsinh, &kFloatTypes},      {"Acosh", U::kAcosh, &kFloatTypes},
      {"Atanh", U::kAtanh, &kFloatTypes},      {"Softplus", U::kSoftplus, &kFloatTypes},
      {"Softsign", U::kSoftsign, &kFloatTypes}, {"Mish", U::kMish, &kFloatTypes},
      {"Floor", U::kFloor, &kFloatTypes},      {"Ceil", U::kCeil, &kFloatTypes},
      {"Round", U::kRound, &kFloatTypes},
  };
  for (const UnaryRow& u : unary)
    r.Register(Def("", u.op, InputTypeIn(0, *u.types), UnaryFactory(u.fn)));
  r.Register(Def("", "Gelu", InputTypeIn(0, kFloatTypes), CreateGelu));
  for (const char* op : {"LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "ThresholdedRelu"})
    r.Register(Def("", op, InputTypeIn(0, kFloatTypes), MakeCheckedFactory<ActivationKernel>()));
  r.Register(Def(graph::kCleaveDomain, "Gelu", InputTypeIn(0, kFloatTypes), CreateGelu));

  using B = kc::BinaryOp;
  struct BinaryRow {
    const char* op;
    B fn;
    const std::vector<DT>* types;
  };
  const std::vector<DT> equal_types = With(kNumericTypes, kBoolType);
  const BinaryRow binary[] = {
      {"Add", B::kAdd, &kNumericTypes},         {"Sub", B::kSub, &kNumericTypes},
      {"Mul", B::kMul, &kNumericTypes},         {"Div", B::kDiv, &kNumericTypes},
      {"Equal", B::kEqual, &equal_types},       {"Less", B::kLess, &kNumericTypes},
      {"Greater", B::kGreater, &kNumericTypes}, {"LessOrEqual", B::kLessOrEqual, &kNumericTypes},
      {"GreaterOrEqual", B::kGreaterOrEqual, &kNumericTypes},
      {"And", B::kAnd, &kBoolType},             {"Or", B::kOr, &kBoolType},
      {"Xor", B::kXor, &kBoolType},             {"PRelu", B::kPRelu, &kNumericTypes},
      {"BitwiseAnd", B::kBitAnd, &kIntegerTypes}, {"BitwiseOr", B::kBitOr, &kIntegerTypes},
      {"BitwiseXor", B::kBitXor, &kIntegerTypes},
  };
  for (const BinaryRow& b : binary)
    r.Register(Def("", b.op, AllOf({InputTypeIn(0, *b.types), InputTypeIn(1, *b.types)}),
                   OpFactory<BinaryKernel>(b.fn)));
  r.Register(Def("", "Max", InputTypeIn(0, kNumericTypes), OpFactory<VariadicKernel>(B::kMax)));
  r.Register(Def("", "Min", InputTypeIn(0, kNumericTypes), OpFactory<VariadicKernel>(B::kMin)));
  r.Register(Def("", "Sum", InputTypeIn(0, kFloatTypes), OpFactory<VariadicKernel>(B::kAdd)));
  r.Register(Def("", "Mod", AllOf({InputTypeIn(0, kNumericTypes), InputTypeIn(1, kNumericTypes)}), CreateMod));
  r.Register(Def("", "BitShift", AllOf({InputTypeIn(0, kIntegerTypes), InputTypeIn(1, kIntegerTypes)}),
                 CreateBitShift));
  for (const char* op : {"IsNaN", "IsInf"})
    r.Register(Def("", op, InputTypeIn(0, kFloatTypes), MakeFactory<FloatClassKernel>()));
  r.Register(Def("", "Mean", InputTypeIn(0, kFloatTypes), OpFactory<VariadicKernel>(B::kAdd)));
  r.Register(Def("", "Pow", AllOf({InputTypeIn(0, kPowBaseTypes), InputTypeIn(1, kNumericTypes)}),
                 MakeFactory<PowKernel>()));
  r.Register(Def("", "Where",
                 AllOf({InputTypeIn(0, kBoolType), InputTypeIn(1, kAllTypes)}),
                 MakeFactory<WhereKernel>()));
  r.Register(Def("", "Clip",
                 [](const graph::Node& n, int version) -> std::string {
                   // Before version 11 the bounds are float attributes: float types only.
                   return InputTypeIn(0, version >= 11 ? kNumericTypes : kFloatTypes)(n, version);
                 },
                 MakeFactory<ClipKernel>()));
  r.Register(Def("", "Cast", AllOf({InputTypeIn(0, kAllTypes), InputTypeIn(-1, kAllTypes)}),
                 MakeFactory<CastKernel>()));
  // CastLike: a Cast to input 1's type (the output's, which the kernel writes).
  r.Register(Def("", "CastLike", AllOf({InputTypeIn(0, kAllTypes), InputTypeIn(1, kAllTypes)}),
                 MakeFactory<CastKernel>()));
}

}  // namespace cleave::providers
