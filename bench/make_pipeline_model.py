#!/usr/bin/env python3
# A GPT whose layers dominate its head, for pipeline measurements: width 128, 8 layers, vocab 64
# (the LM head is 128 x 64 against 12 x 128^2 per layer), exported for training like the
# bundled models. Usage: /usr/bin/python3 bench/make_pipeline_model.py OUT.onnx
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "models"))
from gpt import GPT, GPTConfig  # noqa: E402


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=64, context=32, layers=8, width=128, heads=4))
    ids = torch.randint(0, 64, (2, 32))
    torch.onnx.export(model, (ids,), out, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
