// The profiler (runtime/): timed events of one process, written as a Chrome trace (the JSON
// that chrome://tracing and Perfetto open), like ONNX Runtime's session profiling.
//
// Events sit on named tracks: the executor puts each node it runs on the compute track, and
// the gradient reducer puts each collective on the track of the thread that runs it, so a
// reduction that overlaps the backward shows as two bars side by side. Add is thread-safe;
// times are on the machine's monotonic clock, so the traces of ranks on one machine align.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace cleave::runtime {

class Profiler {
 public:
  using Clock = std::chrono::steady_clock;
  struct Event {
    std::string name, category;
    int track = 0;
    int64_t start_us = 0, duration_us = 0;
    std::vector<std::pair<std::string, std::string>> args;
  };
  // `process` names the trace's process (e.g. "rank 3"); `pid` orders processes in a viewer.
  explicit Profiler(std::string process = "cleave", int pid = 0);

  // A track by name, made on first use ("compute", "gradient reduction", ...).
  int Track(const std::string& name);
  static int64_t Micros(Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  }
  // Events are kept only while enabled (the steps a run profiles).
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void Add(Event e);
  void Add(std::string name, std::string category, int track, Clock::time_point start, Clock::time_point end,
           std::vector<std::pair<std::string, std::string>> args = {});

  std::vector<Event> events() const;
  std::vector<std::string> tracks() const;
  // A table of what the events add up to, as torch.profiler's key_averages: per category (the
  // op type) its calls, total and mean time and share of its track, the `top` busiest; then
  // each track's busy time and, for the others, how much of it overlapped the first track (the
  // communication hidden behind compute).
  std::string Summary(int top = 12) const;
  // The Chrome trace: complete ("X") events plus the process and track names. Written to a
  // temporary file and renamed, so a reader never sees half a trace.
  std::string ToChromeTrace() const;
  absl::Status WriteChromeTrace(const std::string& path) const;

 private:
  std::string process_;
  int pid_;
  std::atomic<bool> enabled_{true};  // read by threads that add events
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

}  // namespace cleave::runtime
