#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs the whole suite with ctest (unit and
# op tests, ONNX conformance, golden models, CLI and bad-input checks), then the CUDA
# provider's gpu tests over the emulated device (a second build, of those tests only), then a
# short libFuzzer run of the ONNX loader, inference sessions and training.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2
cmake --preset cuda-emulation >/dev/null
cmake --build --preset cuda-emulation
ctest --preset cuda-emulation
bash scripts/fuzz.sh 30
