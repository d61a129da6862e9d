// Minimal leveled logging to stderr (base/). CLEAVE_LOG_LEVEL=0..3 (debug..error).
#pragma once

#include <string_view>

namespace cleave {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
void Log(LogLevel level, std::string_view message);
bool LogEnabled(LogLevel level);

}  // namespace cleave
