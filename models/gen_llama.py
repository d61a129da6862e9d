#!/usr/bin/env python3
# Generates a LLaMA-shaped decoder as ONNX with random (seeded) weights for inference benchmarks.
# Run with a Python that has torch. The default has GPT-2 small's size in LLaMA's form (12
# pre-RMSNorm layers, width 768, 12 heads, SwiGLU with hidden 2048, rotary position embeddings
# from a precomputed angle table cut to the sequence length, an additive causal mask, no biases,
# an untied 32000-word head; 134M parameters). The export is the eval-mode one inference models
# ship with (dynamic batch and seq). Write it outside the repository, e.g.
#   /usr/bin/python3 models/gen_llama.py -o /tmp/cleave-bench/llama_small.onnx
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, width, heads, hidden):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(width), RMSNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x, cos, sin, mask):  # cos, sin (T, HS); mask (T, T)
        B, T, C = x.size()
        hs = C // self.heads
        h = self.attn_norm(x)
        q, k, v = (lin(h).view(B, T, self.heads, hs).transpose(1, 2) for lin in (self.q, self.k, self.v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(hs)) + mask
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o(y)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, vocab, context, layers, width, heads, hidden):
        super().__init__()
        hs = width // heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).float() / hs))
        angles = torch.arange(context).float()[:, None] * inv_freq[None, :]
        self.register_buffer("angles", torch.cat((angles, angles), dim=-1), persistent=False)
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Layer(width, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        for p in self.parameters():  # N(0, 0.02) matrices and embeddings; norms stay at 1
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids):
        T = input_ids.size(1)
        angles = self.angles[:T]
        cos, sin = angles.cos(), angles.sin()
        mask = torch.full((T, T), float("-inf"), device=input_ids.device).triu(1)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


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
    model = Decoder(args.vocab, args.seq, args.layers, args.width, args.heads, args.hidden).eval()
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
