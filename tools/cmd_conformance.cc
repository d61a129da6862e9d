// `cleave conformance DIR...`: runs ONNX backend test folders (model.onnx plus
// test_data_set_*/input_*.pb and output_*.pb) and reports each failure with its max abs and
// rel error, each skip with its reason, then "N passed, N failed, N skipped" (tools/). With
// --device cuda (or auto) the sessions put what the CUDA provider has kernels for on the GPU.
//
// A test is skipped when the model needs an op, opset or dtype the CPU provider does not
// claim (the session reports Unimplemented at load). Each test runs in a forked child with
// a time limit, so a crash or hang fails that test alone. Comparison follows the ONNX
// backend runner: |got - want| <= atol + rtol * |want| with rtol 1e-3 and atol 1e-7.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/tensor_compare.h"
#include "onnx_ext/onnx_io.h"
#include "runtime/inference_session.h"
#include "tools/commands.h"

namespace cleave::tools {

namespace fs = std::filesystem;

namespace {

enum Outcome : char { kPass = 'P', kFail = 'F', kSkip = 'S' };

struct Result {
  Outcome outcome;
  std::string detail;
};

constexpr double kRtol = 1e-3, kAtol = 1e-7;

std::vector<std::string> SortedPbs(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<int, std::string>> found;
  std::regex re(prefix + "_([0-9]+)\\.pb");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) found.emplace_back(std::stoi(m[1]), e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string Compare(const Tensor& got, const Tensor& want, const std::string& what) {
  TensorDiff d = DiffTensors(got, want, kAtol, kRtol);
  return d.ok() ? "" : absl::StrCat(what, ": ", d.Describe(got, want));
}

// The backend test generator stores bfloat16 data as uint16 (numpy has no bfloat16); read
// such a tensor as the type the model declares.
Tensor AsDeclared(Tensor t, DataType declared) {
  if (t.dtype() != DataType::kUInt16 || declared != DataType::kBFloat16) return t;
  Tensor bf = Tensor::Uninitialized(DataType::kBFloat16, t.dims());
  if (t.nbytes()) std::memcpy(bf.raw(), t.raw(), t.nbytes());
  return bf;
}

Result RunDataSet(InferenceSession& s, const fs::path& set) {
  Feeds feeds;
  std::vector<std::string> ins = SortedPbs(set, "input"), outs = SortedPbs(set, "output");
  for (size_t k = 0; k < ins.size(); ++k) {
    auto t = onnx_ext::LoadTensorFile(ins[k]);
    if (!t.ok()) {
      bool dtype = absl::IsUnimplemented(t.status());
      return {dtype ? kSkip : kFail, std::string(t.status().message())};
    }
    if (k >= s.inputs().size()) return {kFail, absl::StrCat("more input files than model inputs")};
    feeds.emplace_back(s.inputs()[k].name, AsDeclared(std::move(t->second), s.inputs()[k].dtype));
  }
  auto got = s.Run(feeds);
  if (!got.ok()) return {kFail, std::string(got.status().message())};
  if (got->size() < outs.size()) return {kFail, "fewer outputs than expected files"};
  for (size_t k = 0; k < outs.size(); ++k) {
    auto want = onnx_ext::LoadTensorFile(outs[k]);
    if (!want.ok()) return {kSkip, std::string(want.status().message())};
    std::string diff = Compare((*got)[k], AsDeclared(std::move(want->second), s.outputs()[k].dtype),
                               absl::StrCat(set.filename().string(), " output ", k, " '",
                                            s.outputs()[k].name, "'"));
    if (!diff.empty()) return {kFail, diff};
  }
  return {kPass, ""};
}

Result RunTest(const fs::path& dir, const SessionOptions& options) {
  auto session = InferenceSession::Load((dir / "model.onnx").string(), options);
  if (!session.ok()) {
    bool unsupported = absl::IsUnimplemented(session.status());
    return {unsupported ? kSkip : kFail, std::string(session.status().message())};
  }
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return {kSkip, "no test_data_set_* folder"};
  for (const fs::path& set : sets) {
    Result r = RunDataSet(**session, set);
    if (r.outcome != kPass) return r;
  }
  return {kPass, ""};
}

// Runs one test in a child process so a crash or hang only fails that test (the parent never
// touches the device: CUDA does not survive a fork).
Result RunIsolated(const fs::path& dir, int timeout_s, const SessionOptions& options) {
  int fds[2];
  if (pipe(fds) != 0) return RunTest(dir, options);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(static_cast<unsigned>(timeout_s));
    Result r = RunTest(dir, options);
    std::string msg = std::string(1, r.outcome) + r.detail;
    ssize_t unused = write(fds[1], msg.data(), msg.size());
    (void)unused;
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (msg.empty()) {
    if (WIFSIGNALED(status))
      return {kFail, absl::StrCat("crashed with signal ", WTERMSIG(status),
                                  WTERMSIG(status) == SIGALRM ? " (time limit)" : "")};
    return {kFail, "child exited without a result"};
  }
  return {static_cast<Outcome>(msg[0]), msg.substr(1)};
}

void FindTests(const fs::path& root, std::vector<fs::path>& out) {
  if (fs::exists(root / "model.onnx")) {
    out.push_back(root);
    return;
  }
  std::vector<fs::path> children;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) children.push_back(e.path());
  std::sort(children.begin(), children.end());
  for (const auto& c : children) FindTests(c, out);
}


// Reads "name reason..." lines; '#' starts a comment.
std::map<std::string, std::string> ReadExclusions(const std::string& path, bool* ok) {
  std::map<std::string, std::string> out;
  std::ifstream f(path);
  *ok = static_cast<bool>(f);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t sp = line.find(' ');
    out[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
  }
  return out;
}

}  // namespace

int ConformanceCommand(const Args& args) {
  std::vector<std::string> roots;
  std::map<std::string, std::string> excluded;
  std::string filter;
  bool quiet = false;
  int timeout_s = 120;
  SessionOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--filter" && i + 1 < args.size()) filter = args[++i];
    else if (args[i] == "--device" && i + 1 < args.size()) {
      const std::string d = args[++i];
      if (d == "cpu") options.device = DeviceChoice::kCpu;
      else if (d == "cuda") options.device = DeviceChoice::kCuda;
      else if (d == "auto") options.device = DeviceChoice::kCudaIfAvailable;
      else {
        std::fprintf(stderr, "cleave conformance: --device expects cpu, cuda or auto, got '%s'\n", d.c_str());
        return 2;
      }
    }
    else if (args[i] == "--quiet") quiet = true;
    else if (args[i] == "--exclude" && i + 1 < args.size()) {
      bool ok;
      excluded = ReadExclusions(args[++i], &ok);
      if (!ok) {
        std::fprintf(stderr, "cleave conformance: cannot read '%s'\n", args[i].c_str());
        return 2;
      }
    }
    else if (args[i] == "--timeout" && i + 1 < args.size()) (void)absl::SimpleAtoi(args[++i], &timeout_s);
    else roots.push_back(args[i]);
  }
  if (roots.empty()) {
    std::fprintf(stderr, "usage: cleave conformance DIR... [--filter SUBSTR] [--device cpu|cuda|auto] [--quiet]\n");
    return 2;
  }
  std::vector<fs::path> tests;
  for (const std::string& r : roots) {
    if (!fs::is_directory(r)) {
      std::fprintf(stderr, "cleave conformance: '%s' is not a directory\n", r.c_str());
      return 2;
    }
    FindTests(r, tests);
  }
  int passed = 0, failed = 0, skipped = 0;
  for (const fs::path& t : tests) {
    if (!filter.empty() && t.string().find(filter) == std::string::npos) continue;
    auto ex = excluded.find(t.filename().string());
    Result r = ex != excluded.end() ? Result{kSkip, "excluded: " + ex->second}
                                    : RunIsolated(t, timeout_s, options);
    // A device asked for and not there fails every test alike: said once.
    if (options.device == DeviceChoice::kCuda && r.outcome != kPass &&
        absl::StrContains(r.detail, "the session asks for CUDA")) {
      std::fprintf(stderr, "cleave conformance: --device cuda: %s\n", r.detail.c_str());
      return 2;
    }
    std::string name = t.string();
    if (r.outcome == kPass) {
      ++passed;
      if (!quiet) std::printf("PASS %s\n", name.c_str());
    } else if (r.outcome == kSkip) {
      ++skipped;
      std::string reason = r.detail;  // one line: the session lists nodes on separate lines
      for (size_t p; (p = reason.find("\n  ")) != std::string::npos;) reason.replace(p, 3, "; ");
      std::printf("SKIP %s: %s\n", name.c_str(), reason.c_str());
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", name.c_str(), r.detail.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed > 0 ? 1 : 0;
}

}  // namespace cleave::tools
