#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU (sm_90: H100/H200):
#   1. configure and build the CUDA provider, its tests and the benchmark for sm_90
#      (skipped with --prebuilt DIR: a build folder made elsewhere, see --bundle);
#   2. run every ctest test labelled gpu (the CUDA kernels against the CPU kernels, the
#      provider's placement, memory and training-trajectory checks, NCCL);
#   3. run the GPU benchmark (bench/bench_gpu.py: a GPT-2 124M training step in bf16 with MFU,
#      PyTorch eager and torch.compile on the same step, an attention microbenchmark);
#   4. write a summary (gpu-check-summary.txt, in $OUT when set, else in the build folder).
# It aims to finish in under 8 minutes on one H200.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--prebuilt DIR] [--skip-bench] [--bench-iters N]
#   scripts/gpu-check.sh --bundle FILE.tar.xz   # build for sm_90 and pack the binaries and the
#       non-system shared libraries they need (stripped), for a GPU machine without cleave's
#       build dependencies; run it there with --prebuilt FILE.tar.xz
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build-gpu"
prebuilt="" bundle="" skip_bench=0 bench_iters=10
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    --skip-bench) skip_bench=1; shift ;;
    --bench-iters) bench_iters="$2"; shift 2 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

configure_and_build() {
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCLEAVE_ENABLE_CUDA=ON >/dev/null || return 1
  local targets=(cleave_cuda_tests cleave_bench_train cleave)
  if grep -q cleave_nccl_tests "$build/build.ninja" 2>/dev/null; then targets+=(cleave_nccl_tests); fi
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
}

if [ -n "$bundle" ]; then
  configure_and_build || { echo "gpu-check: build failed" >&2; exit 1; }
  stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  bins=("$build/tests/cleave_cuda_tests" "$build/bench/cleave_bench_train" "$build/tools/cleave")
  [ -x "$build/tests/cleave_nccl_tests" ] && bins+=("$build/tests/cleave_nccl_tests")
  cp "${bins[@]}" "$stage/bin/"
  # tar runs in the stage folder: the bundle's path must not be relative to it.
  mkdir -p "$(dirname "$bundle")"
  bundle="$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")"
  # Shared libraries outside the C runtime and the CUDA/driver stack (those come with the GPU
  # machine's own toolkit and driver).
  for b in "${bins[@]}"; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux)[.-]|libcuda|libcudart|libcublas|libnccl|libnvidia' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  strip --strip-unneeded "$stage"/bin/* "$stage"/lib/* 2>/dev/null
  tar -C "$stage" -cJf "$bundle" bin lib || exit 1
  ls -l "$bundle"
  exit 0
fi

summary_dir="${OUT:-$build}"
mkdir -p "$summary_dir"
summary="$summary_dir/gpu-check-summary.txt"
log="$summary_dir/gpu-check.log"
: > "$log"
start=$(date +%s)
say() { echo "$*" | tee -a "$summary"; }
: > "$summary"
say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if command -v nvidia-smi >/dev/null; then
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
else
  say "nvidia-smi: not found"
fi

if [ -n "$prebuilt" ] && [ -f "$prebuilt" ]; then
  unpacked="${TMPDIR:-/tmp}/cleave-gpu-bundle"
  rm -rf "$unpacked"; mkdir -p "$unpacked"
  tar -C "$unpacked" -xJf "$prebuilt" || { echo "gpu-check: cannot unpack $prebuilt" >&2; exit 1; }
  prebuilt="$unpacked"
fi
export CLEAVE_SOURCE_DIR="$repo"
if [ -n "$prebuilt" ]; then
  bin="$prebuilt/bin"
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "build: prebuilt ($prebuilt)"
else
  bin=""
  if configure_and_build >>"$log" 2>&1; then say "build: ok (sm_90, $(( $(date +%s) - start )) s)"
  else say "build: FAILED (see $log)"; exit 1; fi
fi
# NCCL from the Python wheel when the toolkit has none on the loader path.
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)
[ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_dir"
# cuDNN (loaded at run time by the fused attention) from the Python wheel likewise.
cudnn_dir=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(os.path.dirname(nvidia.cudnn.__file__), "lib"))' 2>/dev/null || true)
[ -n "$cudnn_dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cudnn_dir"

# 2. The gpu tests (each binary's tests run; a skip means no usable device and fails the check).
status=0
run_tests() {
  local exe="$1"
  [ -x "$exe" ] || return 0
  local out
  out=$(cd "$repo" && timeout 300 "$exe" --gtest_brief=0 2>&1); local rc=$?
  echo "$out" >>"$log"
  # gtest's closing counts: "[  PASSED  ] N tests.", "[  SKIPPED ] N tests, listed below:", ...
  count() { echo "$out" | sed -n "s/^\[  $1 *\] \([0-9]*\) tests\{0,1\}[.,].*/\1/p" | tail -1; }
  local passed failed skipped
  passed=$(count PASSED); failed=$(count FAILED); skipped=$(count SKIPPED)
  passed=${passed:-0}; failed=${failed:-0}; skipped=${skipped:-0}
  say "$(basename "$exe"): $passed passed, $failed failed, $skipped skipped (exit $rc)"
  # Which failed, and why the first skip skipped.
  echo "$out" | grep -E '^\[  FAILED  \] [A-Za-z].*\(' | head -20 | tee -a "$summary" >/dev/null
  [ "$skipped" -gt 0 ] && echo "$out" | grep -A1 -m1 ': Skipped$' | tail -1 | sed 's/^/  skipped: /' | tee -a "$summary" >/dev/null
  # Whether attention ran on cuDNN's fused kernels (the bf16 attention test says).
  echo "$out" | grep -m1 '^cuDNN fused attention:' | tee -a "$summary" >/dev/null
  if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$skipped" -ne 0 ] || [ "$passed" -eq 0 ]; then status=1; fi
}
if [ -n "$bin" ]; then
  run_tests "$bin/cleave_cuda_tests"
  run_tests "$bin/cleave_nccl_tests"
else
  run_tests "$build/tests/cleave_cuda_tests"
  run_tests "$build/tests/cleave_nccl_tests"
fi

# 3. The benchmark.
if [ "$skip_bench" -eq 0 ]; then
  bench_bin="${bin:-$build/bench}/cleave_bench_train"
  bench_json="$summary_dir/gpu-bench.json"
  if PYTHONUNBUFFERED=1 timeout 420 python3 "$repo/bench/bench_gpu.py" --cleave-bin "$bench_bin" \
       --iters "$bench_iters" --json "$bench_json" >>"$log" 2>&1; then
    say "bench:"
    python3 - "$bench_json" <<'EOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["rows"]:
    print("  " + row)
EOF
  else
    say "bench: FAILED (see $log)"
    tail -20 "$log" | tee -a "$summary" >/dev/null
    status=1
  fi
fi
say "total $(( $(date +%s) - start )) s; $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
