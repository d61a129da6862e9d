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

// Layout "bshd": [B, T, H, D] operands. cuDNN reads and writes them through their strides; the
// own kernels run on [B, H, T, D] copies in scratch (swapping axes 1 and 2).
bool BshdLayout(const graph::Node& n) { return n.AttrString("layout", "bhsd") == "bshd"; }

// The [B, H, T, D] view (dims only) of the [B, T, H, D] t.
TensorView HeadsMajorDims(const TensorView& t) {
  const int64_t dims[4] = {t.dims[0], t.dims[2], t.dims[1], t.dims[3]};
  return TensorView(t.data, t.dtype, dims);
}

const int64_t kSwapSeqHeads[4] = {0, 2, 1, 3};

// Layout "bs3hd": q, k and v packed [B, T, 3, H, D] in one tensor (the q/k/v product). cuDNN
// reads them (and writes dq, dk, dv) in place; the own kernels run on an unpacked [3, B, H, T,
// D] copy.
bool PackedLayout(const graph::Node& n) { return n.AttrString("layout", "bhsd") == "bs3hd"; }
const int64_t kUnpackQkv[5] = {2, 0, 3, 1, 4};  // [B, T, 3, H, D] -> [3, B, H, T, D]
const int64_t kPackQkv[5] = {1, 3, 0, 2, 4};    // [3, B, H, T, D] -> [B, T, 3, H, D]

// The [B, H, T, D] dims (no data) of one of the packed [B, T, 3, H, D] q, k, v.
TensorView OneOfPacked(const TensorView& qkv) {
  const int64_t dims[4] = {qkv.dims[0], qkv.dims[3], qkv.dims[1], qkv.dims[4]};
  return TensorView(nullptr, qkv.dtype, dims);
}

// The attention kernels' moves between the layouts for their own kernels.
class AttentionLayoutKernel : public CudaKernel {
 protected:
  using CudaKernel::CudaKernel;
  // A [B, H, T, D] copy in scratch of the [B, T, H, D] device tensor t.
  absl::StatusOr<const void*> HeadsMajorCopy(KernelContext& ctx, const TensorView& t) const {
    void* c = ctx.Scratch(t.nbytes());
    if (!c && t.nbytes() > 0) return absl::ResourceExhaustedError(absl::StrCat(name_, ": no device scratch"));
    RETURN_IF_ERROR(Check(kc::Transpose(static_cast<int>(ElementSize(t.dtype)), t.data, c, 4, t.dims, kSwapSeqHeads,
                                        stream())));
    return static_cast<const void*>(c);
  }
  // The packed [B, T, 3, H, D] qkv unpacked into a [3, B, H, T, D] copy in scratch.
  absl::StatusOr<const char*> UnpackedCopy(KernelContext& ctx, const TensorView& qkv) const {
    void* c = ctx.Scratch(qkv.nbytes());
    if (!c && qkv.nbytes() > 0) return absl::ResourceExhaustedError(absl::StrCat(name_, ": no device scratch"));
    RETURN_IF_ERROR(Check(kc::Transpose(static_cast<int>(ElementSize(qkv.dtype)), qkv.data, c, 5, qkv.dims, kUnpackQkv,
                                        stream())));
    return static_cast<const char*>(c);
  }
  absl::Status ExpectPacked(const TensorView& t) const {
    if (t.rank == 5 && t.dims[2] == 3) return absl::OkStatus();
    return InvalidArgument(name_, ": layout \"bs3hd\" takes q, k and v packed [B, T, 3, H, D], got ",
                           DimsToString(t.shape()));
  }
  // Moves the [B, H, T, D] result in heads_major into the [B, T, H, D] output y.
  absl::Status SeqMajorCopy(const void* heads_major, const TensorView& y) const {
    const TensorView h = HeadsMajorDims(y);
    return Check(kc::Transpose(static_cast<int>(ElementSize(y.dtype)), heads_major, y.data, 4, h.dims,
                               kSwapSeqHeads, stream()));
  }
};

class AttentionKernel : public AttentionLayoutKernel {
 public:
  AttentionKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : AttentionLayoutKernel(p, n), scale_(n.AttrFloat("scale", 1.f)), causal_(n.AttrInt("causal", 0) != 0),
        bshd_(BshdLayout(n)), packed_(PackedLayout(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    if (packed_) return ComputePacked(ctx);
    const TensorView& q_in = *ctx.input(0);
    const TensorView& k_in = *ctx.input(1);
    const TensorView& v_in = *ctx.input(2);
    if (bshd_ && (q_in.rank != 4 || k_in.rank != 4 || v_in.rank != 4))
      return InvalidArgument(name_, ": layout \"bshd\" takes q, k and v of rank 4 [B, T, H, D]");
    // The sizes, as over [B, H, T, D] operands.
    const TensorView q = bshd_ ? HeadsMajorDims(q_in) : q_in;
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams a,
                     AttentionShape(name_, q, bshd_ ? HeadsMajorDims(k_in) : k_in, bshd_ ? HeadsMajorDims(v_in) : v_in,
                                    scale_, causal_));
    std::vector<int64_t> out(q_in.dims, q_in.dims + q_in.rank), lse(q.dims, q.dims + q.rank - 1);
    out.back() = a.Dv;
    TensorView* y = ctx.Output(0, out);
    TensorView* l = ctx.num_outputs() > 1 ? ctx.Output(1, lse) : nullptr;
    if (!y) return absl::OkStatus();
    // bf16/fp16: cuDNN's fused flash attention (tensor cores) when it takes the shape.
    const SdpaShape s{q.dtype, a.batch, a.T, a.S, a.D, a.Dv, scale_, causal_, bshd_ ? q_in.dims[2] : 0};
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      float* stats = l ? l->as<float>() : static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * 4));
      absl::Status st = stats ? cudnn->Forward(s, q_in.data, k_in.data, v_in.data, y->data, stats,
                                               [&ctx](size_t n) { return ctx.Scratch(n); })
                              : absl::OkStatus();  // the allocation error is reported
      if (st.code() != absl::StatusCode::kUnimplemented)
        return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
    }
    const void *qd = q_in.data, *kd = k_in.data, *vd = v_in.data;
    void* yd = y->data;
    if (bshd_) {
      ASSIGN_OR_RETURN(qd, HeadsMajorCopy(ctx, q_in));
      ASSIGN_OR_RETURN(kd, HeadsMajorCopy(ctx, k_in));
      ASSIGN_OR_RETURN(vd, HeadsMajorCopy(ctx, v_in));
      yd = ctx.Scratch(y->nbytes());
      if (!yd && y->nbytes() > 0) return absl::OkStatus();  // the allocation error is reported
    }
    RETURN_IF_ERROR(Check(kc::AttentionForward(DtOf(q.dtype), qd, kd, vd, yd, l ? l->as<float>() : nullptr, a.batch,
                                               a.T, a.S, static_cast<int>(a.D), static_cast<int>(a.Dv), scale_,
                                               causal_, stream())));
    if (!bshd_) return absl::OkStatus();
    return SeqMajorCopy(yd, *y);
  }

 private:
  absl::Status ComputePacked(KernelContext& ctx) const {
    const TensorView& qkv = *ctx.input(0);
    RETURN_IF_ERROR(ExpectPacked(qkv));
    const TensorView one = OneOfPacked(qkv);
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams a, AttentionShape(name_, one, one, one, scale_, causal_));
    TensorView* y = ctx.Output(0, std::vector<int64_t>{qkv.dims[0], qkv.dims[1], qkv.dims[3], qkv.dims[4]});
    TensorView* l =
        ctx.num_outputs() > 1 ? ctx.Output(1, std::vector<int64_t>{qkv.dims[0], qkv.dims[3], qkv.dims[1]}) : nullptr;
    if (!y) return absl::OkStatus();
    const size_t part = static_cast<size_t>(qkv.dims[3] * qkv.dims[4]) * ElementSize(qkv.dtype);  // H * D elements
    const char* base = static_cast<const char*>(qkv.data);
    const SdpaShape s{qkv.dtype, a.batch, a.T, a.S, a.D, a.Dv, scale_, causal_, qkv.dims[3], true};
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      float* stats = l ? l->as<float>() : static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * 4));
      absl::Status st = stats ? cudnn->Forward(s, base, base + part, base + 2 * part, y->data, stats,
                                               [&ctx](size_t n) { return ctx.Scratch(n); })
                              : absl::OkStatus();  // the allocation error is reported
      if (st.code() != absl::StatusCode::kUnimplemented)
        return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
    }
    ASSIGN_OR_RETURN(const char* u, UnpackedCopy(ctx, qkv));
    const size_t third = qkv.nbytes() / 3;
    void* yd = ctx.Scratch(y->nbytes());
    if (!yd && y->nbytes() > 0) return absl::OkStatus();  // the allocation error is reported
    RETURN_IF_ERROR(Check(kc::AttentionForward(DtOf(qkv.dtype), u, u + third, u + 2 * third, yd,
                                               l ? l->as<float>() : nullptr, a.batch, a.T, a.S, static_cast<int>(a.D),
                                               static_cast<int>(a.Dv), scale_, causal_, stream())));
    return SeqMajorCopy(yd, *y);
  }

  float scale_;
  bool causal_;
  bool bshd_;
  bool packed_;
};

class AttentionGradKernel : public AttentionLayoutKernel {
 public:
  AttentionGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : AttentionLayoutKernel(p, n), scale_(n.AttrFloat("scale", 1.f)), causal_(n.AttrInt("causal", 0) != 0),
        bshd_(BshdLayout(n)), packed_(PackedLayout(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    if (packed_) return ComputePacked(ctx);
    const TensorView* in[5];
    for (int i = 0; i < 5; ++i) {
      in[i] = ctx.input(i);
      if (bshd_ && in[i]->rank != 4)
        return InvalidArgument(name_, ": layout \"bshd\" takes dOut, q, k, v and out of rank 4 [B, T, H, D]");
    }
    const TensorView& dout = *in[0];
    const TensorView& q = *in[1];
    const TensorView& k = *in[2];
    const TensorView& v = *in[3];
    const TensorView& out = *in[4];
    const TensorView& lse = *ctx.input(5);
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams a,
                     AttentionShape(name_, bshd_ ? HeadsMajorDims(q) : q, bshd_ ? HeadsMajorDims(k) : k,
                                    bshd_ ? HeadsMajorDims(v) : v, scale_, causal_));
    if (dout.numel() != a.batch * a.T * a.Dv || out.numel() != dout.numel() || lse.numel() != a.batch * a.T)
      return InvalidArgument(name_, ": dOut, out or lse do not match q and v");
    TensorView* dq = ctx.Output(0, q.dim_span());
    TensorView* dk = ctx.Output(1, k.dim_span());
    TensorView* dv = ctx.Output(2, v.dim_span());
    if (!dq || !dk || !dv) return Unimplemented(name_, ": every AttentionGrad output must be used on CUDA");
    const SdpaShape s{q.dtype, a.batch, a.T, a.S, a.D, a.Dv, scale_, causal_, bshd_ ? q.dims[2] : 0};
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      absl::Status st = cudnn->Backward(s, dout.data, q.data, k.data, v.data, out.data, lse.as<float>(), dq->data,
                                        dk->data, dv->data, [&ctx](size_t n) { return ctx.Scratch(n); });
      if (st.code() != absl::StatusCode::kUnimplemented)
        return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
    }
    float* delta = static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * sizeof(float)));
    if (!delta && a.batch * a.T > 0) return absl::OkStatus();  // the allocation error is reported
    const void* src[5] = {dout.data, q.data, k.data, v.data, out.data};
    void* dst[3] = {dq->data, dk->data, dv->data};
    if (bshd_) {
      for (int i = 0; i < 5; ++i) {
        ASSIGN_OR_RETURN(src[i], HeadsMajorCopy(ctx, *in[i]));
      }
      const TensorView* grads[3] = {dq, dk, dv};
      for (int i = 0; i < 3; ++i)
        if (!(dst[i] = ctx.Scratch(grads[i]->nbytes())) && grads[i]->nbytes() > 0)
          return absl::OkStatus();  // the allocation error is reported
    }
    RETURN_IF_ERROR(Check(kc::AttentionBackward(DtOf(q.dtype), src[0], src[1], src[2], src[3], src[4],
                                                lse.as<float>(), dst[0], dst[1], dst[2], delta, a.batch, a.T, a.S,
                                                static_cast<int>(a.D), static_cast<int>(a.Dv), scale_, causal_,
                                                stream())));
    if (!bshd_) return absl::OkStatus();
    RETURN_IF_ERROR(SeqMajorCopy(dst[0], *dq));
    RETURN_IF_ERROR(SeqMajorCopy(dst[1], *dk));
    return SeqMajorCopy(dst[2], *dv);
  }

 private:
  // AttentionGrad(dOut, qkv, _, _, out, lse) -> dqkv, all but lse packed or [B, T, H, D].
  absl::Status ComputePacked(KernelContext& ctx) const {
    const TensorView& dout = *ctx.input(0);
    const TensorView& qkv = *ctx.input(1);
    const TensorView& out = *ctx.input(4);
    const TensorView& lse = *ctx.input(5);
    RETURN_IF_ERROR(ExpectPacked(qkv));
    if (dout.rank != 4 || out.rank != 4)
      return InvalidArgument(name_, ": layout \"bs3hd\" takes dOut and out of rank 4 [B, T, H, D]");
    const TensorView one = OneOfPacked(qkv);
    ASSIGN_OR_RETURN(kernels::cpu::AttentionParams a, AttentionShape(name_, one, one, one, scale_, causal_));
    if (dout.numel() != a.batch * a.T * a.Dv || out.numel() != dout.numel() || lse.numel() != a.batch * a.T)
      return InvalidArgument(name_, ": dOut, out or lse do not match qkv");
    TensorView* dqkv = ctx.Output(0, qkv.dim_span());
    if (!dqkv) return absl::OkStatus();
    const size_t part = static_cast<size_t>(qkv.dims[3] * qkv.dims[4]) * ElementSize(qkv.dtype);
    const char* base = static_cast<const char*>(qkv.data);
    char* dbase = static_cast<char*>(dqkv->data);
    const SdpaShape s{qkv.dtype, a.batch, a.T, a.S, a.D, a.Dv, scale_, causal_, qkv.dims[3], true};
    if (CudnnAttention* cudnn = CudnnAttention::Eligible(s) ? p_->cudnn_attention() : nullptr) {
      absl::Status st = cudnn->Backward(s, dout.data, base, base + part, base + 2 * part, out.data, lse.as<float>(),
                                        dbase, dbase + part, dbase + 2 * part,
                                        [&ctx](size_t n) { return ctx.Scratch(n); });
      if (st.code() != absl::StatusCode::kUnimplemented)
        return st.ok() ? st : absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
    }
    float* delta = static_cast<float*>(ctx.Scratch(static_cast<size_t>(a.batch * a.T) * sizeof(float)));
    char* grads = static_cast<char*>(ctx.Scratch(qkv.nbytes()));
    if ((!delta && a.batch * a.T > 0) || (!grads && qkv.nbytes() > 0)) return absl::OkStatus();  // reported
    ASSIGN_OR_RETURN(const char* u, UnpackedCopy(ctx, qkv));
    ASSIGN_OR_RETURN(const void* dout_h, HeadsMajorCopy(ctx, dout));
    ASSIGN_OR_RETURN(const void* out_h, HeadsMajorCopy(ctx, out));
    const size_t third = qkv.nbytes() / 3;
    RETURN_IF_ERROR(Check(kc::AttentionBackward(DtOf(qkv.dtype), dout_h, u, u + third, u + 2 * third, out_h,
                                                lse.as<float>(), grads, grads + third, grads + 2 * third, delta,
                                                a.batch, a.T, a.S, static_cast<int>(a.D), static_cast<int>(a.Dv),
                                                scale_, causal_, stream())));
    const int64_t unpacked[5] = {3, qkv.dims[0], qkv.dims[3], qkv.dims[1], qkv.dims[4]};
    return Check(kc::Transpose(static_cast<int>(ElementSize(qkv.dtype)), grads, dqkv->data, 5, unpacked, kPackQkv,
                               stream()));
  }

  float scale_;
  bool causal_;
  bool bshd_;
  bool packed_;
};

}  // namespace

void RegisterCudaAttentionKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  Add<AttentionKernel>(r, p, C, "Attention", 1, 1, InputTypeIn(0, kFloats));
  Add<AttentionGradKernel>(r, p, C, "AttentionGrad", 1, 1, InputTypeIn(1, kFloats));
}

}  // namespace cleave::providers
