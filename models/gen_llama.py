#!/usr/bin/env python3
# Generates a LLaMA-shaped decoder as ONNX with random (seeded) weights for inference benchmarks.
# Run with a Python that has torch. The default has GPT-2 small's size in LLaMA's form (12
# pre-RMSNorm layers, width 768, 12 heads, SwiGLU with hidden 2048, rotary position embeddings
# from a precomputed angle table cut to the sequence length, an additive causal mask, no biases,
# an untied 32000-word head; 134M parameters). The export is the eval-mode one inference models
# ship with (dynamic batch and seq). Write it outside the repository, e.g.
#   /usr/bin/python3 models/gen_llama.py -o /tmp/cleave-bench/llama_small.onnx
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "variants"))
from make_variants import Llama, _normal_init  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description="Export a LLaMA-shaped decoder to ONNX.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=2048, help="SwiGLU hidden width")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=2048, help="context length (rotary table rows)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", required=True, help="path of the .onnx to write")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    # N(0, 0.02) matrices and embeddings; the norms stay at 1.
    model = _normal_init(Llama(args.layers, args.vocab, args.seq, args.width, args.heads, args.hidden)).eval()
    example = torch.randint(0, args.vocab, (1, 8), dtype=torch.int64)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    start = time.time()
    with torch.no_grad():
        dynamic = {0: "batch", 1: "seq"}
        torch.onnx.export(model, (example,), args.output, opset_version=args.opset, do_constant_folding=True,
                          input_names=["input_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": dynamic, "logits": dynamic})
    params = sum(p.numel() for p in model.parameters())
    size_mb = os.path.getsize(args.output) / 2**20
    print(f"wrote {args.output}: {params} parameters, {size_mb:.1f} MiB, opset {args.opset}, "
          f"export {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
