// `cleave inspect MODEL`: what a model holds, without running it (tools/).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "graph/dot.h"
#include "graph/graph.h"
#include "graph/op_table.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "tools/commands.h"
#include "trainer/partition_plan.h"

namespace cleave::tools {

namespace {

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

void PrintValues(const char* title, const std::vector<graph::Value*>& values) {
  std::printf("%s:\n", title);
  for (const graph::Value* v : values)
    std::printf("  %-32s %-8s %s\n", v->name().c_str(), DataTypeName(v->dtype()),
                v->shape().ToString().c_str());
}

}  // namespace

// `cleave inspect PLAN_DIR`: per rank, the collectives and pipeline messages by graph, kind
// and group with their bytes per step, memory against the unpartitioned graph, and the
// pipeline schedule as a step x rank grid; --dot / --svg draws a rank's graph (its first
// stage's forward part under a pipeline, or `--part backward`) with collectives and Send/Recv
// in red.
int InspectPlan(const std::string& dir, int only_rank, const std::string& dot, const std::string& svg,
                const std::string& part) {
  auto ranks = trainer::ReadPlanSummary(dir);
  if (!ranks.ok()) {
    std::fprintf(stderr, "cleave inspect: %s\n", std::string(ranks.status().message()).c_str());
    return 1;
  }
  if (only_rank >= static_cast<int>(ranks->size())) {
    std::fprintf(stderr, "cleave inspect: --rank %d: the plan has ranks 0..%zu\n", only_rank, ranks->size() - 1);
    return 1;
  }
  std::ifstream f(std::filesystem::path(dir) / "plan.json");
  std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto number = [&](const char* key) -> int64_t {
    std::smatch m;
    const std::string unpart = json.substr(json.find("\"unpartitioned\""));
    return std::regex_search(unpart, m, std::regex(std::string("\"") + key + "\": ([0-9]+)")) ? std::stoll(m[1]) : 0;
  };
  std::smatch mesh;
  std::regex_search(json, mesh, std::regex("\"spec\": \"([^\"]*)\""));
  const int64_t params = number("parameters"), grads = number("gradients"), state = number("optimizer_state"),
                acts = number("activations");
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf("plan: %s, mesh %s, %zu ranks\n", dir.c_str(), mesh.size() > 1 ? mesh[1].str().c_str() : "?",
              ranks->size());
  std::printf("unpartitioned: parameters %.3f MiB, gradients %.3f MiB, optimizer state %.3f MiB, saved activations "
              "%.3f MiB\n",
              mib(params), mib(grads), mib(state), mib(acts));
  for (const auto& r : *ranks) {
    if (only_rank >= 0 && r.rank != only_rank) continue;
    auto pct = [](int64_t part, int64_t whole) { return whole ? 100.0 * static_cast<double>(part) / whole : 0.0; };
    std::printf("\nrank %d: parameters %.3f MiB (%.1f%%), gradients %.3f MiB (%.1f%%), optimizer state %.3f MiB "
                "(%.1f%%), saved activations %.3f MiB (%.1f%%)\n",
                r.rank, mib(r.memory.parameters), pct(r.memory.parameters, params), mib(r.memory.gradients),
                pct(r.memory.gradients, grads), mib(r.memory.optimizer_state), pct(r.memory.optimizer_state, state),
                mib(r.memory.activations), pct(r.memory.activations, acts));
    if (r.collectives.empty()) std::printf("  no collectives\n");
    for (const auto& [k, v] : r.collectives)
      std::printf("  %-60s %4d x %10.3f MiB per step\n", k.c_str(), v.first, mib(v.second));
  }
  auto schedule = trainer::DescribePlanSchedule(dir);
  if (!schedule.ok()) {
    std::fprintf(stderr, "cleave inspect: %s\n", std::string(schedule.status().message()).c_str());
    return 1;
  }
  std::printf("\n%s", schedule->c_str());
  if (dot.empty() && svg.empty()) return 0;
  const int rank = only_rank >= 0 ? only_rank : 0;
  const std::filesystem::path rdir = std::filesystem::path(dir) / ("rank_" + std::to_string(rank));
  std::filesystem::path file = rdir / "training_model.onnx";
  if (!std::filesystem::exists(file)) {
    std::vector<std::filesystem::path> parts;
    for (const auto& e : std::filesystem::directory_iterator(rdir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("stage_", 0) == 0 && name.find("_" + part + ".onnx") != std::string::npos) parts.push_back(e.path());
    }
    std::sort(parts.begin(), parts.end());
    if (parts.empty()) {
      std::fprintf(stderr, "cleave inspect: rank %d has no %s part (--part forward|backward|eval)\n", rank, part.c_str());
      return 1;
    }
    file = parts.front();
  }
  auto g = onnx_ext::LoadModel(file.string());
  if (!g.ok() || !graph::InferShapes(**g).ok()) {
    std::fprintf(stderr, "cleave inspect: cannot load %s\n", file.string().c_str());
    return 1;
  }
  const std::string title = "rank " + std::to_string(rank) + " " + file.filename().string();
  const std::string text = graph::GraphToDot(**g, title);
  const std::string dot_file = dot.empty() ? svg + ".dot" : dot;
  absl::Status w = onnx_ext::WriteFileAtomic(dot_file, text);
  if (!w.ok()) {
    std::fprintf(stderr, "cleave inspect: %s\n", std::string(w.message()).c_str());
    return 1;
  }
  if (!svg.empty()) {
    const std::string cmd = "dot -Tsvg '" + dot_file + "' -o '" + svg + "'";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "cleave inspect: '%s' failed (is graphviz installed?)\n", cmd.c_str());
      return 1;
    }
    if (dot.empty()) std::filesystem::remove(dot_file);
    std::printf("%s drawn to %s (collectives and Send/Recv in red)\n", title.c_str(), svg.c_str());
  } else {
    std::printf("%s written to %s (collectives and Send/Recv in red)\n", title.c_str(), dot.c_str());
  }
  return 0;
}

int InspectCommand(const Args& args) {
  std::string model, dot, svg, part = "forward";
  bool optimized = false;
  int only_rank = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--dot" && i + 1 < args.size()) dot = args[++i];
    else if (args[i] == "--svg" && i + 1 < args.size()) svg = args[++i];
    else if (args[i] == "--part" && i + 1 < args.size()) part = args[++i];
    else if (args[i] == "--rank" && i + 1 < args.size()) only_rank = std::atoi(args[++i].c_str());
    else if (args[i] == "--optimized") optimized = true;
    else if (model.empty() && args[i][0] != '-') model = args[i];
    else model.clear(), i = args.size();
  }
  if (!model.empty() && std::filesystem::is_directory(model)) return InspectPlan(model, only_rank, dot, svg, part);
  if (model.empty()) {
    std::fprintf(stderr, "usage: cleave inspect MODEL.onnx [--optimized] [--dot FILE.dot]\n"
                         "       cleave inspect PLAN_DIR [--rank R] [--dot FILE.dot | --svg FILE.svg] "
                         "[--part forward|backward|eval]\n");
    return 2;
  }
  // --optimized shows the graph a session runs: folded, fused, shapes inferred.
  std::unique_ptr<InferenceSession> session;
  std::unique_ptr<graph::Graph> loaded;
  absl::Status status;
  if (optimized) {
    auto s = InferenceSession::Load(model);
    status = s.status();
    if (s.ok()) session = std::move(*s);
  } else {
    auto g = onnx_ext::LoadModel(model);
    status = g.status();
    if (g.ok()) loaded = std::move(*g);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "cleave inspect: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  const graph::Graph& graph = optimized ? session->graph() : *loaded;
  if (!dot.empty()) {
    absl::Status w = onnx_ext::WriteFileAtomic(dot, graph::GraphToDot(graph, model));
    if (!w.ok()) {
      std::fprintf(stderr, "cleave inspect: %s\n", std::string(w.message()).c_str());
      return 1;
    }
  }
  std::printf("model: %s%s\n", model.c_str(), optimized ? " (as optimised for the CPU provider)" : "");
  std::printf("producer: %s %s, ir_version %lld\n", graph.info().producer_name.c_str(),
              graph.info().producer_version.c_str(),
              static_cast<long long>(graph.info().ir_version));
  std::printf("opsets:");
  for (const auto& [domain, v] : graph.opset_imports())
    std::printf(" %s=%lld", domain.empty() ? "ai.onnx" : domain.c_str(), static_cast<long long>(v));
  std::printf("\n");
  PrintValues("inputs", graph.inputs());
  PrintValues("outputs", graph.outputs());

  std::map<std::string, int> hist;
  for (const auto& n : graph.nodes())
    hist[n->domain().empty() ? n->op_type() : n->domain() + "." + n->op_type()]++;
  std::vector<std::pair<std::string, int>> ops(hist.begin(), hist.end());
  std::stable_sort(ops.begin(), ops.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::printf("nodes: %zu\n", graph.nodes().size());
  for (const auto& [op, count] : ops) {
    const graph::OpDef* def = nullptr;
    size_t dot = op.rfind('.');
    def = dot == std::string::npos ? graph::FindOp("", op)
                                   : graph::FindOp(op.substr(0, dot), op.substr(dot + 1));
    std::printf("  %-28s %6d%s\n", op.c_str(), count, def ? "" : "   (not supported)");
  }
  int64_t params = 0, bytes = 0;
  std::vector<graph::Value*> inits = graph.Initializers();
  std::printf("initializers: %zu\n", inits.size());
  for (const graph::Value* v : inits) {
    const Tensor* t = v->initializer();
    params += t->numel();
    bytes += static_cast<int64_t>(t->nbytes());
    std::printf("  %-40s %-8s %-18s %s\n", v->name().c_str(), DataTypeName(t->dtype()),
                DimsToString(t->dims()).c_str(), HumanBytes(static_cast<double>(t->nbytes())).c_str());
  }
  std::printf("parameters: %lld elements, %s\n", static_cast<long long>(params),
              HumanBytes(static_cast<double>(bytes)).c_str());
  if (!dot.empty()) std::printf("graph picture: %s (render: dot -Tsvg %s -o graph.svg)\n", dot.c_str(), dot.c_str());
  return 0;
}

}  // namespace cleave::tools
