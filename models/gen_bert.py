#!/usr/bin/env python3
# Generates a BERT-shaped encoder as ONNX with random (seeded) weights for inference benchmarks.
# Run with a Python that has torch. The default is BERT-base (12 post-LayerNorm layers, width
# 768, 12 heads, 110M parameters with the 30522-word vocabulary): word, position and token-type
# embeddings, the padding mask turned into a -10000 additive bias on the scores, exact GELU and
# a tanh pooler. Write it outside the repository, e.g.
#   /usr/bin/python3 models/gen_bert.py -o /tmp/cleave-bench/bert_base.onnx
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Layer(nn.Module):
    def __init__(self, width, heads, hidden):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.attn_out = nn.Linear(width, width)
        self.attn_norm = nn.LayerNorm(width, eps=1e-12)
        self.intermediate = nn.Linear(width, hidden)
        self.output = nn.Linear(hidden, width)
        self.out_norm = nn.LayerNorm(width, eps=1e-12)

    def forward(self, x, mask_bias):  # x (B, T, C), mask_bias (B, 1, 1, T)
        B, T, C = x.size()
        hs = C // self.heads
        q, k, v = (lin(x).view(B, T, self.heads, hs).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs) + mask_bias
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = self.attn_norm(x + self.attn_out(y))
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))


class Encoder(nn.Module):
    def __init__(self, vocab, context, layers, width, heads):
        super().__init__()
        self.word = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.token_type = nn.Embedding(2, width)
        self.embed_norm = nn.LayerNorm(width, eps=1e-12)
        self.layers = nn.ModuleList(Layer(width, heads, 4 * width) for _ in range(layers))
        self.pooler = nn.Linear(width, width)
        for p in self.parameters():  # BERT's N(0, 0.02) initialisation, biases and norms aside
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids, token_type_ids, attention_mask):
        T = input_ids.size(1)
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.embed_norm(self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids))
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x, torch.tanh(self.pooler(x[:, 0]))


def main():
    parser = argparse.ArgumentParser(description="Export a BERT-shaped encoder to ONNX.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seq", type=int, default=512, help="context length (position rows)")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", required=True, help="path of the .onnx to write")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Encoder(args.vocab, args.seq, args.layers, args.width, args.heads).eval()
    example = (torch.randint(0, args.vocab, (1, 8), dtype=torch.int64), torch.zeros(1, 8, dtype=torch.int64),
               torch.ones(1, 8, dtype=torch.int64))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    start = time.time()
    with torch.no_grad():
        dynamic = {0: "batch", 1: "seq"}
        torch.onnx.export(
            model, example, args.output, opset_version=args.opset, do_constant_folding=True,
            input_names=["input_ids", "token_type_ids", "attention_mask"],
            output_names=["last_hidden_state", "pooler_output"],
            dynamic_axes={"input_ids": dynamic, "token_type_ids": dynamic, "attention_mask": dynamic,
                          "last_hidden_state": dynamic, "pooler_output": {0: "batch"}})
    params = sum(p.numel() for p in model.parameters())
    size_mb = os.path.getsize(args.output) / 2**20
    print(f"wrote {args.output}: {params} parameters, {size_mb:.1f} MiB, opset {args.opset}, "
          f"export {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
