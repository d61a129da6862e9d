// CPU kernels for matrix products (providers/cpu/): MatMul, Gemm and ai.cleave FusedMatMul.
// Each resolves its operand shapes at run time, checks them, and calls kernels/cpu/nn.h.
//
// ai.cleave FusedMatMul (version 1): Y = act(A @ op(B) + bias)
//   inputs:  A [..., M, K]; B [..., K, N], or [..., N, K] when transB = 1 (batch dims
//            broadcast as in MatMul); bias [N] (optional)
//   attrs:   transB (int, default 0); activation "" | "gelu" (erf) | "gelu_tanh" (default "")
//   output:  Y [..., M, N] with A's dtype (float32, float64)
// The fusion pass turns MatMul -> Add(bias [N]) (-> Gelu) into it. In fp32 it is one GEMM:
// without an activation, Y is pre-filled with the bias and sgemm accumulates onto it
// (beta = 1); with one, sgemm writes Y and a single pass per row, while the row is in
// cache, adds the bias and applies the activation.
// When B is a 2-D fp32 initializer (constant for the session's lifetime), MatMul and
// FusedMatMul pack it once at construction and run kernels/cpu/packed_gemm.h instead,
// which starts each tile from the bias and applies the activation per tile, for products
// of up to a few hundred rows (PackedGemmPreferred); larger ones still go to OpenBLAS.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/grad.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/packed_gemm.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"

namespace cleave::providers {

namespace {

using kernels::cpu::Activation;
using kernels::cpu::MatMulPlan;
using kernels::cpu::PackedB;

// The activation a product's attribute `attr` names ("", "gelu" or "gelu_tanh"), or
// InvalidArgument naming the node and what it found.
absl::StatusOr<Activation> ActivationNamed(const graph::Node& n, const char* attr) {
  const std::string act = n.AttrString(attr, "");
  if (act.empty()) return Activation::kNone;
  if (act == "gelu") return Activation::kGelu;
  if (act == "gelu_tanh") return Activation::kGeluTanh;
  return InvalidArgument(n.Describe(), ": expected ", attr, " '', 'gelu' or 'gelu_tanh', got '", act, "'");
}

// Input 1 packed for GemmPacked when it is a 2-D fp32 initializer and the CPU runs the
// packed kernels; an empty PackedB (the OpenBLAS path) otherwise.
PackedB MaybePackWeight(const graph::Node& n, bool trans_b) {
  const graph::Value* w = n.input(1);
  const Tensor* t = w ? w->initializer() : nullptr;
  if (!t || t->dtype() != DataType::kFloat32 || t->rank() != 2 ||
      !kernels::cpu::PackedGemmAvailable())
    return PackedB();
  const int64_t K = t->dims()[trans_b ? 1 : 0], N = t->dims()[trans_b ? 0 : 1];
  return kernels::cpu::PackB(t->data<float>(), K, N, trans_b);
}

// Y = act(A @ packed B + bias) with A's batch dims folded into M: B is 2-D, so every
// product shares it, and A is dense, so its matrices stack into one [batch * M, K].
void RunPacked(const MatMulPlan& p, const PackedB& b, const TensorView& a, const float* bias,
               Activation act, TensorView& y, ThreadPool* pool) {
  kernels::cpu::GemmPacked(p.batch() * p.M, a.as<float>(), p.K, b, bias, act, y.as<float>(),
                           p.N, pool);
}

// C = A @ op(B) for any claimed dtype; beta = 1 (accumulate onto C) is honoured for fp32
// only, which is the only dtype its callers pass it for.
absl::Status RunMatMul(const MatMulPlan& p, const TensorView& a, const TensorView& b, float beta,
                       TensorView& c, ThreadPool* pool) {
  switch (a.dtype) {
    case DataType::kFloat32:
      kernels::cpu::MatMulF32(p, a.as<float>(), b.as<float>(), beta, c.as<float>(), pool);
      return absl::OkStatus();
    case DataType::kFloat64:
      kernels::cpu::MatMulLoops(p, a.as<double>(), b.as<double>(), c.as<double>(), pool);
      return absl::OkStatus();
    case DataType::kInt32:
      kernels::cpu::MatMulLoops(p, a.as<int32_t>(), b.as<int32_t>(), c.as<int32_t>(), pool);
      return absl::OkStatus();
    case DataType::kInt64:
      kernels::cpu::MatMulLoops(p, a.as<int64_t>(), b.as<int64_t>(), c.as<int64_t>(), pool);
      return absl::OkStatus();
    default:
      return Internal("matmul kernel reached with dtype ", DataTypeName(a.dtype));
  }
}

class MatMulKernel : public OpKernel {
 public:
  MatMulKernel(const graph::Node& n, int) : packed_(MaybePackWeight(n, false)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    ASSIGN_OR_RETURN(MatMulPlan p, kernels::cpu::PlanMatMul(a.dim_span(), b.dim_span()));
    TensorView* y = ctx.Output(0, p.out_shape());
    if (!y) return absl::OkStatus();
    if (!packed_.empty() && a.dtype == DataType::kFloat32 &&
        kernels::cpu::PackedGemmPreferred(p.batch() * p.M)) {
      RunPacked(p, packed_, a, nullptr, Activation::kNone, *y, ctx.thread_pool());
      return absl::OkStatus();
    }
    return RunMatMul(p, a, b, 0.f, *y, ctx.thread_pool());
  }

 private:
  PackedB packed_;  // input 1 when it is a constant 2-D fp32 matrix
};

// ai.cleave MatMulBf16 (bf16 operands, through oneDNN) and MatMulF16 (fp16 operands, widened
// to fp32 for OpenBLAS: the products of fp16 values are exact in fp32, so this is the fp16
// product with fp32 accumulation), both with an fp32 result, plus an optional fp32 bias [N].
class MatMulBf16Kernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const Activation activation, ActivationNamed(n, "activation"));
    ASSIGN_OR_RETURN(const Activation activation_grad, ActivationNamed(n, "activation_grad"));
    return std::unique_ptr<OpKernel>(new MatMulBf16Kernel(n, activation, activation_grad));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    RETURN_IF_ERROR(BiasGradient(ctx));
    if (a.rank < 2 || (b.rank != 2 && b.rank != a.rank))
      return InvalidArgument("MatMulBf16: A ", DimsToString(a.shape()), " and B ", DimsToString(b.shape()),
                             " (B must be 2-D or have A's rank)");
    kernels::cpu::GemmBf16Params p;
    p.trans_a = trans_a_;
    p.trans_b = trans_b_;
    p.M = a.dim(trans_a_ ? -1 : -2);
    p.K = a.dim(trans_a_ ? -2 : -1);
    p.N = b.dim(trans_b_ ? -2 : -1);
    const int64_t kb = b.dim(trans_b_ ? -1 : -2);
    if (kb != p.K)
      return InvalidArgument("MatMulBf16: A ", DimsToString(a.shape()), " and B ", DimsToString(b.shape()),
                             " disagree on K (", p.K, " vs ", kb, ")");
    if (rows_ >= 0) {
      // Only op(A)'s first `rows` rows: a prefix of A's rows, or with transA of its columns.
      if (a.rank != 2 || rows_ > p.M)
        return InvalidArgument("MatMulBf16: rows = ", rows_, " needs a 2-D A with at least that many rows of op(A), got ",
                               DimsToString(a.shape()), trans_a_ ? " (transA)" : "");
      p.lda = trans_a_ ? p.M : p.K;
      p.M = rows_;
    }
    const std::vector<int64_t> a_dims = a.shape();
    std::vector<int64_t> out(a_dims.begin(), a_dims.end() - 2);
    p.batch = 1;
    for (int64_t d : out) p.batch *= d;
    p.b_batched = b.rank > 2;
    if (p.b_batched)
      for (int i = 0; i < a.rank - 2; ++i)
        if (b.dims[i] != a.dims[i])
          return InvalidArgument("MatMulBf16: batch dims of A ", DimsToString(a.shape()), " and B ",
                                 DimsToString(b.shape()), " differ");
    out.push_back(p.M);
    out.push_back(p.N);
    const TensorView* bias = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    if (bias && (bias->rank != 1 || bias->dims[0] != p.N))
      return InvalidArgument("MatMulBf16: expected bias of shape [", p.N, "], got ", DimsToString(bias->shape()));
    TensorView* y = ctx.Output(0, out);
    if (!y) return absl::OkStatus();
    // An accumulation buffer (input 3) and its reset flag (input 4): y = the product (+ the
    // buffer unless reset), as InPlaceAccumulator adds a gradient.
    const TensorView* acc = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
    if (acc && (acc->shape() != y->shape() || acc->dtype != DataType::kFloat32 || y->dtype != DataType::kFloat32 ||
                ctx.num_inputs() < 5 || !ctx.input(4)))
      return InvalidArgument("MatMulBf16: expected a float32 accumulation buffer of the float32 result's shape ",
                             DimsToString(y->shape()), " and its reset flag");
    // The GELU (`activation`) of the result with its input kept (output 2), or the product times
    // the GELU's derivative at input 5 (`activation_grad`), as cuBLASLt's GELU_AUX_BIAS and DGELU
    // epilogues form them: from the float32 result, rounded once.
    const TensorView* gelu_in = ctx.num_inputs() > 5 ? ctx.input(5) : nullptr;
    if ((activation_grad_ != Activation::kNone) != (gelu_in != nullptr) ||
        (gelu_in && (gelu_in->shape() != y->shape() || gelu_in->dtype != y->dtype || bias || acc ||
                     activation_ != Activation::kNone)))
      return InvalidArgument("MatMulBf16: activation_grad takes the GELU input (input 5) of the result's shape ",
                             DimsToString(y->shape()), " and type, without bias, accumulation or activation");
    TensorView* pre = activation_ != Activation::kNone && ctx.num_outputs() > 2
                          ? ctx.Output(2, y->dim_span())
                          : nullptr;
    // A low-precision result (`to`): the float32 result, bias included, rounded once.
    const bool low_out = y->dtype != DataType::kFloat32;
    TensorView y32 = *y;
    if (low_out || acc) {
      y32.dtype = DataType::kFloat32;
      y32.data = ctx.Scratch(y32.nbytes());
      if (!y32.data) return NoScratch();
    }
    RETURN_IF_ERROR(Product(p, a, b, &y32, ctx));
    if (bias && p.N > 0) {
      TensorView bias32 = *bias;
      if (bias->dtype != DataType::kFloat32) {
        bias32.dtype = DataType::kFloat32;
        bias32.data = ctx.Scratch(bias32.nbytes());
        if (!bias32.data) return NoScratch();
        kernels::cpu::Cast(*bias, bias32, ctx.thread_pool());
      }
      kernels::cpu::BiasActivation(y32.as<float>(), bias32.as<float>(), y32.numel() / p.N, p.N,
                                   Activation::kNone, ctx.thread_pool());
    }
    if (activation_ != Activation::kNone && p.N > 0) {
      if (pre) kernels::cpu::Cast(y32, *pre, ctx.thread_pool());
      kernels::cpu::BiasActivation(y32.as<float>(), nullptr, y32.numel() / p.N, p.N, activation_, ctx.thread_pool());
    }
    if (gelu_in) {
      TensorView x32 = *gelu_in;
      if (gelu_in->dtype != DataType::kFloat32) {
        x32.dtype = DataType::kFloat32;
        x32.data = ctx.Scratch(x32.nbytes());
        if (!x32.data) return NoScratch();
        kernels::cpu::Cast(*gelu_in, x32, ctx.thread_pool());
      }
      kernels::cpu::GeluGrad(activation_grad_ == Activation::kGeluTanh, y32.as<const float>(),
                             x32.as<const float>(), y32.as<float>(), y32.numel(), ctx.thread_pool());
    }
    if (low_out) kernels::cpu::Cast(y32, *y, ctx.thread_pool());
    if (acc)
      kernels::cpu::AccumulateGrad(acc->as<const float>(), y32.as<const float>(), *ctx.input(4)->as<const bool>(),
                                   y->as<float>(), y->numel(), ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  absl::Status Product(kernels::cpu::GemmBf16Params p, const TensorView& a, const TensorView& b, TensorView* y,
                       KernelContext& ctx) const {
    // A shared B and an untransposed A: one product over all rows.
    if (!p.b_batched && !p.trans_a) {
      p.M *= p.batch;
      p.batch = 1;
    }
    if (!f16_)
      return kernels::cpu::GemmBf16(p, static_cast<const uint16_t*>(a.data), static_cast<const uint16_t*>(b.data),
                                    static_cast<float*>(y->data), ctx.thread_pool());
    // The operands widened into scratch (kept by the session: no allocation or page faults
    // per call), both in parallel.
    const TensorView fa(ctx.Scratch(static_cast<size_t>(a.numel()) * sizeof(float)), DataType::kFloat32,
                        a.dim_span());
    const TensorView fb(ctx.Scratch(static_cast<size_t>(b.numel()) * sizeof(float)), DataType::kFloat32,
                        b.dim_span());
    if (!fa.data || !fb.data) return NoScratch();
    kernels::cpu::Cast(a, fa, ctx.thread_pool());
    kernels::cpu::Cast(b, fb, ctx.thread_pool());
    kernels::cpu::GemmParams g;
    g.M = p.M;
    g.N = p.N;
    g.K = p.K;
    g.trans_a = p.trans_a;
    g.trans_b = p.trans_b;
    g.lda = p.lda;  // A is 2-D (one batch) where it is set
    float* yd = static_cast<float*>(y->data);
    for (int64_t i = 0; i < p.batch; ++i)
      kernels::cpu::Sgemm(g, fa.as<const float>() + i * p.M * p.K,
                          fb.as<const float>() + (p.b_batched ? i * p.K * p.N : 0), yd + i * p.M * p.N,
                          ctx.thread_pool());
    return absl::OkStatus();
  }

  // dbias (output 1): the float32 column sums of A [K, M] (transA) or B [K, N] (not transB),
  // each column's low-precision values summed in float32 in row order.
  absl::Status BiasGradient(KernelContext& ctx) const {
    if (!has_dbias_) return absl::OkStatus();
    const TensorView& x = *ctx.input(dbias_of_a_ ? 0 : 1);
    if (x.rank != 2 || (dbias_of_a_ ? !trans_a_ : trans_b_))
      return InvalidArgument("MatMulBf16: dbias sums a 2-D ", dbias_of_a_ ? "A with transA" : "B without transB",
                             ", got ", DimsToString(x.shape()));
    if (dbias_of_a_ && rows_ >= 0) return InvalidArgument("MatMulBf16: dbias of A with `rows`");
    const int64_t rows = x.dims[0], cols = x.dims[1];
    TensorView* db = ctx.Output(1, {cols});
    if (!db) return absl::OkStatus();
    const auto* src = static_cast<const uint16_t*>(x.data);
    float* out = db->as<float>();
    const bool f16 = f16_;
    ParallelFor(ctx.thread_pool(), cols, 64, [&](int64_t c0, int64_t c1) {
      std::fill(out + c0, out + c1, 0.f);
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* row = src + r * cols;
        for (int64_t c = c0; c < c1; ++c) out[c] += f16 ? HalfToFloat(row[c]) : BFloat16ToFloat(row[c]);
      }
    });
    return absl::OkStatus();
  }

  MatMulBf16Kernel(const graph::Node& n, Activation activation, Activation activation_grad)
      : trans_a_(n.AttrInt("transA", 0) != 0),
        trans_b_(n.AttrInt("transB", 0) != 0),
        f16_(n.op_type() == "MatMulF16"),
        dbias_of_a_(n.AttrInt("dbias_operand", 1) == 0),
        has_dbias_(n.num_outputs() > 1 && n.output(1) != nullptr),
        rows_(n.AttrInt("rows", -1)),
        activation_(activation),
        activation_grad_(activation_grad) {}

  bool trans_a_, trans_b_, f16_, dbias_of_a_, has_dbias_;
  int64_t rows_;  // -1: every row of op(A)
  Activation activation_, activation_grad_;
};

class GemmKernel : public OpKernel {
 public:
  GemmKernel(const graph::Node& n, int)
      : trans_a_(n.AttrInt("transA", 0) != 0),
        trans_b_(n.AttrInt("transB", 0) != 0),
        alpha_(n.AttrFloat("alpha", 1.f)),
        beta_(n.AttrFloat("beta", 1.f)) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    const TensorView* c = ctx.input(2);
    std::span<const int64_t> c_dims;
    if (c) c_dims = c->dim_span();
    ASSIGN_OR_RETURN(const kernels::cpu::GemmOpParams p,
                     kernels::cpu::PlanGemm(a.dim_span(), b.dim_span(), c ? &c_dims : nullptr, trans_a_, trans_b_,
                                            alpha_, beta_));
    TensorView* y = ctx.Output(0, {p.M, p.N});
    if (!y) return absl::OkStatus();
    if (a.dtype == DataType::kFloat64) {
      kernels::cpu::GemmOp(p, a.as<double>(), b.as<double>(), c ? c->as<double>() : nullptr,
                           y->as<double>(), ctx.thread_pool());
    } else {
      kernels::cpu::GemmOp(p, a.as<float>(), b.as<float>(), c ? c->as<float>() : nullptr,
                           y->as<float>(), ctx.thread_pool());
    }
    return absl::OkStatus();
  }

 private:
  bool trans_a_, trans_b_;
  float alpha_, beta_;
};

class FusedMatMulKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int) {
    ASSIGN_OR_RETURN(const Activation a, ActivationNamed(n, "activation"));
    const bool trans_b = n.AttrInt("transB", 0) != 0;
    const bool trans_a = n.AttrInt("transA", 0) != 0;
    return std::unique_ptr<OpKernel>(
        new FusedMatMulKernel(trans_a, trans_b, a, trans_a ? PackedB() : MaybePackWeight(n, trans_b)));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& a = *ctx.input(0);
    const TensorView& b = *ctx.input(1);
    const TensorView* bias = ctx.input(2);
    ASSIGN_OR_RETURN(MatMulPlan p, kernels::cpu::PlanMatMul(a.dim_span(), b.dim_span(), trans_b_, trans_a_));
    if (bias && (bias->rank != 1 || bias->dims[0] != p.N))
      return InvalidArgument("expected bias of shape [", p.N, "], got ", DimsToString(bias->shape()));
    TensorView* y = ctx.Output(0, p.out_shape());
    if (!y) return absl::OkStatus();
    const int64_t rows = p.N == 0 ? 0 : y->numel() / p.N;
    ThreadPool* pool = ctx.thread_pool();
    if (a.dtype == DataType::kFloat64) {
      kernels::cpu::MatMulLoops(p, a.as<double>(), b.as<double>(), y->as<double>(), pool);
      if (bias || act_ != Activation::kNone)
        kernels::cpu::BiasActivation(y->as<double>(), bias ? bias->as<double>() : nullptr, rows,
                                     p.N, act_, pool);
      return absl::OkStatus();
    }
    float* out = y->as<float>();
    const float* bias_data = bias ? bias->as<float>() : nullptr;
    if (!packed_.empty() && kernels::cpu::PackedGemmPreferred(p.batch() * p.M)) {
      RunPacked(p, packed_, a, bias_data, act_, *y, pool);
      return absl::OkStatus();
    }
    if (bias && act_ == Activation::kNone) {
      kernels::cpu::BroadcastRows(out, bias_data, rows, p.N, pool);
      kernels::cpu::MatMulF32(p, a.as<float>(), b.as<float>(), 1.f, out, pool);
      return absl::OkStatus();
    }
    kernels::cpu::MatMulF32(p, a.as<float>(), b.as<float>(), 0.f, out, pool);
    if (bias || act_ != Activation::kNone)
      kernels::cpu::BiasActivation(out, bias_data, rows, p.N, act_, pool);
    return absl::OkStatus();
  }

 private:
  FusedMatMulKernel(bool trans_a, bool trans_b, Activation act, PackedB packed)
      : trans_a_(trans_a), trans_b_(trans_b), act_(act), packed_(std::move(packed)) {}
  bool trans_a_, trans_b_;
  Activation act_;
  PackedB packed_;  // input 1 when it is a constant 2-D fp32 matrix
};

}  // namespace

void RegisterMatMulKernels(KernelRegistry& r) {
  const DataType f32 = DataType::kFloat32, f64 = DataType::kFloat64;
  r.Register({"", "MatMul", 1, 13,
              InputTypeIn(0, {f32, f64, DataType::kInt32, DataType::kInt64}),
              MakeFactory<MatMulKernel>()});
  r.Register({"", "Gemm", 7, 13, InputTypeIn(0, {f32, f64}), MakeFactory<GemmKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "FusedMatMul", 1, 1, InputTypeIn(0, {f32, f64}),
              MakeCheckedFactory<FusedMatMulKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "MatMulBf16", 1, 1, InputTypeIn(0, {DataType::kBFloat16}),
              MakeCheckedFactory<MatMulBf16Kernel>()});
  r.Register({std::string(graph::kCleaveDomain), "MatMulF16", 1, 1, InputTypeIn(0, {DataType::kFloat16}),
              MakeCheckedFactory<MatMulBf16Kernel>()});
}

}  // namespace cleave::providers
