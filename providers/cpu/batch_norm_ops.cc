// CPU kernels for BatchNormalization and its gradient ai.cleave.BatchNormalizationGrad
// (providers/cpu/): each channel on its own, in parallel over the channels; statistics and sums
// in double. Training mode normalises by the batch's mean and biased variance and outputs the
// running statistics input * momentum + batch * (1 - momentum); inference mode by input_mean
// and input_var. The gradient in training mode goes through the batch statistics:
//   dX = scale * inv / M * (M dY - sum(dY) - xhat sum(dY xhat)),  M = N * spatial;
// in inference mode dX = dY scale inv. dScale = sum(dY xhat), dB = sum(dY) in both.
// InstanceNormalization and ai.cleave.InstanceNormalizationGrad likewise with the statistics of
// each image's channel over its spatial dims (M = spatial), dScale and dB summed over the images.
#include <cmath>
#include <memory>

#include "base/fixed_vector.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "providers/batch_norm_plan.h"
#include "providers/cpu/cpu_provider.h"

namespace cleave::providers {

namespace {

// A channel's mean and variance: from the batch (training) or the inputs.
template <typename T>
void ChannelStats(const BatchNormShape& s, const T* x, int64_t c, bool training, const T* mean, const T* var,
                  double* m, double* v) {
  if (!training) {
    *m = mean[c];
    *v = var[c];
    return;
  }
  double sum = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* xc = x + (n * s.C + c) * s.S;
    for (int64_t k = 0; k < s.S; ++k) sum += xc[k];
  }
  const double count = static_cast<double>(s.N * s.S);
  *m = sum / count;
  double q = 0;
  for (int64_t n = 0; n < s.N; ++n) {
    const T* xc = x + (n * s.C + c) * s.S;
    for (int64_t k = 0; k < s.S; ++k) q += (xc[k] - *m) * (xc[k] - *m);
  }
  *v = q / count;
}

absl::Status SameDtypes(const KernelContext& ctx, DataType t) {
  for (int i = 0; i < ctx.num_inputs(); ++i)
    if (ctx.input(i) && ctx.input(i)->dtype != t)
      return InvalidArgument("expected every input of X's dtype ", DataTypeName(t), ", got ",
                             DataTypeName(ctx.input(i)->dtype), " for input ", i);
  return absl::OkStatus();
}

// BatchNormalization(X, scale, B, input_mean, input_var) -> Y[, running_mean, running_var].
class BatchNormKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int version) {
    ASSIGN_OR_RETURN(const BatchNormAttrs a, BatchNormAttrsOf(n, version));
    return std::unique_ptr<OpKernel>(new BatchNormKernel(a));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    RETURN_IF_ERROR(SameDtypes(ctx, x.dtype));
    ASSIGN_OR_RETURN(const BatchNormShape s,
                     PlanBatchNorm(x, {{"scale", ctx.input(1)}, {"B", ctx.input(2)}, {"input_mean", ctx.input(3)},
                                       {"input_var", ctx.input(4)}}));
    TensorView* y = ctx.Output(0, x.dim_span());
    TensorView* rm = a_.training && ctx.num_outputs() > 1 ? ctx.Output(1, {s.C}) : nullptr;
    TensorView* rv = a_.training && ctx.num_outputs() > 2 ? ctx.Output(2, {s.C}) : nullptr;
    if (x.dtype == DataType::kFloat64) Run<double>(s, ctx, y, rm, rv);
    else Run<float>(s, ctx, y, rm, rv);
    return absl::OkStatus();
  }

 private:
  explicit BatchNormKernel(BatchNormAttrs a) : a_(a) {}
  template <typename T>
  void Run(const BatchNormShape& s, KernelContext& ctx, TensorView* y, TensorView* rm, TensorView* rv) const {
    const T* x = ctx.input(0)->as<T>();
    const T *scale = ctx.input(1)->as<T>(), *bias = ctx.input(2)->as<T>();
    const T *mean = ctx.input(3)->as<T>(), *var = ctx.input(4)->as<T>();
    ParallelFor(ctx.thread_pool(), s.C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double m, v;
        ChannelStats(s, x, c, a_.training, mean, var, &m, &v);
        if (rm) rm->as<T>()[c] = static_cast<T>(mean[c] * a_.momentum + m * (1.0 - a_.momentum));
        if (rv) rv->as<T>()[c] = static_cast<T>(var[c] * a_.momentum + v * (1.0 - a_.momentum));
        if (!y) continue;
        const double inv = 1.0 / std::sqrt(v + a_.epsilon), mul = inv * scale[c], add = bias[c] - m * mul;
        for (int64_t n = 0; n < s.N; ++n) {
          const T* xc = x + (n * s.C + c) * s.S;
          T* yc = y->as<T>() + (n * s.C + c) * s.S;
          for (int64_t k = 0; k < s.S; ++k) yc[k] = static_cast<T>(xc[k] * mul + add);
        }
      }
    });
  }
  BatchNormAttrs a_;
};

// ai.cleave.BatchNormalizationGrad(dY, X, scale, input_mean, input_var) {epsilon, training_mode}
// -> dX, dScale, dB (each may go unused).
class BatchNormGradKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const graph::Node& n, int version) {
    ASSIGN_OR_RETURN(const BatchNormAttrs a, BatchNormAttrsOf(n, version));
    return std::unique_ptr<OpKernel>(new BatchNormGradKernel(a));
  }

  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    RETURN_IF_ERROR(SameDtypes(ctx, x.dtype));
    if (DimVector(dy.dim_span()) != DimVector(x.dim_span()))
      return InvalidArgument("expected dY of X's dims ", DimsToString(x.dim_span()), ", got ",
                             DimsToString(dy.dim_span()));
    ASSIGN_OR_RETURN(const BatchNormShape s, PlanBatchNorm(x, {{"scale", ctx.input(2)}, {"input_mean", ctx.input(3)},
                                                               {"input_var", ctx.input(4)}}));
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* ds = ctx.num_outputs() > 1 ? ctx.Output(1, {s.C}) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {s.C}) : nullptr;
    if (x.dtype == DataType::kFloat64) Run<double>(s, ctx, dx, ds, db);
    else Run<float>(s, ctx, dx, ds, db);
    return absl::OkStatus();
  }

 private:
  explicit BatchNormGradKernel(BatchNormAttrs a) : a_(a) {}
  template <typename T>
  void Run(const BatchNormShape& s, KernelContext& ctx, TensorView* dx, TensorView* ds, TensorView* db) const {
    const T *g = ctx.input(0)->as<T>(), *x = ctx.input(1)->as<T>(), *scale = ctx.input(2)->as<T>();
    const T *mean = ctx.input(3)->as<T>(), *var = ctx.input(4)->as<T>();
    ParallelFor(ctx.thread_pool(), s.C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double m, v;
        ChannelStats(s, x, c, a_.training, mean, var, &m, &v);
        const double inv = 1.0 / std::sqrt(v + a_.epsilon);
        double sum_g = 0, sum_gx = 0;  // sum(dY), sum(dY xhat)
        for (int64_t n = 0; n < s.N; ++n) {
          const int64_t base = (n * s.C + c) * s.S;
          for (int64_t k = 0; k < s.S; ++k) {
            sum_g += g[base + k];
            sum_gx += g[base + k] * (x[base + k] - m) * inv;
          }
        }
        if (ds) ds->as<T>()[c] = static_cast<T>(sum_gx);
        if (db) db->as<T>()[c] = static_cast<T>(sum_g);
        if (!dx) continue;
        const double count = static_cast<double>(s.N * s.S), mul = scale[c] * inv;
        for (int64_t n = 0; n < s.N; ++n) {
          const int64_t base = (n * s.C + c) * s.S;
          T* out = dx->as<T>() + base;
          for (int64_t k = 0; k < s.S; ++k) {
            if (a_.training) {
              const double xhat = (x[base + k] - m) * inv;
              out[k] = static_cast<T>(mul * (g[base + k] - sum_g / count - xhat * sum_gx / count));
            } else {
              out[k] = static_cast<T>(mul * g[base + k]);
            }
          }
        }
      }
    });
  }
  BatchNormAttrs a_;
};

// One image's channel (a plane of S elements): its mean and biased variance, in double.
template <typename T>
void PlaneStats(const T* x, int64_t S, double* m, double* v) {
  double sum = 0;
  for (int64_t k = 0; k < S; ++k) sum += x[k];
  *m = sum / static_cast<double>(S);
  double q = 0;
  for (int64_t k = 0; k < S; ++k) q += (x[k] - *m) * (x[k] - *m);
  *v = q / static_cast<double>(S);
}

float EpsilonOf(const graph::Node& n) { return n.AttrFloat("epsilon", 1e-5f); }

// InstanceNormalization(X, scale, B) {epsilon} -> Y.
class InstanceNormKernel : public OpKernel {
 public:
  InstanceNormKernel(const graph::Node& n, int) : epsilon_(EpsilonOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& x = *ctx.input(0);
    RETURN_IF_ERROR(SameDtypes(ctx, x.dtype));
    if (x.rank < 3) return InvalidArgument("expected X [N, C, spatial...] of rank >= 3, got ", DimsToString(x.dim_span()));
    ASSIGN_OR_RETURN(const BatchNormShape s, PlanBatchNorm(x, {{"scale", ctx.input(1)}, {"B", ctx.input(2)}}));
    TensorView* y = ctx.Output(0, x.dim_span());
    if (!y) return absl::OkStatus();
    if (x.dtype == DataType::kFloat64) Run<double>(s, ctx, *y);
    else Run<float>(s, ctx, *y);
    return absl::OkStatus();
  }

 private:
  template <typename T>
  void Run(const BatchNormShape& s, KernelContext& ctx, TensorView& y) const {
    const T* x = ctx.input(0)->as<T>();
    const T *scale = ctx.input(1)->as<T>(), *bias = ctx.input(2)->as<T>();
    ParallelFor(ctx.thread_pool(), s.N * s.C, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t c = p % s.C;
        double m, v;
        PlaneStats(x + p * s.S, s.S, &m, &v);
        const double inv = 1.0 / std::sqrt(v + epsilon_), mul = inv * scale[c], add = bias[c] - m * mul;
        const T* xp = x + p * s.S;
        T* yp = y.as<T>() + p * s.S;
        for (int64_t k = 0; k < s.S; ++k) yp[k] = static_cast<T>(xp[k] * mul + add);
      }
    });
  }
  float epsilon_;
};

// ai.cleave.InstanceNormalizationGrad(dY, X, scale) {epsilon} -> dX, dScale, dB (each may go
// unused).
class InstanceNormGradKernel : public OpKernel {
 public:
  InstanceNormGradKernel(const graph::Node& n, int) : epsilon_(EpsilonOf(n)) {}
  absl::Status Compute(KernelContext& ctx) const override {
    const TensorView& dy = *ctx.input(0);
    const TensorView& x = *ctx.input(1);
    RETURN_IF_ERROR(SameDtypes(ctx, x.dtype));
    if (DimVector(dy.dim_span()) != DimVector(x.dim_span()) || x.rank < 3)
      return InvalidArgument("expected X [N, C, spatial...] and dY of its dims, got ", DimsToString(x.dim_span()),
                             " and ", DimsToString(dy.dim_span()));
    ASSIGN_OR_RETURN(const BatchNormShape s, PlanBatchNorm(x, {{"scale", ctx.input(2)}}));
    TensorView* dx = ctx.Output(0, x.dim_span());
    TensorView* ds = ctx.num_outputs() > 1 ? ctx.Output(1, {s.C}) : nullptr;
    TensorView* db = ctx.num_outputs() > 2 ? ctx.Output(2, {s.C}) : nullptr;
    if (x.dtype == DataType::kFloat64) Run<double>(s, ctx, dx, ds, db);
    else Run<float>(s, ctx, dx, ds, db);
    return absl::OkStatus();
  }

 private:
  // Per channel (in parallel), its planes in image order: dX of each, and the sums over them.
  template <typename T>
  void Run(const BatchNormShape& s, KernelContext& ctx, TensorView* dx, TensorView* ds, TensorView* db) const {
    const T *g = ctx.input(0)->as<T>(), *x = ctx.input(1)->as<T>(), *scale = ctx.input(2)->as<T>();
    const double count = static_cast<double>(s.S);
    ParallelFor(ctx.thread_pool(), s.C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double total_g = 0, total_gx = 0;
        for (int64_t n = 0; n < s.N; ++n) {
          const int64_t base = (n * s.C + c) * s.S;
          double m, v;
          PlaneStats(x + base, s.S, &m, &v);
          const double inv = 1.0 / std::sqrt(v + epsilon_);
          double sum_g = 0, sum_gx = 0;
          for (int64_t k = 0; k < s.S; ++k) {
            sum_g += g[base + k];
            sum_gx += g[base + k] * (x[base + k] - m) * inv;
          }
          total_g += sum_g;
          total_gx += sum_gx;
          if (!dx) continue;
          const double mul = scale[c] * inv;
          T* out = dx->as<T>() + base;
          for (int64_t k = 0; k < s.S; ++k) {
            const double xhat = (x[base + k] - m) * inv;
            out[k] = static_cast<T>(mul * (g[base + k] - sum_g / count - xhat * sum_gx / count));
          }
        }
        if (ds) ds->as<T>()[c] = static_cast<T>(total_gx);
        if (db) db->as<T>()[c] = static_cast<T>(total_g);
      }
    });
  }
  float epsilon_;
};

}  // namespace

void RegisterBatchNormKernels(KernelRegistry& r) {
  const std::vector<DataType> floats = {DataType::kFloat32, DataType::kFloat64};
  r.Register({"", "BatchNormalization", 6, 1 << 30, InputTypeIn(0, floats), MakeCheckedFactory<BatchNormKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "BatchNormalizationGrad", 1, 1, InputTypeIn(1, floats),
              MakeCheckedFactory<BatchNormGradKernel>()});
  r.Register({"", "InstanceNormalization", 6, 1 << 30, InputTypeIn(0, floats), MakeFactory<InstanceNormKernel>()});
  r.Register({std::string(graph::kCleaveDomain), "InstanceNormalizationGrad", 1, 1, InputTypeIn(1, floats),
              MakeFactory<InstanceNormGradKernel>()});
}

}  // namespace cleave::providers
