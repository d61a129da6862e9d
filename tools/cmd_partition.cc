// `cleave partition`: build per-rank training graphs for a mesh and write a plan directory
// (tools/). Training options follow `cleave train`.
#include <cstdio>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/commands.h"
#include "trainer/partition_plan.h"

namespace cleave::tools {

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cleave partition: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int PartitionCommand(const Args& args) {
  trainer::PlanConfig c;
  c.spec.optimizer.weight_decay = 0.0f;
  std::string out, error;
  for (size_t i = 0; i < args.size() && error.empty(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> std::string {
      if (i + 1 < args.size()) return args[++i];
      error = absl::StrCat(a, " expects a value");
      return "";
    };
    auto num = [&](auto* v) {
      const std::string s = next();
      bool ok;
      if constexpr (std::is_floating_point_v<std::remove_pointer_t<decltype(v)>>) {
        double d;
        ok = absl::SimpleAtod(s, &d);
        *v = static_cast<std::remove_pointer_t<decltype(v)>>(d);
      } else {
        ok = absl::SimpleAtoi(s, v);
      }
      if (!ok && error.empty()) error = absl::StrCat(a, " expects a number, got '", s, "'");
    };
    if (a == "--mesh") c.mesh = next();
    else if (a == "-o" || a == "--output") out = next();
    else if (a == "--batch") num(&c.batch);
    else if (a == "--seq") num(&c.seq);
    else if (a == "--zero") num(&c.zero);
    else if (a == "--bucket-mb") {
      double mb = 25;
      num(&mb);
      c.bucket_bytes = static_cast<int64_t>(mb * (1 << 20));
    }
    else if (a == "--tp") {
      const std::string v = next();
      if (v != "megatron" && error.empty()) error = absl::StrCat("--tp expects megatron, got '", v, "'");
    } else if (a == "--loss") {
      const std::string v = next();
      if (v == "mse") c.spec.loss.kind = trainer::LossKind::kMse;
      else if (v != "cross_entropy" && error.empty()) error = absl::StrCat("--loss expects cross_entropy or mse, got '", v, "'");
    } else if (a == "--optimizer") {
      const std::string v = next();
      if (v == "sgd") c.spec.optimizer.kind = trainer::OptimizerConfig::Kind::kSgd;
      else if (v != "adamw" && error.empty()) error = absl::StrCat("--optimizer expects adamw or sgd, got '", v, "'");
    } else if (a == "--weight-decay") num(&c.spec.optimizer.weight_decay);
    else if (a == "--clip") num(&c.spec.optimizer.max_grad_norm);
    else if (a == "--beta1") num(&c.spec.optimizer.beta1);
    else if (a == "--beta2") num(&c.spec.optimizer.beta2);
    else if (a == "--eps") num(&c.spec.optimizer.epsilon);
    else if (a == "--momentum") num(&c.spec.optimizer.momentum);
    else if (a == "--freeze") {
      for (absl::string_view p : absl::StrSplit(next(), ',', absl::SkipEmpty())) c.spec.frozen.emplace_back(p);
    } else if (a == "--sp" || a == "--schedule" || a == "--pp-cuts" || a == "--shard-plan" || a == "--microbatches" ||
               a == "--virtual-stages" || a == "--vocab-parallel-loss") {
      error = absl::StrCat(a, " is not implemented yet (this version partitions over dp and tp)");
    } else if (c.model.empty() && !a.empty() && a[0] != '-') {
      c.model = a;
    } else {
      error = absl::StrCat("unknown argument '", a, "'");
    }
  }
  if (!error.empty()) return Fail(error);
  if (c.model.empty()) return Fail("no model given (cleave partition MODEL.onnx --mesh dp=2,tp=2 -o PLAN_DIR)");
  if (out.empty()) return Fail("no output directory given (-o PLAN_DIR)");
  auto plan = trainer::BuildPlan(c);
  if (!plan.ok()) return Fail(std::string(plan.status().message()));
  absl::Status s = trainer::WritePlan(*plan, out);
  if (!s.ok()) return Fail(std::string(s.message()));
  std::printf("plan for %s over %s (%d ranks) written to %s\n", c.model.c_str(), plan->mesh.ToString().c_str(),
              plan->mesh.world_size(), out.c_str());
  return 0;
}

}  // namespace cleave::tools
