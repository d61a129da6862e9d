// The cleave command-line tool (tools/): dispatches to subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/commands.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: cleave <command> [options]\n"
               "\n"
               "commands:\n"
               "  run MODEL.onnx --input NAME=FILE.pb ... [--output-dir DIR] [--threads N]\n"
               "                 [--check DIR [--atol A]] [--dim NAME=VALUE] [--no-optimize]\n"
               "                 [--save-optimized FILE.onnx]\n"
               "      run a model on TensorProto inputs and write its outputs as TensorProto files\n"
               "  inspect MODEL.onnx [--optimized] [--dot FILE.dot]\n"
               "      print opsets, op histogram, parameters and inputs/outputs; --optimized shows the\n"
               "      graph after folding and fusion, --dot draws it for Graphviz\n"
               "  conformance DIR... [--filter SUBSTR] [--quiet]\n"
               "      run every ONNX backend test folder under DIR and report\n"
               "      (--exclude FILE lists tests to skip, each with its reason)\n"
               "      'N passed, N failed, N skipped'\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage();
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  cleave::tools::Args args(argv + 2, argv + argc);
  if (cmd == "run") return cleave::tools::RunCommand(args);
  if (cmd == "inspect") return cleave::tools::InspectCommand(args);
  if (cmd == "conformance") return cleave::tools::ConformanceCommand(args);
  std::fprintf(stderr, "cleave: unknown command '%s'\n\n", cmd.c_str());
  Usage();
  return 2;
}
