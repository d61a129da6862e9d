#!/usr/bin/env bash
# The demo: installs dependencies, builds, then shows cleave on the bundled tiny GPT:
# what the model holds, a run whose logits are checked against PyTorch's, and a picture of
# the optimised graph.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
M=models/tiny_gpt
echo "== cleave inspect $M/model.onnx"
build/tools/cleave inspect $M/model.onnx
echo
echo "== cleave run (logits checked against the PyTorch golden file)"
mkdir -p out/demo
build/tools/cleave run $M/model.onnx --input input_ids=$M/test_data_set_0/input_0.pb \
  --output-dir out/demo --check $M/test_data_set_0 --atol 1e-4
echo
echo "== the graph cleave runs after folding and fusion, drawn with Graphviz"
build/tools/cleave inspect $M/model.onnx --optimized --dot out/demo/tiny_gpt.dot | tail -n 3
dot -Tsvg out/demo/tiny_gpt.dot -o out/demo/tiny_gpt.svg
echo "picture: out/demo/tiny_gpt.svg"
echo
echo "outputs written to out/demo/"
