#!/usr/bin/env python3
# GPU training benchmark: one training step of a GPT-2 124M-shaped model (12 layers, 768 wide,
# 12 heads, seq 1024, GPT-2's tanh-form GELU) in bf16 on one GPU, cleave against PyTorch in the
# same run:
#   python3 bench/bench_gpu.py [--batch 8] [--iters 10] [--gelu tanh|none]
#       [--cleave-bin build/bench/cleave_bench_train] [--profile-dir DIR] [--ablate PASS,PASS...]
# Reports ms/step, tokens/s and MFU against the 989 TFLOP/s dense bf16 peak of an H100/H200
# (model FLOPs per token: 6 N + 12 L d T, N the parameters, as PaLM counts them), the same step
# in PyTorch eager and with torch.compile (bf16 autocast, fused AdamW), and a causal attention
# microbenchmark (PyTorch's scaled_dot_product_attention on the cuDNN backend) in TFLOP/s; with
# --ablate, the cleave step once more with those graph passes off. With --profile-dir, also the
# floor of cleave's forward + backward: its graph's products at that peak plus its other bytes at
# 4.8 TB/s (cleave_bench_train --traffic), beside the measured TrainStep.
import argparse
import inspect
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "models"))
sys.path.insert(0, os.path.join(REPO, "models", "tiny_gpt"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpt import GPT, GPTConfig, parameter_count  # noqa: E402

PEAK_BF16 = 989e12
PEAK_BYTES = 4.8e12  # the H200's HBM3e bandwidth


def build_model(args):
    torch.manual_seed(args.seed)
    return GPT(GPTConfig(vocab=args.vocab, context=args.seq, layers=args.layers, width=args.width,
                         heads=args.heads), gelu_approximate=args.gelu).train()


def export(model, path, vocab):
    """A training export (every parameter an initializer, dynamic batch and seq) with the
    TorchScript exporter, which keeps TrainingMode.TRAINING."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kwargs = dict(opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                  do_constant_folding=False, input_names=["input_ids"], output_names=["logits"],
                  dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    tmp = path + ".tmp"
    torch.onnx.export(model, (torch.randint(0, vocab, (1, 8)),), tmp, **kwargs)
    os.replace(tmp, path)


def flops_per_token(params, args):
    return 6 * params + 12 * args.layers * args.width * args.seq


def torch_step_ms(args, model, tokens, compiled):
    """Median ms of zero_grad + forward (bf16 autocast) + cross-entropy + backward + clip +
    fused AdamW, timed with CUDA events."""
    dev = torch.device("cuda")
    model = model.to(dev)
    step_model = torch.compile(model) if compiled else model
    inputs = torch.from_numpy(tokens[:, :-1].copy()).to(dev)
    labels = torch.from_numpy(tokens[:, 1:].copy()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=True)
    times, losses = [], []
    for i in range(args.warmup + args.iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        end.record()
        torch.cuda.synchronize()
        losses.append(float(loss.item()))
        if i >= args.warmup:
            times.append(start.elapsed_time(end))
    return float(np.median(times)), losses


def attention_tflops(args):
    """Causal attention at the model's shape: forward, and forward + backward, in TFLOP/s
    (4 B H T^2 D multiply-adds counted as FLOPs, halved for the causal mask; backward 2.5x)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, H, T, D = args.batch, args.heads, args.seq, args.width // args.heads
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    fwd_flops = 4 * B * H * T * T * D / 2
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                for _ in range(3):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                torch.cuda.synchronize()
                n = 20
                t0 = time.perf_counter()
                for _ in range(n):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.cuda.synchronize()
                fwd = (time.perf_counter() - t0) / n
                t0 = time.perf_counter()
                for _ in range(n):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
                torch.cuda.synchronize()
                both = (time.perf_counter() - t0) / n
            out[name] = {"fwd_tflops": fwd_flops / fwd / 1e12, "fwd_bwd_tflops": 3.5 * fwd_flops / both / 1e12}
        except Exception as e:  # a backend this build or device lacks
            out[name] = {"error": str(e).splitlines()[0][:200]}
    return out


def run_cleave(args, path, tokens_path, disabled=None):
    """One cleave_bench_train run; `disabled`: passes to skip (CLEAVE_DISABLED_OPTIMIZERS), for the
    ablation run, which is not profiled."""
    cmd = [args.cleave_bin, path, "--device", "cuda", "--precision", args.precision, "--batch", str(args.batch),
           "--seq", str(args.seq), "--warmup", str(args.warmup), "--iters", str(args.iters), "--tokens",
           tokens_path, "--threads", str(min(8, os.cpu_count() or 1)), "--lr", repr(args.lr)]
    profile = args.profile_dir and not disabled
    if profile:  # one more step after the timed ones, each node's stream time
        os.makedirs(args.profile_dir, exist_ok=True)
        cmd += ["--profile", os.path.join(args.profile_dir, "cleave-profile.json"),
                "--traffic", os.path.join(args.profile_dir, "cleave-traffic.txt")]
    # The C++ binary's own libraries (a bundle's, the CUDA wheels') are for it alone, not for
    # this process's torch: scripts/gpu-check.sh passes them in CLEAVE_LD_LIBRARY_PATH.
    env = dict(os.environ)
    if os.environ.get("CLEAVE_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["CLEAVE_LD_LIBRARY_PATH"]
    if disabled:
        env["CLEAVE_DISABLED_OPTIMIZERS"] = ",".join(x for x in [env.get("CLEAVE_DISABLED_OPTIMIZERS"), disabled] if x)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.cleave_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{args.cleave_bin} did not finish within {args.cleave_timeout} s"}
    except OSError as e:
        return {"error": f"{args.cleave_bin}: {e}"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip() or f"exit status {proc.returncode}")[-2000:]}
    if profile:  # the profile's summary table, which cleave_bench_train prints to stderr
        with open(os.path.join(args.profile_dir, "cleave-profile.txt"), "w") as f:
            f.write(proc.stderr)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"no result line in the output: {proc.stdout[-500:]!r}"}


def main():
    p = argparse.ArgumentParser(description="cleave vs PyTorch: a GPT-2 124M training step on one GPU")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gelu", default="tanh", choices=["none", "tanh"],
                   help="the MLP's GELU: tanh (GPT-2's and llm.c's, which cuBLASLt's epilogues form) or erf")
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--cache-dir", default="/tmp/cleave-bench-gpu")
    p.add_argument("--cleave-bin", default=os.path.join(REPO, "build", "bench", "cleave_bench_train"))
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile run")
    p.add_argument("--cleave-timeout", type=int, default=240, help="seconds the cleave run may take")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--profile-dir", help="profile one more cleave step: cleave-profile.json (a Chrome trace with "
                                         "the device stream's track), cleave-profile.txt (its summary) and cleave-traffic.txt "
                                         "(the training graph's bytes and FLOPs per op type, and the floor they imply) here")
    p.add_argument("--ablate", help="comma-separated pass names: after the others, time cleave once more with "
                                    "these passes off (CLEAVE_DISABLED_OPTIMIZERS), to see what they give")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu: torch sees no CUDA device")

    model = build_model(args)
    params = parameter_count(model)
    path = os.path.join(args.cache_dir, f"gpt_l{args.layers}_c{args.width}_h{args.heads}_v{args.vocab}"
                                        f"_ctx{args.seq}_seed{args.seed}_gelu{args.gelu}_train.onnx")
    if not os.path.exists(path):
        t0 = time.time()
        export(model, path, args.vocab)
        print(f"exported {path} in {time.time() - t0:.1f} s", flush=True)
    rng = np.random.default_rng(args.seed)
    tokens = rng.integers(0, args.vocab, size=(args.batch, args.seq + 1), dtype=np.int64)
    tokens_path = os.path.join(args.cache_dir, f"tokens_b{args.batch}_t{args.seq}.bin")
    tokens.tofile(tokens_path)

    fpt = flops_per_token(params, args)
    tokens_per_step = args.batch * args.seq
    result = {"device": torch.cuda.get_device_name(0), "params": params, "flops_per_token": fpt,
              "batch": args.batch, "seq": args.seq, "precision": args.precision, "gelu": args.gelu,
              "peak_flops": PEAK_BF16}
    rows = [f"{result['device']}: GPT {args.layers}x{args.width}x{args.heads}, {params / 1e6:.1f}M parameters, "
            f"batch {args.batch} x seq {args.seq}, {args.precision}, {'tanh' if args.gelu == 'tanh' else 'erf'} GELU"]

    def save():  # after every phase, so that a run stopped at its time limit keeps what it measured
        result["rows"] = rows
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(result, f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    def describe(name, ms):
        tps = tokens_per_step / (ms / 1e3)
        mfu = fpt * tps / PEAK_BF16
        return tps, mfu, f"{name}: {ms:.1f} ms/step, {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}%"

    c = run_cleave(args, path, tokens_path)
    result["cleave"] = c
    if "error" in c:
        rows.append(f"cleave: FAILED: {c['error'].splitlines()[-1] if c['error'] else ''}")
    else:
        _, c_mfu, text = describe("cleave", c["median_ms"])
        result["cleave_mfu"] = c_mfu
        rows.append(text + f" (loss {c['first_loss']:.3f} -> {c['last_loss']:.3f})")
        if "graph_mb" in c:  # the training graph's arithmetic (cleave-traffic.txt): a floor, not a target
            mb = c["graph_product_mb"]
            floor_ms = 1e3 * (c["graph_product_gflop"] * 1e9 / PEAK_BF16 + (c["graph_mb"] - mb) * 1e6 / PEAK_BYTES)
            rows.append(f"cleave forward + backward floor: {c['graph_product_gflop'] / 1e3:.2f} TFLOP of products at "
                        f"{PEAK_BF16 / 1e12:.0f} TFLOP/s + {(c['graph_mb'] - mb) / 1e3:.1f} GB of other traffic at "
                        f"{PEAK_BYTES / 1e12:.1f} TB/s = {floor_ms:.1f} ms (TrainStep measured "
                        f"{c['train_step_ms']:.1f} ms; attention FLOPs and the optimizer not in it)")
    save()
    for compiled in ([False] if args.no_compile else [False, True]):
        name = "torch.compile" if compiled else "torch eager"
        try:
            ms, losses = torch_step_ms(args, build_model(args), tokens, compiled)
            _, mfu, text = describe(name, ms)
            if "median_ms" in c:
                text += f"; cleave/{name} time ratio {c['median_ms'] / ms:.2f}"
            result[name] = {"median_ms": ms, "mfu": mfu, "losses": losses}
            rows.append(text)
        except Exception as e:
            result[name] = {"error": str(e)[:500]}
            rows.append(f"{name}: FAILED: {str(e).splitlines()[0][:200]}")
        save()
    att = attention_tflops(args)
    result["attention"] = att
    for name, r in att.items():
        if "error" in r:
            rows.append(f"attention ({name}, torch SDPA): unavailable: {r['error']}")
        else:
            rows.append(f"attention ({name}, torch SDPA, causal, B{args.batch} H{args.heads} T{args.seq} "
                        f"D{args.width // args.heads}): fwd {r['fwd_tflops']:.0f} TFLOP/s, "
                        f"fwd+bwd {r['fwd_bwd_tflops']:.0f} TFLOP/s")
    save()
    if args.ablate:
        torch.cuda.empty_cache()  # the device memory PyTorch's allocator still holds, for cleave's run
        a = run_cleave(args, path, tokens_path, disabled=args.ablate)
        result["cleave_ablated"] = dict(a, disabled=args.ablate)
        if "error" in a:
            rows.append(f"cleave without {args.ablate}: FAILED: {a['error'].splitlines()[-1] if a['error'] else ''}")
        else:
            _, a_mfu, text = describe(f"cleave without {args.ablate}", a["median_ms"])
            if "median_ms" in c:
                text += f"; with them {a['median_ms'] / c['median_ms']:.2f}x faster"
            rows.append(text)
        save()
    for r in rows:
        print(r, flush=True)
    if "error" in c:
        sys.exit(1)  # the comparison is meaningless without cleave's figures


if __name__ == "__main__":
    main()
