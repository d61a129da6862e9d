#!/usr/bin/env bash
# Configures and builds cleave with the default preset (CPU + CUDA when nvcc exists), -j2.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset default >/dev/null
cmake --build --preset default
