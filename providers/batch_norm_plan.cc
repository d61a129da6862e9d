// BatchNormalization's plan (providers/batch_norm_plan.h).
#include "providers/batch_norm_plan.h"

#include "base/status.h"
#include "graph/op_table.h"

namespace cleave::providers {

absl::StatusOr<BatchNormAttrs> BatchNormAttrsOf(const graph::Node& n, int version) {
  BatchNormAttrs a;
  a.epsilon = n.AttrFloat("epsilon", 1e-5f);
  a.momentum = n.AttrFloat("momentum", 0.9f);
  const bool grad = n.domain() == graph::kCleaveDomain;
  if (grad || version >= 14) {
    a.training = n.AttrInt("training_mode", 0) != 0;
  } else if (n.num_outputs() > 1) {
    return Unimplemented(n.Describe(), ": BatchNormalization version ", version,
                         " with its training outputs (mean, var, saved_mean, saved_var); cleave implements "
                         "training mode as version 14 has it (training_mode = 1)");
  }
  if (n.AttrInt("spatial", 1) != 1)
    return Unimplemented(n.Describe(), ": BatchNormalization with spatial = 0 (statistics per element, not per channel)");
  if (!(a.epsilon >= 0.f)) return InvalidArgument(n.Describe(), ": expected epsilon >= 0, got ", a.epsilon);
  return a;
}

absl::StatusOr<BatchNormShape> PlanBatchNorm(const TensorView& x, std::initializer_list<ChannelOperand> per_channel) {
  if (x.rank < 2) return InvalidArgument("expected X [N, C, ...] of rank >= 2, got ", DimsToString(x.dim_span()));
  BatchNormShape s;
  s.N = x.dims[0];
  s.C = x.dims[1];
  for (int d = 2; d < x.rank; ++d) s.S *= x.dims[d];
  for (const auto& [name, t] : per_channel)
    if (t && (t->rank != 1 || t->dims[0] != s.C))
      return InvalidArgument("expected ", name, " of [", s.C, "] (X's channels), got ", DimsToString(t->dim_span()));
  return s;
}

}  // namespace cleave::providers
