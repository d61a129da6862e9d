#!/usr/bin/env python3
# Generates a GPT-2-shaped ONNX model with random (seeded) weights for inference benchmarks.
# Run with a Python that has torch. The default is GPT-2 small (124M parameters, about
# 650 MB on disk: the tied embedding is stored twice, once folded into the LM head's
# transposed MatMul weight). Write it outside the repository, e.g.
#   /usr/bin/python3 models/gen_gpt2.py -o /tmp/cleave-bench/gpt2_124m.onnx
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, GPTConfig, parameter_count  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description="Export a GPT-2-shaped model to ONNX.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--seq", type=int, default=1024, help="context length (wpe rows)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gelu", default="none", choices=["none", "tanh"],
                        help="the MLP's GELU: erf (PyTorch's default) or tanh (GPT-2's)")
    parser.add_argument("-o", "--output", required=True, help="path of the .onnx to write")
    args = parser.parse_args()

    cfg = GPTConfig(vocab=args.vocab, context=args.seq, layers=args.layers, width=args.width,
                    heads=args.heads)
    torch.manual_seed(args.seed)
    model = GPT(cfg, gelu_approximate=args.gelu).eval()
    # Any (B, T) works for tracing: batch and seq are dynamic axes of the exported graph.
    example = torch.randint(0, args.vocab, (1, min(8, args.seq)), dtype=torch.int64)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    start = time.time()
    with torch.no_grad():
        # Inference export: eval mode and constant folding, so weight transposes are folded
        # into the initializers as in most exported models.
        torch.onnx.export(
            model, (example,), args.output, opset_version=args.opset, do_constant_folding=True,
            input_names=["input_ids"], output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                          "logits": {0: "batch", 1: "seq"}})
    size_mb = os.path.getsize(args.output) / 2**20
    print(f"wrote {args.output}: {parameter_count(model)} parameters, {size_mb:.1f} MiB, "
          f"opset {args.opset}, export {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
