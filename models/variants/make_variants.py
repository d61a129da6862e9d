#!/usr/bin/env python3
# Exports the small transformer variants in models/variants/ with their PyTorch goldens.
# Run with a Python that has torch: `/usr/bin/python3 models/variants/make_variants.py`.
# Each variant is one exporter dialect cleave must import: decomposed LayerNorm (opset 14),
# BERT padding masks (opset 15), LLaMA RMSNorm/SwiGLU/rotary (opset 18), fused
# LayerNormalization with tanh GELU (opset 17). Weights are seeded, so reruns are identical.
import argparse
import math
import os
import subprocess
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gpt import GPT, GPTConfig  # noqa: E402
import onnx_pb  # noqa: E402

# torch 1.13 exports at most opset 17; newer opsets are reached with onnx.version_converter,
# run by a Python that has onnx (this one may not).
TORCH_MAX_OPSET = 17
GOLDEN_SHAPES = [(2, 16), (3, 7)]  # (B, T): set 0 and set 1, the second unseen at export
VOCAB, WIDTH, HEADS, CONTEXT = 64, 32, 2, 32


class BertLayer(nn.Module):
    """Post-LayerNorm encoder layer as in BERT: LN(x + attn(x)), then LN(x + ffn(x))."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.attn_out = nn.Linear(WIDTH, WIDTH)
        self.attn_norm = nn.LayerNorm(WIDTH, eps=1e-12)
        self.intermediate = nn.Linear(WIDTH, 4 * WIDTH)
        self.output = nn.Linear(4 * WIDTH, WIDTH)
        self.out_norm = nn.LayerNorm(WIDTH, eps=1e-12)

    def forward(self, x, mask_bias):  # x (B, T, C), mask_bias (B, 1, 1, T)
        B, T, C = x.size()
        hs = WIDTH // HEADS
        q, k, v = (lin(x).view(B, T, HEADS, hs).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))  # (B, NH, T, HS)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs) + mask_bias  # (B, NH, T, T)
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = self.attn_norm(x + self.attn_out(y))
        return self.out_norm(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.word = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(CONTEXT, WIDTH)
        self.token_type = nn.Embedding(2, WIDTH)
        self.embed_norm = nn.LayerNorm(WIDTH, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer() for _ in range(layers))
        self.pooler = nn.Linear(WIDTH, WIDTH)

    def forward(self, input_ids, token_type_ids, attention_mask):
        T = input_ids.size(1)
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids)
        x = self.embed_norm(x)
        # 1 keeps a key, 0 hides it: hidden keys get -10000 added to their scores, which
        # softmax turns into exp(-10000) == 0 in float32 (the classic BERT formulation).
        mask = attention_mask[:, None, None, :].to(torch.float32)  # (B, 1, 1, T)
        mask_bias = (1.0 - mask) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # (B, C) from the first token
        return x, pooled


class RMSNorm(nn.Module):
    def __init__(self, width=WIDTH, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, width=WIDTH, heads=HEADS, hidden=88):
        super().__init__()
        self.heads, self.hs = heads, width // heads
        self.attn_norm, self.mlp_norm = RMSNorm(width), RMSNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x, cos, sin, mask):  # cos, sin (T, HS); mask (T, T)
        B, T, C = x.size()
        hs = self.hs
        h = self.attn_norm(x)
        q, k, v = (lin(h).view(B, T, self.heads, hs).transpose(1, 2) for lin in (self.q, self.k, self.v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(hs)) + mask  # (B, NH, T, T)
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.o(y)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))  # SwiGLU


class Llama(nn.Module):
    """Pre-RMSNorm decoder: rotary q and k, an additive causal mask, SwiGLU, an untied head."""

    def __init__(self, layers=2, vocab=VOCAB, context=CONTEXT, width=WIDTH, heads=HEADS, hidden=88):
        super().__init__()
        hs = width // heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).float() / hs))  # (HS/2,)
        angles = torch.arange(context).float()[:, None] * inv_freq[None, :]  # (CONTEXT, HS/2)
        # Precomputed angle table; Cos and Sin run in the graph on its first T rows.
        self.register_buffer("angles", torch.cat((angles, angles), dim=-1), persistent=False)
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(LlamaLayer(width, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids):
        T = input_ids.size(1)
        angles = self.angles[:T]  # (T, HS)
        cos, sin = angles.cos(), angles.sin()
        # Additive causal mask: 0 on and below the diagonal, -inf above it.
        mask = torch.full((T, T), float("-inf"), device=input_ids.device).triu(1)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def _normal_init(model):
    # Matrices and embeddings N(0, 0.02) as in GPT-2/BERT; biases keep torch's default
    # uniform init so they are non-zero and the goldens check that they are applied.
    for p in model.parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, mean=0.0, std=0.02)
    return model


def gpt_inputs(g, B, T):
    return (torch.randint(0, VOCAB, (B, T), generator=g),)


def bert_inputs(g, B, T):
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    token_type = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()  # two segments
    attention_mask = torch.ones(B, T, dtype=torch.long)
    for b in range(1, B):
        attention_mask[b, T - 2 * b:] = 0  # later rows are padded by 2 more keys each
    return ids, token_type, attention_mask


GPT_CONFIG = GPTConfig(vocab=VOCAB, context=CONTEXT, layers=2, width=WIDTH, heads=HEADS)
# name: (model builder, opset, input names, output names, input maker)
VARIANTS = {
    "gpt_opset14": (lambda: GPT(GPT_CONFIG), 14, ["input_ids"], ["logits"], gpt_inputs),
    "bert_opset15": (lambda: _normal_init(Bert()), 15,
                     ["input_ids", "token_type_ids", "attention_mask"],
                     ["last_hidden_state", "pooler_output"], bert_inputs),
    "llama_opset18": (lambda: _normal_init(Llama()), 18, ["input_ids"], ["logits"], gpt_inputs),
    "gpt_opset17": (lambda: GPT(GPT_CONFIG, gelu_approximate="tanh"), 17, ["input_ids"],
                    ["logits"], gpt_inputs),
}


def make_variant(name, onnx_python):
    build, opset, input_names, output_names, make_inputs = VARIANTS[name]
    torch.manual_seed(0)
    model = build().eval()
    g = torch.Generator().manual_seed(1)
    goldens = [make_inputs(g, B, T) for B, T in GOLDEN_SHAPES]

    out_dir = os.path.join(HERE, name)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    # Every input and output is (B, T, ...) except BERT's pooled (B, C).
    dynamic = {n: {0: "batch"} if n == "pooler_output" else {0: "batch", 1: "seq"}
               for n in input_names + output_names}
    export_opset = min(opset, TORCH_MAX_OPSET)
    # Eval mode with the default constant folding: the form most exported models take.
    torch.onnx.export(model, goldens[0], path, opset_version=export_opset,
                      input_names=input_names, output_names=output_names, dynamic_axes=dynamic)
    if opset > export_opset:
        upgrade = os.path.join(HERE, "upgrade_opset.py")
        subprocess.run([onnx_python, upgrade, path, str(opset)], check=True)

    for i, inputs in enumerate(goldens):
        with torch.no_grad():
            outputs = model(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        data_dir = os.path.join(out_dir, f"test_data_set_{i}")
        os.makedirs(data_dir, exist_ok=True)
        for j, (n, t) in enumerate(zip(input_names, inputs)):
            onnx_pb.save_tensor(t.numpy(), n, os.path.join(data_dir, f"input_{j}.pb"))
        for j, (n, t) in enumerate(zip(output_names, outputs)):
            onnx_pb.save_tensor(t.numpy(), n, os.path.join(data_dir, f"output_{j}.pb"))

    summary = onnx_pb.ModelSummary(path)
    print(f"{name}: opset {summary.opsets.get('', '?')}, {summary.parameter_count()} "
          f"initializer elements, {os.path.getsize(path)} bytes")
    print(f"  ops: {onnx_pb.format_histogram(summary.op_histogram())}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(VARIANTS), help="variants to make")
    parser.add_argument("--onnx-python", default="python3",
                        help="a Python with the onnx package, for opsets above 17")
    args = parser.parse_args()
    for name in args.names:
        make_variant(name, args.onnx_python)


if __name__ == "__main__":
    main()
