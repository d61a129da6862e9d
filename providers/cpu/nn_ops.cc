// CPU kernels for Dropout and Trilu, and the registration of every neural-network kernel
// family (providers/cpu/). When the run carries a seed (KernelContext::run_seed; the training
// session sets one per training run), Dropout's mask is a hash of (run seed, node name,
// element): reproducible and recomputable. Otherwise each node keeps one MT19937 generator,
// seeded from the seed attribute (else from std::random_device) and advanced by each
// training-mode run, so a seeded model replays the same sequence of masks run after run
// (numpy's sequence, as the ONNX backend tests expect).
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

// Attention(q, k, v) {scale, causal} -> out[, lse] and AttentionGrad(dOut, q, k, v, out, lse)
// -> dq, dk, dv, over [..., T, D] operands whose leading dims are the same. bf16 and fp16
// operands (mixed precision) are widened to float32 scratch and the results rounded back, as
// the CUDA kernels compute them in float32 from low-precision tensors.
bool LowPrecision(DataType t) { return t == DataType::kBFloat16 || t == DataType::kFloat16; }

const float* Widened(const TensorView& t, KernelContext& ctx) {
  if (!LowPrecision(t.dtype)) return t.as<float>();
  float* w = static_cast<float*>(ctx.Scratch(static_cast<size_t>(t.numel()) * sizeof(float)));
  kernels::cpu::Cast(t, TensorView(w, DataType::kFloat32, t.dim_span()), ctx.thread_pool());
  return w;
}

// Where a kernel writes `t` in float32: `t` itself, or scratch that Narrow rounds into it.
float* Wide(TensorView* t, KernelContext& ctx) {
  if (!t) return nullptr;
  if (!LowPrecision(t->dtype)) return t->as<float>();
  return static_cast<float*>(ctx.Scratch(static_cast<size_t>(t->numel()) * sizeof(float)));
}

void Narrow(float* w, TensorView* t, ThreadPool* pool) {
  if (!t || !LowPrecision(t->dtype)) return;
  kernels::cpu::Cast(TensorView(w, DataType::kFloat32, t->dim_span()), *t, pool);
}

// Layout "bshd": the operands are [B, T, H, D]; the kernels run on [B, H, T, D] copies in
// scratch (swapping axes 1 and 2), and write their outputs through such copies.
constexpr int kSwapSeqHeads[4] = {0, 2, 1, 3};

bool BshdLayout(const graph::Node& n) { return n.AttrString("layout", "bhsd") == "bshd"; }

// Layout "bs3hd": q, k and v packed [B, T, 3, H, D] in one input (the q/k/v product itself); the
// kernels run on an unpacked [3, B, H, T, D] copy, and AttentionGrad packs dq, dk, dv so.
bool PackedLayout(const graph::Node& n) { return n.AttrString("layout", "bhsd") == "bs3hd"; }
constexpr int kUnpackQkv[5] = {2, 0, 3, 1, 4};  // [B, T, 3, H, D] -> [3, B, H, T, D]
constexpr int kPackQkv[5] = {1, 3, 0, 2, 4};    // [3, B, H, T, D] -> [B, T, 3, H, D]

absl::Status ExpectPacked(const TensorView& t) {
  if (t.rank == 5 && t.dims[2] == 3) return absl::OkStatus();
  return InvalidArgument("layout \"bs3hd\": expected q, k and v packed [B, T, 3, H, D], got ", DimsToString(t.shape()));
}

// q, k and v ([B, H, T, D] each) of the packed [B, T, 3, H, D] qkv, unpacked into scratch.
std::array<TensorView, 3> Unpacked(const TensorView& qkv, KernelContext& ctx) {
  const DimVector all = {3, qkv.dims[0], qkv.dims[3], qkv.dims[1], qkv.dims[4]};
  TensorView c(ctx.Scratch(qkv.nbytes()), qkv.dtype, all);
  kernels::cpu::Transpose(qkv, kUnpackQkv, c, ctx.thread_pool());
  const DimVector one(all.span().subspan(1));
  const size_t bytes = qkv.nbytes() / 3;
  std::array<TensorView, 3> out;
  for (int i = 0; i < 3; ++i) out[i] = TensorView(static_cast<char*>(c.data) + i * bytes, qkv.dtype, one);
  return out;
}

absl::Status ExpectRank4(const TensorView& t, const char* what) {
  if (t.rank == 4) return absl::OkStatus();
  return InvalidArgument("layout \"bshd\": expected ", what, " of rank 4 [B, T, H, D], got rank ", t.rank);
}

DimVector SwappedDims(const TensorView& t) { return {t.dims[0], t.dims[2], t.dims[1], t.dims[3]}; }

// A [B, H, T, D] copy of the [B, T, H, D] t in scratch.
TensorView HeadsMajor(const TensorView& t, KernelContext& ctx) {
  const DimVector dims = SwappedDims(t);
  TensorView c(ctx.Scratch(t.nbytes()), t.dtype, dims);
  kernels::cpu::Transpose(t, kSwapSeqHeads, c, ctx.thread_pool());
  return c;
}

// Where a kernel writes the [B, H, T, D] form of the [B, T, H, D] output y: scratch, which
// SeqMajor then moves into y.
TensorView* HeadsMajorOutput(TensorView* y, KernelContext& ctx, TensorView& storage) {
  if (!y) return nullptr;
  storage = TensorView(ctx.Scratch(y->nbytes()), y->dtype, SwappedDims(*y));
  return &storage;
}

void SeqMajor(const TensorView* heads_major, TensorView* y, ThreadPool* pool) {
  if (y) kernels::cpu::Transpose(*heads_major, kSwapSeqHeads, *y, pool);
}

class AttentionKernel : public OpKernel {
 public:
  AttentionKernel(const graph::Node& n, int)
      : scale_(n.AttrFloat("scale", 1.f)), causal_(n.AttrInt("causal", 0) != 0), bshd_(BshdLayout(n)),
        packed_(PackedLayout(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    if (packed_) {
      const TensorView& qkv = *ctx.input(0);
      RETURN_IF_ERROR(ExpectPacked(qkv));
      const std::array<TensorView, 3> u = Unpacked(qkv, ctx);
      ASSIGN_OR_RETURN(kernels::cpu::AttentionParams p, Plan(u[0], u[1], u[2]));
      TensorView* y = ctx.Output(0, {qkv.dims[0], qkv.dims[1], qkv.dims[3], p.Dv});
      TensorView* l =
          ctx.num_outputs() > 1 ? ctx.Output(1, {qkv.dims[0], qkv.dims[3], qkv.dims[1]}) : nullptr;
      TensorView y_store;
      TensorView* y_h = HeadsMajorOutput(y, ctx, y_store);
      RETURN_IF_ERROR(Run(ctx, p, u[0], u[1], u[2], y_h, l));
      SeqMajor(y_h, y, ctx.thread_pool());
      return absl::OkStatus();
    }
    if (!bshd_) {
      const TensorView& q = *ctx.input(0);
      ASSIGN_OR_RETURN(kernels::cpu::AttentionParams p, Plan(q, *ctx.input(1), *ctx.input(2)));
      DimVector out(q.dim_span()), lse(q.dim_span().first(q.rank - 1));
      out.back() = p.Dv;
      TensorView* y = ctx.Output(0, out);
      TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, lse) : nullptr;
      return Run(ctx, p, q, *ctx.input(1), *ctx.input(2), y, l);
    }
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(ExpectRank4(*ctx.input(i), i == 0 ? "q" : i == 1 ? "k" : "v"));
    const TensorView q = HeadsMajor(*ctx.input(0), ctx), k = HeadsMajor(*ctx.input(1), ctx),
                     v = HeadsMajor(*ctx.input(2), ctx);
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams p, Plan(q, k, v));
    const TensorView& q_in = *ctx.input(0);
    const DimVector out = {q_in.dims[0], q_in.dims[1], q_in.dims[2], p.Dv}, lse = {q.dims[0], q.dims[1], q.dims[2]};
    TensorView* y = ctx.Output(0, out);
    TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, lse) : nullptr;
    TensorView y_store;
    TensorView* y_h = HeadsMajorOutput(y, ctx, y_store);
    RETURN_IF_ERROR(Run(ctx, p, q, k, v, y_h, l));
    SeqMajor(y_h, y, ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<kernels::cpu::AttentionParams> Plan(const TensorView& q, const TensorView& k,
                                                     const TensorView& v) const {
    return kernels::cpu::PlanAttention(q.dim_span(), k.dim_span(), v.dim_span(), scale_, causal_);
  }

  // Over [..., T, D] operands.
  absl::Status Run(KernelContext& ctx, const kernels::cpu::AttentionParams& p, const TensorView& q,
                   const TensorView& k, const TensorView& v, TensorView* y, TensorView* l) const {
    if (!y) return absl::OkStatus();
    float* lp = l ? l->as<float>() : nullptr;
    if (q.dtype == DataType::kFloat64) {
      kernels::cpu::AttentionForward(p, q.as<double>(), k.as<double>(), v.as<double>(), y->as<double>(), lp,
                                     ctx.thread_pool());
      return absl::OkStatus();
    }
    float* out32 = Wide(y, ctx);
    kernels::cpu::AttentionForward(p, Widened(q, ctx), Widened(k, ctx), Widened(v, ctx), out32, lp,
                                   ctx.thread_pool());
    Narrow(out32, y, ctx.thread_pool());
    return absl::OkStatus();
  }

  float scale_;
  bool causal_;
  bool bshd_, packed_;
};

class AttentionGradKernel : public OpKernel {
 public:
  AttentionGradKernel(const graph::Node& n, int)
      : scale_(n.AttrFloat("scale", 1.f)), causal_(n.AttrInt("causal", 0) != 0), bshd_(BshdLayout(n)),
        packed_(PackedLayout(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& lse = *ctx.input(5);
    if (packed_) {
      const TensorView& qkv = *ctx.input(1);
      RETURN_IF_ERROR(ExpectPacked(qkv));
      RETURN_IF_ERROR(ExpectRank4(*ctx.input(0), "dOut"));
      RETURN_IF_ERROR(ExpectRank4(*ctx.input(4), "out"));
      const std::array<TensorView, 3> u = Unpacked(qkv, ctx);
      const TensorView dout = HeadsMajor(*ctx.input(0), ctx), out = HeadsMajor(*ctx.input(4), ctx);
      TensorView* dqkv = ctx.Output(0, qkv.dim_span());
      if (!dqkv) return absl::OkStatus();
      const DimVector all = {3, qkv.dims[0], qkv.dims[3], qkv.dims[1], qkv.dims[4]};
      TensorView grads(ctx.Scratch(qkv.nbytes()), qkv.dtype, all);
      std::array<TensorView, 3> d;
      for (int i = 0; i < 3; ++i)
        d[i] = TensorView(static_cast<char*>(grads.data) + i * (qkv.nbytes() / 3), qkv.dtype, u[i].dim_span());
      RETURN_IF_ERROR(Run(ctx, dout, u[0], u[1], u[2], out, lse, &d[0], &d[1], &d[2]));
      kernels::cpu::Transpose(grads, kPackQkv, *dqkv, ctx.thread_pool());
      return absl::OkStatus();
    }
    if (!bshd_) {
      const TensorView &q = *ctx.input(1), &k = *ctx.input(2), &v = *ctx.input(3);
      return Run(ctx, *ctx.input(0), q, k, v, *ctx.input(4), lse, ctx.Output(0, q.dim_span()),
                 ctx.Output(1, k.dim_span()), ctx.Output(2, v.dim_span()));
    }
    static const char* kNames[] = {"dOut", "q", "k", "v", "out"};
    for (int i = 0; i < 5; ++i) RETURN_IF_ERROR(ExpectRank4(*ctx.input(i), kNames[i]));
    TensorView in[5];
    for (int i = 0; i < 5; ++i) in[i] = HeadsMajor(*ctx.input(i), ctx);
    TensorView* d[3];
    TensorView store[3];
    TensorView* d_h[3];
    for (int i = 0; i < 3; ++i) {
      d[i] = ctx.Output(i, ctx.input(1 + i)->dim_span());
      d_h[i] = HeadsMajorOutput(d[i], ctx, store[i]);
    }
    RETURN_IF_ERROR(Run(ctx, in[0], in[1], in[2], in[3], in[4], lse, d_h[0], d_h[1], d_h[2]));
    for (int i = 0; i < 3; ++i) SeqMajor(d_h[i], d[i], ctx.thread_pool());
    return absl::OkStatus();
  }

 private:
  // Over [..., T, D] operands.
  absl::Status Run(KernelContext& ctx, const TensorView& dout, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView& lse, TensorView* dq, TensorView* dk,
                   TensorView* dv) const {
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams p,
                     kernels::cpu::PlanAttention(q.dim_span(), k.dim_span(), v.dim_span(), scale_, causal_));
    if (dout.numel() != p.batch * p.T * p.Dv || out.numel() != dout.numel() || lse.numel() != p.batch * p.T)
      return InvalidArgument("expected dOut and out of ", p.batch * p.T * p.Dv, " elements and lse of ", p.batch * p.T,
                             ", got ", dout.numel(), ", ", out.numel(), " and ", lse.numel());
    if (q.dtype == DataType::kFloat64) {
      kernels::cpu::AttentionBackward(p, dout.as<double>(), q.as<double>(), k.as<double>(), v.as<double>(),
                                      out.as<double>(), lse.as<float>(), dq ? dq->as<double>() : nullptr,
                                      dk ? dk->as<double>() : nullptr, dv ? dv->as<double>() : nullptr,
                                      ctx.thread_pool());
      return absl::OkStatus();
    }
    if (dout.dtype != q.dtype || out.dtype != q.dtype)
      return InvalidArgument("expected dOut and out of q's type ", DataTypeName(q.dtype), ", got ",
                             DataTypeName(dout.dtype), " and ", DataTypeName(out.dtype));
    float *dq32 = Wide(dq, ctx), *dk32 = Wide(dk, ctx), *dv32 = Wide(dv, ctx);
    kernels::cpu::AttentionBackward(p, Widened(dout, ctx), Widened(q, ctx), Widened(k, ctx), Widened(v, ctx),
                                    Widened(out, ctx), lse.as<float>(), dq32, dk32, dv32, ctx.thread_pool());
    Narrow(dq32, dq, ctx.thread_pool());
    Narrow(dk32, dk, ctx.thread_pool());
    Narrow(dv32, dv, ctx.thread_pool());
    return absl::OkStatus();
  }

  float scale_;
  bool causal_;
  bool bshd_, packed_;
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
