// The profiler (runtime/): see profiler.h.
#include "runtime/profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cleave::runtime {

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

Profiler::Profiler(std::string process, int pid) : process_(std::move(process)), pid_(pid) {}

int Profiler::Track(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == name) return static_cast<int>(i);
  tracks_.push_back(name);
  return static_cast<int>(tracks_.size()) - 1;
}

void Profiler::Add(Event e) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

void Profiler::Add(std::string name, std::string category, int track, Clock::time_point start, Clock::time_point end,
                   std::vector<std::pair<std::string, std::string>> args) {
  if (!enabled()) return;
  Event e;
  e.name = std::move(name);
  e.category = std::move(category);
  e.track = track;
  e.start_us = Micros(start);
  e.duration_us = std::max<int64_t>(0, Micros(end) - e.start_us);
  e.args = std::move(args);
  Add(std::move(e));
}

std::vector<Profiler::Event> Profiler::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<std::string> Profiler::tracks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tracks_;
}

std::string Profiler::ToChromeTrace() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  absl::StrAppend(&out, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": ", pid_,
                  ", \"args\": {\"name\": ", JsonString(process_), "}}");
  for (size_t t = 0; t < tracks_.size(); ++t)
    absl::StrAppend(&out, ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": ", pid_, ", \"tid\": ", t,
                    ", \"args\": {\"name\": ", JsonString(tracks_[t]), "}}");
  for (const Event& e : events_) {
    absl::StrAppend(&out, ",\n{\"ph\": \"X\", \"name\": ", JsonString(e.name), ", \"cat\": ", JsonString(e.category),
                    ", \"pid\": ", pid_, ", \"tid\": ", e.track, ", \"ts\": ", e.start_us, ", \"dur\": ", e.duration_us);
    if (!e.args.empty()) {
      out += ", \"args\": {";
      for (size_t i = 0; i < e.args.size(); ++i)
        absl::StrAppend(&out, i ? ", " : "", JsonString(e.args[i].first), ": ", JsonString(e.args[i].second));
      out += "}";
    }
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

absl::Status Profiler::WriteChromeTrace(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write the profile '", tmp, "'"));
    f << ToChromeTrace();
    if (!f.flush()) return absl::DataLossError(absl::StrCat("writing the profile '", tmp, "' failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return absl::PermissionDeniedError(absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  return absl::OkStatus();
}

}  // namespace cleave::runtime
