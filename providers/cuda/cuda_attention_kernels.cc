// The CUDA provider's attention kernels (providers/cuda/): ai.cleave.Attention and
// AttentionGrad in their layouts, through cuDNN's fused flash attention where it takes the case
// and the own flash-style kernels otherwise.
#include <vector>

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

// Attention(q, k, v) -> out[, lse] and AttentionGrad(dOut, q, k, v, out, lse) -> dq, dk, dv
// (flash-style: the probabilities are never stored): cuDNN's fused attention for the bf16/fp16
// shapes it takes (cudnn_attention.h), the own kernels otherwise.
// The attention sizes as the CPU plans them, within what the CUDA kernels hold (head dims <= 256).
absl::StatusOr<kernels::cpu::AttentionParams> AttentionShape(const std::string& name, const TensorView& q,
                                                             const TensorView& k, const TensorView& v, float scale,
                                                             bool causal) {
  auto p = kernels::cpu::PlanAttention(q.dim_span(), k.dim_span(), v.dim_span(), scale, causal);
  if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(name, ": ", p.status().message()));
  if (p->D > 256 || p->Dv > 256) return Unimplemented(name, ": head dims over 256 on CUDA");
  return p;
}

// Layout "bshd": [B, T, H, D] operands, and "bs3hd": q, k and v packed [B, T, 3, H, D] in one
// tensor (the q/k/v product), out [B, T, H, D]. cuDNN and the own kernels alike read and write
// them in place through their strides.
kernels::cpu::AttentionLayout LayoutOf(const graph::Node& n) {
  const std::string layout = n.AttrString("layout", "bhsd");
  return layout == "bshd"    ? kernels::cpu::AttentionLayout::kBshd
         : layout == "bs3hd" ? kernels::cpu::AttentionLayout::kBs3hd
                             : kernels::cpu::AttentionLayout::kBhsd;
}

// The [B, H, T, D] view (dims only) of the [B, T, H, D] t.
TensorView HeadsMajorDims(const TensorView& t) {
  const int64_t dims[4] = {t.dims[0], t.dims[2], t.dims[1], t.dims[3]};
  return TensorView(t.data, t.dtype, dims);
}

// The [B, H, T, D] dims (no data) of one of the packed [B, T, 3, H, D] q, k, v.
TensorView OneOfPacked(const TensorView& qkv) {
  const int64_t dims[4] = {qkv.dims[0], qkv.dims[3], qkv.dims[1], qkv.dims[4]};
  return TensorView(nullptr, qkv.dtype, dims);
}

// The device kernels' strides of a planned over [B, H, T, D] operands, laid out as `layout`
// with `heads` heads.
kc::AttentionLayout DeviceLayout(kernels::cpu::AttentionParams a, kernels::cpu::AttentionLayout layout,
                                 int64_t heads) {
  kernels::cpu::SetLayout(a, layout, heads);
  const auto strides = [](const kernels::cpu::AttentionStrides& s) { return kc::AttentionStrides{s.batch, s.head, s.row}; };
  return {a.heads, strides(a.q), strides(a.k), strides(a.v), strides(a.o)};
}

// The attention kernels' operand checks and sizes for the three layouts.
class AttentionLayoutKernel : public CudaKernel {
 protected:
  AttentionLayoutKernel(const CudaExecutionProvider* p, const graph::Node& n)
      : CudaKernel(p, n), scale_(n.AttrFloat("scale", 1.f)), causal_(n.AttrInt("causal", 0) != 0),
        layout_(LayoutOf(n)) {}

  bool packed() const { return layout_ == kernels::cpu::AttentionLayout::kBs3hd; }
  bool bshd() const { return layout_ == kernels::cpu::AttentionLayout::kBshd; }

  absl::Status ExpectPacked(const TensorView& t) const {
    if (t.rank == 5 && t.dims[2] == 3) return absl::OkStatus();
    return InvalidArgument(name_, ": layout \"bs3hd\" takes q, k and v packed [B, T, 3, H, D], got ",
                           DimsToString(t.shape()));
  }
  // The sizes of q, k and v (each [B, T, H, D] under "bshd").
  absl::StatusOr<kernels::cpu::AttentionParams> Plan(const TensorView& q, const TensorView& k,
                                                     const TensorView& v) const {
    if (!bshd()) return AttentionShape(name_, q, k, v, scale_, causal_);
    return AttentionShape(name_, HeadsMajorDims(q), HeadsMajorDims(k), HeadsMajorDims(v), scale_, causal_);
  }
  // The heads of the layout's operands: dim 2 of [B, T, H, D], dim 3 of [B, T, 3, H, D].
  int64_t Heads(const TensorView& q) const { return packed() ? q.dims[3] : bshd() ? q.dims[2] : 0; }
  SdpaShape Sdpa(const kernels::cpu::AttentionParams& a, const TensorView& q) const {
    return SdpaShape{q.dtype, a.batch, a.T, a.S, a.D, a.Dv, scale_, causal_, Heads(q), packed()};
  }
  kc::AttentionLayout Strides(const kernels::cpu::AttentionParams& a, const TensorView& q) const {
    return DeviceLayout(a, layout_, layout_ == kernels::cpu::AttentionLayout::kBhsd ? 1 : Heads(q));
  }
  absl::Status Named(const absl::Status& st) const {
    return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
  }

  float scale_;
  bool causal_;
  kernels::cpu::AttentionLayout layout_;
};

class AttentionKernel : public AttentionLayoutKernel {
 public:
  AttentionKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : AttentionLayoutKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& q = *ctx.input(0);
    const void *qd = q.data, *kd, *vd;
    kernels::cpu::AttentionParams a;
    std::vector<int64_t> out_dims, lse_dims;
    if (packed()) {
      RETURN_IF_ERROR(ExpectPacked(q));
      const TensorView one = OneOfPacked(q);
      ASSIGN_OR_RETURN(a, AttentionShape(name_, one, one, one, scale_, causal_));
      const size_t part = static_cast<size_t>(q.dims[3] * q.dims[4]) * ElementSize(q.dtype);  // H * D elements
      kd = static_cast<const char*>(q.data) + part;
      vd = static_cast<const char*>(q.data) + 2 * part;
      out_dims = {q.dims[0], q.dims[1], q.dims[3], q.dims[4]};
      lse_dims = {q.dims[0], q.dims[3], q.dims[1]};
    } else {
      const TensorView& k = *ctx.input(1);
      const TensorView& v = *ctx.input(2);
      if (bshd() && (q.rank != 4 || k.rank != 4 || v.rank != 4))
        return InvalidArgument(name_, ": layout \"bshd\" takes q, k and v of rank 4 [B, T, H, D]");
      ASSIGN_OR_RETURN(a, Plan(q, k, v));
      kd = k.data;
      vd = v.data;
      out_dims.assign(q.dims, q.dims + q.rank);
      out_dims.back() = a.Dv;
      const TensorView heads_major = bshd() ? HeadsMajorDims(q) : q;
      lse_dims.assign(heads_major.dims, heads_major.dims + heads_major.rank - 1);
    }
    TensorView* y = ctx.Output(0, out_dims);
    TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, lse_dims) : nullptr;
    if (!y) return absl::OkStatus();
    // bf16/fp16: cuDNN's fused flash attention (tensor cores) when it takes the shape.
    const SdpaShape s = Sdpa(a, q);
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      float* stats = l ? l->as<float>() : static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * 4));
      absl::Status st = stats ? cudnn->Forward(s, qd, kd, vd, y->data, stats, [&ctx](size_t n) { return ctx.Scratch(n); })
                              : absl::OkStatus();  // the allocation error is reported
      if (st.code() != absl::StatusCode::kUnimplemented) return Named(st);
    }
    return Check(kc::AttentionForward(DtOf(q.dtype), Strides(a, q), qd, kd, vd, y->data, l ? l->as<float>() : nullptr,
                                      a.batch, a.T, a.S, static_cast<int>(a.D), static_cast<int>(a.Dv), scale_,
                                      causal_, stream()));
  }
};

// AttentionGrad(dOut, q, k, v, out, lse) -> dq, dk, dv; under "bs3hd" AttentionGrad(dOut, qkv, _,
// _, out, lse) -> dqkv, all but lse packed or [B, T, H, D].
class AttentionGradKernel : public AttentionLayoutKernel {
 public:
  AttentionGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : AttentionLayoutKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dout = *ctx.input(0);
    const TensorView& q = *ctx.input(1);
    const TensorView& out = *ctx.input(4);
    const TensorView& lse = *ctx.input(5);
    const void *kd, *vd;
    void *dq, *dk, *dv;
    kernels::cpu::AttentionParams a;
    if (packed()) {
      RETURN_IF_ERROR(ExpectPacked(q));
      if (dout.rank != 4 || out.rank != 4)
        return InvalidArgument(name_, ": layout \"bs3hd\" takes dOut and out of rank 4 [B, T, H, D]");
      const TensorView one = OneOfPacked(q);
      ASSIGN_OR_RETURN(a, AttentionShape(name_, one, one, one, scale_, causal_));
      RETURN_IF_ERROR(ExpectOutAndLse(a, dout, out, lse));
      TensorView* dqkv = ctx.Output(0, q.dim_span());
      if (!dqkv) return absl::OkStatus();
      const size_t part = static_cast<size_t>(q.dims[3] * q.dims[4]) * ElementSize(q.dtype);
      kd = static_cast<const char*>(q.data) + part;
      vd = static_cast<const char*>(q.data) + 2 * part;
      dq = dqkv->data;
      dk = static_cast<char*>(dqkv->data) + part;
      dv = static_cast<char*>(dqkv->data) + 2 * part;
    } else {
      const TensorView& k = *ctx.input(2);
      const TensorView& v = *ctx.input(3);
      if (bshd())
        for (const TensorView* t : {&dout, &q, &k, &v, &out})
          if (t->rank != 4)
            return InvalidArgument(name_, ": layout \"bshd\" takes dOut, q, k, v and out of rank 4 [B, T, H, D]");
      ASSIGN_OR_RETURN(a, Plan(q, k, v));
      RETURN_IF_ERROR(ExpectOutAndLse(a, dout, out, lse));
      TensorView* dq_t = ctx.Output(0, q.dim_span());
      TensorView* dk_t = ctx.Output(1, k.dim_span());
      TensorView* dv_t = ctx.Output(2, v.dim_span());
      if (!dq_t || !dk_t || !dv_t) return Unimplemented(name_, ": every AttentionGrad output must be used on CUDA");
      kd = k.data;
      vd = v.data;
      dq = dq_t->data;
      dk = dk_t->data;
      dv = dv_t->data;
    }
    const SdpaShape s = Sdpa(a, q);
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      absl::Status st = cudnn->Backward(s, dout.data, q.data, kd, vd, out.data, lse.as<float>(), dq, dk, dv,
                                        [&ctx](size_t n) { return ctx.Scratch(n); });
      if (st.code() != absl::StatusCode::kUnimplemented) return Named(st);
    }
    float* delta = static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * sizeof(float)));
    if (!delta && a.batch * a.T > 0) return absl::OkStatus();  // the allocation error is reported
    return Check(kc::AttentionBackward(DtOf(q.dtype), Strides(a, q), dout.data, q.data, kd, vd, out.data,
                                       lse.as<float>(), dq, dk, dv, delta, a.batch, a.T, a.S, static_cast<int>(a.D),
                                       static_cast<int>(a.Dv), scale_, causal_, stream()));
  }

 private:
  absl::Status ExpectOutAndLse(const kernels::cpu::AttentionParams& a, const TensorView& dout, const TensorView& out,
                               const TensorView& lse) const {
    if (dout.numel() == a.batch * a.T * a.Dv && out.numel() == dout.numel() && lse.numel() == a.batch * a.T)
      return absl::OkStatus();
    return InvalidArgument(name_, ": dOut ", DimsToString(dout.shape()), ", out ", DimsToString(out.shape()),
                           " or lse ", DimsToString(lse.shape()), " do not match ", a.batch, " slices of ", a.T,
                           " rows of ", a.Dv);
  }
};

}  // namespace

void RegisterCudaAttentionKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  Add<AttentionKernel>(r, p, C, "Attention", 1, 1, InputTypeIn(0, kFloats));
  Add<AttentionGradKernel>(r, p, C, "AttentionGrad", 1, 1, InputTypeIn(1, kFloats));
}

}  // namespace cleave::providers
