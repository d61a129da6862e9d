// The CUDA provider's attention kernels (providers/cuda/): ai.cleave.Attention and
// AttentionGrad in their layouts, through cuDNN's fused flash attention where it takes the case
// and the own flash-style kernels otherwise.
#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/kernels.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_provider.h"
#include "providers/cuda/cudnn_attention.h"

namespace cleave::providers {
namespace {

// Attention(q, k, v[, bias]) -> out[, lse] and AttentionGrad(dOut, q, k, v, out, lse[, bias]) ->
// dq, dk, dv[, dbias] (flash-style: the probabilities are never stored) in the three layouts:
// "bhsd", [..., T, D]; "bshd", [B, T, H, D]; "bs3hd", q, k and v packed [B, T, 3, H, D] in one
// tensor (the q/k/v product), out [B, T, H, D]. cuDNN's fused attention runs the bf16/fp16
// shapes it takes (cudnn_attention.h; a bias too, but not a backward that forms the bias's
// gradient), the own kernels the others; both read and write every layout in place through
// its strides.
class AttentionLayoutKernel : public CudaKernel {
 protected:
  AttentionLayoutKernel(const CudaExecutionProvider* p, const graph::Node& n)
      : CudaKernel(p, n),
        scale_(n.AttrFloat("scale", 1.f)),
        causal_(n.AttrInt("causal", 0) != 0),
        layout_(kernels::cpu::AttentionLayoutNamed(n.AttrString("layout", "bhsd"))) {}

  bool packed() const { return layout_ == kernels::cpu::AttentionLayout::kBs3hd; }

  // The operands planned as the CPU plans them (q, k and v: inputs first to first + 2, or the
  // packed input first; the bias input `bias`, absent or fp32 device memory or cast into fp32
  // scratch), within what the CUDA kernels hold (head dims <= 256).
  absl::StatusOr<kernels::cpu::AttentionOperands> Plan(KernelContext& ctx, int first, int bias) const {
    const auto dims = [&](int i) {
      return packed() ? std::span<const int64_t>() : ctx.input(first + i)->dim_span();
    };
    auto a = kernels::cpu::PlanAttentionOperands(layout_, ctx.input(first)->dim_span(), dims(1), dims(2), scale_,
                                                 causal_);
    if (!a.ok()) return Named(a.status());
    if (a->p.D > 256 || a->p.Dv > 256) return Unimplemented(name_, ": head dims over 256 on CUDA");
    if (const TensorView* b = bias < ctx.num_inputs() ? ctx.input(bias) : nullptr) {
      RETURN_IF_ERROR(Named(kernels::cpu::PlanAttentionBias(*a, b->dim_span())));
      if (b->dtype == DataType::kFloat32) {
        a->p.bias.data = b->as<float>();
      } else {
        float* w = static_cast<float*>(ctx.Scratch(static_cast<size_t>(b->numel()) * sizeof(float)));
        if (!w) return absl::ResourceExhaustedError(absl::StrCat(name_, ": no device memory for the fp32 bias"));
        RETURN_IF_ERROR(Check(kc::Cast(DtOf(b->dtype), kc::Dt::kF32, b->data, w, b->numel(), stream())));
        a->p.bias.data = w;
      }
    }
    return a;
  }
  // The k and v of the planned operands: the next inputs, or parts of the packed one.
  const void* Part(KernelContext& ctx, const kernels::cpu::AttentionOperands& a, int first, int i) const {
    if (!a.packed) return ctx.input(first + i)->data;
    const TensorView& qkv = *ctx.input(first);
    return static_cast<const char*>(qkv.data) + (i == 1 ? a.k_offset : a.v_offset) * ElementSize(qkv.dtype);
  }
  SdpaShape Sdpa(const kernels::cpu::AttentionOperands& a, DataType dtype) const {
    const kernels::cpu::AttentionParams& p = a.p;
    const int64_t heads = layout_ == kernels::cpu::AttentionLayout::kBhsd ? 0 : p.heads;
    SdpaShape s{dtype, p.batch, p.T, p.S, p.D, p.Dv, scale_, causal_, heads, a.packed};
    if (p.bias.data) {  // slice b's bias at b / heads * batch + b % heads * head: [b / heads, heads] strides
      s.bias = true;
      s.bias_heads = p.bias.heads;
      const int64_t strides[4] = {p.bias.batch, p.bias.head, p.bias.row, p.bias.col};
      std::copy(strides, strides + 4, s.bias_strides);
    }
    return s;
  }
  // The device kernels' strides, as the plan laid them out.
  static kc::AttentionLayout Strides(const kernels::cpu::AttentionParams& p) {
    const auto strides = [](const kernels::cpu::AttentionStrides& s) { return kc::AttentionStrides{s.batch, s.head, s.row}; };
    const kernels::cpu::AttentionBias& b = p.bias;
    return {p.heads, strides(p.q), strides(p.k), strides(p.v), strides(p.o),
            kc::AttentionBias{b.data, b.heads, b.batch, b.head, b.row, b.col}, p.dscores};
  }
  float scale_;
  bool causal_;
  kernels::cpu::AttentionLayout layout_;
};

class AttentionKernel : public AttentionLayoutKernel {
 public:
  AttentionKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : AttentionLayoutKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(const kernels::cpu::AttentionOperands a, Plan(ctx, 0, 3));
    const kernels::cpu::AttentionParams& p = a.p;
    const TensorView& q = *ctx.input(0);
    const void *kd = Part(ctx, a, 0, 1), *vd = Part(ctx, a, 0, 2);
    TensorView* y = ctx.Output(0, a.out.span());
    TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, a.lse.span()) : nullptr;
    if (!y) return absl::OkStatus();
    // bf16/fp16: cuDNN's fused flash attention (tensor cores) when it takes the shape.
    const SdpaShape s = Sdpa(a, q.dtype);
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      float* stats = l ? l->as<float>() : static_cast<float*>(ctx.Scratch(static_cast<size_t>(p.batch * p.T) * 4));
      absl::Status st = stats ? cudnn->Forward(s, q.data, kd, vd, y->data, stats,
                                               [&ctx](size_t n) { return ctx.Scratch(n); }, p.bias.data)
                              : NoScratch();
      if (st.code() != absl::StatusCode::kUnimplemented) return Named(st);
    }
    return Check(kc::AttentionForward(DtOf(q.dtype), Strides(p), q.data, kd, vd, y->data, l ? l->as<float>() : nullptr,
                                      p.batch, p.T, p.S, static_cast<int>(p.D), static_cast<int>(p.Dv), scale_,
                                      causal_, stream()));
  }
};

// AttentionGrad(dOut, q, k, v, out, lse[, bias]) -> dq, dk, dv[, dbias]; under "bs3hd"
// AttentionGrad(dOut, qkv, _, _, out, lse[, bias]) -> dqkv, _, _[, dbias], all but lse and dbias
// packed or [B, T, H, D]; dbias, the scores' gradient, is fp32 [B, H, T, S].
class AttentionGradKernel : public AttentionLayoutKernel {
 public:
  AttentionGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : AttentionLayoutKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    ASSIGN_OR_RETURN(kernels::cpu::AttentionOperands a, Plan(ctx, 1, 6));
    const kernels::cpu::AttentionParams& p = a.p;
    const TensorView& dout = *ctx.input(0);
    const TensorView& q = *ctx.input(1);
    const TensorView& out = *ctx.input(4);
    const TensorView& lse = *ctx.input(5);
    if (DimVector(dout.dim_span()) != a.out || DimVector(out.dim_span()) != a.out || lse.numel() != p.batch * p.T)
      return InvalidArgument(name_, ": expected dOut and out ", DimsToString(a.out.span()), " and lse of ",
                             p.batch * p.T, " elements, got ", DimsToString(dout.shape()), ", ",
                             DimsToString(out.shape()), " and ", lse.numel());
    const void *kd = Part(ctx, a, 1, 1), *vd = Part(ctx, a, 1, 2);
    void *dq, *dk, *dv;
    if (a.packed) {
      TensorView* dqkv = ctx.Output(0, q.dim_span());
      if (!dqkv) return absl::OkStatus();
      const size_t es = ElementSize(q.dtype);
      dq = dqkv->data;
      dk = static_cast<char*>(dqkv->data) + a.k_offset * es;
      dv = static_cast<char*>(dqkv->data) + a.v_offset * es;
    } else {
      TensorView* d[3];
      for (int i = 0; i < 3; ++i) d[i] = ctx.Output(i, ctx.input(1 + i)->dim_span());
      if (!d[0] || !d[1] || !d[2]) return Unimplemented(name_, ": every AttentionGrad output must be used on CUDA");
      dq = d[0]->data;
      dk = d[1]->data;
      dv = d[2]->data;
    }
    if (ctx.num_outputs() > 3) {  // the scores' gradient, for the bias
      if (TensorView* ds = ctx.Output(3, kernels::cpu::ScoreDims(a).span())) a.p.dscores = ds->as<float>();
    }
    const SdpaShape s = Sdpa(a, q.dtype);
    // The bias's gradient (the scores' gradient) only from the own kernels.
    if (CudnnAttention* cudnn = !a.p.dscores && CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      absl::Status st = cudnn->Backward(s, dout.data, q.data, kd, vd, out.data, lse.as<float>(), dq, dk, dv,
                                        [&ctx](size_t n) { return ctx.Scratch(n); }, p.bias.data);
      if (st.code() != absl::StatusCode::kUnimplemented) return Named(st);
    }
    float* delta = static_cast<float*>(ctx.Scratch(static_cast<size_t>(p.batch * p.T) * sizeof(float)));
    if (!delta && p.batch * p.T > 0) return NoScratch();
    return Check(kc::AttentionBackward(DtOf(q.dtype), Strides(p), dout.data, q.data, kd, vd, out.data, lse.as<float>(),
                                       dq, dk, dv, delta, p.batch, p.T, p.S, static_cast<int>(p.D),
                                       static_cast<int>(p.Dv), scale_, causal_, stream()));
  }
};

}  // namespace

void RegisterCudaAttentionKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  Add<AttentionKernel>(r, p, C, "Attention", 1, 1, InputTypeIn(0, kFloats));
  Add<AttentionGradKernel>(r, p, C, "AttentionGrad", 1, 1, InputTypeIn(1, kFloats));
}

}  // namespace cleave::providers
