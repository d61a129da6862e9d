// CPU kernels for Dropout and Trilu, and the registration of every neural-network kernel
// family (providers/cpu/). When the run carries a seed (KernelContext::run_seed; the training
// session sets one per training run), Dropout's mask is drawn by Philox4x32-10 under a key of
// (run seed, node name) at a counter of the element: reproducible and recomputable. Otherwise
// each node keeps one MT19937 generator, seeded from the seed attribute (else from
// std::random_device) and advanced by each training-mode run, so a seeded model replays the same
// sequence of masks run after run (numpy's sequence, as the ONNX backend tests expect).
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>

#include "base/fixed_vector.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/shape.h"
#include "providers/cpu/cpu_provider.h"
#include "providers/cpu/nn_ops.h"
#include "providers/cpu/shape_ops.h"

namespace cleave::providers {

namespace {

class DropoutKernel : public OpKernel {
 public:
  DropoutKernel(const graph::Node& n, int) {
    // Seeds are taken mod 2^32, as MT19937 (and numpy's RandomState) take them.
    const uint32_t seed = n.HasAttr("seed") ? static_cast<uint32_t>(n.AttrInt("seed", 0))
                                            : std::random_device{}();
    gen_.seed(seed);
    for (unsigned char c : n.name()) salt_ = (salt_ ^ c) * 1099511628211ull;
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* ratio_in = ctx.input(1);
    const TensorView* training_in = ctx.input(2);
    for (const TensorView* s : {ratio_in, training_in})
      if (s && s->numel() != 1)
        return InvalidArgument("expected scalar ratio and training_mode, got an input of shape ",
                               DimsToString(s->shape()));
    float ratio = 0.5f;
    if (ratio_in)
      ratio = ratio_in->dtype == DataType::kFloat64 ? static_cast<float>(*ratio_in->as<double>())
                                                    : *ratio_in->as<float>();
    const bool training = training_in && *training_in->as<bool>();
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* mask = ctx.Output(1, x.dim_span());
    const int64_t n = x.numel();
    if (!training || ratio == 0.f) {  // inference, or nothing to drop: the identity
      if (y && n) kernels::cpu::CopyBytes(y->data, x.data, x.nbytes(), ctx.thread_pool());
      if (mask) std::memset(mask->data, 1, n * sizeof(bool));
      return absl::OkStatus();
    }
    if (!(ratio > 0.f && ratio < 1.f))
      return InvalidArgument("expected ratio in [0, 1), got ", ratio);
    // y is required by ONNX; should a graph leave it unread, draw into scratch so the
    // generator still advances by one mask.
    void* out = y ? y->data : ctx.Scratch(x.nbytes() + 8);
    if (!out) return NoScratch();
    bool* m = mask ? mask->as<bool>() : nullptr;
    if (ctx.run_seed() != KernelContext::kNoRunSeed) {
      const uint64_t key = ctx.run_seed() * 0xd1342543de82ef95ull ^ salt_;
      if (x.dtype == DataType::kFloat64)
        kernels::cpu::DropoutKeyed(key, ratio, n, x.as<double>(), static_cast<double*>(out), m, ctx.thread_pool());
      else
        kernels::cpu::DropoutKeyed(key, ratio, n, x.as<float>(), static_cast<float*>(out), m, ctx.thread_pool());
      return absl::OkStatus();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (x.dtype == DataType::kFloat64)
      kernels::cpu::Dropout(gen_, ratio, n, x.as<double>(), static_cast<double*>(out), m);
    else
      kernels::cpu::Dropout(gen_, ratio, n, x.as<float>(), static_cast<float*>(out), m);
    return absl::OkStatus();
  }

 private:
  mutable std::mutex mu_;
  mutable std::mt19937 gen_;
  uint64_t salt_ = 1469598103934665603ull;  // FNV-1a of the node name
};

// Dropout before version 12 takes its ratio as an attribute and has no training_mode input;
// ONNX runs those graphs in inference, where Dropout is the identity and keeps every element.
class LegacyDropoutKernel : public OpKernel {
 public:
  LegacyDropoutKernel(const graph::Node&, int) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (TensorView* y = ctx.Output(0, x.dim_span()); y && x.numel())
      kernels::cpu::CopyBytes(y->data, x.data, x.nbytes(), ctx.thread_pool());
    if (TensorView* mask = ctx.Output(1, x.dim_span())) {
      if (mask->dtype == DataType::kBool) std::memset(mask->data, 1, x.numel());
      else if (mask->dtype == DataType::kFloat64) std::fill_n(mask->as<double>(), x.numel(), 1.0);
      else std::fill_n(mask->as<float>(), x.numel(), 1.0f);
    }
    return absl::OkStatus();
  }
};

class TriluKernel : public OpKernel {
 public:
  TriluKernel(const graph::Node& n, int) : upper_(n.AttrInt("upper", 1) != 0) {}

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView* k_in = ctx.input(1);
    if (x.rank < 2)
      return InvalidArgument("expected an input of rank >= 2, got ", DimsToString(x.shape()));
    if (k_in && k_in->numel() != 1)
      return InvalidArgument("expected a scalar k, got shape ", DimsToString(k_in->shape()));
    kernels::cpu::TriluParams p;
    p.k = k_in ? IntAt(*k_in, 0) : 0;
    p.upper = upper_;
    p.rows = x.dims[x.rank - 2];
    p.cols = x.dims[x.rank - 1];
    p.batch = 1;
    for (int i = 0; i < x.rank - 2; ++i) p.batch *= x.dims[i];
    p.elem_size = ElementSize(x.dtype);
    TensorView* y = ctx.Output(0, x.dim_span());
    if (y) kernels::cpu::Trilu(p, x.data, y->data, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  bool upper_;
};

}  // namespace

namespace {

// Attention(q, k, v[, bias]) {scale, causal} -> out[, lse] and AttentionGrad(dOut, q, k, v, out,
// lse[, bias]) -> dq, dk, dv[, dbias], over [..., T, D] operands whose leading dims are the
// same. bf16 operands run the bf16 kernels where the CPU has AVX-512 BF16 (their block products
// take bf16 operands, as cuDNN's do); otherwise bf16 and fp16 operands (mixed precision) are
// widened to float32 scratch and the results rounded back, as the CUDA provider's own kernels
// compute them.
bool LowPrecision(DataType t) { return t == DataType::kBFloat16 || t == DataType::kFloat16; }

// Null when the scratch cannot be had.
const float* Widened(const TensorView& t, KernelContext& ctx) {
  if (!LowPrecision(t.dtype)) return t.as<float>();
  float* w = ctx.ScratchOf<float>(t.numel());
  if (!w) return nullptr;
  kernels::cpu::Cast(t, TensorView(w, DataType::kFloat32, t.dim_span()), ctx.thread_pool());
  return w;
}

// Where a kernel writes `t` in float32: `t` itself, or scratch that Narrow rounds into it
// (null when `t` goes unread; *failed set when the scratch cannot be had).
float* Wide(TensorView* t, KernelContext& ctx, bool* failed) {
  if (!t) return nullptr;
  if (!LowPrecision(t->dtype)) return t->as<float>();
  float* w = ctx.ScratchOf<float>(t->numel());
  if (!w) *failed = true;
  return w;
}

void Narrow(float* w, TensorView* t, ThreadPool* pool) {
  if (!t || !LowPrecision(t->dtype)) return;
  kernels::cpu::Cast(TensorView(w, DataType::kFloat32, t->dim_span()), *t, pool);
}

using kernels::cpu::AttentionOperands;

// The plan of an Attention or AttentionGrad's operands in their layout (kernels/cpu/attention.h):
// "bhsd", q, k, v [..., T, D]; "bshd", q, k, v [B, T, H, D]; "bs3hd", one input, the q/k/v
// product [B, T, 3, H, D]. The kernels read and write each layout in place.
absl::StatusOr<AttentionOperands> PlanOperands(kernels::cpu::AttentionLayout layout, const TensorView& q,
                                               const TensorView* k, const TensorView* v, double scale, bool causal) {
  return kernels::cpu::PlanAttentionOperands(layout, q.dim_span(), k ? k->dim_span() : std::span<const int64_t>(),
                                             v ? v->dim_span() : std::span<const int64_t>(), scale, causal);
}

// Lays the bias input `index` (none where it is absent) out in a's plan: its data as float32 or
// float64, or a float32 copy cast into scratch from bf16 / fp16.
absl::Status BindBias(KernelContext& ctx, int index, DataType q, AttentionOperands& a) {
  const TensorView* b = index < ctx.num_inputs() ? ctx.input(index) : nullptr;
  if (!b) return absl::OkStatus();
  if (b->dtype != DataType::kFloat32 && b->dtype != q)
    return InvalidArgument("expected a float32 bias or one of q's type ", DataTypeName(q), ", got ",
                           DataTypeName(b->dtype));
  RETURN_IF_ERROR(kernels::cpu::PlanAttentionBias(a, b->dim_span()));
  if (b->dtype == DataType::kFloat32) {
    a.p.bias.data = b->as<float>();
    return absl::OkStatus();
  }
  if (b->dtype == DataType::kFloat64) {  // float64 operands: the reference kernels read it as is
    a.p.bias.data64 = b->as<double>();
    return absl::OkStatus();
  }
  float* w = ctx.ScratchOf<float>(b->numel());
  if (!w) return NoScratch();
  kernels::cpu::Cast(*b, TensorView(w, DataType::kFloat32, b->dim_span()), ctx.thread_pool());
  a.p.bias.data = w;
  return absl::OkStatus();
}

// q, k and v of type T: inputs first, first + 1 and first + 2, or the three parts of the packed
// input `first`.
template <typename T>
std::array<const T*, 3> QkvData(KernelContext& ctx, int first, const AttentionOperands& a,
                                const T* (*data)(const TensorView&, KernelContext&)) {
  if (a.packed) {
    const T* base = data(*ctx.input(first), ctx);
    if (!base) return {nullptr, nullptr, nullptr};
    return {base, base + a.k_offset, base + a.v_offset};
  }
  return {data(*ctx.input(first), ctx), data(*ctx.input(first + 1), ctx), data(*ctx.input(first + 2), ctx)};
}

const double* Doubles(const TensorView& t, KernelContext&) { return t.as<double>(); }
const uint16_t* Bits(const TensorView& t, KernelContext&) { return t.as<uint16_t>(); }

// The bf16 kernels run on this CPU and these operands.
bool Bf16Kernels(const TensorView& q, const kernels::cpu::AttentionParams& p) {
  return q.dtype == DataType::kBFloat16 && kernels::cpu::Bf16AttentionSupported(p);
}

// Where the backward writes dq, dk and dv: the outputs' data as given, or with "bs3hd" the three
// parts of the packed one (all null where it goes unread).
template <typename T>
std::array<T*, 3> GradientData(const std::array<T*, 3>& outputs, const AttentionOperands& a) {
  if (!a.packed) return outputs;
  T* base = outputs[0];
  if (!base) return {nullptr, nullptr, nullptr};
  return {base, base + a.k_offset, base + a.v_offset};
}

// GradientData over the outputs' own data of type T (the outputs not asked for null).
template <typename T>
std::array<T*, 3> GradientData(const std::array<TensorView*, 3>& outputs, const AttentionOperands& a) {
  std::array<T*, 3> data{};
  for (int i = 0; i < 3; ++i) data[i] = outputs[i] ? outputs[i]->as<T>() : nullptr;
  return GradientData(data, a);
}

class AttentionKernel : public OpKernel {
 public:
  AttentionKernel(const graph::Node& n, int)
      : scale_(n.AttrFloat("scale", 1.f)),
        causal_(n.AttrInt("causal", 0) != 0),
        layout_(kernels::cpu::AttentionLayoutNamed(n.AttrString("layout", "bhsd"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const bool packed = layout_ == kernels::cpu::AttentionLayout::kBs3hd;
    const TensorView& q = *ctx.input(0);
    ASSIGN_OR_RETURN(AttentionOperands a,
                     PlanOperands(layout_, q, packed ? nullptr : ctx.input(1), packed ? nullptr : ctx.input(2),
                                  scale_, causal_));
    RETURN_IF_ERROR(BindBias(ctx, 3, q.dtype, a));
    TensorView* y = ctx.Output(0, a.out);
    TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, a.lse) : nullptr;
    if (!y) return absl::OkStatus();
    float* lp = l ? l->as<float>() : nullptr;
    if (q.dtype == DataType::kFloat64) {
      const auto in = QkvData<double>(ctx, 0, a, Doubles);
      kernels::cpu::AttentionForward(a.p, in[0], in[1], in[2], y->as<double>(), lp, ctx.thread_pool());
      return absl::OkStatus();
    }
    if (Bf16Kernels(q, a.p)) {
      const auto in = QkvData<uint16_t>(ctx, 0, a, Bits);
      kernels::cpu::AttentionForwardBf16(a.p, in[0], in[1], in[2], y->as<uint16_t>(), lp, ctx.thread_pool());
      return absl::OkStatus();
    }
    const auto in = QkvData<float>(ctx, 0, a, Widened);
    bool failed = false;
    float* out32 = Wide(y, ctx, &failed);
    if (failed || !in[0] || !in[1] || !in[2]) return NoScratch();
    kernels::cpu::AttentionForward(a.p, in[0], in[1], in[2], out32, lp, ctx.thread_pool());
    Narrow(out32, y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  float scale_;
  bool causal_;
  kernels::cpu::AttentionLayout layout_;
};

// Inputs dOut, q, k, v, out, lse[, bias] ("bs3hd": dOut, qkv, _, _, out, lse[, bias]); outputs
// dq, dk, dv ("bs3hd": the packed dqkv) and dbias (the scores' gradient), each of which may go
// unread.
class AttentionGradKernel : public OpKernel {
 public:
  AttentionGradKernel(const graph::Node& n, int)
      : scale_(n.AttrFloat("scale", 1.f)),
        causal_(n.AttrInt("causal", 0) != 0),
        layout_(kernels::cpu::AttentionLayoutNamed(n.AttrString("layout", "bhsd"))) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const bool packed = layout_ == kernels::cpu::AttentionLayout::kBs3hd;
    const TensorView &dout = *ctx.input(0), &q = *ctx.input(1), &out = *ctx.input(4), &lse = *ctx.input(5);
    ASSIGN_OR_RETURN(AttentionOperands a,
                     PlanOperands(layout_, q, packed ? nullptr : ctx.input(2), packed ? nullptr : ctx.input(3),
                                  scale_, causal_));
    RETURN_IF_ERROR(BindBias(ctx, 6, q.dtype, a));
    const kernels::cpu::AttentionParams& p = a.p;
    if (DimVector(dout.dim_span()) != a.out || DimVector(out.dim_span()) != a.out || lse.numel() != p.batch * p.T)
      return InvalidArgument("expected dOut and out ", DimsToString(a.out.span()), " and lse of ", p.batch * p.T,
                             " elements, got ", DimsToString(dout.shape()), ", ", DimsToString(out.shape()), " and ",
                             lse.numel());
    if (dout.dtype != q.dtype || out.dtype != q.dtype)
      return InvalidArgument("expected dOut and out of q's type ", DataTypeName(q.dtype), ", got ",
                             DataTypeName(dout.dtype), " and ", DataTypeName(out.dtype));
    std::array<TensorView*, 3> d{};
    if (a.packed) d[0] = ctx.Output(0, q.dim_span());
    else
      for (int i = 0; i < 3; ++i) d[i] = ctx.Output(i, ctx.input(1 + i)->dim_span());
    if (ctx.num_outputs() > 3) {  // the scores' gradient, for the bias
      if (TensorView* ds = ctx.Output(3, kernels::cpu::ScoreDims(a).span())) a.p.dscores = ds->as<float>();
    }
    if (q.dtype == DataType::kFloat64) {
      const auto in = QkvData<double>(ctx, 1, a, Doubles);
      const auto g = GradientData<double>(d, a);
      kernels::cpu::AttentionBackward(p, dout.as<double>(), in[0], in[1], in[2], out.as<double>(), lse.as<float>(),
                                      g[0], g[1], g[2], ctx.thread_pool());
      return absl::OkStatus();
    }
    if (Bf16Kernels(q, p)) {
      const auto in = QkvData<uint16_t>(ctx, 1, a, Bits);
      const auto g = GradientData<uint16_t>(d, a);
      kernels::cpu::AttentionBackwardBf16(p, dout.as<uint16_t>(), in[0], in[1], in[2], out.as<uint16_t>(),
                                          lse.as<float>(), g[0], g[1], g[2], ctx.thread_pool());
      return absl::OkStatus();
    }
    const auto in = QkvData<float>(ctx, 1, a, Widened);
    bool failed = false;
    std::array<float*, 3> wide{};
    for (int i = 0; i < 3; ++i) wide[i] = Wide(d[i], ctx, &failed);
    const std::array<float*, 3> g = GradientData(wide, a);
    const float* dout32 = Widened(dout, ctx);
    const float* out32 = Widened(out, ctx);
    if (failed || !in[0] || !in[1] || !in[2] || !dout32 || !out32) return NoScratch();
    kernels::cpu::AttentionBackward(p, dout32, in[0], in[1], in[2], out32, lse.as<float>(),
                                    g[0], g[1], g[2], ctx.thread_pool());
    for (int i = 0; i < 3; ++i) Narrow(wide[i], d[i], ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  float scale_;
  bool causal_;
  kernels::cpu::AttentionLayout layout_;
};

}  // namespace

void RegisterNnKernels(KernelRegistry& r) {
  RegisterMatMulKernels(r);
  RegisterNormKernels(r);
  RegisterReduceKernels(r);
  const DataType f32 = DataType::kFloat32, f64 = DataType::kFloat64;
  r.Register({"", "Dropout", 12, 22, AllOf({InputTypeIn(0, {f32, f64}), InputTypeIn(1, {f32, f64})}),
              MakeFactory<DropoutKernel>()});
  r.Register({"", "Dropout", 7, 11, InputTypeIn(0, {f32, f64}), MakeFactory<LegacyDropoutKernel>()});
  r.Register({"", "Trilu", 14, 14, InputTypeIn(0, FixedSizeTypes()), MakeFactory<TriluKernel>()});
  const std::string C(graph::kCleaveDomain);
  const DataType bf16 = DataType::kBFloat16, f16 = DataType::kFloat16;
  r.Register({C, "Attention", 1, 1, InputTypeIn(0, {f32, f64, bf16, f16}), MakeFactory<AttentionKernel>()});
  r.Register({C, "AttentionGrad", 1, 1, InputTypeIn(1, {f32, f64, bf16, f16}), MakeFactory<AttentionGradKernel>()});
}

}  // namespace cleave::providers
