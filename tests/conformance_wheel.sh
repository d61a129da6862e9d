#!/usr/bin/env bash
# Runs `cleave conformance` over the backend node tests shipped inside the onnx wheel
# (newer opsets than Debian's libonnx-testdata). The wheel is installed by install-deps.sh.
set -euo pipefail
cleave="$1"
dir=$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))')
if [ ! -d "$dir" ]; then
  echo "onnx wheel node tests not found at $dir (run scripts/install-deps.sh)" >&2
  exit 1
fi
exec "$cleave" conformance "$dir" --quiet --exclude "$(dirname "$0")/conformance_exclusions.txt"
