// Argument reading shared by the subcommands (tools/): a FlagReader walks the arguments,
// hands out each flag's value and numbers, and keeps the first error; TrainingFlag reads
// the loss and optimizer flags `cleave train` and `cleave partition` both take.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tools/commands.h"
#include "trainer/training_graph.h"

namespace cleave::tools {

class FlagReader {
 public:
  explicit FlagReader(const Args& args) : args_(args) {}

  // Moves to the next argument; false at the end or after an error.
  bool Next() { return error_.empty() && ++i_ < args_.size(); }
  const std::string& flag() const { return args_[i_]; }
  // The current flag's value (the next argument).
  std::string Value() {
    if (i_ + 1 < args_.size()) return args_[++i_];
    Fail(absl::StrCat(flag(), " expects a value"));
    return "";
  }
  // The current flag's value as a number.
  template <typename T>
  void Number(T* out) {
    const std::string& name = flag();
    const std::string v = Value();
    if (!error_.empty()) return;
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      double d;
      ok = absl::SimpleAtod(v, &d);
      *out = static_cast<T>(d);
    } else {
      ok = absl::SimpleAtoi(v, out);
    }
    if (!ok) Fail(absl::StrCat(name, " expects a number, got '", v, "'"));
  }
  void Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }
  const std::string& error() const { return error_; }

 private:
  const Args& args_;
  size_t i_ = static_cast<size_t>(-1);
  std::string error_;
};

// --loss cross_entropy|mse, --optimizer adamw|sgd, --weight-decay, --clip, --beta1, --beta2,
// --eps, --momentum, --nesterov, --freeze NAME|REGEX,..., --recompute none|selective|full,
// --precision fp32|bf16. Returns false when the current flag is none of these.
bool TrainingFlag(FlagReader& r, trainer::LossKind* loss, trainer::OptimizerConfig* optimizer,
                  std::vector<std::string>* frozen, trainer::RecomputeMode* recompute,
                  trainer::Precision* precision);

}  // namespace cleave::tools
