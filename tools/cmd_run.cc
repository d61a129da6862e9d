// `cleave run`: feed TensorProto files to a model, write its outputs as TensorProto files
// named output_<i>.pb (the layout of ONNX backend test data), optionally checking them
// against a folder of expected outputs, and optionally profiling repeated runs per node
// (a Chrome trace and a per-op-type table).
#include <cstdio>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/tensor_compare.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "runtime/profiler.h"
#include "tools/commands.h"

namespace cleave::tools {

namespace {

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cleave run: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int RunCommand(const Args& args) {
  std::string model, out_dir, check_dir, save_optimized, profile;
  int profile_runs = 3;
  std::vector<std::pair<std::string, std::string>> inputs;  // (name or "", path)
  double atol = 1e-4;
  SessionOptions opts;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next = [&]() -> std::string { return i + 1 < args.size() ? args[++i] : ""; };
    if (a == "--input") {
      std::string v = next();
      size_t eq = v.find('=');
      if (eq == std::string::npos) inputs.emplace_back("", v);
      else inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--output-dir") {
      out_dir = next();
    } else if (a == "--save-optimized") {
      save_optimized = next();
    } else if (a == "--check") {
      check_dir = next();
    } else if (a == "--atol") {
      if (!absl::SimpleAtod(next(), &atol)) return Fail("--atol expects a number");
    } else if (a == "--device") {
      const std::string d = next();
      if (d == "cpu") opts.device = DeviceChoice::kCpu;
      else if (d == "cuda") opts.device = DeviceChoice::kCuda;
      else if (d == "auto") opts.device = DeviceChoice::kCudaIfAvailable;
      else return Fail("--device expects cpu, cuda or auto, got '" + d + "'");
    } else if (a == "--threads") {
      if (!absl::SimpleAtoi(next(), &opts.intra_op_threads)) return Fail("--threads expects an integer");
    } else if (a == "--dim") {  // fixes a symbolic dim so shape arithmetic folds at load
      std::string v = next();
      size_t eq = v.find('=');
      int64_t value;
      if (eq == std::string::npos || !absl::SimpleAtoi(v.substr(eq + 1), &value))
        return Fail(absl::StrCat("--dim expects NAME=VALUE, got '", v, "'"));
      opts.free_dimension_overrides[v.substr(0, eq)] = value;
    } else if (a == "--profile") {
      profile = next();
      if (profile.empty()) return Fail("--profile expects a trace file (TRACE.json)");
    } else if (a == "--profile-runs") {
      if (!absl::SimpleAtoi(next(), &profile_runs) || profile_runs < 1)
        return Fail("--profile-runs expects a positive integer");
    } else if (a == "--no-optimize") {
      opts.optimize = false;
    } else if (model.empty() && a[0] != '-') {
      model = a;
    } else {
      return Fail(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  if (model.empty()) return Fail("no model given (cleave run MODEL.onnx --input NAME=FILE.pb ...)");
  auto session = InferenceSession::Load(model, opts);
  if (!session.ok()) return Fail(std::string(session.status().message()));
  if (!save_optimized.empty()) {  // the graph after folding and fusion, as ONNX
    absl::Status s = onnx_ext::SaveModel((*session)->graph(), save_optimized);
    if (!s.ok()) return Fail(std::string(s.message()));
    std::printf("optimised model written to %s\n", save_optimized.c_str());
  }
  Feeds feeds;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto t = onnx_ext::LoadTensorFile(inputs[k].second);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    std::string name = inputs[k].first;
    if (name.empty()) name = t->first;
    if (name.empty() && k < (*session)->inputs().size()) name = (*session)->inputs()[k].name;
    feeds.emplace_back(name, std::move(t->second));
  }
  auto outputs = (*session)->Run(feeds);
  if (!outputs.ok()) return Fail(std::string(outputs.status().message()));
  if (!profile.empty()) {
    // The first run planned memory and warmed the caches; the profiled runs repeat it into
    // outputs of the same shapes, as an application's steady state would.
    runtime::Profiler profiler("cleave run");
    RunOptions options;
    options.profiler = &profiler;
    options.profile_track = profiler.Track("compute");
    std::vector<Tensor> again;
    for (const Tensor& t : *outputs) again.emplace_back(t.dtype(), t.dims());
    for (int r = 0; r < profile_runs; ++r)
      if (absl::Status s = (*session)->RunInto(feeds, again, options); !s.ok())
        return Fail(absl::StrCat("profiled run ", r + 1, ": ", s.message()));
    if (absl::Status s = profiler.WriteChromeTrace(profile); !s.ok()) return Fail(std::string(s.message()));
    std::printf("profile of %d run(s) written to %s (open it in Perfetto or chrome://tracing)\n%s", profile_runs,
                profile.c_str(), profiler.Summary().c_str());
  }
  if (!out_dir.empty()) std::filesystem::create_directories(out_dir);
  int status = 0;
  for (size_t k = 0; k < outputs->size(); ++k) {
    const IoInfo& info = (*session)->outputs()[k];
    const Tensor& t = (*outputs)[k];
    std::printf("output %zu '%s': %s%s\n", k, info.name.c_str(), DataTypeName(t.dtype()),
                DimsToString(t.dims()).c_str());
    if (!out_dir.empty()) {
      std::string path = absl::StrCat(out_dir, "/output_", k, ".pb");
      absl::Status s = onnx_ext::SaveTensorFile(path, info.name, t);
      if (!s.ok()) return Fail(std::string(s.message()));
    }
    if (!check_dir.empty()) {
      auto want = onnx_ext::LoadTensorFile(absl::StrCat(check_dir, "/output_", k, ".pb"));
      if (!want.ok()) return Fail(std::string(want.status().message()));
      TensorDiff d = DiffTensors(t, want->second, atol, 0);
      if (d.mismatch.empty())
        std::printf("  check against %s: max abs error %g (limit %g) %s\n", check_dir.c_str(),
                    d.max_abs, atol, d.ok() ? "OK" : "MISMATCH");
      else
        std::printf("  check against %s: %s MISMATCH\n", check_dir.c_str(), d.mismatch.c_str());
      bool ok = d.ok();
      if (!ok) status = 1;
    }
  }
  return status;
}

}  // namespace cleave::tools
