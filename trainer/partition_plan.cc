// Partition plans (trainer/): see partition_plan.h.
#include "trainer/partition_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <regex>
#include <map>
#include <optional>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
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

// After autocast a collective may move the bf16 / fp16 cast of the value lowering recorded (a
// gather of a product's operand): the record names what it now moves and the bytes that now
// cross the wire.
void RecordCollectivesAfterAutocast(const graph::Graph& g, std::vector<partition::CollectiveRecord>& records) {
  std::map<std::string, const graph::Node*> by_name;
  for (const auto& n : g.nodes()) by_name[n->name()] = n.get();
  for (partition::CollectiveRecord& rec : records) {
    auto it = by_name.find(rec.node);
    if (rec.node.empty() || it == by_name.end() || !it->second->input(0)) continue;
    const graph::Value* moved = it->second->input(0);
    if (moved->dtype() != DataType::kBFloat16 && moved->dtype() != DataType::kFloat16) continue;
    rec.value = moved->name();
    rec.bytes = Bytes(moved);
  }
}

}  // namespace

absl::StatusOr<std::map<std::string, Sharding>> LoadShardPlan(const std::string& path, const graph::Graph& g,
                                                                const partition::Mesh& mesh) {
  std::ifstream f(path);
  if (!f) return NotFound("--shard-plan: cannot read '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  google::protobuf::Struct doc;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text, &doc);
  if (!parsed.ok())
    return InvalidArgument("--shard-plan '", path, "' is not valid JSON: ", std::string(parsed.message()));
  const google::protobuf::Struct* entries = &doc;
  if (auto it = doc.fields().find("shardings"); it != doc.fields().end()) {
    if (!it->second.has_struct_value())
      return InvalidArgument("--shard-plan '", path, "': \"shardings\" must be an object of tensor -> sharding");
    entries = &it->second.struct_value();
  }
  std::vector<std::string> names;
  for (const graph::Value* v : g.AllValues()) names.push_back(v->name());
  std::map<std::string, Sharding> out;
  std::map<std::string, std::string> by;  // tensor -> the entry that set it
  std::vector<std::pair<std::string, std::string>> sorted;
  for (const auto& [key, value] : entries->fields()) {
    if (!value.has_string_value())
      return InvalidArgument("--shard-plan entry '", key, "': expected a sharding string such as \"[tp,-]\"");
    sorted.emplace_back(key, value.string_value());
  }
  std::sort(sorted.begin(), sorted.end());
  for (const auto& [key, text_s] : sorted) {
    ASSIGN_OR_RETURN(Sharding s, Sharding::Parse(text_s));
    std::vector<std::string> hits;
    if (g.FindValue(key)) {
      hits.push_back(key);
    } else {
      std::regex re;
      try {
        re = std::regex(key, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return InvalidArgument("--shard-plan entry '", key, "' is neither a tensor name nor a valid regex: ", e.what());
      }
      for (const std::string& n : names)
        if (std::regex_match(n, re)) hits.push_back(n);
    }
    if (hits.empty())
      return InvalidArgument("--shard-plan entry '", key, "' matches no tensor of the training graph");
    for (const std::string& n : hits) {
      const graph::Value* v = g.FindValue(n);
      absl::Status valid = partition::ValidateSharding(mesh, n, v->shape(), s);
      if (!valid.ok())
        return absl::Status(valid.code(), absl::StrCat("--shard-plan entry '", key, "': ", valid.message()));
      auto [it, fresh] = out.emplace(n, s);
      if (!fresh && !(it->second == s))
        return InvalidArgument("--shard-plan: tensor '", n, "' is ", it->second.ToString(), " by entry '", by[n],
                               "' and ", s.ToString(), " by entry '", key, "'");
      by[n] = key;
    }
  }
  return out;
}

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
  // Megatron splits q, k and v by heads: a fused projection becomes one per part.
  if (tp > 1 && c.shard_plan.empty() && c.tp_megatron) {
    ASSIGN_OR_RETURN(plan.weight_parts, partition::SplitFusedProjections(*model));
  }
  ASSIGN_OR_RETURN(const graph::Value* token, TokenInput(*model, c.model));
  TrainingSpec spec = c.spec;
  // Each graph computes one micro-batch of the global batch (split over dp by the sharding).
  RETURN_IF_ERROR(FixTokenDims(*token, c.batch / micro, c.seq, &spec.dims));
  // Recompute is applied to each rank's lowered graph (so the forward collectives it repeats
  // are its own), not before sharding propagation.
  spec.recompute = RecomputeMode::kNone;
  spec.precision = Precision::kFp32;  // likewise mixed precision
  ASSIGN_OR_RETURN(TrainingArtifacts a, BuildTrainingArtifacts(*model, spec));
  if (!a.buffers.empty())
    return Unimplemented("the model has training-mode BatchNormalization (running statistic '", a.buffers.front(),
                         "'), whose batch statistics and running statistics a partition plan does not carry yet; "
                         "train it on one process, or export it in eval mode (training_mode = 0) to train with "
                         "fixed statistics");
  if (c.vocab_parallel_loss) {
    if (spec.loss.kind != LossKind::kCrossEntropy)
      return InvalidArgument("--vocab-parallel-loss needs the cross-entropy loss");
    if (tp == 1) return InvalidArgument("--vocab-parallel-loss shards the vocabulary over tp, and the mesh has tp=1");
    partition::MarkVocabParallelLoss(*a.training);
    partition::MarkVocabParallelLoss(*a.eval);
  }
  if (a.eval->outputs().size() > 1) {
    const graph::Value* logits = a.eval->outputs()[1];
    if (logits->shape().is_static() && logits->shape().rank() == 3) plan.vocab = logits->shape()[2].value;
  }
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
  if (!c.shard_plan.empty()) {
    ASSIGN_OR_RETURN(auto explicit_seeds, LoadShardPlan(c.shard_plan, *a.training, mesh));
    for (auto& [k, v] : explicit_seeds) seeds[k] = v;
  }
  if (tp > 1) {
    if (c.shard_plan.empty()) {
      if (!c.tp_megatron) return InvalidArgument("tp=", tp, " needs --tp megatron or --shard-plan FILE.json");
      ASSIGN_OR_RETURN(auto megatron, partition::FindMegatronSeeds(*a.training, a.params, mesh));
      for (auto& [k, v] : partition::SeedShardings(*a.training, megatron)) seeds[k] = v;
    }
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
  // The unpartitioned graph takes the whole batch at once: micro-batches times the saved
  // activations of one.
  {
    std::unique_ptr<graph::Graph> whole = a.training->Clone();
    RETURN_IF_ERROR(ApplyRecompute(*whole, c.spec.recompute, a.params).status());
    plan.unpartitioned.activations = SavedActivationBytes(*whole) * micro;
  }

  for (int r = 0; r < mesh.world_size(); ++r) {
    RankPlan rp;
    rp.rank = r;
    rp.coords = mesh.Coords(r);
    const int s = mesh.Coord(r, "pp");
    const StageOptimizer& so = optimizers[s];
    ASSIGN_OR_RETURN(partition::LoweredGraph train, partition::LowerForRank(*a.training, mesh, train_p, r, kLoss));
    RETURN_IF_ERROR(ApplyRecompute(*train.graph, c.spec.recompute, a.params).status());
    ASSIGN_OR_RETURN(partition::LoweredGraph eval, partition::LowerForRank(*a.eval, mesh, eval_p, r, kLoss));
    RETURN_IF_ERROR(ApplyAutocast(*train.graph, c.spec.precision).status());
    RETURN_IF_ERROR(ApplyAutocast(*eval.graph, c.spec.precision).status());
    RecordCollectivesAfterAutocast(*train.graph, train.collectives);
    RecordCollectivesAfterAutocast(*eval.graph, eval.collectives);
    if (c.spec.precision == Precision::kFp16) RETURN_IF_ERROR(AddLossScaleInput(*train.graph, kLoss));
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
              Bytes(opt.graph->FindValue(p + "_grad")), ""});
        }
      RETURN_IF_ERROR(partition::AddPipelineReductions(*opt.graph, tied, pp_group));
      rp.collectives.emplace_back("optimizer",
                                  partition::CollectiveRecord{"AllReduce", "grad_norm/squared", "(gradient norm)", "pp",
                                                              pp_group, 4, ""});
      std::set<std::string> present;  // values this rank's stage parts hold
      int64_t stash_bytes = 0;
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
        for (const std::string& name : st.stash) stash_bytes += Bytes(st.forward->FindValue(name));
        rp.p2p.insert(rp.p2p.end(), tpart.p2p.begin(), tpart.p2p.end());
        rp.artifacts.stages.push_back(std::move(st));
      }
      // Each in-flight (micro-batch, chunk) holds one chunk's stash; on average a chunk's.
      rp.memory.activations = stash_bytes / virt * plan.schedule_stats.peak_in_flight.at(s);
      for (auto& rec : train.collectives)
        if (present.count(rec.value)) rp.collectives.emplace_back("training", rec);
      for (auto& rec : eval.collectives)
        if (present.count(rec.value)) rp.collectives.emplace_back("eval", rec);
    } else {
      rp.memory.activations = SavedActivationBytes(*train.graph);
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
    // A part of a fused weight is a block of that weight (its state of that weight's state).
    auto block_of = [&](const graph::Value* v, const Sharding& sh, const std::string& param, const std::string& suffix) {
      Block b;
      b.global = v->shape().StaticDims();
      for (size_t d = 0; d < b.global.size(); ++d)
        b.offset.push_back(partition::ShardOffset(mesh, r, sh, static_cast<int>(d), b.global[d]));
      if (auto part = plan.weight_parts.find(param); part != plan.weight_parts.end()) {
        b.tensor = part->second.source + suffix;
        b.global = part->second.source_dims;
        b.offset[part->second.axis] += part->second.offset;
      }
      return BlockString(b);
    };
    for (const std::string& p : so.params) {
      rp.blocks[p] = block_of(a.training->FindValue(p), plan.param_shardings.at(p), p, "");
      for (const std::string& suf : a.state_suffixes) {
        const graph::Value* sv = so.graph->FindValue(p + suf);
        if (!sv) return Internal("the optimizer of pipeline rank ", s, " has no state '", p + suf, "'");
        rp.blocks[p + suf] = block_of(sv, so.prop.sharding.at(sv), p, suf);
      }
    }
    const int64_t activations = rp.memory.activations;
    rp.memory = MemoryOf(rp.artifacts);
    rp.memory.activations = activations;
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
  json << "{\n  \"format\": " << Json(kPlanFormat) << ",\n  \"mesh\": {\"spec\": " << Json(mesh.ToString()) << ", \"world_size\": " << mesh.world_size()
       << ", \"axes\": [";
  for (size_t i = 0; i < mesh.axes().size(); ++i)
    json << (i ? ", " : "") << "{\"name\": " << Json(mesh.axes()[i].name) << ", \"size\": " << mesh.axes()[i].size << "}";
  json << "]},\n  \"model\": " << Json(plan.config.model) << ",\n  \"batch\": " << plan.config.batch
       << ", \"seq\": " << plan.config.seq << ", \"vocab\": " << plan.vocab << ", \"loss\": "
       << Json(plan.config.spec.loss.kind == LossKind::kMse ? "mse"
               : plan.config.spec.loss.kind == LossKind::kCrossEntropy ? "cross_entropy" : "output")
       << ", \"precision\": " << Json(PrecisionName(plan.config.spec.precision)) << ", \"recompute\": "
       << Json(plan.config.spec.recompute == RecomputeMode::kFull        ? "full"
               : plan.config.spec.recompute == RecomputeMode::kSelective ? "selective"
                                                                          : "none")
       << ", \"zero\": " << plan.config.zero
       << ", \"tp\": " << Json(plan.config.tp_megatron ? "megatron" : "none") << ", \"sp\": " << (plan.config.sp ? "true" : "false")
       << ", \"vocab_parallel_loss\": " << (plan.config.vocab_parallel_loss ? "true" : "false")
       << ", \"fuse_attention\": " << (plan.config.spec.fuse_attention ? "true" : "false")
       << ",\n  \"schedule\": ";
  const int micro = plan.config.microbatches;
  const int pp = mesh.size("pp");
  if (plan.schedule.empty()) {
    json << "{\"kind\": \"none\", \"stages\": 1, \"virtual_stages\": 1, \"microbatches\": 1}";
  } else {
    json << "{\"kind\": " << Json(partition::ScheduleKindName(plan.schedule_kind)) << ", \"stages\": " << pp
         << ", \"virtual_stages\": " << plan.config.virtual_stages << ", \"microbatches\": " << micro
         << ", \"layers\": " << plan.stages.num_layers << ", \"first_layer\": ["
         << absl::StrJoin(plan.stages.first_layer, ", ") << "], \"stage_flops\": ["
         << absl::StrJoin(plan.stages.stage_flops, ", ", [](std::string* o, double f) { absl::StrAppend(o, static_cast<int64_t>(f)); })
         << "], \"bubble\": " << absl::StrFormat("%.4f", plan.schedule_stats.bubble) << ", \"actions\": [";
    for (size_t r = 0; r < plan.schedule.size(); ++r)
      json << (r ? ", " : "") << Json(partition::FormatActions(plan.schedule[r], plan.config.virtual_stages > 1));
    json << "]}";
  }
  json << ",\n  \"shardings\": {";
  bool first = true;
  for (const auto* m : {&plan.data_shardings, &plan.param_shardings})
    for (const auto& [name, s] : *m) {
      json << (first ? "\n" : ",\n") << "    " << Json(name) << ": " << Json(s.ToString());
      first = false;
    }
  json << "\n  },\n  \"unpartitioned\": {\"parameters\": " << plan.unpartitioned.parameters
       << ", \"gradients\": " << plan.unpartitioned.gradients
       << ", \"optimizer_state\": " << plan.unpartitioned.optimizer_state
       << ", \"activations\": " << plan.unpartitioned.activations << "},\n  \"ranks\": [";
  report << "cleave partition plan\nmodel: " << plan.config.model << "\nmesh: " << mesh.ToString() << " ("
         << mesh.world_size() << " ranks), global batch " << plan.config.batch << ", seq " << plan.config.seq
         << ", ZeRO " << plan.config.zero << "\n\nunpartitioned: parameters " << MiB(plan.unpartitioned.parameters)
         << ", gradients " << MiB(plan.unpartitioned.gradients) << ", optimizer state "
         << MiB(plan.unpartitioned.optimizer_state) << ", saved activations " << MiB(plan.unpartitioned.activations) << "\n";
  if (!plan.schedule.empty()) {
    report << "\npipeline: " << partition::ScheduleKindName(plan.schedule_kind) << ", " << pp << " stages x "
           << plan.config.virtual_stages << " chunk(s), " << micro << " micro-batches of " << plan.config.batch / micro
           << " rows; " << plan.stages.num_layers << " layers, virtual stage s starts at layer ["
           << absl::StrJoin(plan.stages.first_layer, ", ") << "]\nbubble (simulated, backward = 2 x forward): "
           << absl::StrFormat("%.1f%%", 100 * plan.schedule_stats.bubble) << "\n" << plan.schedule_stats.grid;
  }
  for (const RankPlan& rp : plan.ranks) {
    const std::string rdir = "rank_" + std::to_string(rp.rank);
    fs::create_directories(tmp / rdir, ec);
    std::vector<std::pair<std::string, const graph::Graph*>> files = {{"optimizer_model.onnx", rp.artifacts.optimizer.get()}};
    if (rp.artifacts.stages.empty()) {
      files.emplace_back("training_model.onnx", rp.artifacts.training.get());
      files.emplace_back("eval_model.onnx", rp.artifacts.eval.get());
    }
    for (const PipelineStage& st : rp.artifacts.stages) {
      const std::string base = absl::StrCat("stage_", st.stage, "_");
      files.emplace_back(base + "forward.onnx", st.forward.get());
      files.emplace_back(base + "backward.onnx", st.backward.get());
      files.emplace_back(base + "eval.onnx", st.eval.get());
    }
    for (const auto& [file, g] : files) {
      absl::Status s = onnx_ext::SaveModel(*g, (tmp / rdir / file).string());
      if (!s.ok()) return fail(s);
    }
    Checkpoint ck;
    ck.properties["rank"] = std::to_string(rp.rank);
    ck.properties["mesh"] = mesh.ToString();
    for (const auto& [name, b] : rp.blocks) ck.properties["block:" + name] = b;
    for (const std::string& p : rp.artifacts.params) ck.tensors.emplace_back(p, rp.artifacts.initial.at(p));
    absl::Status s = WriteCheckpoint((tmp / rdir / "params.ckpt").string(), ck);
    if (!s.ok()) return fail(s);

    json << (rp.rank ? "," : "") << "\n    {\"rank\": " << rp.rank << ", \"coords\": {";
    for (size_t i = 0; i < mesh.axes().size(); ++i)
      json << (i ? ", " : "") << Json(mesh.axes()[i].name) << ": " << rp.coords[i];
    json << "},\n     \"files\": {";
    if (rp.artifacts.stages.empty()) {
      json << "\"training\": " << Json(rdir + "/training_model.onnx") << ", \"eval\": " << Json(rdir + "/eval_model.onnx");
    } else {
      json << "\"stages\": [";
      for (size_t i = 0; i < rp.artifacts.stages.size(); ++i) {
        const PipelineStage& st = rp.artifacts.stages[i];
        const std::string base = absl::StrCat(rdir, "/stage_", st.stage, "_");
        json << (i ? ", " : "") << "{\"stage\": " << st.stage << ", \"chunk\": " << st.chunk
             << ", \"forward\": " << Json(base + "forward.onnx") << ", \"backward\": " << Json(base + "backward.onnx")
             << ", \"eval\": " << Json(base + "eval.onnx") << ", \"stash\": ["
             << absl::StrJoin(st.stash, ", ", [](std::string* o, const std::string& n) { absl::StrAppend(o, Json(n)); })
             << "]}";
      }
      json << "]";
    }
    json << ", \"optimizer\": " << Json(rdir + "/optimizer_model.onnx") << ", \"params\": " << Json(rdir + "/params.ckpt")
         << "},\n     \"memory\": {\"parameters\": " << rp.memory.parameters << ", \"gradients\": " << rp.memory.gradients
         << ", \"optimizer_state\": " << rp.memory.optimizer_state << ", \"activations\": " << rp.memory.activations
         << "},\n     \"p2p\": [";
    for (size_t i = 0; i < rp.p2p.size(); ++i) {
      const partition::P2PRecord& m = rp.p2p[i];
      json << (i ? "," : "") << "\n       {\"kind\": " << Json(m.kind) << ", \"value\": " << Json(m.value)
           << ", \"peer\": " << m.peer << ", \"tag\": " << m.tag << ", \"direction\": "
           << Json(m.backward ? "backward" : "forward") << ", \"bytes\": " << m.bytes
           << ", \"bytes_per_step\": " << m.bytes * micro << "}";
    }
    json << "],\n     \"collectives\": [";
    report << "\nrank " << rp.rank << " (" ;
    for (size_t i = 0; i < mesh.axes().size(); ++i) report << (i ? " " : "") << mesh.axes()[i].name << "=" << rp.coords[i];
    report << "): parameters " << MiB(rp.memory.parameters) << ", gradients " << MiB(rp.memory.gradients)
           << ", optimizer state " << MiB(rp.memory.optimizer_state) << ", saved activations "
           << MiB(rp.memory.activations) << "\n";
    std::map<std::string, std::pair<int, int64_t>> by_kind;
    for (size_t i = 0; i < rp.collectives.size(); ++i) {
      const auto& [graph_name, c] = rp.collectives[i];
      json << (i ? "," : "") << "\n       {\"graph\": " << Json(graph_name) << ", \"kind\": " << Json(c.kind)
           << ", \"value\": " << Json(c.value) << ", \"reader\": " << Json(c.reader) << ", \"mesh_axis\": " << Json(c.mesh_axis)
           << ", \"group\": [" << absl::StrJoin(c.group, ", ") << "], \"dtype\": \"float32\", \"bytes\": " << c.bytes
           << ", \"bytes_per_step\": " << c.bytes * (graph_name == "training" ? micro : 1) << "}";
      auto& e = by_kind[absl::StrCat(graph_name, " ", c.kind, " over ", c.mesh_axis, " [", absl::StrJoin(c.group, ","), "]")];
      const int times = graph_name == "training" ? micro : 1;
      e.first += times;
      e.second += c.bytes * times;
    }
    for (const partition::P2PRecord& m : rp.p2p) {
      auto& e = by_kind[absl::StrCat("training ", m.kind, " ", m.backward ? "gradient" : "activation",
                                     m.kind == "Send" ? " to rank " : " from rank ", m.peer)];
      e.first += micro;
      e.second += m.bytes * micro;
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

namespace {

// The first integer after "key": in `json` (plan.json is written by WritePlan, one key per
// field), or `dflt`.
int64_t JsonInt(const std::string& json, const std::string& key, int64_t dflt) {
  const size_t at = json.find("\"" + key + "\": ");
  if (at == std::string::npos) return dflt;
  int64_t v = dflt;
  size_t end = at + key.size() + 4;
  while (end < json.size() && (std::isdigit(static_cast<unsigned char>(json[end])) || json[end] == '-')) ++end;
  return absl::SimpleAtoi(json.substr(at + key.size() + 4, end - at - key.size() - 4), &v) ? v : dflt;
}

}  // namespace

absl::StatusOr<std::vector<RankSummary>> ReadPlanSummary(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "plan.json"))
    return NotFound("'", dir, "' is not a plan directory (no plan.json)");
  const std::string json = onnx_ext::ReadFileOrEmpty((fs::path(dir) / "plan.json").string());
  const int64_t micro = JsonInt(json, "microbatches", 1);
  std::vector<RankSummary> out;
  for (int r = 0;; ++r) {
    const fs::path rdir = fs::path(dir) / ("rank_" + std::to_string(r));
    if (!fs::exists(rdir)) break;
    RankSummary s;
    s.rank = r;
    // (kind of graph, file): the whole training and eval graphs, or each stage's parts.
    std::vector<std::pair<std::string, fs::path>> files = {{"optimizer", rdir / "optimizer_model.onnx"}};
    if (fs::exists(rdir / "training_model.onnx")) {
      files.emplace_back("training", rdir / "training_model.onnx");
      files.emplace_back("eval", rdir / "eval_model.onnx");
    } else {
      std::vector<fs::path> parts;
      for (const auto& e : fs::directory_iterator(rdir))
        if (e.path().filename().string().rfind("stage_", 0) == 0) parts.push_back(e.path());
      std::sort(parts.begin(), parts.end());
      for (const fs::path& p : parts) {
        const std::string f = p.filename().string();
        files.emplace_back(f.find("_eval") != std::string::npos ? "eval" : "training", p);
      }
    }
    for (const auto& [kind, path] : files) {
      ASSIGN_OR_RETURN(auto g, onnx_ext::LoadModel(path.string()));
      RETURN_IF_ERROR(graph::InferShapes(*g));
      const int64_t times = kind == "training" ? micro : 1;
      for (const auto& n : g->nodes()) {
        if (n->domain() != graph::kCleaveDomain) continue;
        const std::string& op = n->op_type();
        std::string key;
        if (op == "AllReduce" || op == "AllGather" || op == "ReduceScatter" || op == "AllToAll")
          key = absl::StrCat(kind, " ", op, " over ", n->AttrString("mesh_axis", "?"), " [",
                             absl::StrJoin(n->AttrInts("group"), ","), "]");
        else if (op == "Send" || op == "Recv")
          key = absl::StrCat(kind, " ", op, op == "Send" ? " to rank " : " from rank ", n->AttrInt("peer", -1));
        else
          continue;
        auto& e = s.collectives[key];
        e.first += static_cast<int>(times);
        e.second += times * Bytes(op == "Recv" ? n->output(0) : n->input(0));
      }
      if (kind == "optimizer")
        for (const graph::Value* v : g->inputs()) {
          const std::string& vn = v->name();
          if (const graph::Value* grad = g->FindValue(vn + "_grad"); grad && grad->is_graph_input()) {
            s.memory.parameters += Bytes(v);
            s.memory.gradients += Bytes(grad);
          }
          if (vn.find(".exp_avg") != std::string::npos || vn.find(".momentum_buffer") != std::string::npos)
            s.memory.optimizer_state += Bytes(v);
        }
    }
    out.push_back(std::move(s));
  }
  if (out.empty()) return NotFound("plan '", dir, "' has no rank_0 directory");
  // Saved activations are counted when the plan is built (they need the node roles).
  size_t at = json.find("\"ranks\"");
  for (RankSummary& s : out) {
    at = json.find("\"activations\": ", at == std::string::npos ? json.size() : at);
    if (at == std::string::npos) break;
    s.memory.activations = JsonInt(json.substr(at), "activations", 0);
    ++at;
  }
  return out;
}

namespace {

// The string value of "key": "..." in `json`, or empty.
std::string JsonString(const std::string& json, const std::string& key) {
  const std::string open = "\"" + key + "\": \"";
  const size_t at = json.find(open);
  if (at == std::string::npos) return "";
  const size_t end = json.find('"', at + open.size());
  return end == std::string::npos ? "" : json.substr(at + open.size(), end - at - open.size());
}

}  // namespace

absl::StatusOr<RankRun> LoadRankRun(const std::string& dir, int rank) {
  const fs::path root(dir);
  const std::string json = onnx_ext::ReadFileOrEmpty((root / "plan.json").string());
  if (json.empty()) return NotFound("'", dir, "' is not a plan directory (no plan.json; make one with cleave partition)");
  if (JsonString(json, "format") != kPlanFormat)
    return InvalidArgument(dir, "/plan.json is of format '", JsonString(json, "format"), "', this cleave reads '",
                           kPlanFormat, "': partition the model again");
  RankRun run;
  ASSIGN_OR_RETURN(run.mesh, partition::Mesh::Parse(JsonString(json, "spec")));
  run.model = JsonString(json, "model");
  run.batch = JsonInt(json, "batch", 0);
  run.seq = JsonInt(json, "seq", 0);
  run.vocab = JsonInt(json, "vocab", 0);
  run.loss = JsonString(json, "loss");
  run.precision = JsonString(json, "precision");
  const size_t sched_at = json.find("\"schedule\": {");
  const std::string sched = sched_at == std::string::npos ? "" : json.substr(sched_at);
  run.microbatches = static_cast<int>(JsonInt(sched, "microbatches", 1));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : json) h = (h ^ ch) * 1099511628211ull;
  run.plan_hash = h;
  if (rank < 0 || rank >= run.mesh.world_size())
    return InvalidArgument("rank ", rank, " is outside the plan's mesh ", run.mesh.ToString(), " (",
                           run.mesh.world_size(), " ranks)");
  const std::string kind = JsonString(sched, "kind");
  if (!kind.empty() && kind != "none") {
    ASSIGN_OR_RETURN(partition::ScheduleKind sk, partition::ParseScheduleKind(kind));
    ASSIGN_OR_RETURN(partition::Schedule schedule,
                     partition::BuildSchedule(sk, static_cast<int>(JsonInt(sched, "stages", 1)), run.microbatches,
                                              static_cast<int>(JsonInt(sched, "virtual_stages", 1))));
    for (const partition::Action& a : schedule.at(run.mesh.Coord(rank, "pp")))
      if (a.IsCompute()) run.work.push_back({a.kind == partition::ActionKind::kBackward, a.microbatch, a.chunk});
  } else {
    run.work = {{false, 0, 0}, {true, 0, 0}};
  }

  const fs::path rdir = root / ("rank_" + std::to_string(rank));
  auto load = [](const fs::path& p) -> absl::StatusOr<std::unique_ptr<graph::Graph>> {
    auto g = onnx_ext::LoadModel(p.string());
    if (!g.ok()) return absl::Status(g.status().code(), absl::StrCat(p.string(), ": ", g.status().message()));
    RETURN_IF_ERROR(graph::InferShapes(**g));
    return g;
  };
  TrainingArtifacts& a = run.artifacts;
  ASSIGN_OR_RETURN(a.optimizer, load(rdir / "optimizer_model.onnx"));
  ASSIGN_OR_RETURN(Checkpoint ck, ReadCheckpoint((rdir / "params.ckpt").string()));
  for (const auto& [k, v] : ck.properties)
    if (k.rfind("block:", 0) == 0) run.blocks[k.substr(6)] = v;
  for (const auto& [name, t] : ck.tensors) {
    a.params.push_back(name);
    a.initial.emplace(name, t);
  }
  std::sort(a.params.begin(), a.params.end());
  std::vector<const graph::Graph*> parts;
  if (fs::exists(rdir / "training_model.onnx")) {
    ASSIGN_OR_RETURN(a.training, load(rdir / "training_model.onnx"));
    ASSIGN_OR_RETURN(a.eval, load(rdir / "eval_model.onnx"));
    parts.push_back(a.training.get());
  } else {
    std::vector<int> stages;
    if (fs::exists(rdir))
      for (const auto& e : fs::directory_iterator(rdir)) {
        const std::string f = e.path().filename().string();
        int st;
        if (f.rfind("stage_", 0) == 0 && f.size() > 14 && f.ends_with("_forward.onnx") &&
            absl::SimpleAtoi(f.substr(6, f.size() - 6 - 13), &st))
          stages.push_back(st);
      }
    std::sort(stages.begin(), stages.end());
    if (stages.empty()) return NotFound(rdir.string(), " holds neither training_model.onnx nor stage parts");
    for (size_t c = 0; c < stages.size(); ++c) {
      PipelineStage st;
      st.stage = stages[c];
      st.chunk = static_cast<int>(c);
      const std::string base = absl::StrCat("stage_", stages[c], "_");
      ASSIGN_OR_RETURN(st.forward, load(rdir / (base + "forward.onnx")));
      ASSIGN_OR_RETURN(st.backward, load(rdir / (base + "backward.onnx")));
      ASSIGN_OR_RETURN(st.eval, load(rdir / (base + "eval.onnx")));
      std::set<std::string> fwd_out;
      for (const graph::Value* v : st.forward->outputs()) fwd_out.insert(v->name());
      for (const graph::Value* v : st.backward->inputs())
        if (fwd_out.count(v->name())) st.stash.push_back(v->name());
      a.stages.push_back(std::move(st));
    }
    for (const PipelineStage& st : a.stages) {
      parts.push_back(st.forward.get());
      parts.push_back(st.backward.get());
    }
  }
  // Optimizer state: the inputs "<param>.<suffix>" of the first parameter.
  if (!a.params.empty())
    for (const graph::Value* v : a.optimizer->inputs())
      if (v->name().rfind(a.params[0] + ".", 0) == 0) a.state_suffixes.push_back(v->name().substr(a.params[0].size()));
  // Data: what the graphs read that is not a parameter, gradient buffer, flag or stash.
  std::set<std::string> known(a.params.begin(), a.params.end());
  for (const std::string& p : a.params) known.insert(AccumulationBuffer(p));
  known.insert(kLazyResetGrad);
  known.insert(kLossScale);
  for (const PipelineStage& st : a.stages) known.insert(st.stash.begin(), st.stash.end());
  std::set<std::string> data;
  for (const graph::Graph* g : parts)
    for (const graph::Value* v : g->inputs())
      if (!known.count(v->name()) && !v->is_initializer()) data.insert(v->name());
  a.data_inputs.assign(data.begin(), data.end());
  return run;
}

std::string BlockString(const Block& b) {
  return absl::StrCat(b.tensor.empty() ? "" : absl::StrCat("t=", b.tensor, ";"), "g=", absl::StrJoin(b.global, ","),
                      ";o=", absl::StrJoin(b.offset, ","));
}

absl::StatusOr<Block> ParseBlock(const std::string& text) {
  Block b;
  std::string s = text;
  if (s.rfind("t=", 0) == 0) {
    const size_t end = s.find(";g=");
    if (end == std::string::npos) return InvalidArgument("bad block '", text, "'");
    b.tensor = s.substr(2, end - 2);
    s = s.substr(end + 1);
  }
  const size_t semi = s.find(";o=");
  if (s.rfind("g=", 0) != 0 || semi == std::string::npos) return InvalidArgument("bad block '", s, "'");
  auto ints = [](const std::string& text, std::vector<int64_t>* out) {
    if (text.empty()) return true;
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      int64_t v;
      if (!absl::SimpleAtoi(part, &v)) return false;
      out->push_back(v);
    }
    return true;
  };
  if (!ints(s.substr(2, semi - 2), &b.global) || !ints(s.substr(semi + 3), &b.offset) ||
      b.global.size() != b.offset.size())
    return InvalidArgument("bad block '", text, "'");
  return b;
}

namespace {

// Copies the overlap of `src` (a block of the whole tensor) into `dst` (another block of it),
// marking the elements of `dst` it wrote.
void CopyOverlap(const Tensor& src, const Block& sb, Tensor& dst, const Block& db, std::vector<char>* written) {
  const int rank = static_cast<int>(sb.global.size());
  const size_t es = ElementSize(src.dtype());
  if (rank == 0) {
    std::memcpy(dst.data<char>(), src.data<char>(), es);
    (*written)[0] = 1;
    return;
  }
  std::vector<int64_t> lo(rank), hi(rank);
  for (int d = 0; d < rank; ++d) {
    lo[d] = std::max(sb.offset[d], db.offset[d]);
    hi[d] = std::min(sb.offset[d] + src.dims()[d], db.offset[d] + dst.dims()[d]);
    if (lo[d] >= hi[d]) return;
  }
  // Row by row along the last dim.
  std::vector<int64_t> idx(lo.begin(), lo.end());
  const int64_t run = hi[rank - 1] - lo[rank - 1];
  while (true) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < rank; ++d) {
      so = so * src.dims()[d] + (idx[d] - sb.offset[d]);
      doff = doff * dst.dims()[d] + (idx[d] - db.offset[d]);
    }
    std::memcpy(dst.data<char>() + doff * es, src.data<char>() + so * es, run * es);
    std::fill(written->begin() + doff, written->begin() + doff + run, 1);
    int d = rank - 2;
    while (d >= 0 && ++idx[d] == hi[d]) idx[d] = lo[d], --d;
    if (d < 0) break;
  }
}

}  // namespace

absl::Status ReshardInto(const std::vector<Checkpoint>& shards, const std::map<std::string, std::string>& blocks,
                         std::map<std::string, Tensor>& targets) {
  // Every shard tensor by the whole tensor it is a block of.
  struct Piece {
    const Tensor* tensor;
    Block block;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (const Checkpoint& c : shards)
    for (const auto& [tensor_name, t] : c.tensors) {
      auto b = c.properties.find("block:" + tensor_name);
      if (b == c.properties.end()) continue;
      ASSIGN_OR_RETURN(Block have, ParseBlock(b->second));
      const std::string whole = have.tensor.empty() ? tensor_name : have.tensor;
      pieces[whole].push_back({&t, std::move(have)});
    }
  for (auto& [name, dst] : targets) {
    auto bit = blocks.find(name);
    if (bit == blocks.end()) return NotFound("this rank's plan has no block for '", name, "'");
    ASSIGN_OR_RETURN(Block want, ParseBlock(bit->second));
    if (want.global.size() != dst.dims().size())
      return InvalidArgument("'", name, "': block ", bit->second, " does not fit ", DimsToString(dst.dims()));
    const std::string whole = want.tensor.empty() ? name : want.tensor;
    auto found = pieces.find(whole);
    if (found == pieces.end()) return NotFound("no checkpoint shard holds '", whole, "'");
    std::vector<char> written(static_cast<size_t>(dst.numel()), 0);
    for (const Piece& piece : found->second) {
      if (piece.block.global != want.global)
        return InvalidArgument("checkpoint tensor '", whole, "' is ", DimsToString(piece.block.global),
                               " as a whole, this run's is ", DimsToString(want.global));
      if (piece.tensor->dtype() != dst.dtype())
        return InvalidArgument("checkpoint tensor '", whole, "' is ", DataTypeName(piece.tensor->dtype()),
                               ", expected ", DataTypeName(dst.dtype()));
      CopyOverlap(*piece.tensor, piece.block, dst, want, &written);
    }
    if (std::find(written.begin(), written.end(), 0) != written.end())
      return absl::DataLossError(absl::StrCat("the checkpoint shards do not cover this rank's block ", bit->second,
                                              " of '", whole, "' (a shard is missing)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DescribePlanSchedule(const std::string& dir) {
  const std::string json = onnx_ext::ReadFileOrEmpty((fs::path(dir) / "plan.json").string());
  if (json.empty()) return NotFound("'", dir, "' is not a plan directory (no plan.json)");
  const size_t at = json.find("\"schedule\": {\"kind\": \"");
  if (at == std::string::npos) return absl::DataLossError(absl::StrCat(dir, "/plan.json has no schedule"));
  const size_t k0 = at + 22, k1 = json.find('"', k0);
  const std::string kind = json.substr(k0, k1 - k0);
  if (kind == "none") return std::string("schedule: no pipeline stages (pp=1)\n");
  const std::string sched = json.substr(at);
  const int stages = static_cast<int>(JsonInt(sched, "stages", 1));
  const int virt = static_cast<int>(JsonInt(sched, "virtual_stages", 1));
  const int micro = static_cast<int>(JsonInt(sched, "microbatches", 1));
  ASSIGN_OR_RETURN(partition::ScheduleKind sk, partition::ParseScheduleKind(kind));
  ASSIGN_OR_RETURN(partition::Schedule schedule, partition::BuildSchedule(sk, stages, micro, virt));
  ASSIGN_OR_RETURN(partition::ScheduleStats stats, partition::SimulateSchedule(schedule, {1.0, 2.0}));
  std::string text = absl::StrFormat(
      "schedule: %s, %d pipeline ranks x %d chunk(s), %d micro-batches; bubble %.1f%% (simulated with backward = 2 x "
      "forward)\nin flight at the peak (micro-batches whose backward is pending), per pipeline rank: %s\n",
      kind, stages, virt, micro, 100 * stats.bubble, absl::StrJoin(stats.peak_in_flight, " "));
  return text + stats.grid;
}

}  // namespace cleave::trainer
