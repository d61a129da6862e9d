// Learning-rate schedules (trainer/): linear warmup, then constant, cosine or linear decay.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace cleave::trainer {

struct LrSchedule {
  enum class Kind { kConstant, kCosine, kLinear };
  Kind kind = Kind::kConstant;
  double peak = 3e-4;    // the learning rate after warmup
  double min_lr = 0.0;   // where cosine and linear decay end
  int64_t warmup = 0;    // steps of linear warmup
  int64_t total = 1;     // steps in the whole run (decay ends at the last one)

  // The rate for 0-based optimizer step s:
  //   s < warmup:   peak * (s + 1) / warmup
  //   otherwise:    p = (s - warmup) / max(1, total - warmup), clamped to [0, 1];
  //                 cosine: min + (peak - min) * (1 + cos(pi p)) / 2; linear: peak - (peak - min) p
  double At(int64_t step) const;
};

absl::StatusOr<LrSchedule::Kind> ParseLrScheduleKind(const std::string& s);

}  // namespace cleave::trainer
