// The CUDA provider's Conv, ConvTranspose and their gradients (ai.cleave.ConvGrad,
// ConvTransposeGrad), and the pools with their gradients (providers/cuda/).
// Conv and ConvGrad: im2col over a chunk of images at a time (kernels/cuda/conv.cu), then one
// cuBLASLt product per group covering the whole chunk, whose columns are every image's output
// positions side by side:
//   forward   Y_g [Mg, n O]      = W_g [Mg, Cg K] col_g [Cg K, n O]
//   dW        dW_g [Mg, Cg K]   += dY_g [Mg, n O] col_g^T          (float32, summed over chunks)
//   dX        col_g [Cg K, n O]  = W_g^T dY_g                     (float32), then col2im
//   dB        the sums of dY over images and positions.
// A product's float32 [M, n, O] result gets the bias and the images' [n, M, O] layout as it is
// rounded to Y's type, once (dY is transposed the other way where a chunk holds more than one
// image). The chunk is as many images as keep the scratch under the provider's conv_chunk_bytes.
// ConvTranspose is the dX of the Conv that PlanConvTranspose describes (its bias added as col2im
// writes Y), and its gradients that Conv's forward (dX) and dW.
// MaxPool, AveragePool, the global pools, MaxPoolGrad and AveragePoolGrad: kernels/cuda/pool.cu,
// over the windows the CPU's kernels use (providers/pool_plan.h). BatchNormalization and its
// gradient: kernels/cuda/norm.cu, a block per channel for the statistics and the sums;
// InstanceNormalization and its gradient through the same kernels, a block per image's channel.
// Resize (nearest, linear) and its gradient: one resampling kernel per resized dim.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/nn.h"
#include "providers/conv_attrs.h"
#include "providers/cuda/cuda_kernel.h"
#include "providers/cuda/cuda_matmul.h"
#include "providers/batch_norm_plan.h"
#include "providers/grid_sample_plan.h"
#include "providers/pool_plan.h"
#include "providers/resize_plan.h"

namespace cleave::providers {
namespace {

kc::ConvGeometry GeometryOf(const kernels::cpu::ConvParams& p) {
  kc::ConvGeometry g;
  g.spatial = p.spatial;
  g.C = p.C;
  g.in_size = p.InSize();
  g.kernel_size = p.KernelSize();
  g.out_size = p.OutSize();
  for (int d = 0; d < p.spatial; ++d) {
    g.in[d] = p.in[d];
    g.kernel[d] = p.kernel[d];
    g.out[d] = p.out[d];
    g.stride[d] = p.stride[d];
    g.dilation[d] = p.dilation[d];
    g.pad_begin[d] = p.pad_begin[d];
  }
  return g;
}

// Images per chunk: scratch of `per_image` bytes each, at most `budget` (at least one image).
int64_t ChunkImages(int64_t N, int64_t per_image, size_t budget) {
  const int64_t most = static_cast<int64_t>(std::min<size_t>(budget, size_t{1} << 62));
  return std::clamp<int64_t>(most / std::max<int64_t>(per_image, 1), 1, std::max<int64_t>(N, 1));
}

// [a, b, c] -> [b, a, c] of elem_bytes elements.
int SwapLeading(size_t elem_bytes, const void* x, void* y, int64_t a, int64_t b, int64_t c, void* stream) {
  const int64_t dims[3] = {a, b, c}, perm[3] = {1, 0, 2};
  return kc::Transpose(static_cast<int>(elem_bytes), x, y, 3, dims, perm, stream);
}

absl::Status PlanOf(const std::string& name, std::vector<int64_t> a, std::vector<int64_t> b, bool trans_b,
                    bool trans_a, kernels::cpu::MatMulPlan* plan) {
  auto p = kernels::cpu::PlanMatMul(a, b, trans_b, trans_a);
  if (!p.ok()) return Internal(name, ": ", p.status().message());
  *plan = *p;
  return absl::OkStatus();
}

// Conv's plan (kernels/cpu/conv.h PlanConv), or with ConvTransposeAttrs the Conv whose input
// gradient the ConvTranspose is (PlanConvTranspose), its errors naming the node.
template <typename Attrs>
absl::StatusOr<kernels::cpu::ConvParams> Plan(const std::string& name, const TensorView& x, const TensorView& w,
                                              const Attrs& attrs) {
  if (x.rank - 2 > kc::kMaxRank) return Unimplemented(name, ": ", x.rank - 2, " spatial dims, over ", kc::kMaxRank);
  absl::StatusOr<kernels::cpu::ConvParams> p;
  if constexpr (std::is_same_v<Attrs, kernels::cpu::ConvTransposeAttrs>)
    p = kernels::cpu::PlanConvTranspose(x.dim_span(), w.dim_span(), attrs);
  else
    p = kernels::cpu::PlanConv(x.dim_span(), w.dim_span(), attrs);
  if (!p.ok()) return InvalidArgument(name, ": ", p.status().message());
  if (p->ColumnElements() < 0) return InvalidArgument(name, ": the patches of one image overflow int64 elements");
  return *p;
}

// The products of Conv, ConvTranspose and their gradients over a chunk of images at a time.
class ConvProducts : public CudaKernel {
 public:
  ConvProducts(const CudaExecutionProvider* p, const graph::Node& n)
      : CudaKernel(p, n),
        transposed_(n.op_type() == "ConvTranspose" || n.op_type() == "ConvTransposeGrad"),
        attrs_(ConvTransposeAttrsOf(n)) {}

 protected:
  // The node's plan: its Conv's, or the Conv whose input gradient the ConvTranspose is.
  absl::StatusOr<kernels::cpu::ConvParams> ConvPlan(const TensorView& x, const TensorView& w) const {
    if (transposed_) return Plan(name_, x, w, attrs_);
    return Plan(name_, x, w, static_cast<const kernels::cpu::ConvAttrs&>(attrs_));
  }
  // Y [N, M, out...] of Conv, or [N, M, in...] of the ConvTranspose (the planned Conv's C, in).
  std::vector<int64_t> YDims(const kernels::cpu::ConvParams& p) const {
    std::vector<int64_t> d = {p.N, transposed_ ? p.C : p.M};
    for (int i = 0; i < p.spatial; ++i) d.push_back(transposed_ ? p.in[i] : p.out[i]);
    return d;
  }

  // y [N, M, out...] = conv(x, w) + b (b [M] or null).
  absl::Status Forward(KernelContext& ctx, const kernels::cpu::ConvParams& p, DataType dtype, const void* x,
                       const void* w, const void* b, void* y) const {
    const kc::ConvGeometry g = GeometryOf(p);
    const kc::Dt dt = DtOf(dtype);
    const size_t es = ElementSize(dtype);
    const int64_t G = p.group, Cg = p.C / G, Mg = p.M / G, K = g.kernel_size, O = g.out_size, I = g.in_size;
    if (p.N * p.M * O == 0) return absl::OkStatus();
    // The product straight into Y where it is Y (float32, one image, no bias); else in float32
    // into scratch, from which ConvOutput adds the bias, lays the images out and rounds once.
    const bool direct = dtype == DataType::kFloat32 && !b;
    const int64_t per_image = p.C * K * O * static_cast<int64_t>(es) + p.M * O * 4;
    const int64_t nb = ChunkImages(p.N, per_image, p_->conv_chunk_bytes());
    void* col = ctx.Scratch(static_cast<size_t>(p.C * K * nb * O) * es);
    float* product = direct && nb == 1 ? nullptr : ctx.ScratchOf<float>(p.M * nb * O);
    if (!col || (!product && !(direct && nb == 1))) return NoScratch();
    for (int64_t n0 = 0; n0 < p.N; n0 += nb) {
      const int64_t n = std::min(nb, p.N - n0);
      char* yn = static_cast<char*>(y) + static_cast<size_t>(n0 * p.M * O) * es;
      RETURN_IF_ERROR(Check(kc::Im2Col(dt, g, static_cast<const char*>(x) + n0 * p.C * I * es, col, n, stream())));
      kernels::cpu::MatMulPlan plan;
      RETURN_IF_ERROR(PlanOf(name_, {G, Mg, Cg * K}, {G, Cg * K, n * O}, false, false, &plan));
      void* c = product ? static_cast<void*>(product) : yn;
      RETURN_IF_ERROR(CudaMatMul(*p_, plan, dtype, DataType::kFloat32, w, col, c, nullptr, false));
      if (product) RETURN_IF_ERROR(Check(kc::ConvOutput(dt, product, b, yn, n, p.M, O, stream())));
    }
    return absl::OkStatus();
  }

  // The gradients of conv(x, w) from dy: dx [N, C, in...] (plus dx_bias [C] where given: the
  // ConvTranspose forward), dw and db [M]; each null when not wanted (x is read for dw alone).
  absl::Status Backward(KernelContext& ctx, const kernels::cpu::ConvParams& p, DataType dtype, const void* dy,
                        const void* x, const void* w, void* dx, void* dw, void* db, const void* dx_bias) const {
    const kc::ConvGeometry g = GeometryOf(p);
    const kc::Dt dt = DtOf(dtype);
    const size_t es = ElementSize(dtype);
    const int64_t G = p.group, Cg = p.C / G, Mg = p.M / G, K = g.kernel_size, O = g.out_size, I = g.in_size;
    const int64_t w_elems = p.M * Cg * K, x_elems = p.N * p.C * I;
    auto s = static_cast<cudaStream_t>(stream());
    if (db && p.M > 0) {
      if (p.N * O == 0) {
        RETURN_IF_ERROR(Check(cudaMemsetAsync(db, 0, static_cast<size_t>(p.M) * es, s)));
      } else {
        const int64_t dims[3] = {p.N, p.M, O};
        const bool reduce[3] = {true, false, true};
        const int64_t parts = kc::ReduceScratch(3, dims, reduce);
        double* scratch = parts ? ctx.ScratchOf<double>(parts) : nullptr;
        if (parts && !scratch) return NoScratch();
        RETURN_IF_ERROR(Check(kc::Reduce(kc::ReduceOp::kSum, dt, dy, db, 3, dims, reduce, scratch, s)));
      }
    }
    if (x_elems == 0) dx = nullptr;
    if (w_elems == 0) dw = nullptr;
    if (!dx && !dw) return absl::OkStatus();
    // dW accumulates in float32: in dW itself when that is float32, else in scratch cast at the end.
    float* dw_acc = nullptr;
    float* dw_part = nullptr;
    if (dw) {
      dw_acc = dtype == DataType::kFloat32 ? static_cast<float*>(dw) : ctx.ScratchOf<float>(w_elems);
      if (!dw_acc) return NoScratch();
    }
    if (p.N * O == 0 || p.M == 0) {  // no output positions or channels: zero gradients (dx the bias alone)
      if (dw) RETURN_IF_ERROR(Check(cudaMemsetAsync(dw, 0, static_cast<size_t>(w_elems) * es, s)));
      if (!dx) return absl::OkStatus();
      if (!dx_bias) return Check(cudaMemsetAsync(dx, 0, static_cast<size_t>(x_elems) * es, s));
      kc::ConvGeometry none = g;
      none.kernel_size = 0;  // no taps: Col2Im writes the bias
      return Check(kc::Col2Im(dt, none, nullptr, dx_bias, dx, p.N, s));
    }
    const int64_t per_image = p.C * K * O * static_cast<int64_t>((dw ? es : 0) + (dx ? sizeof(float) : 0)) +
                              p.M * O * static_cast<int64_t>(es);
    const int64_t nb = ChunkImages(p.N, per_image, p_->conv_chunk_bytes());
    void* col = dw ? ctx.Scratch(static_cast<size_t>(p.C * K * nb * O) * es) : nullptr;
    float* colf = dx ? ctx.ScratchOf<float>(p.C * K * nb * O) : nullptr;
    void* dyt = nb > 1 ? ctx.Scratch(static_cast<size_t>(p.M * nb * O) * es) : nullptr;
    if ((dw && !col) || (dx && !colf) || (nb > 1 && !dyt)) return NoScratch();
    if (dw && nb < p.N) {
      dw_part = ctx.ScratchOf<float>(w_elems);
      if (!dw_part) return NoScratch();
    }
    for (int64_t n0 = 0; n0 < p.N; n0 += nb) {
      const int64_t n = std::min(nb, p.N - n0);
      const char* dyn = static_cast<const char*>(dy) + static_cast<size_t>(n0 * p.M * O) * es;
      // dY_g [Mg, n O] for every group: dY's [n, M, O] as [M, n, O].
      const void* dyg = dyn;
      if (n > 1) {
        RETURN_IF_ERROR(Check(SwapLeading(es, dyn, dyt, n, p.M, O, s)));
        dyg = dyt;
      }
      if (dw) {
        RETURN_IF_ERROR(Check(kc::Im2Col(dt, g, static_cast<const char*>(x) + n0 * p.C * I * es, col, n, s)));
        kernels::cpu::MatMulPlan plan;
        RETURN_IF_ERROR(PlanOf(name_, {G, Mg, n * O}, {G, Cg * K, n * O}, /*trans_b=*/true, false, &plan));
        float* into = n0 == 0 ? dw_acc : dw_part;
        RETURN_IF_ERROR(CudaMatMul(*p_, plan, dtype, DataType::kFloat32, dyg, col, into, nullptr, false));
        if (n0 > 0)
          RETURN_IF_ERROR(Check(kc::Binary(kc::BinaryOp::kAdd, kc::Dt::kF32, dw_acc, dw_part, dw_acc, w_elems,
                                           nullptr, s)));
      }
      if (dx) {
        kernels::cpu::MatMulPlan plan;
        RETURN_IF_ERROR(PlanOf(name_, {G, Mg, Cg * K}, {G, Mg, n * O}, false, /*trans_a=*/true, &plan));
        RETURN_IF_ERROR(CudaMatMul(*p_, plan, dtype, DataType::kFloat32, w, dyg, colf, nullptr, false));
        RETURN_IF_ERROR(
            Check(kc::Col2Im(dt, g, colf, dx_bias, static_cast<char*>(dx) + n0 * p.C * I * es, n, s)));
      }
    }
    if (dw && dtype != DataType::kFloat32)
      RETURN_IF_ERROR(Check(kc::Cast(kc::Dt::kF32, dt, dw_acc, dw, w_elems, s)));
    return absl::OkStatus();
  }

  bool transposed_;
  kernels::cpu::ConvTransposeAttrs attrs_;
};

void* DataOf(TensorView* t) { return t && t->numel() > 0 ? t->data : nullptr; }

// Conv(X, W[, B]) -> Y, and ConvTranspose(X, W[, B]) -> Y: the input gradient of the Conv
// PlanConvTranspose describes, the bias added as col2im writes Y.
class ConvKernel : public ConvProducts {
 public:
  ConvKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : ConvProducts(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    const TensorView& w = *ctx.input(1);
    const TensorView* b = ctx.num_inputs() > 2 ? ctx.input(2) : nullptr;
    ASSIGN_OR_RETURN(const kernels::cpu::ConvParams p, ConvPlan(x, w));
    const std::vector<int64_t> dims = YDims(p);
    if (b && b->numel() != dims[1])
      return InvalidArgument(name_, ": expected B of ", dims[1], " elements (",
                             transposed_ ? "W's dim 1 times group" : "W's dim 0", "), got ", b->numel());
    TensorView* y = ctx.Output(0, dims);
    if (!y || y->numel() == 0) return absl::OkStatus();
    const void* bias = b ? b->data : nullptr;
    if (!transposed_) return Forward(ctx, p, x.dtype, x.data, w.data, bias, y->data);
    return Backward(ctx, p, x.dtype, x.data, nullptr, w.data, y->data, nullptr, nullptr, bias);
  }
};

// ai.cleave.ConvGrad(dY, X, W) and ConvTransposeGrad(dY, X, W) -> dX, dW, dB (each may go
// unread), the forward's attributes. The transposed op's dX is the planned Conv's forward of dY,
// its dW that Conv's weight gradient from X, and its dB dY summed over the images and positions.
class ConvGradKernel : public ConvProducts {
 public:
  ConvGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int) : ConvProducts(p, n) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    const TensorView& w = *ctx.input(2);
    ASSIGN_OR_RETURN(const kernels::cpu::ConvParams p, ConvPlan(x, w));
    const std::vector<int64_t> want = YDims(p);
    if (std::vector<int64_t>(dy.dims, dy.dims + dy.rank) != want)
      return InvalidArgument(name_, ": expected dY [", absl::StrJoin(want, ","), "], got [",
                             absl::StrJoin(dy.dim_span(), ","), "]");
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dw = ctx.num_outputs() > 1 ? ctx.Output(1, w.dim_span()) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {want[1]}) : nullptr;
    if (!transposed_)
      return Backward(ctx, p, x.dtype, dy.data, x.data, w.data, DataOf(dx), DataOf(dw), DataOf(db), nullptr);
    if (void* out = DataOf(dx)) RETURN_IF_ERROR(Forward(ctx, p, x.dtype, dy.data, w.data, nullptr, out));
    if (void* out = DataOf(dw))
      RETURN_IF_ERROR(Backward(ctx, p, x.dtype, x.data, dy.data, w.data, nullptr, out, nullptr, nullptr));
    void* out = DataOf(db);
    if (!out) return absl::OkStatus();
    // dB is the planned Conv's input-channel sum, which its Backward does not form: dY's [N, C, I]
    // summed over N and I.
    auto s = static_cast<cudaStream_t>(stream());
    if (p.N * p.InSize() == 0) return Check(cudaMemsetAsync(out, 0, db->nbytes(), s));
    const int64_t dims[3] = {p.N, p.C, p.InSize()};
    const bool reduce[3] = {true, false, true};
    const int64_t parts = kc::ReduceScratch(3, dims, reduce);
    double* scratch = parts ? ctx.ScratchOf<double>(parts) : nullptr;
    if (parts && !scratch) return NoScratch();
    return Check(kc::Reduce(kc::ReduceOp::kSum, DtOf(x.dtype), dy.data, out, 3, dims, reduce, scratch, s));
  }
};

// MaxPool (X) -> Y[, Indices], AveragePool (X) -> Y and the global pools (kernels/cuda/pool.cu).
class PoolKernel : public CudaKernel {
 public:
  PoolKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), attrs_(graph::PoolAttrsOf(n)), max_(n.op_type().find("Max") != std::string::npos) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    auto plan = PlanPool(x.dim_span(), attrs_);
    if (!plan.ok()) return Named(plan.status());
    if (max_ && attrs_.storage_order != 0 && attrs_.storage_order != 1)
      return InvalidArgument(name_, ": expected storage_order 0 or 1, got ", attrs_.storage_order);
    TensorView* y = ctx.Output(0, plan->out);
    TensorView* indices = ctx.num_outputs() > 1 ? ctx.Output(1, plan->out) : nullptr;
    if (!y || y->numel() == 0) return absl::OkStatus();
    if (max_)
      return Check(kc::MaxPool(DtOf(x.dtype), plan->layout, plan->planes, x.data, y->data,
                               indices ? indices->as<int64_t>() : nullptr, attrs_.storage_order == 1, stream()));
    return Check(kc::AveragePool(DtOf(x.dtype), plan->layout, plan->planes, x.data, y->data, stream()));
  }

 private:
  graph::PoolAttrs attrs_;
  bool max_;
};

// ai.cleave.MaxPoolGrad (dY, X) and ai.cleave.AveragePoolGrad (dY, X's shape, read on the host)
// -> dX.
class PoolGradKernel : public CudaKernel {
 public:
  PoolGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), attrs_(graph::PoolAttrsOf(n)), max_(n.op_type() == "MaxPoolGrad") {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& second = *ctx.input(1);
    DimVector x_dims;
    if (max_) {
      if (second.dtype != dy.dtype)
        return InvalidArgument(name_, ": expected dY and X of one dtype, got ", DataTypeName(dy.dtype), " and ",
                               DataTypeName(second.dtype));
      x_dims = DimVector(second.dim_span());
    } else {
      auto dims = PoolInputDims(second);
      if (!dims.ok()) return Named(dims.status());
      x_dims = *dims;
    }
    auto plan = PlanPoolGrad(x_dims.span(), dy.dim_span(), attrs_);
    if (!plan.ok()) return Named(plan.status());
    TensorView* dx = ctx.Output(0, x_dims.span());
    if (!dx || dx->numel() == 0) return absl::OkStatus();
    if (!max_)
      return Check(kc::AveragePoolGrad(DtOf(dy.dtype), plan->layout, plan->planes, dy.data, dx->data, stream()));
    int64_t* arg = ctx.ScratchOf<int64_t>(std::max<int64_t>(plan->planes * plan->layout.out_size, 1));
    if (!arg) return NoScratch();
    return Check(
        kc::MaxPoolGrad(DtOf(dy.dtype), plan->layout, plan->planes, dy.data, second.data, arg, dx->data, stream()));
  }

 private:
  graph::PoolAttrs attrs_;
  bool max_;
};

// The per-channel operands' dtype: all float32, or all X's.
absl::StatusOr<DataType> ChannelDtype(const std::string& name, const KernelContext& ctx, int first, DataType x) {
  const DataType p = ctx.input(first)->dtype;
  if (p != DataType::kFloat32 && p != x)
    return InvalidArgument(name, ": expected the per-channel operands in float32 or X's ", DataTypeName(x), ", got ",
                           DataTypeName(p));
  for (int i = first + 1; i < ctx.num_inputs(); ++i)
    if (ctx.input(i)->dtype != p)
      return InvalidArgument(name, ": expected the per-channel operands of one dtype, got ", DataTypeName(p), " and ",
                             DataTypeName(ctx.input(i)->dtype), " (input ", i, ")");
  return p;
}

// BatchNormalization(X, scale, B, input_mean, input_var) -> Y[, running_mean, running_var].
class BatchNormKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n,
                                                          int version) {
    ASSIGN_OR_RETURN(const BatchNormAttrs a, BatchNormAttrsOf(n, version));
    return std::unique_ptr<OpKernel>(new BatchNormKernel(p, n, a));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    ASSIGN_OR_RETURN(const DataType pt, ChannelDtype(name_, ctx, 1, x.dtype));
    auto s = PlanBatchNorm(x, {{"scale", ctx.input(1)}, {"B", ctx.input(2)}, {"input_mean", ctx.input(3)},
                               {"input_var", ctx.input(4)}});
    if (!s.ok()) return Named(s.status());
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* rm = a_.training && ctx.num_outputs() > 1 ? ctx.Output(1, {s->C}) : nullptr;
    TensorView* rv = a_.training && ctx.num_outputs() > 2 ? ctx.Output(2, {s->C}) : nullptr;
    float* stats = ctx.ScratchOf<float>(std::max<int64_t>(2 * s->C, 1));
    if (!stats) return NoScratch();
    return Check(kc::BatchNorm(DtOf(x.dtype), DtOf(pt), x.data, ctx.input(1)->data, ctx.input(2)->data,
                               ctx.input(3)->data, ctx.input(4)->data, y ? y->data : nullptr, rm ? rm->data : nullptr,
                               rv ? rv->data : nullptr, stats, s->N, s->C, s->S, a_.epsilon, a_.momentum, a_.training,
                               stream()));
  }

 private:
  BatchNormKernel(const CudaExecutionProvider* p, const graph::Node& n, BatchNormAttrs a) : CudaKernel(p, n), a_(a) {}
  BatchNormAttrs a_;
};

// ai.cleave.BatchNormalizationGrad(dY, X, scale, input_mean, input_var) -> dX, dScale, dB.
class BatchNormGradKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n,
                                                          int version) {
    ASSIGN_OR_RETURN(const BatchNormAttrs a, BatchNormAttrsOf(n, version));
    return std::unique_ptr<OpKernel>(new BatchNormGradKernel(p, n, a));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    if (dy.dtype != x.dtype || DimVector(dy.dim_span()) != DimVector(x.dim_span()))
      return InvalidArgument(name_, ": expected dY of X's dtype and dims ", DataTypeName(x.dtype), " ",
                             DimsToString(x.dim_span()), ", got ", DataTypeName(dy.dtype), " ",
                             DimsToString(dy.dim_span()));
    ASSIGN_OR_RETURN(const DataType pt, ChannelDtype(name_, ctx, 2, x.dtype));
    auto s = PlanBatchNorm(x, {{"scale", ctx.input(2)}, {"input_mean", ctx.input(3)}, {"input_var", ctx.input(4)}});
    if (!s.ok()) return Named(s.status());
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* ds = ctx.num_outputs() > 1 ? ctx.Output(1, {s->C}) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {s->C}) : nullptr;
    float* stats = ctx.ScratchOf<float>(std::max<int64_t>(4 * s->C, 1));
    if (!stats) return NoScratch();
    return Check(kc::BatchNormGrad(DtOf(x.dtype), DtOf(pt), dy.data, x.data, ctx.input(2)->data, ctx.input(3)->data,
                                   ctx.input(4)->data, dx ? dx->data : nullptr, ds ? ds->data : nullptr,
                                   db ? db->data : nullptr, stats, s->N, s->C, s->S, a_.epsilon, a_.training, stream()));
  }

 private:
  BatchNormGradKernel(const CudaExecutionProvider* p, const graph::Node& n, BatchNormAttrs a)
      : CudaKernel(p, n), a_(a) {}
  BatchNormAttrs a_;
};

// InstanceNormalization(X, scale, B) {epsilon} -> Y.
class InstanceNormKernel : public CudaKernel {
 public:
  InstanceNormKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), epsilon_(n.AttrFloat("epsilon", 1e-5f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    if (x.rank < 3)
      return InvalidArgument(name_, ": expected X [N, C, spatial...] of rank >= 3, got ", DimsToString(x.dim_span()));
    ASSIGN_OR_RETURN(const DataType pt, ChannelDtype(name_, ctx, 1, x.dtype));
    auto s = PlanBatchNorm(x, {{"scale", ctx.input(1)}, {"B", ctx.input(2)}});
    if (!s.ok()) return Named(s.status());
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y || y->numel() == 0) return absl::OkStatus();
    float* stats = ctx.ScratchOf<float>(2 * s->N * s->C);
    if (!stats) return NoScratch();
    return Check(kc::InstanceNorm(DtOf(x.dtype), DtOf(pt), x.data, ctx.input(1)->data, ctx.input(2)->data, y->data,
                                  stats, s->N, s->C, s->S, epsilon_, stream()));
  }

 private:
  float epsilon_;
};

// ai.cleave.InstanceNormalizationGrad(dY, X, scale) {epsilon} -> dX, dScale, dB.
class InstanceNormGradKernel : public CudaKernel {
 public:
  InstanceNormGradKernel(const CudaExecutionProvider* p, const graph::Node& n, int)
      : CudaKernel(p, n), epsilon_(n.AttrFloat("epsilon", 1e-5f)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    if (dy.dtype != x.dtype || DimVector(dy.dim_span()) != DimVector(x.dim_span()) || x.rank < 3)
      return InvalidArgument(name_, ": expected X [N, C, spatial...] and dY of its dtype and dims, got ",
                             DataTypeName(x.dtype), " ", DimsToString(x.dim_span()), " and ", DataTypeName(dy.dtype),
                             " ", DimsToString(dy.dim_span()));
    ASSIGN_OR_RETURN(const DataType pt, ChannelDtype(name_, ctx, 2, x.dtype));
    auto s = PlanBatchNorm(x, {{"scale", ctx.input(2)}});
    if (!s.ok()) return Named(s.status());
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* ds = ctx.num_outputs() > 1 ? ctx.Output(1, {s->C}) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {s->C}) : nullptr;
    float* stats = ctx.ScratchOf<float>(std::max<int64_t>(4 * s->N * s->C, 1));
    if (!stats) return NoScratch();
    return Check(kc::InstanceNormGrad(DtOf(x.dtype), DtOf(pt), dy.data, x.data, ctx.input(2)->data,
                                      dx ? dx->data : nullptr, ds ? ds->data : nullptr, db ? db->data : nullptr, stats,
                                      s->N, s->C, s->S, epsilon_, stream()));
  }

 private:
  float epsilon_;
};

// Resize and ai.cleave.ResizeGrad: the passes of graph/resize_geometry.h, each one kernel
// (kernels/cuda/pool.cu) over a table of its taps (or, for the gradient, its readers) uploaded
// from the host into scratch; the intermediate tensors between passes in scratch too.
class ResizeKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n, int) {
    ASSIGN_OR_RETURN(graph::ResizeAttrs a, graph::ResizeAttrsOf(n));
    return std::unique_ptr<OpKernel>(new ResizeKernel(p, n, std::move(a)));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const bool grad = n_domain_cleave_;
    const TensorView& src = *ctx.input(0);
    std::vector<int64_t> in_dims;
    if (grad) {
      const TensorView& shape = *ctx.input(1);
      if (shape.dtype != DataType::kInt64 || shape.rank != 1)
        return InvalidArgument(name_, ": expected X's shape as a 1-D int64 tensor");
      in_dims.assign(shape.as<int64_t>(), shape.as<int64_t>() + shape.numel());
    } else {
      in_dims.assign(src.dims, src.dims + src.rank);
    }
    auto dims = PlanResizeInputs(ctx, grad ? 2 : 1, in_dims, a_);
    if (!dims.ok()) return Named(dims.status());
    std::vector<int64_t> out_dims;
    for (const graph::ResizeDim& d : *dims) out_dims.push_back(d.out);
    if (grad && std::vector<int64_t>(src.dims, src.dims + src.rank) != out_dims)
      return InvalidArgument(name_, ": expected dY [", absl::StrJoin(out_dims, ","), "] (the forward's Y), got [",
                             absl::StrJoin(src.dim_span(), ","), "]");
    TensorView* dst = ctx.Output(0, grad ? in_dims : out_dims);
    if (!dst || dst->numel() == 0) return absl::OkStatus();
    auto s = static_cast<cudaStream_t>(stream());
    if (src.numel() == 0) {
      if (grad) return Check(cudaMemsetAsync(dst->data, 0, dst->nbytes(), s));
      return InvalidArgument(name_, ": cannot resize an empty input");
    }
    const std::vector<graph::ResizePass> passes = graph::ResizePasses(a_, *dims);
    if (passes.empty()) return Check(cudaMemcpyAsync(dst->data, src.data, dst->nbytes(), cudaMemcpyDeviceToDevice, s));
    const size_t es = ElementSize(src.dtype);
    const void* cur = src.data;
    for (size_t j = 0; j < passes.size(); ++j) {
      const graph::ResizePass& p = passes[grad ? passes.size() - 1 - j : j];
      void* next = dst->data;
      if (j + 1 < passes.size()) {
        next = ctx.Scratch(static_cast<size_t>(p.outer * (grad ? p.in : p.out) * p.inner) * es);
        if (!next) return NoScratch();
      }
      if (grad) {
        const graph::ResizeReaders r = graph::ResizeReadersOf(p);
        ASSIGN_OR_RETURN(const int64_t* offsets, Upload(ctx, r.offsets));
        ASSIGN_OR_RETURN(const int64_t* outputs, Upload(ctx, r.outputs));
        ASSIGN_OR_RETURN(const float* weights, Upload(ctx, r.weights));
        RETURN_IF_ERROR(Check(kc::ResampleGrad(DtOf(src.dtype), offsets, outputs, weights, cur, next, p.outer, p.in,
                                               p.out, p.inner, s)));
      } else {
        ASSIGN_OR_RETURN(const int64_t* offsets, Upload(ctx, p.taps.offsets));
        ASSIGN_OR_RETURN(const int64_t* index, Upload(ctx, p.taps.index));
        ASSIGN_OR_RETURN(const float* weight, Upload(ctx, p.taps.weight));
        RETURN_IF_ERROR(Check(kc::Resample(DtOf(src.dtype), offsets, index, weight, cur, next, p.outer, p.in, p.out,
                                           p.inner, a_.extrapolation_value, s)));
      }
      cur = next;
    }
    return absl::OkStatus();
  }

 private:
  ResizeKernel(const CudaExecutionProvider* p, const graph::Node& n, graph::ResizeAttrs a)
      : CudaKernel(p, n), a_(std::move(a)), n_domain_cleave_(n.domain() == graph::kCleaveDomain) {}

  // A host table copied into device scratch on the stream (the provider's pinned uploads).
  template <typename T>
  absl::StatusOr<const T*> Upload(KernelContext& ctx, const std::vector<T>& host) const {
    const size_t bytes = std::max<size_t>(host.size() * sizeof(T), 1);
    void* device = ctx.Scratch(bytes);
    if (!device) return NoScratch();
    if (host.empty()) return static_cast<const T*>(device);
    const int64_t n = static_cast<int64_t>(host.size() * sizeof(T));
    const TensorView from(const_cast<T*>(host.data()), DataType::kUInt8, {&n, 1});
    TensorView to(device, DataType::kUInt8, {&n, 1});
    RETURN_IF_ERROR(p_->CopyTensor(from, to));
    return static_cast<const T*>(device);
  }

  graph::ResizeAttrs a_;
  bool n_domain_cleave_;
};

// GridSample(X, grid) -> Y and ai.cleave.GridSampleGrad(dY, X, grid) -> dX[, dGrid], planned as
// the CPU plans them (providers/grid_sample_plan.h). dX accumulates in float32: in the output
// itself for float32, else in scratch, cast into the output after.
class GridSampleKernel : public CudaKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const CudaExecutionProvider* p, const graph::Node& n, int) {
    ASSIGN_OR_RETURN(kc::GridSampleLayout a, GridSampleAttrsOf(n));
    return std::unique_ptr<OpKernel>(new GridSampleKernel(p, n, a));
  }
  absl::Status Compute(KernelContext& ctx) const override {
    const bool grad = n_domain_cleave_;
    const TensorView& x = *ctx.input(grad ? 1 : 0);
    const TensorView& grid = *ctx.input(grad ? 2 : 1);
    if (grid.dtype != x.dtype)
      return InvalidArgument(name_, ": grid is ", DataTypeName(grid.dtype), "; expected X's ", DataTypeName(x.dtype));
    auto planned = PlanGridSample(attrs_, x.dim_span(), grid.dim_span());
    if (!planned.ok()) return Named(planned.status());
    const kc::GridSampleLayout& l = *planned;
    const std::vector<int64_t> y = GridSampleOutputDims(l, grid.dim_span());
    auto s = static_cast<cudaStream_t>(stream());
    if (!grad) {
      TensorView* out = ctx.Output(0, y);
      if (!out || out->numel() == 0) return absl::OkStatus();
      return Check(kc::GridSample(DtOf(x.dtype), l, x.data, grid.data, out->data, s));
    }
    const TensorView& dy = *ctx.input(0);
    if (dy.dtype != x.dtype || std::vector<int64_t>(dy.dims, dy.dims + dy.rank) != y)
      return InvalidArgument(name_, ": expected dY ", DataTypeName(x.dtype), " [", absl::StrJoin(y, ","),
                             "] (the forward's Y), got ", DataTypeName(dy.dtype), " [",
                             absl::StrJoin(dy.dim_span(), ","), "]");
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* dgrid = ctx.num_outputs() > 1 ? ctx.Output(1, grid.dim_span()) : nullptr;
    if (dgrid && dgrid->numel()) RETURN_IF_ERROR(Check(cudaMemsetAsync(dgrid->data, 0, dgrid->nbytes(), s)));
    if ((!dx || dx->numel() == 0) && (!dgrid || dgrid->numel() == 0)) return absl::OkStatus();
    const int64_t n = x.numel();
    float* acc = nullptr;
    if (n > 0) {
      acc = x.dtype == DataType::kFloat32 && dx ? dx->as<float>() : ctx.ScratchOf<float>(n);
      if (!acc) return NoScratch();
      RETURN_IF_ERROR(Check(cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), s)));
    }
    if (dy.numel() > 0)
      RETURN_IF_ERROR(Check(kc::GridSampleGrad(DtOf(x.dtype), l, dy.data, x.data, grid.data, acc,
                                               dgrid ? dgrid->data : nullptr, s)));
    if (dx && n > 0 && x.dtype != DataType::kFloat32)
      return Check(kc::Cast(kc::Dt::kF32, DtOf(x.dtype), acc, dx->data, n, s));
    return absl::OkStatus();
  }

 private:
  GridSampleKernel(const CudaExecutionProvider* p, const graph::Node& n, kc::GridSampleLayout a)
      : CudaKernel(p, n), attrs_(a), n_domain_cleave_(n.domain() == graph::kCleaveDomain) {}
  kc::GridSampleLayout attrs_;
  bool n_domain_cleave_;
};

}  // namespace

void RegisterCudaConvKernels(KernelRegistry& r, CudaExecutionProvider* p) {
  // X, W and B of one float type.
  auto alike = [](const graph::Node& n, int) -> std::string {
    for (int i = 1; i < n.num_inputs(); ++i)
      if (n.input(i) && n.input(i)->dtype() != n.input(0)->dtype()) return "mixed dtypes";
    return "";
  };
  Add<ConvKernel>(r, p, "", "Conv", 1, 1 << 30, AllOf({InputTypeIn(0, kFloats), alike}));
  Add<ConvGradKernel>(r, p, std::string(graph::kCleaveDomain), "ConvGrad", 1, 1,
                      AllOf({InputTypeIn(0, kFloats), alike}));
  Add<ConvKernel>(r, p, "", "ConvTranspose", 1, 1 << 30, AllOf({InputTypeIn(0, kFloats), alike}));
  Add<ConvGradKernel>(r, p, std::string(graph::kCleaveDomain), "ConvTransposeGrad", 1, 1,
                      AllOf({InputTypeIn(0, kFloats), alike}));
  for (const char* op : {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
    Add<PoolKernel>(r, p, "", op, 1, 1 << 30, InputTypeIn(0, kFloats));
  const std::string cleave(graph::kCleaveDomain);
  Add<PoolGradKernel>(r, p, cleave, "MaxPoolGrad", 1, 1, AllOf({InputTypeIn(0, kFloats), alike}));
  Add<PoolGradKernel>(r, p, cleave, "AveragePoolGrad", 1, 1,
                      AllOf({InputTypeIn(0, kFloats), InputTypeIn(1, {DataType::kInt64})}), {1});
  AddChecked<BatchNormKernel>(r, p, "", "BatchNormalization", 6, InputTypeIn(0, kFloats));
  AddChecked<BatchNormGradKernel>(r, p, cleave, "BatchNormalizationGrad", 1, InputTypeIn(1, kFloats));
  Add<InstanceNormKernel>(r, p, "", "InstanceNormalization", 6, 1 << 30, InputTypeIn(0, kFloats));
  Add<InstanceNormGradKernel>(r, p, cleave, "InstanceNormalizationGrad", 1, 1, InputTypeIn(1, kFloats));
  AddChecked<ResizeKernel>(r, p, "", "Resize", 11, InputTypeIn(0, kFloats), {1, 2, 3});
  AddChecked<ResizeKernel>(r, p, cleave, "ResizeGrad", 1, InputTypeIn(0, kFloats), {1, 2, 3, 4});
  AddChecked<GridSampleKernel>(r, p, "", "GridSample", 16, InputTypeIn(0, kFloats));
  AddChecked<GridSampleKernel>(r, p, cleave, "GridSampleGrad", 1, InputTypeIn(0, kFloats));
}

}  // namespace cleave::providers
