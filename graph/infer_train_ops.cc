// Shape inference for the ai.cleave training ops (graph/): the gradient accumulator, the
// squared-norm reduction behind global-norm clipping, and the AdamW and SGD update steps.
// Update steps return their state inputs' shapes; every scalar input must be a scalar.
#include "base/status.h"
#include "graph/infer_fns.h"
#include "graph/infer_util.h"

namespace cleave::graph {

namespace {

const std::initializer_list<DataType> kFloat = {DataType::kFloat32};

absl::Status ExpectScalar(const InferContext& ctx, int i, const char* what) {
  const Shape& s = ctx.input_shape(i);
  if (s.is_static() && s.NumElements() != 1)
    return ctx.Error("expected ", what, " (input ", i, ") to be a scalar, got ", s.ToString());
  return absl::OkStatus();
}

// Inputs [first, first + count) must all have input `first`'s static shape.
absl::Status ExpectSameShapes(const InferContext& ctx, int first, int count) {
  const Shape& want = ctx.input_shape(first);
  for (int i = first + 1; i < first + count; ++i) {
    RETURN_IF_ERROR(ExpectDtype(ctx, i, kFloat));
    const Shape& s = ctx.input_shape(i);
    if (want.has_rank() && s.has_rank() && !(s == want))
      return ctx.Error("expected input ", i, " '", ctx.node().input(i)->name(), "' to have shape ",
                       want.ToString(), ", got ", s.ToString());
  }
  return absl::OkStatus();
}

// The (lr, step, grad_scale) scalars every update op starts with.
absl::Status ExpectStepScalars(const InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kFloat));
  RETURN_IF_ERROR(ExpectScalar(ctx, 0, "lr"));
  RETURN_IF_ERROR(ExpectDtype(ctx, 1, {DataType::kInt64}));
  RETURN_IF_ERROR(ExpectScalar(ctx, 1, "step"));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, kFloat));
  RETURN_IF_ERROR(ExpectScalar(ctx, 2, "grad_scale"));
  return absl::OkStatus();
}

}  // namespace

absl::Status InferInPlaceAccumulator(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectDtype(ctx, 0, kFloat));
  RETURN_IF_ERROR(ExpectSameShapes(ctx, 0, 2));
  RETURN_IF_ERROR(ExpectDtype(ctx, 2, {DataType::kBool}));
  RETURN_IF_ERROR(ExpectScalar(ctx, 2, "reset"));
  ctx.SetOutput(0, DataType::kFloat32, ctx.input_shape(0));
  return absl::OkStatus();
}

absl::Status InferSquaredNorm(InferContext& ctx) {
  for (int i = 0; i < ctx.num_inputs(); ++i) RETURN_IF_ERROR(ExpectDtype(ctx, i, kFloat));
  ctx.SetOutput(0, DataType::kFloat32, Shape::Scalar());
  return absl::OkStatus();
}

absl::Status InferIsAllFinite(InferContext& ctx) {
  for (int i = 0; i < ctx.num_inputs(); ++i) RETURN_IF_ERROR(ExpectDtype(ctx, i, kFloat));
  ctx.SetOutput(0, DataType::kBool, Shape::Scalar());
  return absl::OkStatus();
}

// AdamW(lr, step, scale, param, grad, exp_avg, exp_avg_sq) -> (param, exp_avg, exp_avg_sq)
absl::Status InferAdamW(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectStepScalars(ctx));
  RETURN_IF_ERROR(ExpectDtype(ctx, 3, kFloat));
  RETURN_IF_ERROR(ExpectSameShapes(ctx, 3, 4));
  for (int o = 0; o < ctx.num_outputs(); ++o) ctx.SetOutput(o, DataType::kFloat32, ctx.input_shape(3));
  return absl::OkStatus();
}

// MultiTensorAdamW(lr, step, scale, {param, grad, exp_avg, exp_avg_sq} x n) ->
// {param, exp_avg, exp_avg_sq} x n, plus the global gradient norm (a float scalar) when
// compute_norm = 1.
absl::Status InferMultiTensorAdamW(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectStepScalars(ctx));
  const int n = (ctx.num_inputs() - 3) / 4;
  const int norm = ctx.node().AttrInt("compute_norm", 0) != 0 ? 1 : 0;
  if (n < 1 || ctx.num_inputs() != 3 + 4 * n || ctx.num_outputs() != 3 * n + norm)
    return ctx.Error("expected 3 + 4n inputs and 3n", norm ? " + 1" : "", " outputs, got ", ctx.num_inputs(), " and ",
                     ctx.num_outputs());
  if (norm) ctx.SetOutput(3 * n, DataType::kFloat32, Shape::Scalar());
  for (int k = 0; k < n; ++k) {
    const int in = 3 + 4 * k;
    RETURN_IF_ERROR(ExpectDtype(ctx, in, kFloat));
    RETURN_IF_ERROR(ExpectSameShapes(ctx, in, 4));
    for (int j = 0; j < 3; ++j) ctx.SetOutput(3 * k + j, DataType::kFloat32, ctx.input_shape(in));
  }
  return absl::OkStatus();
}

// MultiTensorSGD(lr, step, scale, {param, grad[, momentum_buffer]} x n) -> {param[,
// momentum_buffer]} x n: the buffers are there when momentum != 0; plus the global gradient
// norm when compute_norm = 1.
absl::Status InferMultiTensorSGD(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectStepScalars(ctx));
  const int k = ctx.node().AttrFloat("momentum", 0.0f) != 0.0f ? 3 : 2;
  const int n = (ctx.num_inputs() - 3) / k;
  const int norm = ctx.node().AttrInt("compute_norm", 0) != 0 ? 1 : 0;
  if (n < 1 || ctx.num_inputs() != 3 + k * n || ctx.num_outputs() != (k - 1) * n + norm)
    return ctx.Error("expected 3 + ", k, "n inputs and ", k - 1, "n", norm ? " + 1" : "", " outputs, got ",
                     ctx.num_inputs(), " and ", ctx.num_outputs());
  for (int g = 0; g < n; ++g) {
    const int in = 3 + k * g;
    RETURN_IF_ERROR(ExpectDtype(ctx, in, kFloat));
    RETURN_IF_ERROR(ExpectSameShapes(ctx, in, k));
    for (int j = 0; j < k - 1; ++j) ctx.SetOutput((k - 1) * g + j, DataType::kFloat32, ctx.input_shape(in));
  }
  if (norm) ctx.SetOutput((k - 1) * n, DataType::kFloat32, Shape::Scalar());
  return absl::OkStatus();
}

// SGD(lr, step, scale, param, grad[, momentum_buffer]) -> (param[, momentum_buffer])
absl::Status InferSGD(InferContext& ctx) {
  RETURN_IF_ERROR(ExpectStepScalars(ctx));
  RETURN_IF_ERROR(ExpectDtype(ctx, 3, kFloat));
  RETURN_IF_ERROR(ExpectSameShapes(ctx, 3, ctx.num_inputs() - 3));
  for (int o = 0; o < ctx.num_outputs(); ++o) ctx.SetOutput(o, DataType::kFloat32, ctx.input_shape(3));
  return absl::OkStatus();
}

}  // namespace cleave::graph
