#!/usr/bin/env bash
# GPT-2 small (124M) training benchmark: cleave against PyTorch eager at 2 threads, batch 4,
# seq 128, AdamW. Exports the model for training into /tmp/cleave-bench on first use. Needs a
# Python with torch (TORCH_PYTHON, default /usr/bin/python3) and the cleave_bench_train target.
# Extra arguments go to bench_train.py, e.g. --iters 5 or --layers 2 --width 128 --heads 4.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
torch_python="${TORCH_PYTHON:-/usr/bin/python3}"

if ! "$torch_python" -c 'import torch' 2>/dev/null; then
  echo "$torch_python has no torch: set TORCH_PYTHON to a Python with torch" >&2
  exit 1
fi

exec "$torch_python" "$repo/bench/bench_train.py" --threads 2 --batch 4 --seq 128 "$@"
