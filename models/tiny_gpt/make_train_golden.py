#!/usr/bin/env python3
# Writes a reference training run of the tiny GPT (models/tiny_gpt/train_golden/): 20 AdamW
# steps on corpus.txt, the per-step loss/lr/grad-norm trajectory and the final parameters.
# Run with a Python that has torch: `/usr/bin/python3 models/tiny_gpt/make_train_golden.py`.
# The batching, schedule, clipping and optimizer are spelled out in CONFIG and the README so
# another trainer can reproduce them exactly; reruns rewrite byte-identical files.
import argparse
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from export import CONFIG as MODEL_CONFIG  # noqa: E402
from make_grad_golden import build_model  # noqa: E402
import onnx_pb  # noqa: E402

CORPUS = os.path.join(HERE, "corpus.txt")

CONFIG = {
    "corpus": "corpus.txt",
    "tokens": "corpus bytes as int64, vocab 256, no validation split",
    "init": "torch.manual_seed(0) GPT init, equal to the model.onnx initializers",
    "batch": 4,
    "seq": 64,
    "steps": 20,
    "batch_offset": "o = ((step * batch + row) * seq) mod (len(tokens) - seq - 1); "
                    "input = tokens[o:o+seq], label = tokens[o+1:o+seq+1]",
    "loss": "mean cross-entropy over batch*seq positions, float32",
    "optimizer": "AdamW (torch 1.13 single-tensor), all parameters decayed, tied "
                 "wte/lm_head weight is one parameter",
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "weight_decay": 0.1,
    "lr_peak": 1e-3,
    "lr_warmup_steps": 5,
    "lr_total_steps": 20,
    "lr_min": 1e-3 * 0.1,
    "lr_schedule": "step < warmup: peak * (step + 1) / warmup; else progress = "
                   "(step - warmup) / max(1, total - warmup), lr = min + 0.5 * (peak - min) "
                   "* (1 + cos(pi * progress)); computed in double, set before opt.step()",
    "clip_grad_norm": 1.0,
    "clip": "total = ||(||g_i||_2 for each parameter i)||_2 before clipping (recorded as "
            "grad_norm); every grad is multiplied by min(1, max_norm / (total + 1e-6)), "
            "float32",
    "step_order": "zero_grad, forward, loss, backward, clip, set lr, optimizer step",
    "recorded_loss": "the loss of the step's batch before that step's update",
}


def lr_at(step):
    peak = CONFIG["lr_peak"]
    warmup = CONFIG["lr_warmup_steps"]
    total = CONFIG["lr_total_steps"]
    min_lr = CONFIG["lr_min"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * progress))


def batch_at(tokens, step):
    # Consecutive, non-overlapping windows walking through the corpus; the modulus keeps
    # o + seq + 1 <= len(tokens) so every label exists.
    B, T = CONFIG["batch"], CONFIG["seq"]
    span = len(tokens) - T - 1
    offsets = [((step * B + r) * T) % span for r in range(B)]
    inputs = torch.stack([tokens[o:o + T] for o in offsets])
    labels = torch.stack([tokens[o + 1:o + T + 1] for o in offsets])
    return inputs, labels  # (B, T) int64 each


def train(model, tokens):
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr_peak"],
                            betas=tuple(CONFIG["betas"]), eps=CONFIG["eps"],
                            weight_decay=CONFIG["weight_decay"], amsgrad=False,
                            foreach=False, maximize=False, capturable=False)
    steps = []
    for step in range(CONFIG["steps"]):
        inputs, labels = batch_at(tokens, step)
        opt.zero_grad(set_to_none=True)
        logits = model(inputs)  # (B, T, V) float32
        loss = F.cross_entropy(logits.reshape(-1, MODEL_CONFIG.vocab), labels.reshape(-1))
        loss.backward()  # the tied wte.weight gets embedding + LM-head gradients summed
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CONFIG["clip_grad_norm"])
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        steps.append({"step": step, "loss": float(loss.item()), "lr": lr,
                      "grad_norm": float(grad_norm.item())})
        print(f"step {step:2d}  loss {loss.item():.6f}  lr {lr:.6e}  "
              f"grad_norm {grad_norm.item():.6f}")
    return steps


def write_outputs(out_dir, model, steps, corpus_sha):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "trajectory.json"), "w") as f:
        # json writes floats with repr(), the shortest string that round-trips the double.
        json.dump({"config": CONFIG, "steps": steps}, f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "corpus.sha256"), "w") as f:
        f.write(f"{corpus_sha}  corpus.txt\n")
    # One file per exported initializer; named_parameters lists the tied weight once, as
    # wte.weight, which is also its ONNX initializer name.
    inits = onnx_pb.load_initializers(os.path.join(HERE, "model.onnx"))
    params = dict(model.named_parameters())
    for name in inits:
        value = params[name].detach().numpy().astype(np.float32)
        onnx_pb.save_tensor(value, name, os.path.join(out_dir, f"{name}.pb"))
    return len(inits)


def main():
    parser = argparse.ArgumentParser(description="Writes the tiny GPT training golden.")
    parser.add_argument("-o", "--out-dir", default=os.path.join(HERE, "train_golden"))
    args = parser.parse_args()

    torch.set_num_threads(1)  # fixed reduction order, so reruns are bit-identical
    torch.use_deterministic_algorithms(True)
    with open(CORPUS, "rb") as f:
        data = f.read()
    corpus_sha = hashlib.sha256(data).hexdigest()
    tokens = torch.tensor(list(data), dtype=torch.int64)

    model = build_model()
    names = [n for n, _ in model.named_parameters()]
    if "lm_head.weight" in names or "wte.weight" not in names:
        raise SystemExit(f"expected the tied weight once as wte.weight, got {names}")
    steps = train(model, tokens)
    count = write_outputs(args.out_dir, model, steps, corpus_sha)
    print(f"corpus {len(data)} bytes, sha256 {corpus_sha}")
    print(f"wrote trajectory.json, corpus.sha256 and {count} parameter files to {args.out_dir}")


if __name__ == "__main__":
    main()
