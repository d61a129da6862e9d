#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs the whole suite with ctest (unit and
# op tests, ONNX conformance, golden models, CLI and bad-input checks), then a short
# libFuzzer run of the ONNX loader.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2
bash scripts/fuzz.sh 30
