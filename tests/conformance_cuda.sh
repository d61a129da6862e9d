#!/usr/bin/env bash
# Runs the ONNX backend tests (the onnx wheel's node tests and Debian's libonnx-testdata suites)
# with `cleave conformance --device cuda`: every node the CUDA provider claims runs on the GPU
# (or the emulated device), the rest on the CPU. Exits 77 (skipped) when no device is usable.
set -uo pipefail
cleave="$1"
here="$(dirname "$0")"
wheel=$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))')
if [ ! -d "$wheel" ]; then
  echo "onnx wheel node tests not found at $wheel (run scripts/install-deps.sh)" >&2
  exit 1
fi
status=0
for dir in "$wheel" /usr/share/libonnx-testdata/data/{node,simple,pytorch-converted,pytorch-operator}; do
  out=$("$cleave" conformance "$dir" --device cuda --quiet --exclude "$here/conformance_exclusions.txt" 2>&1)
  rc=$?
  if [ $rc -eq 2 ] && grep -q "^cleave conformance: --device cuda:" <<<"$out"; then
    grep "^cleave conformance: --device cuda:" <<<"$out" >&2
    exit 77
  fi
  # The tail: the failures (with their errors) and the counts; warnings of CPU fallbacks omitted.
  grep -v "^SKIP \|^cleave: warning\|^  " <<<"$out"
  echo "  ($dir)"
  [ $rc -eq 0 ] || status=1
done
exit $status
