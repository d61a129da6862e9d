#!/usr/bin/env python3
# Exports the tiny GPT sample model (models/tiny_gpt/model.onnx) and its PyTorch goldens.
# Run with a Python that has torch, from anywhere: `/usr/bin/python3 models/tiny_gpt/export.py`.
# The export is for training: TrainingMode.TRAINING and no constant folding keep every
# parameter an initializer named as in the torch state_dict (checked below).
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gpt import GPT, GPTConfig, parameter_count  # noqa: E402
import onnx_pb  # noqa: E402

CONFIG = GPTConfig(vocab=256, context=64, layers=2, width=64, heads=4)
OPSET = 17
# Golden inputs: rows of English text as byte-level tokens, each row starting further
# into the text so rows differ. Set 0 is (2, 64), the full context; set 1 is (3, 23) so
# the dynamic batch and seq axes get exercised with a size the export never saw.
GOLDEN_SHAPES = [(2, 64), (3, 23)]
TEXT = b"The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "


def golden_input_ids(batch=2, seq=CONFIG.context):
    text = TEXT * 4  # long enough for any row offset below
    rows = [list(text[b * 37:b * 37 + seq]) for b in range(batch)]
    return torch.tensor(rows, dtype=torch.int64)  # (B, T)


def export(model, path):
    torch.onnx.export(
        model,
        (golden_input_ids(),),
        path,
        opset_version=OPSET,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
    )


def check_initializer_names(model, path):
    """Fails unless every exported initializer is a state_dict tensor of the same shape."""
    summary = onnx_pb.ModelSummary(path)
    state = {k: list(v.shape) for k, v in model.state_dict().items()}
    unknown = [n for n in summary.initializers if n not in state]
    if unknown:
        raise SystemExit(f"initializers not named after state_dict entries: {unknown}")
    for name, dims in summary.initializers.items():
        if dims != state[name]:
            raise SystemExit(f"initializer {name} has shape {dims}, state_dict says {state[name]}")
    params = {n for n, _ in model.named_parameters()}
    missing = params - set(summary.initializers)
    if missing:
        raise SystemExit(f"parameters missing from the exported initializers: {sorted(missing)}")
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-o", "--out-dir", default=HERE)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT(CONFIG)
    model.train()  # no dropout or batch norm, so train() and eval() compute the same
    model_path = os.path.join(args.out_dir, "model.onnx")
    export(model, model_path)
    summary = check_initializer_names(model, model_path)

    for i, (batch, seq) in enumerate(GOLDEN_SHAPES):
        ids = golden_input_ids(batch, seq)
        with torch.no_grad():
            logits = model(ids)
        data_dir = os.path.join(args.out_dir, f"test_data_set_{i}")
        os.makedirs(data_dir, exist_ok=True)
        onnx_pb.save_tensor(ids.numpy(), "input_ids", os.path.join(data_dir, "input_0.pb"))
        onnx_pb.save_tensor(logits.numpy().astype(np.float32), "logits",
                            os.path.join(data_dir, "output_0.pb"))
        print(f"golden {i}: input_ids {tuple(ids.shape)} -> logits {tuple(logits.shape)}")

    print(f"wrote {model_path} (opset {summary.opsets.get('', '?')})")
    print(f"parameters: {parameter_count(model)} (initializer elements: "
          f"{summary.parameter_count()})")
    print(f"initializers: {', '.join(summary.initializers)}")
    print(f"ops: {onnx_pb.format_histogram(summary.op_histogram())}")


if __name__ == "__main__":
    main()
