#!/usr/bin/env bash
# Installs everything cleave's build, tests and demo need on Debian 12 (idempotent).
# Debian packages: toolchain, ONNX + protobuf, Abseil, OpenBLAS, oneDNN, GoogleTest, OpenMPI, gnuplot,
# Graphviz, clang (for the libFuzzer target). PyPI: the onnx wheel (newer backend node
# tests), onnxruntime + numpy (the inference benchmark) and the cuDNN frontend headers.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libonnx-dev libonnx-testdata libprotobuf-dev protobuf-compiler
  libabsl-dev libopenblas-dev libgtest-dev libgmock-dev zlib1g-dev openmpi-bin libopenmpi-dev libdnnl-dev
  ocl-icd-opencl-dev
  gnuplot-nox graphviz clang libclang-rt-14-dev
  python3 python3-pip
)

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null

# nvidia-cudnn-frontend: the cuDNN frontend's C++ headers, for the CUDA provider's fused attention.
PY_PACKAGES=(onnx==1.17.0 onnxruntime numpy nvidia-cudnn-frontend==1.32.0)
if ! python3 -c "import onnx, onnxruntime, numpy, sysconfig, os; assert onnx.__version__ == '1.17.0'
assert os.path.exists(os.path.join(sysconfig.get_paths()['purelib'], 'include', 'cudnn_frontend.h'))" 2>/dev/null; then
  python3 -m pip install -q "${PY_PACKAGES[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${PY_PACKAGES[@]}"
fi
echo "install-deps: done"
