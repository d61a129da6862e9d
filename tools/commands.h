// Subcommands of the cleave executable (tools/). Each takes argv after the subcommand name
// and returns the process exit code; errors are printed to stderr by the command itself.
#pragma once

#include <string>
#include <vector>

namespace cleave::tools {

using Args = std::vector<std::string>;

int RunCommand(const Args& args);          // cleave run MODEL --input NAME=FILE.pb --output-dir DIR
int InspectCommand(const Args& args);      // cleave inspect MODEL
int ConformanceCommand(const Args& args);  // cleave conformance DIR...
int TrainCommand(const Args& args);        // cleave train MODEL --data FILE ...
int PartitionCommand(const Args& args);    // cleave partition MODEL --mesh ... -o PLAN_DIR

}  // namespace cleave::tools
