// The CUDA provider's kernel table (providers/cuda/): OpKernels that check shapes on the
// host and enqueue the kernels of kernels/cuda/ (or cuBLASLt) on the provider's stream. The
// data-movement kernels are in cuda_layout_kernels.cc, the optimizer kernels in
// cuda_optimizer_kernels.cc, the attention kernels in cuda_attention_kernels.cc, the losses in
// cuda_loss_kernels.cc, Conv in cuda_conv_kernels.cc, the axis and padding kernels in
// cuda_axis_kernels.cc, softmax, the normalisations and the reductions in cuda_norm_kernels.cc,
// the collectives in cuda_collectives.cc.
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/nn.h"
#include "kernels/cuda/kernels.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_matmul.h"
#include "providers/cuda/cuda_provider.h"
#include "providers/random_key.h"

namespace cleave::providers {
namespace {

// ---- elementwise ----------------------------------------------------------------------

// The dims the inputs broadcast to, or the error naming the node and the first pair that does not.
absl::StatusOr<std::vector<int64_t>> BroadcastDims(const std::string& name, KernelContext& ctx) {
  int rank = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) rank = std::max(rank, ctx.input(i)->rank);
  if (rank > kc::kMaxRank) return Unimplemented(name, ": rank ", rank, " over ", kc::kMaxRank);
  std::vector<int64_t> out(rank, 1);
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const TensorView& t = *ctx.input(i);
    for (int d = 0; d < t.rank; ++d) {
      int64_t& o = out[rank - t.rank + d];
      if (t.dims[d] != o && t.dims[d] != 1 && o != 1)
        return InvalidArgument(name, ": input ", i, " ", DimsToString(t.shape()), " does not broadcast to ",
                               DimsToString(out));
      if (t.dims[d] != 1) o = t.dims[d];
    }
  }
  return out;
}

// The element strides of a and b per dim of `out` (which both broadcast to); false when both
// are whole (no broadcasting).
bool PairStrides(const std::vector<int64_t>& out, const TensorView& a, const TensorView& b, kc::Broadcast* bc) {
  const int rank = static_cast<int>(out.size());
  bc->rank = rank;
  int64_t sa = 1, sb = 1, n = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int ia = d - (rank - a.rank), ib = d - (rank - b.rank);
    const int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
    bc->out_dims[d] = out[d];
    bc->a_strides[d] = da == 1 ? 0 : sa;
    bc->b_strides[d] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
    n *= out[d];
  }
  return a.numel() != n || b.numel() != n;
}

// The output of a two-operand node, a and b broadcast together: its strides per output dim in
// bc, and whether a and b are both whole (no broadcasting). *y is null when there is nothing
// to write.
absl::Status BroadcastOutput(const std::string& name, KernelContext& ctx, kc::Broadcast* bc, TensorView** y,
                             bool* same) {
  ASSIGN_OR_RETURN(const std::vector<int64_t> out, BroadcastDims(name, ctx));
  *same = !PairStrides(out, *ctx.input(0), *ctx.input(1), bc);
  *y = ctx.Output(0, out);
  return absl::OkStatus();
}

kc::BinaryOp BinaryOpOf(const graph::Node& n) {
  const std::string& o = n.op_type();
  if (o == "Mod") return n.AttrInt("fmod", 0) ? kc::BinaryOp::kFmod : kc::BinaryOp::kMod;
  if (o == "BitShift") return n.AttrString("direction", "") == "LEFT" ? kc::BinaryOp::kShiftLeft : kc::BinaryOp::kShiftRight;
  if (o == "BitwiseAnd") return kc::BinaryOp::kBitAnd;
  if (o == "BitwiseOr") return kc::BinaryOp::kBitOr;
  if (o == "BitwiseXor") return kc::BinaryOp::kBitXor;
  return o == "Add" || o == "Sum" || o == "Mean" ? kc::BinaryOp::kAdd : o == "Sub" ? kc::BinaryOp::kSub
       : o == "Mul" ? kc::BinaryOp::kMul : o == "Div" ? kc::BinaryOp::kDiv : o == "Max" ? kc::BinaryOp::kMax
       : o == "Min" ? kc::BinaryOp::kMin : o == "PRelu" ? kc::BinaryOp::kPRelu : kc::BinaryOp::kPow;
}

// Add, Sub, Mul, Div, Max, Min, Mod, Pow over float types; all but Pow over the integers too, and
// the integers' bitwise ops and shifts.
// Pow's exponent may be of any number type (converted to the base's, as an exact small integer
// exponent is; the CPU raises a float base to an integer exponent in double).
// Max, Min, Sum and Mean take any number of inputs, folded left to right into the output (Mean
// then scaled by 1 / n in the element type, as the CPU's).
class BinaryKernel : public CudaKernel {
 public:
  BinaryKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), op_(BinaryOpOf(n)), mean_(n.op_type() == "Mean") {}
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(const std::vector<int64_t> out, BroadcastDims(name_, ctx));
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    const TensorView& x0 = *ctx.input(0);
    if (ctx.num_inputs() == 1) return Copy(y->data, x0.data, x0.nbytes());  // out is its dims
    for (int i = 1; i < ctx.num_inputs(); ++i) {
      const TensorView& a = i == 1 ? x0 : *y;
      TensorView b = *ctx.input(i);
      if (b.dtype != a.dtype) {  // Pow's exponent of another type: converted to the base's first
        void* converted = ctx.Scratch(static_cast<size_t>(b.numel()) * ElementSize(a.dtype));
        if (!converted && b.numel() > 0) return NoScratch();
        RETURN_IF_ERROR(Check(kc::CastElem(ElemOf(b.dtype), ElemOf(a.dtype), b.data, converted, b.numel(), stream())));
        b.data = converted;
        b.dtype = a.dtype;
      }
      kc::Broadcast bc;
      const bool broadcast = PairStrides(out, a, b, &bc);
      const int err = IsInteger(a.dtype)
                          ? kc::IntBinary(op_, ElemOf(a.dtype), a.data, b.data, y->data, y->numel(),
                                          broadcast ? &bc : nullptr, stream())
                          : kc::Binary(op_, DtOf(a.dtype), a.data, b.data, y->data, y->numel(),
                                       broadcast ? &bc : nullptr, stream());
      RETURN_IF_ERROR(Check(err));
    }
    if (!mean_) return absl::OkStatus();
    const float inv = 1.f / static_cast<float>(ctx.num_inputs());
    return Check(kc::GemmScaleAdd(DtOf(y->dtype), y->data, inv, nullptr, 0.f, 1, y->numel(), 1, 1, stream()));
  }

 private:
  kc::BinaryOp op_;
  bool mean_;
};

// Equal, Less, Greater, LessOrEqual, GreaterOrEqual (bool out), And, Or, Xor; Not.
class CompareKernel : public CudaKernel {
 public:
  CompareKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {
    const std::string& o = n.op_type();
    not_ = o == "Not";
    op_ = o == "Equal" ? kc::CompareOp::kEqual : o == "Less" ? kc::CompareOp::kLess
        : o == "Greater" ? kc::CompareOp::kGreater : o == "LessOrEqual" ? kc::CompareOp::kLessOrEqual
        : o == "GreaterOrEqual" ? kc::CompareOp::kGreaterOrEqual : o == "And" ? kc::CompareOp::kAnd
        : o == "Xor" ? kc::CompareOp::kXor : kc::CompareOp::kOr;
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    if (not_) {
      TensorView* y = ctx.Output(0, a.dim_span());
      return y ? Check(kc::Not(a.as<bool>(), y->as<bool>(), a.numel(), stream())) : absl::OkStatus();
    }
    const TensorView& b = *ctx.input(1);
    kc::Broadcast bc;
    TensorView* y = nullptr;
    bool same = false;
    RETURN_IF_ERROR(BroadcastOutput(name_, ctx, &bc, &y, &same));
    if (!y) return absl::OkStatus();
    return Check(kc::Compare(op_, ElemOf(a.dtype), a.data, b.data, y->as<bool>(), y->numel(), same ? nullptr : &bc,
                             stream()));
  }

 private:
  kc::CompareOp op_;
  bool not_ = false;
};

// IsNaN, and IsInf {detect_positive, detect_negative}: bool of x's shape.
class FloatClassKernel : public CudaKernel {
 public:
  FloatClassKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), nan_(n.op_type() == "IsNaN"), pos_(n.AttrInt("detect_positive", 1) != 0),
        neg_(n.AttrInt("detect_negative", 1) != 0) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return Check(kc::FloatClass(DtOf(x.dtype), x.data, y->as<bool>(), x.numel(), nan_, pos_, neg_, stream()));
  }

 private:
  bool nan_, pos_, neg_;
};

// The unary ops by name, with the attributes of the activations that have them (their ONNX
// defaults, as the CPU kernels read them).
const std::map<std::string, kc::UnaryOp>& UnaryOps() {
  using U = kc::UnaryOp;
  static const auto* ops = new std::map<std::string, kc::UnaryOp>{
      {"Relu", U::kRelu},         {"Tanh", U::kTanh},         {"Exp", U::kExp},
      {"Log", U::kLog},           {"Neg", U::kNeg},           {"Sqrt", U::kSqrt},
      {"Sigmoid", U::kSigmoid},   {"Erf", U::kErf},           {"Reciprocal", U::kReciprocal},
      {"Abs", U::kAbs},           {"Sin", U::kSin},           {"Cos", U::kCos},
      {"Tan", U::kTan},           {"Asin", U::kAsin},         {"Acos", U::kAcos},
      {"Atan", U::kAtan},         {"Sinh", U::kSinh},         {"Cosh", U::kCosh},
      {"Asinh", U::kAsinh},       {"Acosh", U::kAcosh},       {"Atanh", U::kAtanh},
      {"Softplus", U::kSoftplus}, {"Softsign", U::kSoftsign}, {"Mish", U::kMish},
      {"Floor", U::kFloor},       {"Ceil", U::kCeil},         {"Round", U::kRound},
      {"Sign", U::kSign},         {"LeakyRelu", U::kLeakyRelu}, {"Elu", U::kElu},
      {"Selu", U::kSelu},         {"Celu", U::kCelu},         {"HardSigmoid", U::kHardSigmoid},
      {"HardSwish", U::kHardSwish}, {"ThresholdedRelu", U::kThresholdedRelu}};
  return *ops;
}

class UnaryKernel : public CudaKernel {
 public:
  UnaryKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {
    const std::string& o = n.op_type();
    const bool tanh_gelu = n.AttrString("approximate", "none") == "tanh";
    if (o == "Gelu") {
      op_ = tanh_gelu ? kc::UnaryOp::kGeluTanh : kc::UnaryOp::kGelu;
    } else {
      auto it = UnaryOps().find(o);
      op_ = it == UnaryOps().end() ? kc::UnaryOp::kIdentity : it->second;
    }
    const graph::ActivationAttrs a = graph::ActivationAttrsOf(n);
    params_ = {a.alpha, a.beta, a.gamma};
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return Check(kc::Unary(op_, DtOf(x.dtype), x.data, y->data, x.numel(), stream(), params_));
  }

 private:
  kc::UnaryOp op_;
  kc::UnaryParams params_;
};

// Clip: the bounds are float attributes before version 11 (default -+FLT_MAX, as the CPU's),
// optional one-element inputs of x's dtype (on the host) from 11 (default -+inf).
class ClipKernel : public CudaKernel {
 public:
  ClipKernel(const CudaExecutionProvider* p, const graph::Node& n, int version)
      : CudaKernel(p, n), from_inputs_(version >= 11), lo_(n.AttrFloat("min", -FLT_MAX)),
        hi_(n.AttrFloat("max", FLT_MAX)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    float lo = from_inputs_ ? -INFINITY : lo_, hi = from_inputs_ ? INFINITY : hi_;
    if (from_inputs_) {
      RETURN_IF_ERROR(Bound(ctx, 1, "min", &lo));
      RETURN_IF_ERROR(Bound(ctx, 2, "max", &hi));
    }
    TensorView* y = ctx.Output(0, x.dim_span());
    return y ? Check(kc::Clip(DtOf(x.dtype), x.data, y->data, x.numel(), lo, hi, stream())) : absl::OkStatus();
  }

 private:
  absl::Status Bound(KernelContext& ctx, int i, const char* what, float* v) const {
    const TensorView* t = i < ctx.num_inputs() ? ctx.input(i) : nullptr;
    if (!t) return absl::OkStatus();
    if (t->numel() != 1)
      return InvalidArgument(name_, ": expected one element for ", what, ", got shape ", DimsToString(t->shape()));
    const uint16_t bits = t->dtype == DataType::kFloat32 ? 0 : *t->as<uint16_t>();
    *v = t->dtype == DataType::kFloat32 ? *t->as<float>()
         : t->dtype == DataType::kBFloat16 ? BFloat16ToFloat(bits) : HalfToFloat(bits);
    return absl::OkStatus();
  }
  bool from_inputs_;
  float lo_, hi_;
};

// Cast (and CastLike) among float32, bf16, fp16, float64, the signed and unsigned integers of 8
// to 64 bits and bool, converting as the CPU does (an image's uint8 pixels to float on the device).
class CastKernel : public CudaKernel {
 public:
  CastKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (x.dtype == y->dtype) return Copy(y->data, x.data, x.nbytes());
    return Check(kc::CastElem(ElemOf(x.dtype), ElemOf(y->dtype), x.data, y->data, x.numel(), stream()));
  }
};

class GeluGradKernel : public CudaKernel {
 public:
  GeluGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), tanh_(n.AttrString("approximate", "none") == "tanh") {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    if (dy.shape() != x.shape())
      return InvalidArgument(name_, ": dY ", DimsToString(dy.shape()), " and X ", DimsToString(x.shape()), " differ");
    TensorView* dx = ctx.Output(0, x.dim_span());
    if (!dx) return absl::OkStatus();
    return Check(kc::GeluGrad(DtOf(x.dtype), dy.data, x.data, dx->data, x.numel(), tanh_, stream()));
  }

 private:
  bool tanh_;
};

// RotaryEmbedding(x, cos, sin) -> y and RotaryEmbeddingGrad(dY, cos, sin) -> dX, the layout
// planned as the CPU plans it.
class RotaryKernel : public CudaKernel {
 public:
  RotaryKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), backward_(n.op_type() == "RotaryEmbeddingGrad") {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& cos = *ctx.input(1);
    const TensorView& sin = *ctx.input(2);
    if (cos.shape() != sin.shape() || cos.dtype != x.dtype || sin.dtype != x.dtype)
      return InvalidArgument(name_, ": expected cos and sin of one shape and of x's type, got ",
                             DimsToString(cos.shape()), " and ", DimsToString(sin.shape()));
    absl::StatusOr<kernels::RotaryLayout> l = kernels::cpu::PlanRotary(x.dim_span(), cos.dim_span());
    if (!l.ok()) return InvalidArgument(name_, ": ", l.status().message());
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    return Check(kc::Rotary(DtOf(x.dtype), *l, backward_, x.data, cos.data, sin.data, y->data, stream()));
  }

 private:
  bool backward_;
};

// SwiGLU(gate, up) -> silu(gate) * up, and SwiGLUGrad(dY, gate, up) -> dGate, dUp: every operand
// of one shape and type.
class SwiGluKernel : public CudaKernel {
 public:
  SwiGluKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), grad_(n.op_type() == "SwiGLUGrad") {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& first = *ctx.input(0);
    for (int i = 1; i < ctx.num_inputs(); ++i)
      if (ctx.input(i)->shape() != first.shape() || ctx.input(i)->dtype != first.dtype)
        return InvalidArgument(name_, ": expected input ", i, " of input 0's shape ", DimsToString(first.shape()),
                               " and type, got ", DimsToString(ctx.input(i)->shape()));
    const kc::Dt dt = DtOf(first.dtype);
    if (!grad_) {
      TensorView* y = ctx.Output(0, first.dim_span());
      if (!y) return absl::OkStatus();
      return Check(kc::SwiGlu(dt, first.data, ctx.input(1)->data, y->data, first.numel(), stream()));
    }
    TensorView* dgate = ctx.Output(0, first.dim_span());
    TensorView* dup = ctx.Output(1, first.dim_span());
    if (!dgate && !dup) return absl::OkStatus();
    return Check(kc::SwiGluGrad(dt, first.data, ctx.input(1)->data, ctx.input(2)->data, dgate ? dgate->data : nullptr,
                                dup ? dup->data : nullptr, first.numel(), stream()));
  }

 private:
  bool grad_;
};

// Dropout(x[, ratio, training_mode]) -> y[, mask], as the CPU's: with a run seed (training),
// the counter-based mask the CPU draws under it (the same bits); without one, a node with a
// seed attribute draws numpy's sequence from its own MT19937 on the host (the ONNX reference's
// masks, run after run) and uploads the mask; one without draws a fresh Philox key per run.
// Inference copies.
class DropoutKernel : public CudaKernel {
 public:
  DropoutKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), seeded_(n.HasAttr("seed")) {
    for (unsigned char c : n.name()) salt_ = (salt_ ^ c) * 1099511628211ull;
    // Seeds are taken mod 2^32, as MT19937 (and numpy's RandomState) take them.
    if (seeded_) gen_.seed(static_cast<uint32_t>(n.AttrInt("seed", 0)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* ratio_in = ctx.num_inputs() > 1 ? ctx.input(1) : nullptr;
    const TensorView* training_in = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    for (const TensorView* t : {ratio_in, training_in})
      if (t && t->numel() != 1)
        return InvalidArgument(name_, ": expected scalar ratio and training_mode, got an input of shape ",
                               DimsToString(t->shape()));
    float ratio = 0.5f;
    if (ratio_in) ratio = ratio_in->dtype == DataType::kFloat64 ? static_cast<float>(*ratio_in->as<double>())
                                                                : *ratio_in->as<float>();
    const bool training = training_in && *training_in->as<bool>();
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* mask = ctx.Output(1, x.dim_span());
    if (!training || ratio == 0.f) {
      if (y) RETURN_IF_ERROR(Copy(y->data, x.data, x.nbytes()));
      if (mask) RETURN_IF_ERROR(Check(cudaMemsetAsync(mask->data, 1, x.numel(), static_cast<cudaStream_t>(stream()))));
      return absl::OkStatus();
    }
    if (!(ratio > 0.f && ratio < 1.f)) return InvalidArgument(name_, ": expected ratio in [0, 1), got ", ratio);
    // y is required by ONNX; should a graph read only the mask, y goes to scratch (the draws
    // still advance a seeded node's generator by one mask).
    void* out = y ? y->data : ctx.Scratch(x.nbytes());
    if (!out) return NoScratch();
    if (ctx.run_seed() == KernelContext::kNoRunSeed && seeded_) return DrawOnHost(ctx, x, ratio, out, mask);
    // With a run seed, the CPU's key; without one, a fresh key per run from this node's counter.
    const uint64_t key = ctx.run_seed() != KernelContext::kNoRunSeed
                             ? (ctx.run_seed() * 0xd1342543de82ef95ull ^ salt_)
                             : (salt_ ^ (0x9e3779b97f4a7c15ull * ++runs_));
    return Check(kc::DropoutKeyed(DtOf(x.dtype), key, ratio, x.data, out, mask ? mask->as<bool>() : nullptr,
                                  x.numel(), stream()));
  }

 private:
  absl::Status DrawOnHost(KernelContext& ctx, const TensorView& x, float ratio, void* out, TensorView* mask) const {
    const int64_t n = x.numel();
    bool* keep = mask ? mask->as<bool>() : ctx.ScratchOf<bool>(n);
    if (!keep) return NoScratch();
    std::vector<uint8_t> drawn(static_cast<size_t>(n));  // bool's bytes
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t i = 0; i < n; ++i) drawn[i] = kernels::cpu::DrawKeep(gen_, static_cast<double>(ratio));
    }
    TensorView host(drawn.data(), DataType::kBool, x.dim_span());
    TensorView dev(keep, DataType::kBool, x.dim_span());
    RETURN_IF_ERROR(p_->CopyTensor(host, dev));
    return Check(kc::DropoutMasked(DtOf(x.dtype), keep, ratio, x.data, out, n, stream()));
  }

  bool seeded_;
  uint64_t salt_ = 1469598103934665603ull;
  mutable std::atomic<uint64_t> runs_{0};
  mutable std::mutex mu_;
  mutable std::mt19937 gen_;
};

// Dropout before version 12: the ratio an attribute, no training_mode input, so the identity
// (ONNX runs those graphs in inference); the mask (bool, or of x's type before version 10) all ones.
class LegacyDropoutKernel : public CudaKernel {
 public:
  LegacyDropoutKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (TensorView* y = ctx.Output(0, x.dim_span())) RETURN_IF_ERROR(Copy(y->data, x.data, x.nbytes()));
    TensorView* mask = ctx.Output(1, x.dim_span());
    if (!mask) return absl::OkStatus();
    const uint64_t one = mask->dtype == DataType::kFloat32 ? 0x3f800000u
                         : mask->dtype == DataType::kBFloat16 ? 0x3f80u
                         : mask->dtype == DataType::kFloat16 ? 0x3c00u : 1u;
    return Check(kc::Fill(static_cast<int>(ElementSize(mask->dtype)), one, mask->data, x.numel(), stream()));
  }
};

// RandomNormal, RandomUniform, their Like forms and Bernoulli: the draws in double (into the
// output for float64, else scratch), cast into the output's type; Bernoulli's probabilities
// widened to double first. The key is the CPU kernel's (providers/random_key.h), so a seeded
// node draws the CPU's numbers.
class RandomKernel : public CudaKernel {
 public:
  RandomKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n), spec_(n), keys_(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* x = spec_.like ? ctx.input(0) : nullptr;
    TensorView* y = spec_.like ? ctx.Output(0, x->dim_span()) : ctx.Output(0, spec_.shape);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const int64_t n = y->numel();
    auto s = stream();
    const double* p = nullptr;
    if (spec_.kind == kc::RandomKind::kBernoulli) {
      if (x->dtype == DataType::kFloat64) {
        p = x->as<double>();
      } else {
        double* wide = ctx.ScratchOf<double>(n);
        if (!wide) return NoScratch();
        RETURN_IF_ERROR(Check(kc::CastElem(ElemOf(x->dtype), kc::Elem::kF64, x->data, wide, n, s)));
        p = wide;
      }
    }
    const bool direct = y->dtype == DataType::kFloat64;
    double* draws = direct ? y->as<double>() : ctx.ScratchOf<double>(n);
    if (!draws) return NoScratch();
    RETURN_IF_ERROR(Check(kc::RandomDraw(spec_.kind, keys_.Next(ctx), spec_.a, spec_.b, p, draws, n, s)));
    if (direct) return absl::OkStatus();
    return Check(kc::CastElem(kc::Elem::kF64, ElemOf(y->dtype), draws, y->data, n, s));
  }

 private:
  RandomSpec spec_;
  RandomKeys keys_;
};

// ---- products -------------------------------------------------------------------------

class MatMulKernel : public CudaKernel {
 public:
  MatMulKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {
    // FusedMatMul's bias, and the low-precision products' (MatMulBf16 / MatMulF16 + a bias of the result's type).
    fused_ = n.op_type() == "FusedMatMul" || n.num_inputs() > 2;
    trans_a_ = n.AttrInt("transA", 0) != 0;
    trans_b_ = n.AttrInt("transB", 0) != 0;
    dbias_of_a_ = n.AttrInt("dbias_operand", 1) == 0;
    has_dbias_ = n.num_outputs() > 1 && n.output(1) != nullptr;
    rows_ = n.AttrInt("rows", -1);
    const std::string act = n.AttrString("activation", "");
    gelu_ = act == "gelu";
    gelu_tanh_ = act == "gelu_tanh";
    const std::string act_grad = n.AttrString("activation_grad", "");
    gelu_grad_ = !act_grad.empty();
    gelu_grad_tanh_ = act_grad == "gelu_tanh";
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    const TensorView* bias = fused_ && ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    // MatMulBf16 / MatMulF16's accumulation buffer (input 3) and its reset flag (input 4, host).
    const TensorView* acc = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    auto plan = kernels::cpu::PlanMatMul(a.dim_span(), b.dim_span(), trans_b_, trans_a_);
    if (!plan.ok()) return Named(plan.status());
    int64_t lda = 0;
    if (rows_ >= 0) {
      // Only op(A)'s first `rows` rows: a prefix of A's rows, or with transA of its columns.
      if (a.rank != 2 || rows_ > plan->M || (dbias_of_a_ && has_dbias_))
        return InvalidArgument(name_, ": rows = ", rows_, " needs a 2-D A with at least that many rows of op(A) ",
                               "(and no dbias of A), got ", DimsToString(a.shape()), trans_a_ ? " (transA)" : "");
      lda = trans_a_ ? plan->M : plan->K;
      plan->M = plan->out_dims[0] = rows_;
    }
    if (bias && (bias->rank != 1 || bias->dims[0] != plan->N))
      return InvalidArgument(name_, ": expected bias of shape [", plan->N, "], got ", DimsToString(bias->shape()));
    TensorView* y = ctx.Output(0, plan->out_shape());
    if (!y) return absl::OkStatus();
    if (acc && (acc->shape() != y->shape() || acc->dtype != DataType::kFloat32 || ctx.num_inputs() < 5 || !ctx.input(4)))
      return InvalidArgument(name_, ": expected a float32 accumulation buffer of the result's shape ",
                             DimsToString(y->shape()), " and its reset flag");
    // MatMulBf16 / MatMulF16's GELU input: written (output 2, with the activation) or read
    // (input 5, activation_grad).
    TensorView* pre = (gelu_ || gelu_tanh_) && ctx.num_outputs() > 2 ? ctx.Output(2, y->shape()) : nullptr;
    const TensorView* gelu_in = gelu_grad_ && ctx.num_inputs() > 5 ? ctx.input(5) : nullptr;
    if (gelu_grad_ && !gelu_in) return InvalidArgument(name_, ": activation_grad needs the GELU input (input 5)");
    if (pre || gelu_in) return GeluProduct(ctx, *plan, a, b, bias, acc, y, pre, gelu_in);
    // MatMulBf16 and MatMulF16 take low-precision operands and give a float32 result, or (`to`) one of
    // their own type, which the epilogue rounds to once.
    // MatMulBf16 / MatMulF16's dbias (output 1): the bias gradient of the operand read as [K, C].
    const TensorView& summed = dbias_of_a_ ? a : b;
    TensorView* db = nullptr;
    if (has_dbias_) {
      if (summed.rank != 2 || (dbias_of_a_ ? !trans_a_ : trans_b_))
        return InvalidArgument(name_, ": dbias sums a 2-D ", dbias_of_a_ ? "A with transA" : "B without transB",
                               ", got ", DimsToString(summed.shape()));
      db = ctx.Output(1, {summed.dims[1]});
    }
    bool formed = false;
    absl::Status s = CudaMatMul(*p_, *plan, a.dtype, y->dtype, a.data, b.data, y->data, bias ? bias->data : nullptr,
                                gelu_tanh_, acc ? acc->as<float>() : nullptr, acc && *ctx.input(4)->as<bool>(),
                                {db ? db->as<float>() : nullptr, dbias_of_a_, &formed}, lda);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
    if (db && !formed) {  // no epilogue kernel for this shape: the sums on their own
      const int64_t rows = summed.dims[0], cols = summed.dims[1];
      const int64_t parts = kc::ColumnSumsScratch(rows, cols);
      double* scratch = parts ? ctx.ScratchOf<double>(parts) : nullptr;
      if (parts && !scratch) return NoScratch();
      RETURN_IF_ERROR(Check(kc::ColumnSums(DtOf(summed.dtype), summed.data, db->as<float>(), rows, cols, scratch,
                                           stream())));
    }
    if (gelu_) return Check(kc::Unary(kc::UnaryOp::kGelu, DtOf(y->dtype), y->data, y->data, y->numel(), stream()));
    return absl::OkStatus();
  }

 private:
  // y = GELU(the product + bias) with its input kept in pre, or y = the product times GELU'(gelu_in):
  // in cuBLASLt's epilogue (GELU_AUX_BIAS, DGELU) for the tanh form where it takes the product;
  // otherwise the product, then the GELU (or its gradient) on its own.
  absl::Status GeluProduct(KernelContext& ctx, const kernels::cpu::MatMulPlan& plan, const TensorView& a,
                           const TensorView& b, const TensorView* bias, const TensorView* acc, TensorView* y,
                           TensorView* pre, const TensorView* gelu_in) const {
    // (Shape inference refuses a dbias output beside the GELU's.)
    if (acc || rows_ >= 0) return InvalidArgument(name_, ": a GELU input with an accumulation buffer or rows");
    if (gelu_in && (gelu_in->shape() != y->shape() || gelu_in->dtype != y->dtype || bias || gelu_ || gelu_tanh_))
      return InvalidArgument(name_, ": activation_grad takes a GELU input of the result's shape ",
                             DimsToString(y->shape()), " and type, and no bias or activation");
    const void* bias_data = bias ? bias->data : nullptr;
    bool formed = false;
    if (gelu_in ? gelu_grad_tanh_ : gelu_tanh_) {
      absl::Status s = CudaMatMul(*p_, plan, a.dtype, y->dtype, a.data, b.data, y->data, bias_data, !gelu_in, nullptr,
                                  false, {}, 0, {pre ? pre->data : nullptr, gelu_in ? gelu_in->data : nullptr, &formed});
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
      if (formed) return absl::OkStatus();
    }
    // The product (with its bias) into pre, or into scratch for the gradient.
    void* product = pre ? pre->data : ctx.Scratch(y->nbytes());
    if (!product && y->nbytes() > 0) return NoScratch();
    absl::Status s = CudaMatMul(*p_, plan, a.dtype, y->dtype, a.data, b.data, product, bias_data, false);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
    if (gelu_in)
      return Check(kc::GeluGrad(DtOf(y->dtype), product, gelu_in->data, y->data, y->numel(), gelu_grad_tanh_, stream()));
    return Check(kc::Unary(gelu_tanh_ ? kc::UnaryOp::kGeluTanh : kc::UnaryOp::kGelu, DtOf(y->dtype), product, y->data,
                           y->numel(), stream()));
  }

  bool fused_ = false, trans_a_ = false, trans_b_ = false, gelu_ = false, gelu_tanh_ = false, dbias_of_a_ = false;
  bool gelu_grad_ = false, gelu_grad_tanh_ = false, has_dbias_ = false;
  int64_t rows_ = -1;  // -1: every row of op(A)
};

// Gemm(A, B[, C]) {transA, transB, alpha, beta}: Y [M, N] = alpha op(A) op(B) + beta C, A and B
// 2-D, C broadcast to [M, N] from [N], [1, N], [M, 1], [M, N] or a scalar. With alpha 1 and a
// C of [N] (beta 1) or none, the product's epilogue adds it; otherwise a pass after the product.
class GemmKernel : public CudaKernel {
 public:
  GemmKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), trans_a_(n.AttrInt("transA", 0) != 0), trans_b_(n.AttrInt("transB", 0) != 0),
        alpha_(n.AttrFloat("alpha", 1.f)), beta_(n.AttrFloat("beta", 1.f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    const TensorView* c = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (b.dtype != a.dtype || (c && c->dtype != a.dtype))
      return InvalidArgument(name_, ": A, B and C must share a type, got ", DataTypeName(a.dtype), ", ",
                             DataTypeName(b.dtype), c ? absl::StrCat(", ", DataTypeName(c->dtype)) : "");
    std::span<const int64_t> c_dims;
    if (c) c_dims = c->dim_span();
    auto gemm = kernels::cpu::PlanGemm(a.dim_span(), b.dim_span(), c ? &c_dims : nullptr, trans_a_, trans_b_, alpha_,
                                       beta_);
    if (!gemm.ok()) return absl::Status(gemm.status().code(), absl::StrCat(name_, ": ", gemm.status().message()));
    if (beta_ == 0.f) c = nullptr;  // C is not read
    const int64_t M = gemm->M, N = gemm->N, c_rows = gemm->c_rows, c_cols = gemm->c_cols;
    // The product as a MatMul plan ([M, K] x [K, N], the operands read through the flags).
    auto plan = kernels::cpu::PlanMatMul(a.dim_span(), b.dim_span(), trans_b_, trans_a_);
    if (!plan.ok()) return absl::Status(plan.status().code(), absl::StrCat(name_, ": ", plan.status().message()));
    TensorView* y = ctx.Output(0, {M, N});
    if (!y) return absl::OkStatus();
    const bool bias_epilogue = alpha_ == 1.f && c && beta_ == 1.f && c_rows == 1 && c_cols == N && N > 1;
    absl::Status s = CudaMatMul(*p_, *plan, a.dtype, y->dtype, a.data, b.data, y->data,
                                bias_epilogue ? c->data : nullptr, false);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name_, ": ", s.message()));
    if (bias_epilogue || (alpha_ == 1.f && !c)) return absl::OkStatus();
    return Check(kc::GemmScaleAdd(DtOf(y->dtype), y->data, alpha_, c ? c->data : nullptr, beta_, M, N, c_rows, c_cols,
                                  stream()));
  }

 private:
  bool trans_a_, trans_b_;
  float alpha_, beta_;
};

class WhereKernel : public CudaKernel {
 public:
  WhereKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView* in[3] = {ctx.input(0), ctx.input(1), ctx.input(2)};
    ASSIGN_OR_RETURN(const std::vector<int64_t> out, BroadcastDims(name_, ctx));
    const int rank = static_cast<int>(out.size());
    kc::Broadcast3 bc;
    bc.rank = rank;
    for (int k = 0; k < 3; ++k) {
      int64_t st = 1;
      for (int d = rank - 1; d >= 0; --d) {
        const int i = d - (rank - in[k]->rank);
        const int64_t v = i >= 0 ? in[k]->dims[i] : 1;
        bc.strides[k][d] = v == 1 ? 0 : st;
        bc.out_dims[d] = out[d];
        st *= v;
      }
    }
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    return Check(kc::Where(static_cast<int>(ElementSize(in[1]->dtype)), in[0]->as<bool>(), in[1]->data, in[2]->data,
                           y->data, y->numel(), bc, stream()));
  }
};

// ---- loss -------------------------------------------------------------------------------

}  // namespace

void CudaExecutionProvider::RegisterKernels() {
  KernelRegistry& r = registry_;
  const std::string C(graph::kCleaveDomain);
  auto floats = InputTypeIn(0, kFloats);
  auto f32 = InputTypeIn(0, {DataType::kFloat32});
  auto two = [](const graph::Node& n, int) -> std::string {
    return n.num_inputs() == 2 ? "" : "only two inputs are supported on CUDA";
  };
  auto two_alike = AllOf({two, [](const graph::Node& n, int) -> std::string {
                            return n.input(0)->dtype() == n.input(1)->dtype() ? "" : "mixed dtypes";
                          }});
  auto all_alike = [](const graph::Node& n, int) -> std::string {
    for (int i = 0; i < n.num_inputs(); ++i)
      if (!n.input(i) || n.input(i)->dtype() != n.input(0)->dtype()) return "mixed dtypes or a missing input";
    return n.num_inputs() > 0 ? "" : "no inputs";
  };
  const std::vector<DataType> ints = {DataType::kInt64, DataType::kInt32};
  std::vector<DataType> numbers = kFloats;
  numbers.insert(numbers.end(), ints.begin(), ints.end());
  // The arithmetic's and comparisons' types: every integer besides; comparisons float64 too.
  std::vector<DataType> arith_types = numbers;
  for (DataType t : {DataType::kInt8, DataType::kInt16, DataType::kUInt8, DataType::kUInt16, DataType::kUInt32,
                     DataType::kUInt64})
    arith_types.push_back(t);
  for (const char* op : {"Add", "Sub", "Mul", "Div", "PRelu"})
    Add<BinaryKernel>(r, this, "", op, 7, 1 << 30, AllOf({InputTypeIn(0, arith_types), two_alike}));
  std::vector<DataType> exponents = arith_types;
  exponents.push_back(DataType::kFloat64);
  Add<BinaryKernel>(r, this, "", "Pow", 7, 1 << 30, AllOf({floats, InputTypeIn(1, exponents), two}));
  auto fmod_attr = [](const graph::Node& n, int) -> std::string {
    const int64_t f = n.AttrInt("fmod", 0);
    return f == 0 || f == 1 ? "" : absl::StrCat("fmod ", f, " (expected 0 or 1)");
  };
  Add<BinaryKernel>(r, this, "", "Mod", 10, 1 << 30, AllOf({InputTypeIn(0, arith_types), two_alike, fmod_attr}));
  std::vector<DataType> integers = ints;
  for (DataType t : {DataType::kInt8, DataType::kInt16, DataType::kUInt8, DataType::kUInt16, DataType::kUInt32,
                     DataType::kUInt64})
    integers.push_back(t);
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"})
    Add<BinaryKernel>(r, this, "", op, 18, 1 << 30, AllOf({InputTypeIn(0, integers), two_alike}));
  Add<BinaryKernel>(r, this, "", "BitShift", 11, 1 << 30, AllOf({InputTypeIn(0, integers), two_alike}));
  for (const char* op : {"Max", "Min"})  // variadic (broadcasting from version 8)
    Add<BinaryKernel>(r, this, "", op, 6, 1 << 30, AllOf({InputTypeIn(0, arith_types), all_alike}));
  for (const char* op : {"Sum", "Mean"}) Add<BinaryKernel>(r, this, "", op, 6, 1 << 30, AllOf({floats, all_alike}));
  for (const char* op : {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"}) {
    std::vector<DataType> types = arith_types;
    types.push_back(DataType::kFloat64);
    if (std::string(op) == "Equal") types.push_back(DataType::kBool);
    Add<CompareKernel>(r, this, "", op, 7, 1 << 30, AllOf({InputTypeIn(0, types), two_alike}));
  }
  for (const char* op : {"And", "Or", "Xor"})
    Add<CompareKernel>(r, this, "", op, 7, 1 << 30, AllOf({InputTypeIn(0, {DataType::kBool}), two_alike}));
  Add<CompareKernel>(r, this, "", "Not", 1, 1 << 30, InputTypeIn(0, {DataType::kBool}));
  Add<FloatClassKernel>(r, this, "", "IsNaN", 9, 1 << 30, floats);
  Add<FloatClassKernel>(r, this, "", "IsInf", 10, 1 << 30, floats);
  for (const char* op : {"Relu", "Tanh", "Exp", "Log", "Neg", "Sqrt", "Sigmoid", "Erf", "Reciprocal", "Abs"})
    Add<UnaryKernel>(r, this, "", op, 6, 1 << 30, floats);
  for (const char* op : {"Sin", "Cos"})
    Add<UnaryKernel>(r, this, "", op, 7, 1 << 30, floats);
  // The math and activations beyond the transformer set, from the version each op's current
  // form starts at (Celu's alpha 0 is rejected: it divides by it).
  struct Since {
    const char* op;
    int version;
  };
  for (const Since& u : {Since{"Tan", 7}, Since{"Asin", 7}, Since{"Acos", 7}, Since{"Atan", 7}, Since{"Sinh", 9},
                         Since{"Cosh", 9}, Since{"Asinh", 9}, Since{"Acosh", 9}, Since{"Atanh", 9}, Since{"Softplus", 1},
                         Since{"Softsign", 1}, Since{"Mish", 18}, Since{"Floor", 6}, Since{"Ceil", 6}, Since{"Round", 11},
                         Since{"Sign", 9}, Since{"LeakyRelu", 6}, Since{"Elu", 6}, Since{"Selu", 6}, Since{"HardSigmoid", 6},
                         Since{"HardSwish", 14}, Since{"ThresholdedRelu", 10}})
    Add<UnaryKernel>(r, this, "", u.op, u.version, 1 << 30, floats);
  Add<UnaryKernel>(r, this, "", "Celu", 12, 1 << 30,
                   AllOf({floats, [](const graph::Node& n, int) -> std::string {
                            return n.AttrFloat("alpha", 1.f) == 0.f ? "alpha 0" : "";
                          }}));
  Add<ClipKernel>(r, this, "", "Clip", 6, 10, floats);
  Add<ClipKernel>(r, this, "", "Clip", 11, 1 << 30, floats, {1, 2});
  Add<UnaryKernel>(r, this, "", "Gelu", 20, 20, floats);
  Add<UnaryKernel>(r, this, C, "Gelu", 1, 1, floats);
  Add<GeluGradKernel>(r, this, C, "GeluGrad", 1, 1, floats);
  Add<SwiGluKernel>(r, this, C, "SwiGLU", 1, 1, floats);
  Add<SwiGluKernel>(r, this, C, "SwiGLUGrad", 1, 1, floats);
  Add<RotaryKernel>(r, this, C, "RotaryEmbedding", 1, 1, floats);
  Add<RotaryKernel>(r, this, C, "RotaryEmbeddingGrad", 1, 1, floats);
  std::vector<DataType> castable = numbers;
  for (DataType t : {DataType::kBool, DataType::kFloat64, DataType::kInt8, DataType::kInt16, DataType::kUInt8,
                     DataType::kUInt16, DataType::kUInt32, DataType::kUInt64})
    castable.push_back(t);
  // CastLike(x, like): to like's dtype, which the output has; like's elements are not read.
  auto cast_types = AllOf({InputTypeIn(0, castable), InputTypeIn(-1, castable)});
  Add<CastKernel>(r, this, "", "Cast", 6, 1 << 30, cast_types);
  Add<CastKernel>(r, this, "", "CastLike", 15, 1 << 30, cast_types);
  Add<MatMulKernel>(r, this, "", "MatMul", 1, 1 << 30, floats);
  Add<GemmKernel>(r, this, "", "Gemm", 7, 13, floats);
  Add<MatMulKernel>(r, this, C, "FusedMatMul", 1, 1, floats);
  Add<MatMulKernel>(r, this, C, "MatMulBf16", 1, 1, InputTypeIn(0, {DataType::kBFloat16}), {4});
  Add<MatMulKernel>(r, this, C, "MatMulF16", 1, 1, InputTypeIn(0, {DataType::kFloat16}), {4});
  RegisterCudaNormKernels(r, this);
  Add<WhereKernel>(r, this, "", "Where", 9, 1 << 30, InputTypeIn(0, {DataType::kBool}));
  // The random ops' outputs: every type CastElem writes (Bernoulli's integers and bool too).
  auto random_out = [castable](const graph::Node& n, int) -> std::string {
    const DataType t = n.output(0)->dtype();
    return std::find(castable.begin(), castable.end(), t) != castable.end() ? "" : "an output type without a cast";
  };
  for (const char* op : {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"})
    Add<RandomKernel>(r, this, "", op, 1, 1 << 30, random_out);
  std::vector<DataType> probabilities = kFloats;
  probabilities.push_back(DataType::kFloat64);
  Add<RandomKernel>(r, this, "", "Bernoulli", 15, 1 << 30, AllOf({InputTypeIn(0, probabilities), random_out}));
  Add<DropoutKernel>(r, this, "", "Dropout", 12, 1 << 30, floats, {1, 2});
  Add<LegacyDropoutKernel>(r, this, "", "Dropout", 1, 11,
                           AllOf({floats, InputTypeIn(-2, {DataType::kBool, DataType::kFloat32, DataType::kBFloat16,
                                                           DataType::kFloat16})}));
  RegisterCudaLayoutKernels(r, this);
  RegisterCudaOptimizerKernels(r, this);
  RegisterCudaCollectives(r, this);
  RegisterCudaAttentionKernels(r, this);
  RegisterCudaConvKernels(r, this);
  RegisterCudaAxisKernels(r, this);
  RegisterCudaLossKernels(r, this);
}

}  // namespace cleave::providers
