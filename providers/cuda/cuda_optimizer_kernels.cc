// The CUDA provider's optimizer kernels (providers/cuda/): gradient accumulation, the sum of
// squares behind global-norm clipping, the loss scaler's finiteness test, and the AdamW and
// SGD updates (one tensor or many per launch), as the CPU computes them.
#include <vector>

#include "base/status.h"
#include "graph/op_table.h"
#include "providers/cuda/cuda_kernel.h"

namespace cleave::providers {
namespace {

// ---- optimizer --------------------------------------------------------------------------

// The fused optimizers' global gradient norm (compute_norm = 1): SquaredNorm of the gradients
// into the norm output, then the clipping scale on the device (ClipScale), which the update
// reads there: no host round trip. Returns that device scale, or null without compute_norm.
class GlobalNorm {
 public:
  explicit GlobalNorm(const graph::Node& n)
      : enabled_(n.AttrInt("compute_norm", 0) != 0), max_norm_(n.AttrFloat("max_grad_norm", 0.f)),
        epsilon_(n.AttrFloat("clip_epsilon", 1e-6f)) {}
  absl::StatusOr<const float*> DeviceScale(const CudaKernel& k, const CudaExecutionProvider* p, KernelContext& ctx,
                                           std::vector<const float*>& grads, std::vector<int64_t>& n,
                                           int norm_output, float grad_scale) const {
    if (!enabled_) return nullptr;
    TensorView* norm = ctx.Output(norm_output, std::vector<int64_t>{});
    if (!norm) return Unimplemented(k.name(), ": the gradient norm output must be used on CUDA");
    // The provider's fp64 reduction scratch holds the sum, then (once it is rounded into the
    // norm output) the clipping scale.
    double* acc = p->reduction_scratch();
    float* scale = reinterpret_cast<float*>(acc);
    RETURN_IF_ERROR(k.Check(kc::SquaredNorm(grads.data(), n.data(), static_cast<int>(grads.size()),
                                            norm->as<float>(), acc, p->stream())));
    RETURN_IF_ERROR(k.Check(kc::ClipScale(norm->as<float>(), grad_scale, max_norm_, epsilon_, norm->as<float>(), scale,
                                          p->stream())));
    return scale;
  }

 private:
  bool enabled_;
  float max_norm_, epsilon_;
};

// AdamW and MultiTensorAdamW(lr, step, grad_scale [host], {param, grad, exp_avg, exp_avg_sq} x n)
// -> 3n [+ the global norm], in as few launches as the pointers fit in; AdamW is the one-group
// case.
class AdamWKernel : public CudaKernel {
 public:
  AdamWKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), beta1_(n.AttrFloat("beta1", 0.9f)), beta2_(n.AttrFloat("beta2", 0.999f)),
        epsilon_(n.AttrFloat("epsilon", 1e-8f)), weight_decay_(n.AttrFloat("weight_decay", 0.f)), norm_(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const float lr = *ctx.input(0)->as<float>();
    const int64_t step = *ctx.input(1)->as<int64_t>();
    const float scale = *ctx.input(2)->as<float>();
    const int count = (ctx.num_inputs() - 3) / 4;
    std::vector<const float*> param(count), grad(count), m(count), v(count);
    std::vector<float*> po(count), mo(count), vo(count);
    std::vector<int64_t> n(count);
    for (int k = 0; k < count; ++k) {
      const TensorView& p = *ctx.input(3 + 4 * k);
      for (int j = 1; j < 4; ++j)
        if (ctx.input(3 + 4 * k + j)->numel() != p.numel())
          return InvalidArgument(name_, ": parameter ", k, "'s input ", j, " has ", ctx.input(3 + 4 * k + j)->numel(),
                                 " elements, the parameter ", p.numel());
      TensorView* outs[3];
      for (int j = 0; j < 3; ++j) {
        outs[j] = ctx.Output(3 * k + j, p.dim_span());
        if (!outs[j]) return Unimplemented(name_, ": every output must be used on CUDA");
      }
      param[k] = p.as<float>();
      grad[k] = ctx.input(4 + 4 * k)->as<float>();
      m[k] = ctx.input(5 + 4 * k)->as<float>();
      v[k] = ctx.input(6 + 4 * k)->as<float>();
      po[k] = outs[0]->as<float>(), mo[k] = outs[1]->as<float>(), vo[k] = outs[2]->as<float>();
      n[k] = p.numel();
    }
    ASSIGN_OR_RETURN(const float* device_scale, norm_.DeviceScale(*this, p_, ctx, grad, n, 3 * count, scale));
    return Check(kc::MultiTensorAdamW(count, param.data(), grad.data(), m.data(), v.data(), po.data(), mo.data(),
                                      vo.data(), n.data(), lr, beta1_, beta2_, epsilon_, weight_decay_, step, scale,
                                      stream(), device_scale));
  }

 private:
  float beta1_, beta2_, epsilon_, weight_decay_;
  GlobalNorm norm_;
};

// SGD(lr, step, grad_scale [host], param, grad[, momentum_buffer]) and MultiTensorSGD (those
// groups x n, the buffers there when momentum != 0 [+ the global norm]).
class SgdKernel : public CudaKernel {
 public:
  SgdKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), multi_(n.op_type() == "MultiTensorSGD"), momentum_(n.AttrFloat("momentum", 0.f)),
        dampening_(n.AttrFloat("dampening", 0.f)), weight_decay_(n.AttrFloat("weight_decay", 0.f)),
        nesterov_(n.AttrInt("nesterov", 0) != 0), norm_(n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const float lr = *ctx.input(0)->as<float>();
    const int64_t step = *ctx.input(1)->as<int64_t>();
    const float scale = *ctx.input(2)->as<float>();
    const int k = multi_ ? (momentum_ != 0.f ? 3 : 2) : ctx.num_inputs() - 3;
    if (momentum_ != 0.f && k < 3) return InvalidArgument(name_, ": momentum ", momentum_, " needs momentum buffers");
    const int count = (ctx.num_inputs() - 3) / k;
    std::vector<const float*> param(count), grad(count), buf(count);
    std::vector<float*> po(count), bo(count);
    std::vector<int64_t> n(count);
    for (int g = 0; g < count; ++g) {
      const int in = 3 + k * g;
      const TensorView& p = *ctx.input(in);
      for (int j = 1; j < k; ++j)
        if (ctx.input(in + j)->numel() != p.numel())
          return InvalidArgument(name_, ": parameter ", g, "'s input ", j, " has ", ctx.input(in + j)->numel(),
                                 " elements, the parameter ", p.numel());
      TensorView* p_out = ctx.Output((k - 1) * g, p.dim_span());
      TensorView* b_out = k > 2 ? ctx.Output((k - 1) * g + 1, p.dim_span()) : nullptr;
      if (!p_out || (k > 2 && !b_out)) return Unimplemented(name_, ": every output must be used on CUDA");
      param[g] = p.as<float>();
      grad[g] = ctx.input(in + 1)->as<float>();
      buf[g] = k > 2 ? ctx.input(in + 2)->as<float>() : nullptr;
      po[g] = p_out->as<float>();
      bo[g] = b_out ? b_out->as<float>() : nullptr;
      n[g] = p.numel();
    }
    ASSIGN_OR_RETURN(const float* device_scale,
                     norm_.DeviceScale(*this, p_, ctx, grad, n, (k - 1) * count, scale));
    return Check(kc::MultiTensorSgd(count, param.data(), grad.data(), buf.data(), po.data(), bo.data(), n.data(), lr,
                                    momentum_, dampening_, weight_decay_, nesterov_, step, scale, stream(),
                                    device_scale));
  }

 private:
  bool multi_;
  float momentum_, dampening_, weight_decay_;
  bool nesterov_;
  GlobalNorm norm_;
};

// InPlaceAccumulator(buffer, grad, reset [host]) -> reset ? grad : buffer + grad.
class AccumulatorKernel : public CudaKernel {
 public:
  AccumulatorKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : CudaKernel(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& buffer = *ctx.input(0);
    const TensorView& grad = *ctx.input(1);
    if (buffer.shape() != grad.shape())
      return InvalidArgument(name_, ": grad has shape ", DimsToString(grad.shape()), ", expected ",
                             DimsToString(buffer.shape()));
    const bool reset = *ctx.input(2)->as<bool>();
    TensorView* out = ctx.Output(0, buffer.dim_span());
    if (!out) return absl::OkStatus();
    if (reset) return Copy(out->data, grad.data, grad.nbytes());
    return Check(kc::Binary(kc::BinaryOp::kAdd, kc::Dt::kF32, buffer.data, grad.data, out->data, grad.numel(), nullptr,
                            stream()));
  }
};

// SquaredNorm(x...) -> float scalar and IsAllFinite(x...) -> bool scalar: a reduction over
// every element of many tensors, on the device (the loss scaler reads IsAllFinite's one byte).
class ManyTensorReductionKernel : public CudaKernel {
 public:
  ManyTensorReductionKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), all_finite_(n.op_type() == "IsAllFinite") {}
  absl::Status Compute(KernelContext& ctx) const override {
    std::vector<const float*> xs;
    std::vector<int64_t> ns;
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      xs.push_back(ctx.input(i)->as<float>());
      ns.push_back(ctx.input(i)->numel());
    }
    TensorView* y = ctx.Output(0, std::vector<int64_t>{});
    if (!y) return absl::OkStatus();
    const int count = static_cast<int>(xs.size());
    if (all_finite_) return Check(kc::AllFinite(xs.data(), ns.data(), count, y->as<bool>(), stream()));
    return Check(kc::SquaredNorm(xs.data(), ns.data(), count, y->as<float>(), p_->reduction_scratch(), stream()));
  }

 private:
  bool all_finite_;
};

}  // namespace

void RegisterCudaOptimizerKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  const std::string C(graph::kCleaveDomain);
  const auto f32 = [](int i) { return InputTypeIn(i, {DataType::kFloat32}); };
  Add<AccumulatorKernel>(r, p, C, "InPlaceAccumulator", 1, 1, f32(0), {2});
  Add<ManyTensorReductionKernel>(r, p, C, "SquaredNorm", 1, 1, f32(0));
  Add<ManyTensorReductionKernel>(r, p, C, "IsAllFinite", 1, 1, f32(0));
  Add<AdamWKernel>(r, p, C, "AdamW", 1, 1, f32(3), {0, 1, 2});
  Add<AdamWKernel>(r, p, C, "MultiTensorAdamW", 1, 1, f32(3), {0, 1, 2});
  Add<SgdKernel>(r, p, C, "SGD", 1, 1, f32(3), {0, 1, 2});
  Add<SgdKernel>(r, p, C, "MultiTensorSGD", 1, 1, f32(3), {0, 1, 2});
}

}  // namespace cleave::providers
