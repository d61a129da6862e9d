#!/usr/bin/env python3
# Training benchmark: cleave against PyTorch eager on the same GPT-2-shaped model, batch,
# sequence and thread count. Run with a Python that has torch:
#   /usr/bin/python3 bench/bench_train.py [--threads 2] [--batch 4] [--seq 128] [--precision bf16]
# PyTorch is the anchor measured in the same run. Each side runs in a fresh process of its
# own: PyTorch in this script started as a worker, cleave in build/bench/cleave_bench_train
# on the ONNX export of the very same weights; both train on the same token batch.
import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BIN = os.path.join(REPO, "build", "bench", "cleave_bench_train")
sys.path.insert(0, os.path.join(REPO, "models"))
sys.path.insert(0, os.path.join(REPO, "models", "tiny_gpt"))
# The environment as the user set it. cleave runs with it unchanged: it picks its OpenBLAS
# core itself (kernels/cpu/gemm.cc), and its bf16 products (oneDNN) run one OpenMP thread per
# share of its own pool, so no OpenMP setting matters to it.
USER_ENV = dict(os.environ)
# PyTorch set-ups, each added to the environment of its worker. OMP_WAIT_POLICY=PASSIVE puts
# torch's idle OpenMP threads to sleep at once instead of spinning, which on a machine with as
# many cores as threads otherwise takes the cores from OpenBLAS's own threads in every matmul.
TORCH_ENVS = {"default": {}, "omp-passive": {"OMP_WAIT_POLICY": "PASSIVE"}}


def pin_openblas_core():
    """OpenBLAS 0.3.21 (Debian 12), which this torch calls for float32 matmuls, does not know
    Sapphire Rapids and falls back to its SSE3 'Prescott' kernels, about 4x slower. cleave
    names the matching core when that happens; name the same one here by the same rule, before
    numpy or torch load OpenBLAS, so both sides multiply with the same kernels. A core the
    user set in OPENBLAS_CORETYPE is kept."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f
                          if line.startswith("flags")), set())
    except OSError:
        return
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        os.environ["OPENBLAS_CORETYPE"] = "Haswell"


pin_openblas_core()
import numpy as np  # noqa: E402  (numpy and torch load OpenBLAS: after the core is named)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpt import GPT, GPTConfig, parameter_count  # noqa: E402
from export import check_initializer_names  # noqa: E402  (models/tiny_gpt/export.py)


def openblas_core():
    try:
        blas = ctypes.CDLL("libopenblas.so.0")  # the copy torch loaded, if it uses OpenBLAS
    except OSError:
        return "none"
    blas.openblas_get_corename.restype = ctypes.c_char_p
    return blas.openblas_get_corename().decode()


def set_openblas_threads(n):
    # torch.set_num_threads sizes torch's OpenMP pool; OpenBLAS has threads of its own.
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(n)
    except OSError:
        pass


def machine_description():
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}, "
            f"torch {torch.__version__} (OpenBLAS core {openblas_core()}), numpy {np.__version__}")


def build_model(args):
    # As models/gen_gpt2.py does: the seed, then the model, so the weights are a function of
    # (config, seed) and the cached export holds the same ones.
    torch.manual_seed(args.seed)
    cfg = GPTConfig(vocab=args.vocab, context=args.context, layers=args.layers,
                    width=args.width, heads=args.heads)
    return GPT(cfg, gelu_approximate=args.gelu).train()


def model_path(args):
    if args.model:
        return args.model
    name = (f"gpt_l{args.layers}_c{args.width}_h{args.heads}_v{args.vocab}_ctx{args.context}"
            f"_seed{args.seed}{'_gelutanh' if args.gelu == 'tanh' else ''}_train.onnx")
    return os.path.join(args.cache_dir, name)


def export_for_training(model, path, vocab):
    """Training export, as models/tiny_gpt/export.py: TrainingMode.TRAINING and no constant
    folding keep every parameter an initializer named after its state_dict entry (the tied
    LM head stays wte.weight), with dynamic batch and seq axes."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    example = torch.randint(0, vocab, (1, 8), dtype=torch.int64)
    tmp = path + ".tmp"
    start = time.time()
    torch.onnx.export(
        model, (example,), tmp, opset_version=17,
        training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
        input_names=["input_ids"], output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})
    check_initializer_names(model, tmp)
    os.replace(tmp, path)  # only a checked export becomes the cache
    size_mb = os.path.getsize(path) / 2**20
    print(f"wrote {path}: {parameter_count(model)} parameters, {size_mb:.1f} MiB, "
          f"export {time.time() - start:.1f} s")


def summarise(ms):
    p10, median, p90 = np.percentile(ms, [10, 50, 90])
    return {"median_ms": float(median), "p10_ms": float(p10), "p90_ms": float(p90)}


def torch_steps(args, model, tokens):
    """PyTorch eager steps: zero_grad, forward, cross-entropy, backward, clip_grad_norm_,
    AdamW step, each part timed by wall clock (CPU ops run synchronously). bf16: the forward and
    the loss under CPU autocast (bf16 products, float32 weights and optimizer), as cleave's
    --precision bf16."""
    inputs = torch.from_numpy(tokens[:, :-1].copy())  # (B, T)
    labels = torch.from_numpy(tokens[:, 1:].copy())   # (B, T) the next tokens
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay, foreach=args.foreach)
    step_ms, fwd_ms, bwd_ms, opt_ms, losses = [], [], [], [], []
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = model(inputs)  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()  # the tied wte.weight sums its embedding and LM-head gradients
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        t3 = time.perf_counter()
        losses.append(float(loss.item()))
        if i < args.warmup:
            continue
        step_ms.append((t3 - t0) * 1e3)
        fwd_ms.append((t1 - t0) * 1e3)
        bwd_ms.append((t2 - t1) * 1e3)
        opt_ms.append((t3 - t2) * 1e3)
    result = summarise(step_ms)
    result.update(fwd_ms=float(np.median(fwd_ms)), bwd_ms=float(np.median(bwd_ms)),
                  opt_ms=float(np.median(opt_ms)), losses=losses)
    return result


def torch_worker(args):
    """The PyTorch side, in its own process: prints one JSON line."""
    threads, batch = args.threads[0], args.batch[0]
    torch.set_num_threads(threads)
    set_openblas_threads(threads)
    tokens = np.fromfile(args.torch_worker, dtype="<i8").reshape(batch, args.seq + 1)
    result = torch_steps(args, build_model(args), tokens)  # fresh weights: the exported ones
    result["openblas_core"] = openblas_core()
    print(json.dumps(result))


def run_json(cmd, env):
    """Runs one side; returns its JSON line, or the error text."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return proc.stderr.strip() or f"exit status {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def common_flags(args, threads, batch):
    return ["--threads", str(threads), "--batch", str(batch), "--seq", str(args.seq),
            "--warmup", str(args.warmup), "--iters", str(args.iters), "--seed", str(args.seed),
            "--lr", repr(args.lr), "--weight-decay", repr(args.weight_decay),
            "--clip", repr(args.clip), "--precision", args.precision]


def bench_torch(args, setup, threads, batch, tokens_path):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", tokens_path,
           "--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
           "--gelu", args.gelu,
           "--vocab", str(args.vocab), "--context", str(args.context)]
    cmd += common_flags(args, threads, batch) + (["--foreach"] if args.foreach else [])
    return run_json(cmd, dict(os.environ, **TORCH_ENVS[setup]))


def bench_cleave(args, path, threads, batch, tokens_path):
    cmd = [args.cleave_bin, path, "--tokens", tokens_path] + common_flags(args, threads, batch)
    return run_json(cmd, USER_ENV)


def fmt(r):
    return f"{r['median_ms']:.1f} ({r['p10_ms']:.1f}-{r['p90_ms']:.1f})"


def run_config(args, path, threads, batch, workdir, tables):
    """Benchmarks one (threads, batch): each torch set-up, then cleave. Adds rows to the
    tables; returns whether every side ran and cleave's losses match."""
    # One (B, T+1) batch of uniform token ids, trained on at every step by both sides.
    tokens = np.random.default_rng(args.seed).integers(0, args.vocab, size=(batch, args.seq + 1),
                                                       dtype=np.int64)
    tokens_path = os.path.join(workdir, "tokens.bin")
    tokens.astype("<i8").tofile(tokens_path)
    refs = {setup: bench_torch(args, setup, threads, batch, tokens_path)
            for setup in args.torch_env}
    cl = None if args.no_cleave else bench_cleave(args, path, threads, batch, tokens_path)
    ok = True
    for side, r in list(refs.items()) + [("cleave", cl)]:
        if isinstance(r, str):
            print(f"{side} failed (threads {threads}, batch {batch}): {r}", file=sys.stderr)
            ok = False
    cl_ok = isinstance(cl, dict)
    tok = batch * args.seq
    key = [str(threads), str(batch), str(args.seq)]
    if cl_ok:
        tables["cleave"].append(key + [fmt(cl), f"{cl['tokens_per_s']:.0f}",
                                       f"{cl['train_step_ms']:.1f}",
                                       f"{cl['optimizer_step_ms']:.1f}",
                                       f"{cl['first_loss']:.4f} -> {cl['last_loss']:.4f}",
                                       f"{cl['peak_rss_mib']:.0f}"])
        ok &= cl["last_loss"] < cl["first_loss"]
    for setup, ref in refs.items():
        if not isinstance(ref, dict):
            continue
        row = key + [setup, fmt(ref), fmt(cl) if cl_ok else "-",
                     f"{cl['median_ms'] / ref['median_ms']:.2f}" if cl_ok else "-",
                     f"{tok / ref['median_ms'] * 1e3:.0f}"]
        split = key + [setup, f"{ref['fwd_ms']:.1f}", f"{ref['bwd_ms']:.1f}",
                       f"{ref['opt_ms']:.1f}", f"{ref['losses'][0]:.4f} -> {ref['losses'][-1]:.4f}"]
        if cl_ok:
            # Same weights, batch and optimizer: the loss trajectories must agree (float32
            # sums in a different order drift apart slowly, hence a tolerance).
            diff = max(abs(a - b) for a, b in zip(ref["losses"], cl["losses"]))
            split.append(f"{diff:.1e}{'' if diff <= args.loss_tol else ' FAIL'}")
            ok &= diff <= args.loss_tol
        else:
            split.append("-")
        tables["ratio"].append(row)
        tables["torch"].append(split)
    return ok


def print_table(header, rows):
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def print_tables(args, tables):
    key = ["threads", "batch", "seq"]
    print_table(key + ["torch set-up", "torch ms (p10-p90)", "cleave ms (p10-p90)",
                       "cleave/torch", "torch tok/s"], tables["ratio"])
    print("\ncleave: TrainStep = forward + loss + backward, OptimizerStep = grad norm, clip, "
          "AdamW (median ms); loss of the first -> last step\n")
    print_table(key + ["cleave ms (p10-p90)", "tok/s", "TrainStep", "OptimizerStep",
                       "loss", "peak RSS MiB"], tables["cleave"])
    print(f"\ntorch: forward + loss, backward, clip + AdamW (median ms); loss of the first -> "
          f"last step; largest per-step loss difference from cleave (tolerance {args.loss_tol})\n")
    print_table(key + ["torch set-up", "forward", "backward", "optimizer", "loss",
                       "loss diff"], tables["torch"])


def parse_args():
    p = argparse.ArgumentParser(description="cleave vs PyTorch eager training step time.")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--context", type=int, default=1024, help="wpe rows (max seq)")
    p.add_argument("--seed", type=int, default=0, help="weights and token ids")
    p.add_argument("--gelu", default="none", choices=["none", "tanh"],
                   help="the MLP's GELU: erf (PyTorch's default) or tanh (GPT-2's)")
    p.add_argument("--model", help="use this training export instead of the cached one (it "
                   "must hold the weights the config and seed give)")
    p.add_argument("--cache-dir", default="/tmp/cleave-bench")
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--batch", type=int, nargs="+", default=[4])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--foreach", action="store_true",
                   help="torch AdamW's multi-tensor path (default: single-tensor, foreach=False)")
    p.add_argument("--torch-env", nargs="+", choices=sorted(TORCH_ENVS),
                   default=["default", "omp-passive"], help="PyTorch set-ups to time")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: mixed precision on both sides (torch's CPU autocast)")
    p.add_argument("--loss-tol", type=float,
                   help="largest accepted per-step loss difference between cleave and torch "
                        "(default 2e-3 in fp32, 3e-2 in bf16, whose roundings differ)")
    p.add_argument("--cleave-bin", default=DEFAULT_BIN)
    p.add_argument("--no-cleave", action="store_true", help="only run PyTorch")
    p.add_argument("--torch-worker", metavar="TOKENS", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.loss_tol is None:
        args.loss_tol = 2e-3 if args.precision == "fp32" else 3e-2
    if args.seq > args.context:
        p.error(f"--seq {args.seq} is longer than the context {args.context}")
    if args.warmup < 2:
        # cleave's first run sizes its buffers and the second first touches the planned arena
        # (page faults); neither is a steady-state step.
        print("note: with --warmup < 2 cleave's timed steps include its first runs",
              file=sys.stderr)
    return args


def main():
    args = parse_args()
    if args.torch_worker:
        torch_worker(args)
        return
    if not args.no_cleave and not os.access(args.cleave_bin, os.X_OK):
        raise SystemExit(f"{args.cleave_bin} not found: build the cleave_bench_train target or "
                         "pass --cleave-bin (or --no-cleave)")
    path = model_path(args)
    if not os.path.exists(path):
        export_for_training(build_model(args), path, args.vocab)

    print(f"machine: {machine_description()}")
    print(f"model: {path} ({args.layers} layers, width {args.width}, {args.heads} heads, "
          f"vocab {args.vocab})")
    print(f"AdamW lr {args.lr} (constant), weight decay {args.weight_decay}, clip {args.clip}; "
          f"torch foreach={args.foreach}; {args.precision}; warmup {args.warmup}, iters {args.iters}; "
          "times are per step, median (p10-p90)\n")
    tables = {"ratio": [], "cleave": [], "torch": []}
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="cleave-bench-") as workdir:
        for threads in args.threads:
            for batch in args.batch:
                all_ok &= run_config(args, path, threads, batch, workdir, tables)
    print_tables(args, tables)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
