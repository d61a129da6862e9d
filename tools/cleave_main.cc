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
               "  run MODEL.onnx --input NAME=FILE.pb ... [--output-dir DIR] [--threads N] [--device cpu|cuda|auto]\n"
               "                 [--check DIR [--atol A]] [--dim NAME=VALUE] [--no-optimize]\n"
               "                 [--save-optimized FILE.onnx] [--profile TRACE.json [--profile-runs 3]]\n"
               "      run a model on TensorProto inputs and write its outputs as TensorProto files;\n"
               "      --profile repeats the run, timing every node, and prints the time per op type\n"
               "  inspect MODEL.onnx [--optimized] [--dot FILE.dot]\n"
               "      print opsets, op histogram, parameters and inputs/outputs; --optimized shows the\n"
               "      graph after folding and fusion, --dot draws it for Graphviz\n"
               "  conformance DIR... [--filter SUBSTR] [--quiet]\n"
               "      run every ONNX backend test folder under DIR and report\n"
               "      (--exclude FILE lists tests to skip, each with its reason)\n"
               "      'N passed, N failed, N skipped'\n"
               "  train MODEL.onnx --data FILE [--loss cross_entropy|mse] [--optimizer adamw|sgd]\n"
               "        [--lr 3e-4] [--min-lr LR/10] [--weight-decay 0] [--beta1 0.9] [--beta2 0.999]\n"
               "        [--eps 1e-8] [--momentum 0] [--nesterov] [--warmup 0]\n"
               "        [--lr-schedule cosine|linear|constant] [--clip 0] --batch B --seq T --steps N\n"
               "        [--grad-accum K] [--seed S] [--no-shuffle] [--val-fraction 0.1]\n"
               "        [--eval-every E] [--eval-batches 4] [--metrics FILE.jsonl] [--plot FILE.png]\n"
               "        [--checkpoint-dir DIR [--checkpoint-every N] [--keep-checkpoints 3] [--resume]]\n"
               "        [--save-model OUT.onnx] [--save-artifacts DIR] [--freeze NAME|REGEX,...]\n"
               "        [--threads N] [--device cpu|cuda|auto] [--log-every 1] [--exit-at STEP]\n"
               "        [--profile TRACE.json [--profile-steps 3]] [--no-overlap-grad-reduce]\n"
               "        [--no-async-collectives] [--[no-]fuse-attention]\n"
               "      train a causal LM on a token file (.bin: uint16 tokens; anything else: bytes);\n"
               "      --batch is the global batch, --clip 0 and --weight-decay 0 turn those off\n"
               "  partition MODEL.onnx --mesh dp=D,tp=T --batch B --seq T [--tp megatron] [--zero 0|1]\n"
               "        [--bucket-mb 25]\n"
               "        [--loss ...] [--optimizer ...] [--weight-decay W] [--clip C] [--freeze ...] -o PLAN_DIR\n"
               "      per-rank training, eval and optimizer graphs with collectives, plan.json and report.txt;\n"
               "      `cleave inspect PLAN_DIR` summarises a plan\n");
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
  if (cmd == "train") return cleave::tools::TrainCommand(args);
  if (cmd == "partition") return cleave::tools::PartitionCommand(args);
  std::fprintf(stderr, "cleave: unknown command '%s'\n\n", cmd.c_str());
  Usage();
  return 2;
}
