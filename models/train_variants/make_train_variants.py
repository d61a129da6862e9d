#!/usr/bin/env python3
# Writes reference training runs for architectures other than the tiny GPT
# (models/train_variants/<name>/): an untied-head GPT, a 4-layer tied GPT, the LLaMA-style model, the BERT
# encoder with an MSE and a classification loss, a small convolutional classifier with batch
# normalization, and a convolutional encoder-decoder (group and instance norms, PReLU, a
# transposed convolution) under an MSE loss. Each folder gets model.onnx exported for training, the fixed batch, the 8-step
# AdamW trajectory and the final parameters (and the batch norms' final running statistics).
# Run with a Python that has torch: `/usr/bin/python3 models/train_variants/make_train_variants.py`.
import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.dirname(HERE)
sys.path.insert(0, MODELS)
sys.path.insert(0, os.path.join(MODELS, "variants"))
from gpt import GPT, GPTConfig  # noqa: E402
from make_variants import VOCAB, WIDTH, Bert, Llama, _normal_init  # noqa: E402
import onnx_pb  # noqa: E402

OPSET = 17
BATCH, SEQ = 2, 16
BERT_CLASSES = WIDTH  # the classification loss reads pooler_output [B, 32] as 32 logits
CNN_CLASSES, IMAGE = 10, 12  # the CNN classifies [B, 3, 12, 12] images into 10 classes

# The optimizer and schedule every model trains with; written to trajectory.json as "config".
PEAK_LR, WARMUP, STEPS = 2e-3, 2, 8
MIN_LR = PEAK_LR * 0.1
OPTIM = {"lr": PEAK_LR, "warmup": WARMUP, "steps": STEPS, "min_lr": MIN_LR,
         "weight_decay": 0.1, "clip": 1.0, "betas": [0.9, 0.999], "eps": 1e-8}


class UntiedGPT(GPT):
    """models/gpt.py's GPT with its own LM head matrix instead of the tied wte.weight."""

    def __init__(self, cfg):
        super().__init__(cfg)
        # Replacing the Parameter object unties it; named_parameters then lists lm_head.weight
        # last, after ln_f, in module registration order.
        self.lm_head.weight = nn.Parameter(torch.empty(cfg.vocab, cfg.width))
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.02)


class SmallCnn(nn.Module):
    """Conv-BN-ReLU and max pooling, a residual Conv-BN block, padded average pooling with
    ceil_mode, global average pooling and a linear head: the ops of a ResNet-style classifier."""

    def __init__(self, classes=CNN_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)  # count_include_pad=True
        self.head = nn.Linear(8, classes)

    def forward(self, pixel_values):
        x = self.pool(F.relu(self.bn1(self.conv1(pixel_values))))
        x = F.relu(x + self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(self.avg(x), 1).flatten(1)
        return self.head(x)


class SmallDecoder(nn.Module):
    """A strided Conv down with GroupNorm and PReLU, a ConvTranspose back up (output_padding)
    with ReLU beside a pointwise Conv upsampled bilinearly (Resize), an affine InstanceNorm of
    their sum and a pointwise Conv: a denoiser's shape, under an MSE loss. torch
    exports GroupNorm as an InstanceNormalization of the groups between Reshapes."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.act = nn.PReLU(8)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.side = nn.Conv2d(8, 4, 1, bias=False)  # a bias would be a constant the norm takes off
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.out = nn.Conv2d(4, 3, 1)

    def forward(self, pixel_values):
        h = self.act(self.gn(self.down(pixel_values)))
        # ReLU before the instance norm: after it, up.bias would have no gradient but rounding
        # noise (the norm takes each channel's mean off).
        u = F.relu(self.up(h))
        s = F.interpolate(self.side(h), scale_factor=2, mode="bilinear", align_corners=False)
        return self.out(self.inorm(u + s))


def track_onnx_running_var(model):
    """ONNX's BatchNormalization (and so cleave) moves running_var toward the batch's biased
    variance, PyTorch toward the unbiased one: keeps the ONNX form beside PyTorch's, by module."""
    tracked = {}
    for name, m in model.named_modules():
        if not isinstance(m, nn.BatchNorm2d):
            continue
        tracked[name] = m.running_var.detach().clone()

        def hook(mod, args, name=name):
            if mod.training:
                var = args[0].detach().var(dim=(0, 2, 3), unbiased=False)
                tracked[name] = tracked[name] * (1 - mod.momentum) + var * mod.momentum

        m.register_forward_pre_hook(hook)
    return tracked


def lr_at(step):
    if step < WARMUP:
        return PEAK_LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, STEPS - WARMUP)
    return MIN_LR + 0.5 * (PEAK_LR - MIN_LR) * (1 + math.cos(math.pi * progress))


def token_ids(g):
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)  # (B, T) int64


def lm_batch(g):
    ids = token_ids(g)
    # Next-token labels, the last position wrapping to the first token (as tiny_gpt's goldens).
    return {"input_ids": ids}, torch.roll(ids, shifts=-1, dims=1)


def bert_inputs(g):
    ids = token_ids(g)
    # Two segments per row; row 1's second segment starts earlier so the rows differ.
    starts = torch.tensor([[SEQ // 2], [SEQ // 2 - 3]])
    token_type = (torch.arange(SEQ)[None, :] >= starts).long()  # (B, T)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, SEQ - 4:] = 0  # row 1 is padded: its last 4 keys are hidden
    return {"input_ids": ids, "token_type_ids": token_type, "attention_mask": attention_mask}


# name: model builder, graph inputs, graph outputs, loss, the output the loss reads
MODELS_SPEC = {
    "gpt_untied": dict(
        build=lambda: UntiedGPT(GPTConfig(vocab=VOCAB, context=SEQ, layers=2, width=48, heads=3)),
        inputs=["input_ids"], outputs=["logits"], loss="cross_entropy", output="logits"),
    # Four layers with the tied head: enough blocks for four pipeline stages, or two ranks
    # with two model chunks each.
    "gpt_deep": dict(
        build=lambda: GPT(GPTConfig(vocab=VOCAB, context=SEQ, layers=4, width=32, heads=4)),
        inputs=["input_ids"], outputs=["logits"], loss="cross_entropy", output="logits"),
    "llama": dict(
        build=lambda: _normal_init(Llama()),
        inputs=["input_ids"], outputs=["logits"], loss="cross_entropy", output="logits"),
    "bert_mse": dict(
        build=lambda: _normal_init(Bert()),
        inputs=["input_ids", "token_type_ids", "attention_mask"],
        outputs=["last_hidden_state", "pooler_output"], loss="mse", output="last_hidden_state"),
    "bert_cls": dict(
        build=lambda: _normal_init(Bert()),
        inputs=["input_ids", "token_type_ids", "attention_mask"],
        outputs=["last_hidden_state", "pooler_output"], loss="cross_entropy",
        output="pooler_output"),
    "cnn": dict(
        build=SmallCnn, inputs=["pixel_values"], outputs=["logits"], loss="cross_entropy", output="logits",
        dynamic={"pixel_values": {0: "batch"}, "logits": {0: "batch"}}),
    "decoder": dict(
        build=SmallDecoder, inputs=["pixel_values"], outputs=["reconstruction"], loss="mse",
        output="reconstruction", dynamic={"pixel_values": {0: "batch"}, "reconstruction": {0: "batch"}}),
}


def make_batch(name):
    """The fixed batch and labels of one model, from its own seeded generator."""
    g = torch.Generator().manual_seed(1)
    if name in ("gpt_untied", "gpt_deep", "llama"):
        return lm_batch(g)
    if name == "cnn":
        images = torch.randn((BATCH, 3, IMAGE, IMAGE), generator=g)
        return {"pixel_values": images}, torch.randperm(CNN_CLASSES, generator=g)[:BATCH]
    if name == "decoder":
        images = torch.randn((BATCH, 3, IMAGE, IMAGE), generator=g)
        return {"pixel_values": images}, torch.randn((BATCH, 3, IMAGE, IMAGE), generator=g)
    inputs = bert_inputs(g)
    if name == "bert_mse":
        # A fixed N(0, 1) target of last_hidden_state's shape, drawn after the inputs.
        return inputs, torch.randn((BATCH, SEQ, WIDTH), generator=g)
    # Distinct classes per row (randperm), so a loss that mixes up rows cannot match by luck.
    return inputs, torch.randperm(BERT_CLASSES, generator=g)[:BATCH]  # (B,) int64


def compute_loss(spec, outputs, labels):
    out = outputs[spec["outputs"].index(spec["output"])]
    if spec["loss"] == "mse":
        return F.mse_loss(out, labels)  # mean over every element
    # Classes are the last axis; every other axis is flattened into positions.
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


def export(model, spec, inputs, path):
    dynamic = spec.get("dynamic") or {n: {0: "batch"} if n == "pooler_output" else {0: "batch", 1: "seq"}
                                      for n in spec["inputs"] + spec["outputs"]}
    torch.onnx.export(
        model, tuple(inputs[n] for n in spec["inputs"]), path,
        opset_version=OPSET,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=spec["inputs"], output_names=spec["outputs"], dynamic_axes=dynamic)


def check_export(model, spec, path):
    """Fails unless the initializers are the parameters (same names, shapes and values) plus
    possibly buffers; returns the float initializers that are not parameters."""
    summary = onnx_pb.ModelSummary(path)
    if summary.inputs != spec["inputs"] or summary.outputs != spec["outputs"]:
        raise SystemExit(f"{path}: graph inputs {summary.inputs} / outputs {summary.outputs}, "
                         f"expected {spec['inputs']} / {spec['outputs']}")
    inits = onnx_pb.load_initializers(path)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())  # non-persistent ones too (not in the state_dict)
    missing = [n for n in params if n not in inits]
    unknown = [n for n in inits if n not in params and n not in buffers]
    if missing or unknown:
        raise SystemExit(f"{path}: parameters not exported under their names {missing}; "
                         f"initializers that are neither parameters nor buffers {unknown}")
    for name, value in inits.items():
        mine = (params.get(name, buffers.get(name))).detach().numpy()
        if mine.shape != value.shape or mine.dtype != value.dtype or not np.array_equal(mine, value):
            raise SystemExit(f"{path}: initializer {name} differs from the torch tensor")
    return [n for n in inits if n not in params and inits[n].dtype == np.float32]


def train(model, spec, inputs, labels):
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=PEAK_LR, betas=tuple(OPTIM["betas"]), eps=OPTIM["eps"],
                            weight_decay=OPTIM["weight_decay"], amsgrad=False, foreach=False,
                            maximize=False, capturable=False)
    steps, unreached = [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        outputs = model(**inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        loss = compute_loss(spec, outputs, labels)
        loss.backward()
        # A parameter the loss does not reach (BERT's pooler under the MSE loss) keeps grad
        # None: clip_grad_norm_ leaves it out and AdamW skips it (no weight decay either).
        # The trainer must do the same; the names are listed as "unreached".
        if step == 0:
            unreached = [name for name, p in model.named_parameters() if p.grad is None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, OPTIM["clip"])
        lr = lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        steps.append({"step": step, "loss": float(loss.item()), "lr": lr,
                      "grad_norm": float(grad_norm.item())})
    return steps, unreached


def make_model(name, out_root):
    spec = MODELS_SPEC[name]
    torch.manual_seed(0)
    model = spec["build"]()
    model.train()  # batch norm (the CNN) normalises by each batch's statistics
    inputs, labels = make_batch(name)

    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)  # no stale parameter files from an older run
    golden = os.path.join(out_dir, "golden")
    for sub in ("inputs", "params"):
        os.makedirs(os.path.join(golden, sub))
    # Exporting in training mode runs the model once, which moves the batch norms' running
    # statistics; the export holds them as they are after that run, and training starts there.
    model_path = os.path.join(out_dir, "model.onnx")
    export(model, spec, inputs, model_path)
    frozen = check_export(model, spec, model_path)

    for n in spec["inputs"]:
        onnx_pb.save_tensor(inputs[n].numpy(), n, os.path.join(golden, "inputs", f"{n}.pb"))
    onnx_pb.save_tensor(labels.numpy(), "labels", os.path.join(golden, "inputs", "labels.pb"))

    tracked_var = track_onnx_running_var(model)
    steps, unreached = train(model, spec, inputs, labels)
    config = {"loss": spec["loss"], "output": spec["output"], "frozen": frozen, **OPTIM,
              "unreached": unreached}
    with open(os.path.join(golden, "trajectory.json"), "w") as f:
        # json writes floats with repr(), the shortest string that round-trips the double.
        json.dump({"config": config, "steps": steps}, f, indent=1)
        f.write("\n")
    for pname, p in model.named_parameters():
        onnx_pb.save_tensor(p.detach().numpy().astype(np.float32), pname,
                            os.path.join(golden, "params", f"{pname}.pb"))
    if tracked_var:
        os.makedirs(os.path.join(golden, "buffers"))
        for mname, m in model.named_modules():
            if mname in tracked_var:
                for bname, value in ((f"{mname}.running_mean", m.running_mean),
                                     (f"{mname}.running_var", tracked_var[mname])):
                    onnx_pb.save_tensor(value.detach().numpy().astype(np.float32), bname,
                                        os.path.join(golden, "buffers", f"{bname}.pb"))

    count = sum(p.numel() for p in model.parameters())
    print(f"{name}: {count} parameters in {len(list(model.parameters()))} tensors, "
          f"frozen {frozen}, unreached {unreached}, model.onnx {os.path.getsize(model_path)} B")
    for s in steps:
        print(f"  step {s['step']}  loss {s['loss']:.6f}  lr {s['lr']:.6e}  "
              f"grad_norm {s['grad_norm']:.6f}")


def main():
    parser = argparse.ArgumentParser(description="Writes the training goldens of the variants.")
    parser.add_argument("names", nargs="*", default=list(MODELS_SPEC), help="models to make")
    parser.add_argument("-o", "--out-dir", default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)  # fixed reduction order, so reruns are bit-identical
    torch.use_deterministic_algorithms(True)
    for name in args.names:
        make_model(name, args.out_dir)


if __name__ == "__main__":
    main()
