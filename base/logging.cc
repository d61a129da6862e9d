// Leveled logging (base/).
#include "base/logging.h"

#include <cstdio>
#include <cstdlib>

namespace cleave {

bool LogEnabled(LogLevel level) {
  static const int threshold = [] {
    const char* env = std::getenv("CLEAVE_LOG_LEVEL");
    return env ? std::atoi(env) : 2;
  }();
  return static_cast<int>(level) >= threshold;
}

void Log(LogLevel level, std::string_view message) {
  if (!LogEnabled(level)) return;
  static const char* kNames[] = {"debug", "info", "warning", "error"};
  std::fprintf(stderr, "cleave %s: %.*s\n", kNames[static_cast<int>(level)],
               static_cast<int>(message.size()), message.data());
}

}  // namespace cleave
