# A GPT-2-style decoder in PyTorch, shared by models/tiny_gpt/export.py and models/gen_gpt2.py.
# Needs a Python with torch. Parameter names (the ONNX initializer names after export) are
# the state_dict names: wte.weight, wpe.weight, blocks.<i>.{ln1,attn.qkv,attn.proj,ln2,
# mlp.fc,mlp.proj}.{weight,bias}, ln_f.{weight,bias}; the LM head is tied to wte.weight.
# Legend: B batch, T time (sequence), C channels (width), NH heads, HS head size, V vocab.
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab: int = 256
    context: int = 64
    layers: int = 2
    width: int = 64
    heads: int = 4


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.width % cfg.heads == 0, "width must divide into heads"
        self.heads = cfg.heads
        self.head_size = cfg.width // cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x):
        B, T, C = x.size()
        hs = self.head_size  # a Python int, so the scale below is a constant in the graph
        q, k, v = self.qkv(x).split(C, dim=2)  # each (B, T, C)
        q = q.view(B, T, self.heads, hs).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, NH, T, T)
        # The mask is computed from T at run time (ConstantOfShape + Trilu in ONNX) rather
        # than stored as a buffer, so the exported graph has no mask initializer that a
        # trainer would mistake for a parameter. -inf is safe: every row keeps its diagonal.
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, NH, T, HS)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg, gelu_approximate="none"):
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.gelu = nn.GELU(approximate=gelu_approximate)
        self.proj = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x):
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm residual block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg, gelu_approximate="none"):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg, gelu_approximate)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    # Dropout is left out entirely (it would be p=0 here): with p=0 it is the identity, and
    # exporting nn.Dropout in TRAINING mode emits Dropout nodes with training_mode=True and
    # an unused mask output, which only adds work for the importer and the trainer.
    def __init__(self, cfg, gelu_approximate="none"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, gelu_approximate) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.lm_head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one (V, C) matrix embeds and unembeds
        self.apply(_init_weights)
        # GPT-2 scales the residual output projections by 1/sqrt(2 * layers).
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, input_ids):
        B, T = input_ids.size()
        pos = torch.arange(0, T, dtype=torch.long, device=input_ids.device)  # (T,)
        x = self.wte(input_ids) + self.wpe(pos)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def _init_weights(module):
    # GPT-2 initialisation: N(0, 0.02) weights, zero biases, LayerNorm at (1, 0).
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def parameter_count(model):
    # named_parameters() lists a tied tensor once, so wte/lm_head count once.
    return sum(p.numel() for p in model.parameters())
