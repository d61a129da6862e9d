#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU (sm_90: H100/H200):
#   1. configure and build the CUDA provider, its tests and the benchmark for sm_90
#      (skipped with --prebuilt BUNDLE: binaries packed elsewhere, see --bundle);
#   2. run every test labelled gpu, each in its own process (the CUDA kernels against the CPU
#      kernels, the provider's placement, memory and training-trajectory checks, NCCL), within
#      GPU_CHECK_TEST_SECONDS (300);
#   3. run the GPU benchmark within GPU_CHECK_BENCH_SECONDS (280) (bench/bench_gpu.py: a
#      GPT-2 124M training step in bf16 with MFU, PyTorch eager and torch.compile on the same
#      step, an attention microbenchmark, and the cleave step again with the passes named in
#      GPU_CHECK_ABLATE off: the attention layouts, the vocabulary padding, the bf16 logits,
#      the accumulation and bias gradients in the products, the residual gradients' bf16
#      copies and the bf16 products the LayerNorms read by default; GPU_CHECK_ABLATE= skips
#      that run);
#   4. write a summary (gpu-check-summary.txt, in $OUT when set, else in the build folder), with
#      the busiest op types of one profiled cleave step on the device stream (the trace,
#      cleave-profile.json, opens in Perfetto).
# It aims to finish in under 8 minutes on one H200. The C++ binaries find the CUDA runtime,
# cuBLASLt, cuDNN and NCCL in the toolkit or in the nvidia-* Python wheels.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--prebuilt BUNDLE] [--skip-bench] [--bench-iters N]
#   scripts/gpu-check.sh --bundle build-gpu/cleave-gpu.tar.xz   # build for sm_90 and pack the
#       binaries and the non-system shared libraries they need (stripped), for a GPU machine
#       without cleave's build dependencies; run it there (in the same checkout, the bundle
#       carried along) with --prebuilt build-gpu/cleave-gpu.tar.xz
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
  local targets=(cleave_cuda_tests cleave_bench_train)
  if grep -q cleave_nccl_tests "$build/build.ninja" 2>/dev/null; then targets+=(cleave_nccl_tests); fi
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
}

if [ -n "$bundle" ]; then
  configure_and_build || { echo "gpu-check: build failed" >&2; exit 1; }
  stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  bins=("$build/tests/cleave_cuda_tests" "$build/bench/cleave_bench_train")
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
  tar -C "$unpacked" -xJf "$prebuilt" || { say "gpu-check: cannot unpack $prebuilt"; exit 1; }
  prebuilt="$unpacked"
fi
export CLEAVE_SOURCE_DIR="$repo"
# Libraries for the C++ binaries alone (not for python3's torch): the bundle's, the toolkit's,
# and the CUDA wheels' (cudart, cublasLt, nvrtc, cuDNN, NCCL: nvidia/*/lib and nvidia/cu13/lib).
ld=""
add_ld() { if [ -d "$1" ]; then ld="${ld:+$ld:}$1"; fi; }
if [ -n "$prebuilt" ]; then
  if [ ! -d "$prebuilt/bin" ]; then
    say "build: FAILED: --prebuilt $prebuilt is neither a bundle (made with --bundle) nor its unpacked folder"
    exit 1
  fi
  tests="$prebuilt/bin" bench_bin="$prebuilt/bin/cleave_bench_train"
  add_ld "$prebuilt/lib"
  say "build: prebuilt ($prebuilt)"
else
  if configure_and_build >>"$log" 2>&1; then say "build: ok (sm_90, $(( $(date +%s) - start )) s)"
  else say "build: FAILED (see $log)"; exit 1; fi
  tests="$build/tests" bench_bin="$build/bench/cleave_bench_train"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do add_ld "$d"; done
wheel_libs=$(python3 -c '
import os
try:
    import nvidia
except ImportError:
    raise SystemExit
for base in nvidia.__path__:
    for root, _, files in os.walk(base):
        if os.path.basename(root) == "lib" and any(".so" in f for f in files):
            print(root)
' 2>/dev/null || true)
for d in $wheel_libs; do add_ld "$d"; done
if [ -n "${LD_LIBRARY_PATH:-}" ]; then ld="${ld:+$ld:}$LD_LIBRARY_PATH"; fi
say "loader path: ${ld:-(none)}"
export CLEAVE_LD_LIBRARY_PATH="$ld"  # bench_gpu.py hands it to cleave_bench_train
# A library the binaries link and this machine lacks would fail every test at once: say which.
for b in "$tests/cleave_cuda_tests" "$tests/cleave_nccl_tests" "$bench_bin"; do
  [ -x "$b" ] || continue
  missing=$(LD_LIBRARY_PATH="$ld" ldd "$b" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
  if [ -n "$missing" ]; then say "$(basename "$b"): missing libraries: $missing"; fi
done

# 2. The gpu tests, each in a process of its own (a crash or a sticky CUDA error then costs one
# test, not the rest), within a time budget that leaves the benchmark its share. A skip means
# no usable device and fails the check.
status=0
budget_end=$(( start + ${GPU_CHECK_TEST_SECONDS:-300} ))
run_tests() {
  local exe="$1" per_test="$2" optional="${3:-}"
  if [ ! -x "$exe" ]; then
    say "$(basename "$exe"): not built${optional:+ ($optional)}"
    if [ -z "$optional" ]; then status=1; fi
    return
  fi
  local names passed=0 failed=0 skipped=0 unrun=0
  names=$(cd "$repo" && LD_LIBRARY_PATH="$ld" timeout 60 "$exe" --gtest_list_tests 2>>"$log" |
          awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}')
  if [ -z "$names" ]; then
    say "$(basename "$exe"): cannot list its tests (see $log)"
    status=1
    return
  fi
  for t in $names; do
    if [ "$(date +%s)" -ge "$budget_end" ]; then unrun=$((unrun + 1)); continue; fi
    local out rc why
    out=$(cd "$repo" && LD_LIBRARY_PATH="$ld" timeout "$per_test" "$exe" --gtest_filter="$t" 2>&1); rc=$?
    { echo "=== $t (exit $rc)"; echo "$out"; } >>"$log"
    echo "$out" | grep -m1 -E '^(cuDNN fused attention|cuBLASLt bias-gradient epilogue|cuBLASLt GELU-input epilogues|largest relative loss difference from the CPU)' | tee -a "$summary" >/dev/null
    if [ "$rc" -eq 0 ] && echo "$out" | grep -q '^\[  PASSED  \] 1 test'; then
      passed=$((passed + 1))
    elif [ "$rc" -eq 0 ] && echo "$out" | grep -q '^\[  SKIPPED \] 1 test'; then
      skipped=$((skipped + 1))
      if [ "$skipped" -eq 1 ]; then
        echo "$out" | grep -A1 -m1 ': Skipped$' | tail -1 | sed "s/^/  $t skipped: /" | tee -a "$summary" >/dev/null
      fi
    else
      failed=$((failed + 1))
      why=$(echo "$out" | grep -m1 -E 'Failure|rror|Expected' | cut -c1-200)
      if [ "$rc" -eq 124 ]; then why="timed out after $per_test s"
      elif [ "$rc" -ge 128 ]; then why="killed by signal $((rc - 128))${why:+; $why}"; fi
      say "  FAILED $t: ${why:-exit $rc}"
    fi
  done
  local note=""
  if [ "$unrun" -gt 0 ]; then note=", $unrun not run (time budget)"; fi
  say "$(basename "$exe"): $passed passed, $failed failed, $skipped skipped$note"
  if [ "$failed" -ne 0 ] || [ "$skipped" -ne 0 ] || [ "$unrun" -ne 0 ] || [ "$passed" -eq 0 ]; then status=1; fi
}
run_tests "$tests/cleave_cuda_tests" 90
run_tests "$tests/cleave_nccl_tests" 60 "the build found no NCCL"

# 3. The benchmark.
if [ "$skip_bench" -eq 0 ]; then
  bench_json="$summary_dir/gpu-bench.json"
  rm -f "$bench_json"
  bench_ok=1
  PYTHONUNBUFFERED=1 timeout "${GPU_CHECK_BENCH_SECONDS:-280}" python3 "$repo/bench/bench_gpu.py" \
    --cleave-bin "$bench_bin" --iters "$bench_iters" --json "$bench_json" --profile-dir "$summary_dir" \
    --ablate "${GPU_CHECK_ABLATE-AttentionLayoutFusion,ClassPadding,LowPrecisionScores,GradientAccumulationFusion,EmbeddingGradientAccumulation,BiasGradientFusion,LayerNormGradCastFusion,LowPrecisionNormInputs,GeluEpilogueFusion}" \
    >>"$log" 2>&1 || bench_ok=0
  if [ "$bench_ok" -eq 0 ]; then status=1; fi
  if [ -f "$bench_json" ]; then
    say "bench:$([ "$bench_ok" -eq 1 ] || echo " FAILED (see $log)")"
    python3 -c '
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    print("  " + row)
' "$bench_json" | tee -a "$summary"
  else
    say "bench: FAILED (see $log)"
    tail -20 "$log" | tee -a "$summary" >/dev/null
  fi
  # Where the step's device time goes: the busiest op types on the stream, and the tracks.
  if [ -f "$summary_dir/cleave-profile.txt" ]; then
    say "profile of one cleave step (cleave-profile.json, cleave-profile.txt), busiest on the device stream:"
    grep -E ' stream ' "$summary_dir/cleave-profile.txt" | grep -v '^track' | head -15 | sed 's/^/  /' | tee -a "$summary"
    grep '^track' "$summary_dir/cleave-profile.txt" | sed 's/^/  /' | tee -a "$summary"
  fi
  # The slowest single nodes on the device stream (the vocabulary's products, attention, the loss).
  if [ -f "$summary_dir/cleave-profile.json" ]; then
    say "slowest nodes on the device stream:"
    python3 - "$summary_dir/cleave-profile.json" <<'PY' 2>>"$log" | tee -a "$summary"
import collections, json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
streams = {e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
           and "stream" in e.get("args", {}).get("name", "")}
total = collections.defaultdict(float)
op = {}
for e in events:
    if e.get("ph") == "X" and e.get("tid") in streams:
        total[e["name"]] += e.get("dur", 0)
        op[e["name"]] = e.get("cat", "")
busy = sum(total.values()) or 1
for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:12]:
    print(f"  {us / 1000:8.3f} ms {100 * us / busy:5.1f}%  {op[name]:<28} {name}")
PY
  fi
fi
say "total $(( $(date +%s) - start )) s; $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
