#!/usr/bin/env bash
# GPT-2 small (124M) inference benchmark: cleave against onnxruntime at 2 threads,
# batch 1 and 8, seq 128. Generates the model into /tmp on first use (needs a Python with
# torch: TORCH_PYTHON, default /usr/bin/python3); the driver needs onnxruntime (PYTHON).
# Extra arguments go to bench_inference.py, e.g. --iters 20 or --no-cleave.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="${CLEAVE_BENCH_MODEL:-/tmp/cleave-bench/gpt2_124m.onnx}"
torch_python="${TORCH_PYTHON:-/usr/bin/python3}"
python="${PYTHON:-python3}"

if [[ ! -f "$model" ]]; then
  if ! "$torch_python" -c 'import torch' 2>/dev/null; then
    echo "$model is missing and $torch_python has no torch: set TORCH_PYTHON to a Python" \
         "with torch, or CLEAVE_BENCH_MODEL to an existing model" >&2
    exit 1
  fi
  echo "generating $model (GPT-2 124M, random weights; takes a minute or two)"
  "$torch_python" "$repo/models/gen_gpt2.py" -o "$model"
fi

exec "$python" "$repo/bench/bench_inference.py" "$model" --threads 2 --batch 1 8 --seq 128 "$@"
