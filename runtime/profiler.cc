// The profiler (runtime/): see profiler.h.
#include "runtime/profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

// The union of [start, end) intervals, sorted and merged.
std::vector<std::pair<int64_t, int64_t>> Merged(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& s : spans) {
    if (!out.empty() && s.first <= out.back().second) out.back().second = std::max(out.back().second, s.second);
    else out.push_back(s);
  }
  return out;
}

// How much of [a, b) the merged spans cover.
int64_t Covered(const std::vector<std::pair<int64_t, int64_t>>& merged, int64_t a, int64_t b) {
  int64_t total = 0;
  auto it = std::upper_bound(merged.begin(), merged.end(), std::make_pair(a, std::numeric_limits<int64_t>::max()));
  if (it != merged.begin()) --it;
  for (; it != merged.end() && it->first < b; ++it)
    total += std::max<int64_t>(0, std::min(b, it->second) - std::max(a, it->first));
  return total;
}

}  // namespace

std::string Profiler::Summary(int top) const {
  std::lock_guard<std::mutex> lock(mu_);
  struct Row {
    int64_t calls = 0, total_us = 0;
    int track = 0;
  };
  std::map<std::pair<int, std::string>, Row> rows;
  std::vector<int64_t> track_busy(tracks_.size(), 0);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> spans(tracks_.size());
  for (const Event& e : events_) {
    if (e.track < 0 || e.track >= static_cast<int>(tracks_.size())) continue;
    Row& r = rows[{e.track, e.category}];
    ++r.calls;
    r.total_us += e.duration_us;
    r.track = e.track;
    spans[e.track].push_back({e.start_us, e.start_us + e.duration_us});
  }
  for (size_t t = 0; t < spans.size(); ++t)
    for (const auto& [a, b] : Merged(spans[t])) track_busy[t] += b - a;
  std::vector<std::pair<std::pair<int, std::string>, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& x, const auto& y) { return x.second.total_us > y.second.total_us; });
  std::string out =
      absl::StrFormat("%-28s %-28s %8s %11s %10s %7s\n", "op", "track", "calls", "total ms", "mean us", "share");
  for (int i = 0; i < static_cast<int>(sorted.size()) && i < top; ++i) {
    const auto& [key, r] = sorted[i];
    const double busy = static_cast<double>(std::max<int64_t>(1, track_busy[key.first]));
    absl::StrAppend(&out, absl::StrFormat("%-28s %-28s %8d %11.3f %10.1f %6.1f%%\n", key.second.substr(0, 28),
                                          tracks_[key.first].substr(0, 28), r.calls, r.total_us / 1000.0,
                                          static_cast<double>(r.total_us) / r.calls, 100.0 * r.total_us / busy));
  }
  const auto first = spans.empty() ? std::vector<std::pair<int64_t, int64_t>>{} : Merged(spans[0]);
  for (size_t t = 0; t < tracks_.size(); ++t) {
    absl::StrAppend(&out, absl::StrFormat("track %-20s busy %.3f ms", tracks_[t], track_busy[t] / 1000.0));
    if (t > 0 && track_busy[t] > 0) {
      int64_t overlap = 0;
      for (const auto& [a, b] : Merged(spans[t])) overlap += Covered(first, a, b);
      absl::StrAppend(&out, absl::StrFormat(", %.3f ms of it (%.0f%%) while %s ran", overlap / 1000.0,
                                            100.0 * overlap / track_busy[t], tracks_[0]));
    }
    out += "\n";
  }
  return out;
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
                    ", \"pid\": ", pid_, ", \"tid\": ", e.track);
    absl::StrAppend(&out, ", \"ts\": ", e.start_us, ", \"dur\": ", e.duration_us);
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
