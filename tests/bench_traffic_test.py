#!/usr/bin/env python3
"""cleave_bench_train --traffic on the bundled tiny GPT (2 layers, width 64, 4 heads, vocab 256):
the products' FLOPs of its training graph on the CPU (attention left unfused with --fuse-attention
off, so every score product counts in full) are exactly 6 N + 12 L d T per token (ANCHORS.md), N the weights that enter
products (the blocks' 12 d^2 each and the tied LM head's V d); the table's rows add up to its
total; the gradient accumulators, reset on each one-micro-batch step, move 8 bytes per parameter;
and bad flags fail with a message."""
import json
import os
import subprocess
import sys
import tempfile

bench, src = sys.argv[1], sys.argv[2]
model = os.path.join(src, "models", "tiny_gpt", "model.onnx")
L, d, V = 2, 64, 256
fails = 0


def check(what, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else f": {detail}"))
    fails += 0 if ok else 1


with tempfile.TemporaryDirectory() as tmp:
    table = os.path.join(tmp, "traffic.txt")
    for batch, seq in [(4, 64), (2, 32)]:
        run = subprocess.run([bench, model, "--batch", str(batch), "--seq", str(seq), "--iters", "0",
                              "--fuse-attention", "off", "--traffic", table], capture_output=True, text=True, timeout=120)
        check(f"--iters 0 --traffic at {batch}x{seq} exits 0", run.returncode == 0, run.stderr[-500:])
        if run.returncode != 0:
            continue
        result = json.loads(run.stdout.strip().splitlines()[-1])
        tokens = batch * seq
        expected = (6 * (L * 12 * d * d + V * d) + 12 * L * d * seq) * tokens
        got = result["graph_product_gflop"] * 1e9
        check(f"product FLOPs {got:.0f} = (6 N + 12 L d T) x tokens = {expected}",
              abs(got - expected) <= 1e3, got)  # the JSON's GFLOP carry 6 decimals
        rows = [line.split() for line in open(table).read().splitlines()[2:]]
        body = [r for r in rows if r[0] != "total"]
        total = [r for r in rows if r[0] == "total"]
        check("the table has a total row", len(total) == 1, rows[-1:])
        if total:
            mb = sum(float(r[-2]) for r in body)
            nodes = sum(int(r[-3]) for r in body)
            check(f"rows add up to the total ({mb:.2f} MB, {nodes} nodes)",
                  abs(mb - float(total[0][-2])) < 0.01 * len(body) and nodes == int(total[0][-3]) == result["graph_nodes"],
                  total[0])
            check("products move less than the whole graph", 0 < result["graph_product_mb"] < result["graph_mb"],
                  result)
            # One micro-batch per step resets every accumulation buffer: each parameter's
            # accumulator reads its float32 gradient and writes its buffer, never reading it.
            acc = [r for r in body if r[0] == "ai.cleave.InPlaceAccumulator"]
            acc_mb = 8 * result["params"] / 1e6
            check(f"the accumulators move 8 bytes per parameter ({acc_mb:.3f} MB)",
                  len(acc) == 1 and abs(float(acc[0][-2]) - acc_mb) < 0.006, acc)
    bad = subprocess.run([bench, model, "--iters", "0"], capture_output=True, text=True, timeout=60)
    check("--iters 0 without --traffic fails, naming the flag",
          bad.returncode != 0 and "--iters" in bad.stderr, bad.stderr)
    unwritable = subprocess.run([bench, model, "--batch", "1", "--seq", "8", "--iters", "0", "--traffic",
                                 os.path.join(tmp, "no", "such", "dir", "t.txt")],
                                capture_output=True, text=True, timeout=60)
    check("an unwritable --traffic path fails, naming it",
          unwritable.returncode != 0 and "no/such/dir" in unwritable.stderr, unwritable.stderr)

print(f"{fails} failure(s)")
sys.exit(1 if fails else 0)
