#!/usr/bin/env python3
# Inference benchmark: cleave against onnxruntime on the same model, inputs and threads.
# Run with a Python that has onnxruntime and numpy (no torch needed):
#   python3 bench/bench_inference.py MODEL.onnx [--threads 2] [--batch 1 8] [--seq 128]
# onnxruntime is the anchor measured in the same run; cleave runs in its own process via
# build/bench/cleave_bench_inference, and its logits are checked against onnxruntime's.
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BIN = os.path.join(REPO, "build", "bench", "cleave_bench_inference")


def machine_description():
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}, "
            f"onnxruntime {ort.__version__}, numpy {np.__version__}")


def make_feeds(session, batch, seq, seed=0):
    """Token ids (B, T) uniform over the vocab (the logits' last dim); masks all ones, token
    types all zeros, as cleave_bench_inference fills the inputs it does not read from a file."""
    vocab = session.get_outputs()[0].shape[-1]
    if not isinstance(vocab, int):
        raise SystemExit("expected the first output's last dim (the vocab) to be static")
    ids = np.random.default_rng(seed).integers(0, vocab, size=(batch, seq), dtype=np.int64)
    feeds = {}
    for inp in session.get_inputs():
        if inp.type != "tensor(int64)" or len(inp.shape) != 2:
            raise SystemExit(f"input '{inp.name}': expected int64 (batch, seq), got "
                             f"{inp.type} {inp.shape}")
        if "mask" in inp.name:
            feeds[inp.name] = np.ones_like(ids)
        elif "token_type" in inp.name:
            feeds[inp.name] = np.zeros_like(ids)
        else:
            feeds[inp.name] = ids
    return ids, feeds


def summarise(ms):
    p10, median, p90 = np.percentile(ms, [10, 50, 90])
    return {"median_ms": float(median), "p10_ms": float(p10), "p90_ms": float(p90)}


def bench_ort(session, feeds, warmup, iters):
    for _ in range(warmup):
        outputs = session.run(None, feeds)
    ms = []
    for _ in range(iters):
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        ms.append((time.perf_counter() - start) * 1e3)
    return summarise(ms), outputs[0]


def ort_session(model, threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def bench_cleave(args, model, threads, batch, ids, workdir):
    """Runs the C++ driver; returns (its JSON result, its first output) or (error text, None)."""
    ids_path = os.path.join(workdir, "input_ids.bin")
    out_path = os.path.join(workdir, "output.bin")
    ids.astype("<i8").tofile(ids_path)
    cmd = [args.cleave_bin, model, "--threads", str(threads), "--batch", str(batch),
           "--seq", str(args.seq), "--warmup", str(args.warmup), "--iters", str(args.iters),
           "--input-ids", ids_path, "--dump-output", out_path]
    if args.run_into:
        cmd.append("--run-into")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip() or f"exit status {proc.returncode}"), None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    output = np.fromfile(out_path, dtype="<f4").reshape(result["output_shape"])
    os.remove(out_path)
    return result, output


def model_label(path):
    # Committed models are all called model.onnx; their folder says which one it is.
    name = os.path.basename(path)
    if name == "model.onnx":
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return name


def fmt(r):
    return f"{r['median_ms']:.2f} ({r['p10_ms']:.2f}-{r['p90_ms']:.2f})"


def run_config(args, model, threads, batch, workdir):
    """Benchmarks one (threads, batch); returns a table row and whether cleave passed."""
    session = ort_session(model, threads)
    ids, feeds = make_feeds(session, batch, args.seq)
    ort_result, ort_logits = bench_ort(session, feeds, args.warmup, args.iters)
    del session  # free its arena before cleave runs
    row = [model_label(model), str(threads), str(batch), str(args.seq), fmt(ort_result)]
    if args.no_cleave:
        return row + ["-", "-", "-"], True
    cleave, logits = bench_cleave(args, model, threads, batch, ids, workdir)
    if logits is None:
        print(f"cleave failed (threads {threads}, batch {batch}): {cleave}", file=sys.stderr)
        return row + ["error", "-", "-"], False
    if logits.shape != ort_logits.shape:
        print(f"cleave output shape {logits.shape} != onnxruntime {ort_logits.shape}",
              file=sys.stderr)
        return row + [fmt(cleave), "-", "shape mismatch"], False
    err = float(np.max(np.abs(logits.astype(np.float64) - ort_logits)))
    ratio = cleave["median_ms"] / ort_result["median_ms"]
    ok = err <= args.tol
    return row + [fmt(cleave), f"{ratio:.2f}", f"{err:.2e}{'' if ok else ' FAIL'}"], ok


def print_table(rows):
    header = ["model", "threads", "batch", "seq", "ort ms (p10-p90)", "cleave ms (p10-p90)",
              "cleave/ort", "max abs diff"]
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def main():
    parser = argparse.ArgumentParser(description="cleave vs onnxruntime inference latency.")
    parser.add_argument("models", nargs="+", help="ONNX models with int64 (batch, seq) inputs")
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tol", type=float, default=1e-3,
                        help="max abs logit difference accepted between cleave and onnxruntime")
    parser.add_argument("--cleave-bin", default=DEFAULT_BIN)
    parser.add_argument("--run-into", action="store_true", help="time cleave's RunInto")
    parser.add_argument("--no-cleave", action="store_true", help="only run onnxruntime")
    args = parser.parse_args()
    if not args.no_cleave and not os.access(args.cleave_bin, os.X_OK):
        raise SystemExit(f"{args.cleave_bin} not found: build the cleave_bench_inference target "
                         "or pass --cleave-bin (or --no-cleave)")

    print(f"machine: {machine_description()}")
    print(f"warmup {args.warmup}, iters {args.iters}; times are per run, median (p10-p90)\n")
    rows, all_ok = [], True
    with tempfile.TemporaryDirectory(prefix="cleave-bench-") as workdir:
        for model in args.models:
            for threads in args.threads:
                for batch in args.batch:
                    row, ok = run_config(args, model, threads, batch, workdir)
                    rows.append(row)
                    all_ok &= ok
    print_table(rows)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
