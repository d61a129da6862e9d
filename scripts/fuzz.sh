#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for the given number of
# seconds (default 30):
#   fuzz_onnx_loader  the ONNX loader and shape inference, from the bundled models;
#   fuzz_session      inference sessions (the optimiser, memory planning and one run of the
#                     CPU kernels), from the bundled models and ONNX's node tests;
#   fuzz_training     training (the loss, autodiff, recompute, the optimizer graph and one
#                     step), from the same seeds.
# A crash leaves its input as build-fuzz/crash-* and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_onnx_loader fuzz_session fuzz_training

seed() {  # seed DIR FILES...: copies the model files that exist into DIR
  local dir="$1" i=0
  shift
  mkdir -p "$dir"
  for m in "$@"; do
    [ -f "$m" ] && cp "$m" "$dir/seed_$((i++)).onnx"
  done
  return 0
}
models=(models/*/model.onnx models/*/*/model.onnx)
seed build-fuzz/corpus "${models[@]}" \
  /usr/share/libonnx-testdata/data/node/test_{add,reshape_reduced_dims,slice,layer_normalization_2d_axis0,gather_0,softmax_axis_1,split_equal_parts_1d}/model.onnx
seed build-fuzz/corpus-session "${models[@]}" /usr/share/libonnx-testdata/data/node/*/model.onnx
seed build-fuzz/corpus-training "${models[@]}" /usr/share/libonnx-testdata/data/node/*/model.onnx

for target in fuzz_onnx_loader fuzz_session fuzz_training; do
  corpus=build-fuzz/corpus
  [ "$target" = fuzz_session ] && corpus=build-fuzz/corpus-session
  [ "$target" = fuzz_training ] && corpus=build-fuzz/corpus-training
  echo "== $target, ${secs}s"
  build-fuzz/tests/fuzz/$target "$corpus" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix=build-fuzz/ 2>&1 | tail -n 12
  echo "fuzz: $target, no crash in ${secs}s"
done
