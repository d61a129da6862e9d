// `cleave partition`: build per-rank training graphs for a mesh and write a plan directory
// (tools/). Training options follow `cleave train`.
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "tools/commands.h"
#include "tools/flags.h"
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
  std::string out;
  FlagReader flags(args);
  while (flags.Next()) {
    const std::string& a = flags.flag();
    if (TrainingFlag(flags, &c.spec.loss.kind, &c.spec.optimizer, &c.spec.frozen, &c.spec.recompute,
                     &c.spec.precision))
      continue;
    if (a == "--mesh") c.mesh = flags.Value();
    else if (a == "-o" || a == "--output") out = flags.Value();
    else if (a == "--batch") flags.Number(&c.batch);
    else if (a == "--seq") flags.Number(&c.seq);
    else if (a == "--zero") flags.Number(&c.zero);
    else if (a == "--bucket-mb") {
      double mb = 25;
      flags.Number(&mb);
      c.bucket_bytes = static_cast<int64_t>(mb * (1 << 20));
    } else if (a == "--tp") {
      const std::string v = flags.Value();
      if (v != "megatron") flags.Fail(absl::StrCat("--tp expects megatron, got '", v, "'"));
    } else if (a == "--sp") {
      c.sp = true;
    } else if (a == "--schedule") {
      c.schedule = flags.Value();
    } else if (a == "--microbatches") {
      flags.Number(&c.microbatches);
    } else if (a == "--virtual-stages") {
      flags.Number(&c.virtual_stages);
    } else if (a == "--pp-cuts") {
      c.pp_cuts = flags.Value();
    } else if (a == "--shard-plan") {
      c.shard_plan = flags.Value();
    } else if (a == "--vocab-parallel-loss") {
      c.vocab_parallel_loss = true;
    } else if (a == "--fuse-attention") {
      c.spec.fuse_attention = true;
    } else if (c.model.empty() && !a.empty() && a[0] != '-') {
      c.model = a;
    } else {
      flags.Fail(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  const std::string& error = flags.error();
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
