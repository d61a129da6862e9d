// cleave_bench_inference (bench/): times InferenceSession::Run on a token model and prints
// one JSON line, for bench/bench_inference.py to set against onnxruntime in the same run.
//   cleave_bench_inference MODEL --threads T --batch B --seq S --warmup W --iters N
//       [--input-ids FILE] [--dump-output FILE] [--run-into]
// Every model input must be int64 (batch, seq): ids come from --input-ids (raw little-endian
// int64, B*S values) or a fixed formula; inputs named *mask* are all ones and *token_type*
// all zeros. Timed runs use Run
// (fresh outputs each time, as an application would) or, with --run-into, RunInto.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "runtime/inference_session.h"

namespace cleave::bench {
namespace {

struct Args {
  std::string model;
  int64_t threads = 1, batch = 1, seq = 128, warmup = 3, iters = 10;
  std::string input_ids_file, dump_output_file;
  bool run_into = false;  // time RunInto with preallocated outputs instead of Run
};

constexpr char kUsage[] =
    "usage: cleave_bench_inference MODEL --threads T --batch B --seq S --warmup W --iters N "
    "[--input-ids FILE] [--dump-output FILE] [--run-into]";

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  struct IntFlag {
    const char* name;
    int64_t* field;
    int64_t min;
  };
  const IntFlag int_flags[] = {{"--threads", &a.threads, 1},
                               {"--batch", &a.batch, 1},
                               {"--seq", &a.seq, 1},
                               {"--warmup", &a.warmup, 0},
                               {"--iters", &a.iters, 1}};
  const std::pair<const char*, std::string*> path_flags[] = {
      {"--input-ids", &a.input_ids_file}, {"--dump-output", &a.dump_output_file}};
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--run-into") {
      a.run_into = true;
    } else if (!flag.starts_with("--")) {
      if (!a.model.empty()) return InvalidArgument("expected one MODEL path, got '", flag, "' too");
      a.model = flag;
    } else if (i + 1 >= argc) {
      return InvalidArgument("expected a value after ", flag);
    } else {
      std::string value = argv[++i];
      bool known = false;
      for (const IntFlag& f : int_flags) {
        if (flag != f.name) continue;
        known = true;
        if (!absl::SimpleAtoi(value, f.field) || *f.field < f.min)
          return InvalidArgument("expected an integer >= ", f.min, " for ", flag, ", got '", value,
                                 "'");
      }
      for (const auto& [name, field] : path_flags) {
        if (flag != name) continue;
        known = true;
        *field = value;
      }
      if (!known) return InvalidArgument("unknown flag ", flag, "\n", kUsage);
    }
  }
  if (a.model.empty()) return InvalidArgument("expected a MODEL path\n", kUsage);
  return a;
}

// Token ids (B, T): read from the file, or (b * T + t) % vocab so any model gets valid ids.
absl::StatusOr<Tensor> MakeInputIds(const Args& a, int64_t vocab) {
  Tensor ids(DataType::kInt64, {a.batch, a.seq});
  int64_t* p = ids.data<int64_t>();
  if (a.input_ids_file.empty()) {
    for (int64_t i = 0; i < a.batch * a.seq; ++i) p[i] = i % vocab;
    return ids;
  }
  std::ifstream in(a.input_ids_file, std::ios::binary);
  in.read(reinterpret_cast<char*>(p), static_cast<std::streamsize>(ids.nbytes()));
  if (!in || in.gcount() != static_cast<std::streamsize>(ids.nbytes()))
    return InvalidArgument(a.input_ids_file, ": expected ", ids.nbytes(), " bytes of int64 ids (",
                           a.batch, "x", a.seq, "), could not read them all");
  return ids;
}

absl::StatusOr<Feeds> MakeFeeds(const InferenceSession& s, const Args& a) {
  // The vocab bounds the fallback ids: the last dim of the first output (the logits).
  int64_t vocab = 256;
  const Shape& out = s.outputs().front().shape;
  if (out.has_rank() && out.rank() > 0 && out[out.rank() - 1].is_static())
    vocab = out[out.rank() - 1].value;
  ASSIGN_OR_RETURN(Tensor ids, MakeInputIds(a, vocab));
  Feeds feeds;
  for (const IoInfo& in : s.inputs()) {
    if (in.dtype != DataType::kInt64 || (in.shape.has_rank() && in.shape.rank() != 2))
      return InvalidArgument("input '", in.name, "': expected int64 (batch, seq), got ",
                             DataTypeName(in.dtype), " ", in.shape.ToString());
    feeds.emplace_back(in.name, ids.Clone());
    // Attention masks keep every key; token types are all segment 0 (Tensor zero-fills).
    if (in.name.find("mask") != std::string::npos) {
      std::fill_n(feeds.back().second.data<int64_t>(), ids.numel(), int64_t{1});
    } else if (in.name.find("token_type") != std::string::npos) {
      feeds.back().second = Tensor(DataType::kInt64, {a.batch, a.seq});
    }
  }
  return feeds;
}

// Percentile with linear interpolation between order statistics (numpy's default), so the
// figures line up with the onnxruntime side computed by numpy.percentile.
double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  double pos = q * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

absl::Status DumpOutput(const Tensor& t, const std::string& path) {
  if (t.dtype() != DataType::kFloat32)
    return InvalidArgument("--dump-output: expected a float32 first output, got ",
                           DataTypeName(t.dtype()));
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  if (!out) return InvalidArgument("--dump-output: could not write ", path);
  return absl::OkStatus();
}

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status Bench(const Args& a) {
  auto start = std::chrono::steady_clock::now();
  SessionOptions options;
  options.intra_op_threads = a.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<InferenceSession> session,
                   InferenceSession::Load(a.model, options));
  double load_ms = MsSince(start);
  ASSIGN_OR_RETURN(Feeds feeds, MakeFeeds(*session, a));

  std::vector<Tensor> outputs;
  for (int64_t i = 0; i < a.warmup; ++i) {
    ASSIGN_OR_RETURN(outputs, session->Run(feeds));
  }
  if (a.warmup == 0 && a.run_into) {  // RunInto needs outputs of the right shapes
    ASSIGN_OR_RETURN(outputs, session->Run(feeds));
  }
  std::vector<double> ms;
  for (int64_t i = 0; i < a.iters; ++i) {
    start = std::chrono::steady_clock::now();
    if (a.run_into) {
      RETURN_IF_ERROR(session->RunInto(feeds, outputs));
    } else {
      ASSIGN_OR_RETURN(outputs, session->Run(feeds));
    }
    ms.push_back(MsSince(start));
  }
  if (!a.dump_output_file.empty()) RETURN_IF_ERROR(DumpOutput(outputs.front(), a.dump_output_file));

  std::string json = absl::StrFormat(
      "{\"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, \"load_ms\": %.1f, "
      "\"threads\": %d, \"batch\": %d, \"seq\": %d, \"iters\": %d, \"run_into\": %s, "
      "\"output_shape\": [%s]}",
      Percentile(ms, 0.5), Percentile(ms, 0.1), Percentile(ms, 0.9), load_ms, a.threads, a.batch,
      a.seq, a.iters, a.run_into ? "true" : "false", absl::StrJoin(outputs.front().dims(), ", "));
  std::printf("%s\n", json.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace cleave::bench

int main(int argc, char** argv) {
  auto args = cleave::bench::ParseArgs(argc, argv);
  absl::Status status = args.ok() ? cleave::bench::Bench(*args) : args.status();
  if (!status.ok()) {
    std::fprintf(stderr, "cleave_bench_inference: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
