// `cleave train`: train a causal language model on a token file (tools/). Parses the flags
// into a TrainConfig and hands it to trainer::RunTraining.
#include <cstdio>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/commands.h"
#include "trainer/train_loop.h"

namespace cleave::tools {

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cleave train: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int TrainCommand(const Args& args) {
  trainer::TrainConfig c;
  std::string error;
  for (size_t i = 0; i < args.size() && error.empty(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> std::string {
      if (i + 1 < args.size()) return args[++i];
      error = absl::StrCat(a, " expects a value");
      return "";
    };
    auto num = [&](auto* out) {
      std::string v = next();
      if (error.empty()) {
        bool ok;
        if constexpr (std::is_floating_point_v<std::remove_pointer_t<decltype(out)>>) {
          double d;
          ok = absl::SimpleAtod(v, &d);
          *out = static_cast<std::remove_pointer_t<decltype(out)>>(d);
        } else {
          ok = absl::SimpleAtoi(v, out);
        }
        if (!ok) error = absl::StrCat(a, " expects a number, got '", v, "'");
      }
    };
    if (a == "--data") c.data = next();
    else if (a == "--loss") {
      std::string v = next();
      if (v == "cross_entropy") c.loss = trainer::LossKind::kCrossEntropy;
      else if (v == "mse") c.loss = trainer::LossKind::kMse;
      else if (error.empty()) error = absl::StrCat("--loss expects cross_entropy or mse, got '", v, "'");
    } else if (a == "--optimizer") {
      std::string v = next();
      if (v == "adamw") c.optimizer.kind = trainer::OptimizerConfig::Kind::kAdamW;
      else if (v == "sgd") c.optimizer.kind = trainer::OptimizerConfig::Kind::kSgd;
      else if (error.empty()) error = absl::StrCat("--optimizer expects adamw or sgd, got '", v, "'");
    } else if (a == "--lr") num(&c.lr);
    else if (a == "--min-lr") num(&c.min_lr);
    else if (a == "--weight-decay") num(&c.optimizer.weight_decay);
    else if (a == "--beta1") num(&c.optimizer.beta1);
    else if (a == "--beta2") num(&c.optimizer.beta2);
    else if (a == "--eps") num(&c.optimizer.epsilon);
    else if (a == "--momentum") num(&c.optimizer.momentum);
    else if (a == "--nesterov") c.optimizer.nesterov = true;
    else if (a == "--warmup") num(&c.warmup);
    else if (a == "--lr-schedule") {
      auto k = trainer::ParseLrScheduleKind(next());
      if (!k.ok() && error.empty()) error = std::string(k.status().message());
      if (k.ok()) c.schedule = *k;
    } else if (a == "--clip") num(&c.optimizer.max_grad_norm);
    else if (a == "--batch") num(&c.batch);
    else if (a == "--seq") num(&c.seq);
    else if (a == "--steps") num(&c.steps);
    else if (a == "--grad-accum") num(&c.grad_accum);
    else if (a == "--seed") num(&c.seed);
    else if (a == "--no-shuffle") c.shuffle = false;
    else if (a == "--val-fraction") num(&c.val_fraction);
    else if (a == "--eval-every") num(&c.eval_every);
    else if (a == "--eval-batches") num(&c.eval_batches);
    else if (a == "--metrics") c.metrics = next();
    else if (a == "--plot") c.plot = next();
    else if (a == "--checkpoint-dir") c.checkpoint_dir = next();
    else if (a == "--checkpoint-every") num(&c.checkpoint_every);
    else if (a == "--keep-checkpoints") num(&c.keep_checkpoints);
    else if (a == "--resume") c.resume = true;
    else if (a == "--save-model") c.save_model = next();
    else if (a == "--save-artifacts") c.artifacts_dir = next();
    else if (a == "--freeze") {
      for (absl::string_view p : absl::StrSplit(next(), ',', absl::SkipEmpty())) c.frozen.emplace_back(p);
    } else if (a == "--threads") num(&c.threads);
    else if (a == "--log-every") num(&c.log_every);
    else if (a == "--exit-at") num(&c.exit_at);
    else if (c.model.empty() && !a.empty() && a[0] != '-') c.model = a;
    else error = absl::StrCat("unknown argument '", a, "'");
  }
  if (!error.empty()) return Fail(error);
  if (c.model.empty()) return Fail("no model given (cleave train MODEL.onnx --data FILE ...)");
  if (c.data.empty()) return Fail("no --data file given");
  auto r = trainer::RunTraining(c, std::cout);
  if (!r.ok()) return Fail(std::string(r.status().message()));
  if (!r->losses.empty())
    std::printf("trained %zu steps: loss %.4f -> %.4f%s\n", r->losses.size(), r->losses.front(), r->losses.back(),
                r->val_loss >= 0 ? absl::StrCat(", val loss ", r->val_loss).c_str() : "");
  return 0;
}

}  // namespace cleave::tools
