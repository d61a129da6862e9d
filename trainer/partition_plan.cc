// Partition plans (trainer/): see partition_plan.h.
#include "trainer/partition_plan.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/op_table.h"
#include "onnx_ext/onnx_io.h"
#include "partition/megatron.h"
#include "partition/propagation.h"
#include "trainer/autodiff.h"
#include "trainer/checkpoint.h"
#include "trainer/train_loop.h"

namespace cleave::trainer {

namespace {

namespace fs = std::filesystem;
using partition::Sharding;

int64_t Bytes(const graph::Value* v) {
  if (!v || !v->shape().is_static()) return 0;
  return v->shape().NumElements() * static_cast<int64_t>(ElementSize(v->dtype()));
}

RankMemory MemoryOf(const TrainingArtifacts& a) {
  RankMemory m;
  for (const std::string& p : a.params) {
    const int64_t bytes = static_cast<int64_t>(a.initial.at(p).nbytes());
    m.parameters += bytes;
    const graph::Value* buffer = a.training ? a.training->FindValue(AccumulationBuffer(p)) : nullptr;
    for (const PipelineStage& st : a.stages)
      if (!buffer) buffer = st.backward->FindValue(AccumulationBuffer(p));
    m.gradients += buffer ? Bytes(buffer) : bytes;
    for (const std::string& suf : a.state_suffixes) m.optimizer_state += Bytes(a.optimizer->FindValue(p + suf));
  }
  return m;
}

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string MiB(int64_t bytes) { return absl::StrFormat("%.3f MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

std::vector<TrainingSession::PipelineWork> PipelineWorkFor(const Plan& plan, int rank) {
  std::vector<TrainingSession::PipelineWork> work;
  if (plan.schedule.empty()) return {{false, 0, 0}, {true, 0, 0}};
  for (const partition::Action& a : plan.schedule.at(plan.mesh.Coord(rank, "pp")))
    if (a.IsCompute()) work.push_back({a.kind == partition::ActionKind::kBackward, a.microbatch, a.chunk});
  return work;
}

absl::StatusOr<Plan> BuildPlan(const PlanConfig& c) {
  Plan plan;
  plan.config = c;
  ASSIGN_OR_RETURN(plan.mesh, partition::Mesh::Parse(c.mesh));
  const partition::Mesh& mesh = plan.mesh;
  if (mesh.size("cp") > 1) return Unimplemented("--mesh ", c.mesh, ": context parallelism is not implemented");
  const int dp = mesh.size("dp"), tp = mesh.size("tp"), pp = mesh.size("pp");
  const int micro = c.microbatches, virt = c.virtual_stages;
  if (micro < 1) return InvalidArgument("--microbatches must be >= 1, got ", micro);
  if (pp == 1 && micro > 1) return InvalidArgument("--microbatches ", micro, " needs a pipeline (pp > 1 in --mesh)");
  if (c.batch % (static_cast<int64_t>(dp) * micro) != 0)
    return InvalidArgument("--batch ", c.batch, " (the global batch) is not divisible by dp=", dp,
                           " x microbatches=", micro);
  if (c.sp && tp == 1) return InvalidArgument("--sp splits the sequence over tp, and the mesh has tp=1");
  if (c.zero < 0 || c.zero > 2) return InvalidArgument("--zero ", c.zero, ": expected 0, 1 or 2");
  if (pp > 1) {
    ASSIGN_OR_RETURN(plan.schedule_kind, partition::ParseScheduleKind(c.schedule));
    ASSIGN_OR_RETURN(plan.schedule, partition::BuildSchedule(plan.schedule_kind, pp, micro, virt));
    ASSIGN_OR_RETURN(plan.schedule_stats, partition::SimulateSchedule(plan.schedule, {1.0, 2.0}));
  } else if (virt != 1) {
    return InvalidArgument("--virtual-stages ", virt, " needs a pipeline (pp > 1 in --mesh)");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<graph::Graph> model, onnx_ext::LoadModel(c.model));
  ASSIGN_OR_RETURN(const graph::Value* token, TokenInput(*model, c.model));
  TrainingSpec spec = c.spec;
  // Each graph computes one micro-batch of the global batch (split over dp by the sharding).
  RETURN_IF_ERROR(FixTokenDims(*token, c.batch / micro, c.seq, &spec.dims));
  ASSIGN_OR_RETURN(TrainingArtifacts a, BuildTrainingArtifacts(*model, spec));
  if (pp > 1) {
    ASSIGN_OR_RETURN(std::vector<int> cuts, partition::ParseCuts(c.pp_cuts));
    ASSIGN_OR_RETURN(plan.stages, partition::AssignStages(*a.training, a.params, pp * virt, cuts));
  }

  std::map<std::string, Sharding> seeds;
  for (const std::string& d : a.data_inputs) {
    Sharding s = Sharding::Replicated(a.training->FindValue(d)->shape().rank());
    if (dp > 1) s.dims[0] = {"dp"};
    if (dp > 1 || c.sp) seeds[d] = s;
  }
  plan.data_shardings = seeds;
  if (tp > 1) {
    if (!c.tp_megatron) return Unimplemented("tp=", tp, " needs --tp megatron (shard plans are not supported yet)");
    ASSIGN_OR_RETURN(auto megatron, partition::FindMegatronSeeds(*a.training, a.params, mesh));
    for (auto& [k, v] : partition::SeedShardings(*a.training, megatron)) seeds[k] = v;
    if (c.sp) {
      ASSIGN_OR_RETURN(auto sp, partition::FindSequenceParallelSeed(*a.training, a.params, mesh));
      seeds[sp.first] = sp.second;
    }
  }
  ASSIGN_OR_RETURN(partition::Propagation train_p, partition::PropagateTraining(*a.training, a.params, mesh, seeds, c.zero));
  std::map<std::string, Sharding> grads;
  for (const std::string& p : a.params) {
    plan.param_shardings[p] = train_p.sharding.at(a.training->FindValue(p));
    grads[p] = train_p.sharding.at(a.training->FindValue(AccumulationOut(p)));
  }
  std::map<std::string, Sharding> eval_seeds = plan.data_shardings;
  for (const auto& [p, s] : plan.param_shardings) eval_seeds[p] = s;
  ASSIGN_OR_RETURN(partition::Propagation eval_p, partition::Propagate(*a.eval, mesh, eval_seeds));

  // The optimizer of each pipeline rank: the parameters its stages hold.
  std::vector<std::set<std::string>> held(pp);
  std::map<std::string, int> holders;
  for (const std::string& p : a.params) {
    if (pp == 1) {
      held[0].insert(p);
      continue;
    }
    auto it = plan.stages.param_stages.find(p);
    if (it == plan.stages.param_stages.end()) return Internal("pipeline: no stage reads parameter '", p, "'");
    std::set<int> ranks;
    for (int s : it->second) ranks.insert(s % pp);
    for (int r : ranks) held[r].insert(p);
    holders[p] = static_cast<int>(ranks.size());
  }
  struct StageOptimizer {
    std::unique_ptr<graph::Graph> graph;
    partition::Propagation prop;
    std::map<std::string, Sharding> output_wants;
    std::vector<std::string> params;
  };
  std::vector<StageOptimizer> optimizers(pp);
  for (int s = 0; s < pp; ++s) {
    StageOptimizer& so = optimizers[s];
    so.graph = a.optimizer->Clone();
    so.params.assign(held[s].begin(), held[s].end());
    if (pp > 1) RETURN_IF_ERROR(partition::PrepareStageOptimizer(*so.graph, held[s], holders));
    ASSIGN_OR_RETURN(auto opt_seeds, partition::PrepareOptimizer(*so.graph, so.params, a.state_suffixes, mesh,
                                                                 plan.param_shardings, grads, c.zero, &so.output_wants));
    ASSIGN_OR_RETURN(so.prop, partition::Propagate(*so.graph, mesh, opt_seeds));
  }

  plan.unpartitioned.parameters = 0;
  for (const std::string& p : a.params) {
    plan.unpartitioned.parameters += Bytes(a.training->FindValue(p));
    plan.unpartitioned.optimizer_state +=
        Bytes(a.training->FindValue(p)) * static_cast<int64_t>(a.state_suffixes.size());
  }
  plan.unpartitioned.gradients = plan.unpartitioned.parameters;

  for (int r = 0; r < mesh.world_size(); ++r) {
    RankPlan rp;
    rp.rank = r;
    rp.coords = mesh.Coords(r);
    const int s = mesh.Coord(r, "pp");
    const StageOptimizer& so = optimizers[s];
    ASSIGN_OR_RETURN(partition::LoweredGraph train, partition::LowerForRank(*a.training, mesh, train_p, r, kLoss));
    ASSIGN_OR_RETURN(partition::LoweredGraph eval, partition::LowerForRank(*a.eval, mesh, eval_p, r, kLoss));
    ASSIGN_OR_RETURN(partition::LoweredGraph opt,
                     partition::LowerForRank(*so.graph, mesh, so.prop, r, "", so.output_wants, c.bucket_bytes));
    if (pp > 1) {
      const std::vector<int> pp_group = mesh.Group(r, "pp");
      std::map<std::string, std::vector<int>> tied;
      for (const std::string& p : so.params)
        if (holders.at(p) > 1) {
          std::set<int> ranks;
          for (int st : plan.stages.param_stages.at(p)) ranks.insert(pp_group[st % pp]);
          tied[p + "_grad"] = std::vector<int>(ranks.begin(), ranks.end());
          rp.collectives.emplace_back("optimizer", partition::CollectiveRecord{
              "AllReduce", p + "_grad", "(tied parameter)", "pp", tied[p + "_grad"],
              static_cast<int64_t>(a.initial.at(p).nbytes()) / (tp > 1 && !plan.param_shardings.at(p).IsReplicated() ? tp : 1)});
        }
      RETURN_IF_ERROR(partition::AddPipelineReductions(*opt.graph, tied, pp_group));
      rp.collectives.emplace_back("optimizer",
                                  partition::CollectiveRecord{"AllReduce", "grad_norm/squared", "(gradient norm)", "pp",
                                                              pp_group, 4});
      std::set<std::string> present;  // values this rank's stage parts hold
      for (int chunk = 0; chunk < virt; ++chunk) {
        const int vs = chunk * pp + s;
        const int prev = vs > 0 ? pp_group[(vs - 1) % pp] : -1;
        const int next = vs + 1 < pp * virt ? pp_group[(vs + 1) % pp] : -1;
        ASSIGN_OR_RETURN(partition::StagePart tpart, partition::SplitStage(*train.graph, plan.stages, vs, prev, next));
        ASSIGN_OR_RETURN(partition::StagePart epart, partition::SplitStage(*eval.graph, plan.stages, vs, prev, next));
        for (const graph::Graph* g : {tpart.forward.get(), tpart.backward.get()})
          for (const auto& n : g->nodes())
            for (const graph::Value* v : n->inputs())
              if (v) present.insert(v->name());
        PipelineStage st;
        st.stage = vs;
        st.chunk = chunk;
        st.forward = std::move(tpart.forward);
        st.backward = std::move(tpart.backward);
        st.eval = std::move(epart.forward);
        st.stash = tpart.stash;
        rp.p2p.insert(rp.p2p.end(), tpart.p2p.begin(), tpart.p2p.end());
        rp.artifacts.stages.push_back(std::move(st));
      }
      for (auto& rec : train.collectives)
        if (present.count(rec.value)) rp.collectives.emplace_back("training", rec);
      for (auto& rec : eval.collectives)
        if (present.count(rec.value)) rp.collectives.emplace_back("eval", rec);
    } else {
      for (auto& rec : train.collectives) rp.collectives.emplace_back("training", rec);
      for (auto& rec : eval.collectives) rp.collectives.emplace_back("eval", rec);
      rp.artifacts.training = std::move(train.graph);
      rp.artifacts.eval = std::move(eval.graph);
    }
    for (auto& rec : opt.collectives) rp.collectives.emplace_back("optimizer", rec);
    rp.artifacts.optimizer = std::move(opt.graph);
    rp.artifacts.forward = a.forward->Clone();
    rp.artifacts.params = so.params;
    rp.artifacts.state_suffixes = a.state_suffixes;
    rp.artifacts.data_inputs = a.data_inputs;
    for (const std::string& p : so.params) {
      ASSIGN_OR_RETURN(rp.artifacts.initial[p],
                       partition::ShardTensor(a.initial.at(p), mesh, plan.param_shardings.at(p), r, p));
    }
    rp.memory = MemoryOf(rp.artifacts);
    plan.ranks.push_back(std::move(rp));
  }
  return plan;
}

absl::Status WritePlan(const Plan& plan, const std::string& dir) {
  const fs::path target = fs::absolute(dir);
  const fs::path tmp = target.string() + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return InvalidArgument("cannot create '", tmp.string(), "': ", ec.message());
  auto fail = [&](absl::Status s) {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    return s;
  };
  const partition::Mesh& mesh = plan.mesh;
  std::ostringstream json, report;
  json << "{\n  \"mesh\": {\"spec\": " << Json(mesh.ToString()) << ", \"world_size\": " << mesh.world_size()
       << ", \"axes\": [";
  for (size_t i = 0; i < mesh.axes().size(); ++i)
    json << (i ? ", " : "") << "{\"name\": " << Json(mesh.axes()[i].name) << ", \"size\": " << mesh.axes()[i].size << "}";
  json << "]},\n  \"model\": " << Json(plan.config.model) << ",\n  \"batch\": " << plan.config.batch
       << ", \"seq\": " << plan.config.seq << ", \"zero\": " << plan.config.zero
       << ", \"tp\": " << Json(plan.config.tp_megatron ? "megatron" : "none")
       << ",\n  \"schedule\": {\"kind\": \"none\", \"stages\": 1},\n  \"shardings\": {";
  bool first = true;
  for (const auto* m : {&plan.data_shardings, &plan.param_shardings})
    for (const auto& [name, s] : *m) {
      json << (first ? "\n" : ",\n") << "    " << Json(name) << ": " << Json(s.ToString());
      first = false;
    }
  json << "\n  },\n  \"unpartitioned\": {\"parameters\": " << plan.unpartitioned.parameters
       << ", \"gradients\": " << plan.unpartitioned.gradients
       << ", \"optimizer_state\": " << plan.unpartitioned.optimizer_state << "},\n  \"ranks\": [";
  report << "cleave partition plan\nmodel: " << plan.config.model << "\nmesh: " << mesh.ToString() << " ("
         << mesh.world_size() << " ranks), global batch " << plan.config.batch << ", seq " << plan.config.seq
         << ", ZeRO " << plan.config.zero << "\n\nunpartitioned: parameters " << MiB(plan.unpartitioned.parameters)
         << ", gradients " << MiB(plan.unpartitioned.gradients) << ", optimizer state "
         << MiB(plan.unpartitioned.optimizer_state) << "\n";
  for (const RankPlan& rp : plan.ranks) {
    const std::string rdir = "rank_" + std::to_string(rp.rank);
    fs::create_directories(tmp / rdir, ec);
    for (const auto& [file, g] : {std::pair<const char*, const graph::Graph*>{"training_model.onnx", rp.artifacts.training.get()},
                                  {"eval_model.onnx", rp.artifacts.eval.get()},
                                  {"optimizer_model.onnx", rp.artifacts.optimizer.get()}}) {
      absl::Status s = onnx_ext::SaveModel(*g, (tmp / rdir / file).string());
      if (!s.ok()) return fail(s);
    }
    Checkpoint ck;
    ck.properties["rank"] = std::to_string(rp.rank);
    ck.properties["mesh"] = mesh.ToString();
    for (const std::string& p : rp.artifacts.params) ck.tensors.emplace_back(p, rp.artifacts.initial.at(p));
    absl::Status s = WriteCheckpoint((tmp / rdir / "params.ckpt").string(), ck);
    if (!s.ok()) return fail(s);

    json << (rp.rank ? "," : "") << "\n    {\"rank\": " << rp.rank << ", \"coords\": {";
    for (size_t i = 0; i < mesh.axes().size(); ++i)
      json << (i ? ", " : "") << Json(mesh.axes()[i].name) << ": " << rp.coords[i];
    json << "},\n     \"files\": {\"training\": " << Json(rdir + "/training_model.onnx")
         << ", \"eval\": " << Json(rdir + "/eval_model.onnx") << ", \"optimizer\": " << Json(rdir + "/optimizer_model.onnx")
         << ", \"params\": " << Json(rdir + "/params.ckpt") << "},\n     \"memory\": {\"parameters\": "
         << rp.memory.parameters << ", \"gradients\": " << rp.memory.gradients
         << ", \"optimizer_state\": " << rp.memory.optimizer_state << "},\n     \"collectives\": [";
    report << "\nrank " << rp.rank << " (" ;
    for (size_t i = 0; i < mesh.axes().size(); ++i) report << (i ? " " : "") << mesh.axes()[i].name << "=" << rp.coords[i];
    report << "): parameters " << MiB(rp.memory.parameters) << ", gradients " << MiB(rp.memory.gradients)
           << ", optimizer state " << MiB(rp.memory.optimizer_state) << "\n";
    std::map<std::string, std::pair<int, int64_t>> by_kind;
    for (size_t i = 0; i < rp.collectives.size(); ++i) {
      const auto& [graph_name, c] = rp.collectives[i];
      json << (i ? "," : "") << "\n       {\"graph\": " << Json(graph_name) << ", \"kind\": " << Json(c.kind)
           << ", \"value\": " << Json(c.value) << ", \"reader\": " << Json(c.reader) << ", \"mesh_axis\": " << Json(c.mesh_axis)
           << ", \"group\": [" << absl::StrJoin(c.group, ", ") << "], \"dtype\": \"float32\", \"bytes\": " << c.bytes << "}";
      auto& e = by_kind[absl::StrCat(graph_name, " ", c.kind, " over ", c.mesh_axis, " [", absl::StrJoin(c.group, ","), "]")];
      ++e.first;
      e.second += c.bytes;
    }
    json << "]}";
    for (const auto& [k, v] : by_kind) report << "  " << k << ": " << v.first << " x, " << MiB(v.second) << " per step\n";
  }
  json << "\n  ]\n}\n";
  for (const auto& [file, text] : {std::pair<const char*, std::string>{"plan.json", json.str()}, {"report.txt", report.str()}}) {
    std::ofstream f(tmp / file);
    f << text;
    if (!f) return fail(absl::DataLossError(absl::StrCat("cannot write ", (tmp / file).string())));
  }
  // Replace an existing plan whole: move it aside, move the new one in, then drop the old one.
  const fs::path old = target.string() + ".old." + std::to_string(::getpid());
  if (fs::exists(target)) {
    fs::rename(target, old, ec);
    if (ec) return fail(InvalidArgument("cannot move the existing '", target.string(), "' aside: ", ec.message()));
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    if (fs::exists(old)) fs::rename(old, target, ec);
    return fail(InvalidArgument("cannot move the plan into '", target.string(), "'"));
  }
  fs::remove_all(old, ec);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankSummary>> ReadPlanSummary(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "plan.json"))
    return NotFound("'", dir, "' is not a plan directory (no plan.json)");
  std::vector<RankSummary> out;
  for (int r = 0;; ++r) {
    const fs::path rdir = fs::path(dir) / ("rank_" + std::to_string(r));
    if (!fs::exists(rdir)) break;
    RankSummary s;
    s.rank = r;
    for (const char* name : {"training", "eval", "optimizer"}) {
      ASSIGN_OR_RETURN(auto g, onnx_ext::LoadModel((rdir / (std::string(name) + "_model.onnx")).string()));
      RETURN_IF_ERROR(graph::InferShapes(*g));
      for (const auto& n : g->nodes()) {
        if (n->domain() != graph::kCleaveDomain) continue;
        const std::string& op = n->op_type();
        if (op != "AllReduce" && op != "AllGather" && op != "ReduceScatter" && op != "AllToAll") continue;
        std::vector<int64_t> group = n->AttrInts("group");
        auto& e = s.collectives[absl::StrCat(name, " ", op, " over ", n->AttrString("mesh_axis", "?"), " [",
                                             absl::StrJoin(group, ","), "]")];
        ++e.first;
        e.second += Bytes(n->input(0));
      }
      if (std::string(name) == "training") {
        for (const graph::Value* v : g->inputs()) {
          const std::string& vn = v->name();
          if (vn.ends_with("_grad.accumulation.buffer")) s.memory.gradients += Bytes(v);
          else if (g->FindValue(AccumulationBuffer(vn))) s.memory.parameters += Bytes(v);
        }
      }
      if (std::string(name) == "optimizer")
        for (const graph::Value* v : g->inputs()) {
          const std::string& vn = v->name();
          if (vn.find(".exp_avg") != std::string::npos || vn.find(".momentum_buffer") != std::string::npos)
            s.memory.optimizer_state += Bytes(v);
        }
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) return NotFound("plan '", dir, "' has no rank_0 directory");
  return out;
}

}  // namespace cleave::trainer
