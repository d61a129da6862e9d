#!/usr/bin/env bash
# Builds the libFuzzer target for the ONNX loader with clang (ASan + UBSan) and runs it for
# the given number of seconds (default 30) from a seed corpus of real models.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target fuzz_onnx_loader
corpus=build-fuzz/corpus
mkdir -p "$corpus"
i=0
for m in models/*/model.onnx models/*/*/model.onnx /usr/share/libonnx-testdata/data/node/test_{add,reshape_reduced_dims,slice,layer_normalization_2d_axis0,gather_0,softmax_axis_1,split_equal_parts_1d}/model.onnx; do
  [ -f "$m" ] && cp "$m" "$corpus/seed_$((i++)).onnx"
done
build-fuzz/tests/fuzz/fuzz_onnx_loader "$corpus" -max_total_time="$secs" -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 2>&1 | tail -n 12
echo "fuzz: no crash in ${secs}s"
