// cleave_bench_dropout (bench/): times the training-mode Dropout kernel, the one a training
// step runs (counter-based, Philox4x32-10, mask kept for the backward), on one float32
// activation, and prints one JSON line for bench/bench_dropout.py to set against PyTorch's
// dropout in the same run.
//   cleave_bench_dropout --threads T --numel N --ratio R --warmup W --iters I
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "base/thread_pool.h"
#include "kernels/cpu/nn.h"

namespace {

constexpr char kUsage[] = "usage: cleave_bench_dropout --threads T --numel N --ratio R --warmup W --iters I";

int Run(int argc, char** argv) {
  int64_t threads = 1, numel = 8 * 1024 * 768, warmup = 2, iters = 10;
  double ratio = 0.1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cleave_bench_dropout: %s needs a value\n%s\n", flag.c_str(), kUsage);
      return 2;
    }
    const char* v = argv[++i];
    bool ok = false;
    if (flag == "--threads") ok = absl::SimpleAtoi(v, &threads) && threads >= 1;
    else if (flag == "--numel") ok = absl::SimpleAtoi(v, &numel) && numel >= 1;
    else if (flag == "--ratio") ok = absl::SimpleAtod(v, &ratio) && ratio > 0 && ratio < 1;
    else if (flag == "--warmup") ok = absl::SimpleAtoi(v, &warmup) && warmup >= 0;
    else if (flag == "--iters") ok = absl::SimpleAtoi(v, &iters) && iters >= 1;
    else {
      std::fprintf(stderr, "cleave_bench_dropout: unknown flag %s\n%s\n", flag.c_str(), kUsage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "cleave_bench_dropout: bad value '%s' for %s (threads, numel, iters >= 1; ratio in (0, 1))\n", v,
                   flag.c_str());
      return 2;
    }
  }
  std::vector<float> x(numel), y(numel);
  std::unique_ptr<bool[]> mask(new bool[numel]);
  for (int64_t i = 0; i < numel; ++i) x[i] = static_cast<float>(i % 17) * 0.125f - 1.0f;
  cleave::ThreadPool pool(static_cast<int>(threads));
  std::vector<double> ms;
  for (int64_t it = 0; it < warmup + iters; ++it) {
    // A new key per step, as a training step draws a new mask.
    const uint64_t key = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(it + 1);
    const auto t0 = std::chrono::steady_clock::now();
    cleave::kernels::cpu::DropoutKeyed(key, static_cast<float>(ratio), numel, x.data(), y.data(), mask.get(), &pool);
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  int64_t kept = 0;
  for (int64_t i = 0; i < numel; ++i) kept += mask[i];
  std::sort(ms.begin(), ms.end());
  std::printf("{\"threads\": %lld, \"numel\": %lld, \"ratio\": %g, \"best_ms\": %.3f, \"median_ms\": %.3f, "
              "\"kept_fraction\": %.5f}\n",
              static_cast<long long>(threads), static_cast<long long>(numel), ratio, ms.front(), ms[ms.size() / 2],
              static_cast<double>(kept) / static_cast<double>(numel));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
