#!/usr/bin/env python3
# Training-mode dropout: cleave's kernel (build/bench/cleave_bench_dropout) against PyTorch's
# torch.native_dropout (output and mask, as a training step keeps the mask for the backward) on
# the same float32 activation, thread count and ratio, in the same run. Run with a Python that
# has torch:
#   /usr/bin/python3 bench/bench_dropout.py [--threads 1 2] [--ratio 0.1 0.5] [--shape 8 1024 768]
# Prints the machine, then one row per (threads, ratio): best and median ms of each side and
# cleave's time over PyTorch's (below 1: cleave is faster). Both sides time `--iters` calls
# after `--warmup`, each with a fresh mask.
import argparse
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BIN = os.path.join(REPO, "build", "bench", "cleave_bench_dropout")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def time_torch(torch, shape, ratio, threads, warmup, iters):
    torch.set_num_threads(threads)
    x = torch.randn(*shape)
    ms = []
    kept = 0.0
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        y, mask = torch.native_dropout(x, ratio, True)
        t1 = time.perf_counter()
        if i >= warmup:
            ms.append((t1 - t0) * 1e3)
        kept = mask.float().mean().item()
    ms.sort()
    return {"best_ms": ms[0], "median_ms": ms[len(ms) // 2], "kept_fraction": kept}


def main():
    ap = argparse.ArgumentParser(description="Training-mode dropout: cleave against torch.native_dropout")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--ratio", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--shape", type=int, nargs="+", default=[8, 1024, 768])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cleave-bin", default=DEFAULT_BIN)
    args = ap.parse_args()
    if not os.path.exists(args.cleave_bin):
        sys.exit(f"bench_dropout: {args.cleave_bin} not found (cmake --build build --target cleave_bench_dropout)")
    try:
        import torch
    except ImportError:
        sys.exit(f"bench_dropout: this Python ({sys.executable}) has no torch, the anchor; run it with one that does")
    numel = 1
    for d in args.shape:
        numel *= d
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}; torch {torch.__version__}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"float32 {args.shape} ({numel} elements), warmup {args.warmup}, iters {args.iters}")
    print("| threads | ratio | cleave best / median ms | torch best / median ms | cleave/torch (best) | kept (cleave, torch) |")
    print("|---------|-------|-------------------------|------------------------|---------------------|----------------------|")
    failed = False
    for threads in args.threads:
        for ratio in args.ratio:
            run = subprocess.run([args.cleave_bin, "--threads", str(threads), "--numel", str(numel), "--ratio",
                                  str(ratio), "--warmup", str(args.warmup), "--iters", str(args.iters)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print(f"cleave_bench_dropout failed ({run.returncode}): {run.stderr.strip()}", file=sys.stderr)
                failed = True
                continue
            c = json.loads(run.stdout.strip().splitlines()[-1])
            t = time_torch(torch, args.shape, ratio, threads, args.warmup, args.iters)
            # Both keep about 1 - ratio of the elements; a kernel that dropped the wrong share
            # would not be doing the same work.
            for side, k in (("cleave", c["kept_fraction"]), ("torch", t["kept_fraction"])):
                if abs(k - (1 - ratio)) > 0.01:
                    print(f"{side} kept {k:.4f} of the elements at ratio {ratio}", file=sys.stderr)
                    failed = True
            print(f"| {threads} | {ratio} | {c['best_ms']:.1f} / {c['median_ms']:.1f} | "
                  f"{t['best_ms']:.1f} / {t['median_ms']:.1f} | {c['best_ms'] / t['best_ms']:.2f} | "
                  f"{c['kept_fraction']:.4f}, {t['kept_fraction']:.4f} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
