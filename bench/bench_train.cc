// cleave_bench_train (bench/): times training steps of a causal LM with TrainingSession and
// prints one JSON line, for bench/bench_train.py to set against PyTorch eager in the same run.
//   cleave_bench_train MODEL --threads T --batch B --seq S --warmup W --iters N
//       [--tokens FILE] [--seed S] [--lr 3e-4] [--weight-decay 0.1] [--clip 1.0]
//       [--device cpu|cuda] [--precision fp32|bf16|fp16] [--profile TRACE.json]
//       [--traffic TABLE.txt]
// One step is LazyResetGrad + TrainStep (cross-entropy on the first output) + OptimizerStep
// (AdamW at a constant rate). Every step trains on the same batch, so the loss must fall.
// --traffic writes, per op type of the training graph as the session runs it (after its fusions
// and placement), the bytes its nodes read and write and the products' FLOPs: the arithmetic
// that bounds a step from below on a device of known bandwidth and peak. With --iters 0 it
// does only that (no step runs, so it also serves for a device the machine only emulates).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "graph/graph.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/executor.h"
#include "runtime/profiler.h"
#include "trainer/mixed_precision.h"
#include "trainer/training_graph.h"
#include "trainer/training_session.h"

namespace cleave::bench {
namespace {

struct Args {
  std::string model;
  int64_t threads = 1, batch = 4, seq = 128, warmup = 3, iters = 10, seed = 0;
  double lr = 3e-4, weight_decay = 0.1, clip = 1.0;
  std::string tokens_file;  // one (B, T+1) batch of int64 token ids; empty: random ids
  std::string device = "cpu";     // cpu | cuda
  std::string precision = "fp32";  // fp32 | bf16 | fp16
  std::string profile;             // a Chrome trace of one step after the timed ones
  std::string traffic;             // the training graph's bytes and FLOPs per op type
  std::string fuse_attention = "auto";  // auto (as cleave train: CUDA, or fp32 and bf16) | on | off
};

constexpr char kUsage[] =
    "usage: cleave_bench_train MODEL --threads T --batch B --seq S --warmup W --iters N "
    "[--tokens FILE] [--seed S] [--lr 3e-4] [--weight-decay 0.1] [--clip 1.0] [--device cpu|cuda] "
    "[--precision fp32|bf16|fp16] [--fuse-attention auto|on|off] [--profile TRACE.json] "
    "[--traffic TABLE.txt]";

absl::Status ParseFlag(const std::string& flag, const std::string& value, Args& a, bool* known) {
  struct IntFlag {
    const char* name;
    int64_t* field;
    int64_t min;
  };
  const IntFlag int_flags[] = {{"--threads", &a.threads, 1}, {"--batch", &a.batch, 1},
                               {"--seq", &a.seq, 1},         {"--warmup", &a.warmup, 0},
                               {"--iters", &a.iters, 0},     {"--seed", &a.seed, 0}};
  const std::pair<const char*, double*> float_flags[] = {
      {"--lr", &a.lr}, {"--weight-decay", &a.weight_decay}, {"--clip", &a.clip}};
  for (const IntFlag& f : int_flags) {
    if (flag != f.name) continue;
    *known = true;
    if (!absl::SimpleAtoi(value, f.field) || *f.field < f.min)
      return InvalidArgument("expected an integer >= ", f.min, " for ", flag, ", got '", value,
                             "'");
  }
  for (const auto& [name, field] : float_flags) {
    if (flag != name) continue;
    *known = true;
    if (!absl::SimpleAtod(value, field) || !(*field >= 0))
      return InvalidArgument("expected a number >= 0 for ", flag, ", got '", value, "'");
  }
  if (flag == "--tokens") {
    *known = true;
    a.tokens_file = value;
  }
  if (flag == "--profile") {
    *known = true;
    a.profile = value;
  }
  if (flag == "--traffic") {
    *known = true;
    a.traffic = value;
  }
  if (flag == "--device") {
    *known = true;
    if (value != "cpu" && value != "cuda") return InvalidArgument("expected --device cpu or cuda, got '", value, "'");
    a.device = value;
  }
  if (flag == "--fuse-attention") {
    *known = true;
    if (value != "auto" && value != "on" && value != "off")
      return InvalidArgument("expected --fuse-attention auto, on or off, got '", value, "'");
    a.fuse_attention = value;
  }
  if (flag == "--precision") {
    *known = true;
    RETURN_IF_ERROR(trainer::ParsePrecision(value).status());
    a.precision = value;
  }
  return absl::OkStatus();
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (!flag.starts_with("--")) {
      if (!a.model.empty()) return InvalidArgument("expected one MODEL path, got '", flag, "' too");
      a.model = flag;
    } else if (i + 1 >= argc) {
      return InvalidArgument("expected a value after ", flag);
    } else {
      bool known = false;
      RETURN_IF_ERROR(ParseFlag(flag, argv[++i], a, &known));
      if (!known) return InvalidArgument("unknown flag ", flag, "\n", kUsage);
    }
  }
  if (a.model.empty()) return InvalidArgument("expected a MODEL path\n", kUsage);
  if (a.lr <= 0) return InvalidArgument("expected --lr > 0, got ", a.lr);
  if (a.iters == 0 && a.traffic.empty()) return InvalidArgument("expected --iters >= 1 (0 only with --traffic)");
  return a;
}

// The model's one data input: integer token ids (batch, seq) with named dims, which the
// spec fixes to B and T (training graphs have static shapes).
absl::StatusOr<std::string> FixTokenDims(const graph::Graph& g, const Args& a,
                                         trainer::TrainingSpec* spec) {
  std::vector<const graph::Value*> data;
  for (const graph::Value* v : g.inputs())
    if (!v->is_initializer()) data.push_back(v);
  if (data.size() != 1)
    return InvalidArgument(a.model, ": expected one token input (batch, seq), got ", data.size(),
                           " data inputs");
  const graph::Value* in = data[0];
  if (in->dtype() != DataType::kInt64 || !in->shape().has_rank() || in->shape().rank() != 2)
    return InvalidArgument(a.model, ": input '", in->name(), "': expected int64 (batch, seq), got ",
                           DataTypeName(in->dtype()), " ", in->shape().ToString());
  const int64_t want[2] = {a.batch, a.seq};
  for (int k = 0; k < 2; ++k) {
    const Dim& d = in->shape()[k];
    if (d.is_static() && d.value != want[k])
      return InvalidArgument("input '", in->name(), "' has fixed dim ", k, " = ", d.value,
                             ", the run asks for ", want[k]);
    if (!d.is_static() && d.symbol.empty())
      return InvalidArgument("input '", in->name(), "' has an unnamed dynamic dim ", k);
    if (!d.is_static()) spec->dims[d.symbol] = want[k];
  }
  return in->name();
}

// One batch of B rows of T+1 tokens: inputs are tokens [0, T), labels tokens [1, T] (the next
// token). Read from the file, or drawn uniformly from the vocab with the seed.
absl::StatusOr<std::pair<Tensor, Tensor>> MakeBatch(const Args& a, int64_t vocab) {
  const int64_t B = a.batch, T = a.seq;
  std::vector<int64_t> tokens(B * (T + 1));  // (B, T+1)
  if (a.tokens_file.empty()) {
    std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
    std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
    for (int64_t& t : tokens) t = dist(rng);
  } else {
    const auto bytes = static_cast<std::streamsize>(tokens.size() * sizeof(int64_t));
    std::ifstream in(a.tokens_file, std::ios::binary);
    if (!in) return InvalidArgument("--tokens: cannot open ", a.tokens_file);
    in.read(reinterpret_cast<char*>(tokens.data()), bytes);
    if (!in || in.gcount() != bytes)
      return InvalidArgument(a.tokens_file, ": expected ", bytes, " bytes of int64 tokens (", B,
                             "x", T + 1, "), could not read them all");
    for (int64_t t : tokens)
      if (t < 0 || t >= vocab)
        return InvalidArgument(a.tokens_file, ": token ", t, " is outside the vocab [0, ", vocab,
                               ")");
  }
  Tensor inputs(DataType::kInt64, {B, T}), labels(DataType::kInt64, {B, T});
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(&tokens[b * (T + 1)], T, inputs.data<int64_t>() + b * T);
    std::copy_n(&tokens[b * (T + 1) + 1], T, labels.data<int64_t>() + b * T);
  }
  return std::make_pair(std::move(inputs), std::move(labels));
}

// Percentile with linear interpolation between order statistics (numpy's default), so the
// figures line up with the PyTorch side computed by numpy.percentile.
double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

struct Session {
  std::unique_ptr<trainer::TrainingSession> session;
  Feeds feeds;
  double build_ms = 0, create_ms = 0;
  int64_t params = 0;
};

// Loads the model, builds the artifacts for (B, T) and creates the session with AdamW.
absl::StatusOr<Session> Setup(const Args& a) {
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<graph::Graph> model, onnx_ext::LoadModel(a.model));
  trainer::TrainingSpec spec;
  ASSIGN_OR_RETURN(std::string input_name, FixTokenDims(*model, a, &spec));
  spec.optimizer.kind = trainer::OptimizerConfig::Kind::kAdamW;
  spec.optimizer.weight_decay = static_cast<float>(a.weight_decay);
  spec.optimizer.max_grad_norm = static_cast<float>(a.clip);
  ASSIGN_OR_RETURN(spec.precision, trainer::ParsePrecision(a.precision));
  spec.fuse_attention = a.fuse_attention == "auto"
                            ? trainer::FusesAttentionByDefault(a.device == "cuda", spec.precision)
                            : a.fuse_attention == "on";
  ASSIGN_OR_RETURN(trainer::TrainingArtifacts artifacts,
                   trainer::BuildTrainingArtifacts(*model, spec));
  // The vocab bounds the random ids: the logits' last dim (eval outputs: loss, then logits).
  const auto& eval_outputs = artifacts.eval->outputs();
  const Shape& logits = eval_outputs.size() > 1 ? eval_outputs[1]->shape() : Shape();
  if (!logits.has_rank() || logits.rank() != 3 || !logits[2].is_static())
    return InvalidArgument(a.model,
                           ": expected the first output to be logits (batch, seq, vocab), got ",
                           logits.ToString());
  Session s;
  for (const auto& [name, value] : artifacts.initial) s.params += value.numel();
  ASSIGN_OR_RETURN(auto batch, MakeBatch(a, logits[2].value));
  s.feeds = {{input_name, std::move(batch.first)}, {spec.loss.labels, std::move(batch.second)}};
  s.build_ms = MsSince(start);

  start = std::chrono::steady_clock::now();
  trainer::TrainingSessionOptions options;
  options.intra_op_threads = static_cast<int>(a.threads);
  options.device = a.device == "cuda" ? DeviceChoice::kCuda : DeviceChoice::kCpu;
  ASSIGN_OR_RETURN(s.session, trainer::TrainingSession::Create(std::move(artifacts), options));
  s.session->SetLearningRate(a.lr);  // constant: no scheduler registered
  s.create_ms = MsSince(start);
  return s;
}

struct StepTimes {
  std::vector<double> step_ms, train_ms, optimizer_ms;  // timed steps only
  std::vector<double> losses, grad_norms;               // every step, warmup included
  double minor_faults = 0;  // page faults per timed step: memory first touched in the step
};

int64_t MinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

absl::StatusOr<StepTimes> RunSteps(const Args& a, Session& s) {
  StepTimes t;
  int64_t faults = 0;
  for (int64_t i = 0; i < a.warmup + a.iters; ++i) {
    if (i == a.warmup) faults = MinorFaults();
    const auto start = std::chrono::steady_clock::now();
    s.session->LazyResetGrad();
    ASSIGN_OR_RETURN(float loss, s.session->TrainStep(s.feeds));
    const double train_ms = MsSince(start);
    ASSIGN_OR_RETURN(float norm, s.session->OptimizerStep());
    const double step_ms = MsSince(start);
    if (!std::isfinite(loss))
      return absl::OutOfRangeError(absl::StrCat("step ", i + 1, ": the loss is ", loss));
    t.losses.push_back(loss);
    t.grad_norms.push_back(norm);
    if (i < a.warmup) continue;
    t.step_ms.push_back(step_ms);
    t.train_ms.push_back(train_ms);
    t.optimizer_ms.push_back(step_ms - train_ms);
  }
  t.minor_faults = static_cast<double>(MinorFaults() - faults) / static_cast<double>(a.iters);
  return t;
}

// One more step, profiled: every node on the host track and, on a device, each device node's
// stream time on the stream's track. Writes the trace and prints the summary (per op type, its
// share of each track) to stderr; the timed steps are untouched.
absl::Status ProfileStep(const Args& a, Session& s) {
  runtime::Profiler profiler(absl::StrCat("cleave_bench_train ", a.device, " ", a.precision));
  s.session->set_profiler(&profiler);
  s.session->LazyResetGrad();
  absl::Status status = s.session->TrainStep(s.feeds).status();
  if (status.ok()) status = s.session->OptimizerStep().status();
  s.session->set_profiler(nullptr);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(profiler.WriteChromeTrace(a.profile));
  std::fprintf(stderr, "profile of one step: %s\n%s", a.profile.c_str(), profiler.Summary(25).c_str());
  return absl::OkStatus();
}

// The --traffic table: per op type of the training graph as the session runs it, its nodes,
// the bytes they read and write (each input and output once) and the products' FLOPs
// (2 x the result's elements x K). Left out: Reshape and its kin (the executor makes their
// result a view of their input where it can, and then they move nothing), and the copies of
// graph inputs and outputs across the device boundary (the session keeps parameters, gradients
// and optimizer state in device memory, and the executor skips those copies). A Gather counts
// the rows it reads, not its whole table, and a GatherGrad onto a base (an accumulated
// gradient, which the session's bound accumulation buffer holds and the executor writes where
// the result lies) the rows it reads and writes back, not the whole table twice. Each step
// here is one micro-batch, so the gradient accumulation buffers are reset on every one: a
// product or InPlaceAccumulator that the reset flag gates writes its buffer without reading it
// (a product's beta is 0), and a scatter onto a gated base starts from zeros (its whole table
// written, then its rows). Attention's own FLOPs are not counted here (see the model FLOPs of
// bench_gpu.py).
struct Traffic {
  int64_t nodes = 0;
  double bytes = 0, product_bytes = 0, product_flops = 0;
};

absl::StatusOr<Traffic> WriteTraffic(const Args& a, const trainer::TrainingSession& session) {
  const graph::Graph* g = session.training_graph();
  if (!g) return InvalidArgument("--traffic: this session has no single training graph");
  auto bytes_of = [](const graph::Value* v) {
    return v && v->shape().is_static() ? static_cast<double>(v->shape().NumElements()) * ElementSize(v->dtype()) : 0.0;
  };
  auto is_io = [](const graph::Value* v) { return v && (v->is_graph_input() || v->is_graph_output()); };
  auto gated = [](const graph::Node& n, int reset) {
    const graph::Value* v = reset < n.num_inputs() ? n.input(reset) : nullptr;
    return v && v->is_graph_input() && v->name() == trainer::kLazyResetGrad;
  };
  std::map<std::string, Traffic> rows_of;  // per op type
  Traffic total;
  int64_t views = 0, boundary = 0;
  for (const auto& owned : g->nodes()) {
    const graph::Node& n = *owned;
    const std::string& op = n.op_type();
    if (runtime::IsViewOp(n)) {
      ++views;
      continue;
    }
    if (runtime::IsBoundaryCopy(n) && (is_io(n.input(0)) || is_io(n.output(0)))) {
      ++boundary;
      continue;
    }
    double bytes = 0, flops = 0;
    const bool low_product = op == "MatMulBf16" || op == "MatMulF16";
    const bool product = low_product || op == "MatMul" || op == "Gemm" || op == "FusedMatMul";
    if (op == "GatherGrad" && n.num_inputs() > 3 && n.input(3) && n.num_outputs() > 0) {
      // dY and the indices read; the rows they add to (dY's size: the table has dY's type) read
      // and written.
      bytes = bytes_of(n.input(1)) + 3 * bytes_of(n.input(2)) + (gated(n, 4) ? bytes_of(n.output(0)) : 0.0);
      for (Traffic* t : {&rows_of[absl::StrCat(n.domain(), ".", op)], &total}) {
        ++t->nodes;
        t->bytes += bytes;
      }
      continue;
    }
    for (int i = 0; i < n.num_inputs(); ++i) {
      const graph::Value* v = n.input(i);
      // A Gather reads the rows it gathers: its result's elements of the table.
      if (i == 0 && op == "Gather" && n.domain().empty() && n.num_outputs() > 0) bytes += bytes_of(n.output(0));
      else if (!(i == 3 && low_product && gated(n, 4)) && !(i == 0 && op == "InPlaceAccumulator" && gated(n, 2)))
        bytes += bytes_of(v);  // (an accumulation buffer the reset step does not read)
    }
    for (int i = 0; i < n.num_outputs(); ++i) bytes += bytes_of(n.output(i));
    if (product && n.num_inputs() >= 2 && n.num_outputs() > 0 && n.input(0) && n.output(0) &&
        n.input(0)->shape().is_static() && n.output(0)->shape().is_static() && n.input(0)->shape().rank() >= 1) {
      const std::vector<int64_t> x = n.input(0)->shape().StaticDims();
      const bool trans_a = n.AttrInt("transA", 0) != 0 && x.size() >= 2;
      const int64_t k = trans_a ? x[x.size() - 2] : x.back();
      flops = 2.0 * static_cast<double>(n.output(0)->shape().NumElements()) * static_cast<double>(k);
    }
    for (Traffic* t : {&rows_of[n.domain().empty() ? op : absl::StrCat(n.domain(), ".", op)], &total}) {
      ++t->nodes;
      t->bytes += bytes;
      t->product_flops += flops;
      if (product) t->product_bytes += bytes;
    }
  }
  std::vector<std::pair<std::string, Traffic>> sorted(rows_of.begin(), rows_of.end());
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.bytes > y.second.bytes; });
  std::string out = absl::StrFormat(
      "training graph of %s (batch %d, seq %d, %s, %s): %d nodes counted; %d views and %d copies of graph inputs "
      "and outputs left out\n%-40s %6s %12s %10s\n",
      a.model, a.batch, a.seq, a.device, a.precision, total.nodes, views, boundary, "op type", "nodes", "MB moved",
      "GFLOP");
  for (const auto& [op, r] : sorted)
    out += absl::StrFormat("%-40s %6d %12.2f %10.3f\n", op, r.nodes, r.bytes / 1e6, r.product_flops / 1e9);
  out += absl::StrFormat("%-40s %6d %12.2f %10.3f\n", "total", total.nodes, total.bytes / 1e6,
                         total.product_flops / 1e9);
  std::ofstream f(a.traffic);
  f << out;
  if (!f.flush()) return InvalidArgument("--traffic: cannot write ", a.traffic);
  return total;
}

std::string JsonList(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(absl::StrFormat("%.6f", x));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

absl::Status Bench(const Args& a) {
  ASSIGN_OR_RETURN(Session s, Setup(a));
  Traffic traffic;
  if (!a.traffic.empty()) {
    ASSIGN_OR_RETURN(traffic, WriteTraffic(a, *s.session));
  }
  const std::string traffic_json =
      a.traffic.empty() ? ""
                        : absl::StrFormat(", \"graph_nodes\": %d, \"graph_mb\": %.1f, \"graph_product_mb\": %.1f, "
                                          "\"graph_product_gflop\": %.6f",
                                          traffic.nodes, traffic.bytes / 1e6, traffic.product_bytes / 1e6,
                                          traffic.product_flops / 1e9);
  if (a.iters == 0) {  // --traffic alone
    std::printf("%s\n", absl::StrFormat("{\"params\": %d, \"batch\": %d, \"seq\": %d, \"device\": \"%s\", "
                                         "\"precision\": \"%s\"%s}",
                                         s.params, a.batch, a.seq, a.device, a.precision, traffic_json)
                           .c_str());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(StepTimes t, RunSteps(a, s));
  if (!a.profile.empty()) RETURN_IF_ERROR(ProfileStep(a, s));
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);  // ru_maxrss is in KiB on Linux
  const double median = Percentile(t.step_ms, 0.5);
  std::string json = absl::StrFormat(
      "{\"median_ms\": %.3f, \"p10_ms\": %.3f, \"p90_ms\": %.3f, \"train_step_ms\": %.3f, "
      "\"optimizer_step_ms\": %.3f, \"tokens_per_s\": %.1f, \"first_loss\": %.6f, "
      "\"last_loss\": %.6f, \"build_ms\": %.1f, \"create_ms\": %.1f, \"peak_rss_mib\": %.1f, "
      "\"minor_faults_per_step\": %.0f, "
      "\"params\": %d, \"threads\": %d, \"batch\": %d, \"seq\": %d, \"warmup\": %d, "
      "\"iters\": %d, \"losses\": %s, \"grad_norms\": %s, \"device\": \"%s\", \"precision\": \"%s\"%s}",
      median, Percentile(t.step_ms, 0.1), Percentile(t.step_ms, 0.9), Percentile(t.train_ms, 0.5),
      Percentile(t.optimizer_ms, 0.5), static_cast<double>(a.batch * a.seq) / (median / 1000.0),
      t.losses.front(), t.losses.back(), s.build_ms, s.create_ms,
      static_cast<double>(usage.ru_maxrss) / 1024.0, t.minor_faults, s.params, a.threads, a.batch,
      a.seq, a.warmup, a.iters, JsonList(t.losses), JsonList(t.grad_norms), a.device, a.precision, traffic_json);
  std::printf("%s\n", json.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace cleave::bench

int main(int argc, char** argv) {
  auto args = cleave::bench::ParseArgs(argc, argv);
  absl::Status status = args.ok() ? cleave::bench::Bench(*args) : args.status();
  if (!status.ok()) {
    std::fprintf(stderr, "cleave_bench_train: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
