// Resize's inputs read (providers/): see resize_plan.h.
#include "providers/resize_plan.h"

#include "base/status.h"

namespace cleave::providers {

absl::StatusOr<std::vector<graph::ResizeDim>> PlanResizeInputs(const KernelContext& ctx, int first,
                                                               std::span<const int64_t> in,
                                                               const graph::ResizeAttrs& a) {
  std::vector<float> roi, scales;
  std::vector<int64_t> sizes;
  auto present = [&](int i) { return ctx.num_inputs() > i && ctx.input(i) && ctx.input(i)->numel() > 0; };
  for (int k = 0; k < 2; ++k) {
    if (!present(first + k)) continue;
    const TensorView& t = *ctx.input(first + k);
    if (t.dtype != DataType::kFloat32)
      return InvalidArgument(k == 0 ? "roi" : "scales", " must be float32, got ", DataTypeName(t.dtype));
    (k == 0 ? roi : scales).assign(t.as<float>(), t.as<float>() + t.numel());
  }
  if (present(first + 2)) {
    const TensorView& t = *ctx.input(first + 2);
    if (t.dtype != DataType::kInt64) return InvalidArgument("sizes must be int64, got ", DataTypeName(t.dtype));
    sizes.assign(t.as<int64_t>(), t.as<int64_t>() + t.numel());
  }
  return graph::PlanResize(in, a, roi, scales, sizes);
}

}  // namespace cleave::providers
