// Learning-rate schedules (trainer/): see lr_schedule.h.
#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/status.h"

namespace cleave::trainer {

double LrSchedule::At(int64_t step) const {
  if (warmup > 0 && step < warmup)
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == Kind::kConstant) return peak;
  double p = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  p = std::clamp(p, 0.0, 1.0);
  if (kind == Kind::kCosine) return min_lr + 0.5 * (peak - min_lr) * (1.0 + std::cos(std::numbers::pi * p));
  return peak - (peak - min_lr) * p;
}

absl::StatusOr<LrSchedule::Kind> ParseLrScheduleKind(const std::string& s) {
  if (s == "constant") return LrSchedule::Kind::kConstant;
  if (s == "cosine") return LrSchedule::Kind::kCosine;
  if (s == "linear") return LrSchedule::Kind::kLinear;
  return InvalidArgument("unknown learning-rate schedule '", s, "'; expected cosine, linear or constant");
}

}  // namespace cleave::trainer
