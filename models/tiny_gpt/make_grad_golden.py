#!/usr/bin/env python3
# Writes golden training gradients for the tiny GPT (models/tiny_gpt/grad_golden/).
# Run with a Python that has torch: `/usr/bin/python3 models/tiny_gpt/make_grad_golden.py`.
# Input: test_data_set_0/input_0.pb (int64 [2, 64]). Labels are the input rolled left by one
# along the sequence: labels[:, t] = input_ids[:, t + 1] for t < T-1, labels[:, T-1] =
# input_ids[:, 0]. Loss: mean cross-entropy of the float32 logits over all B*T positions.
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from gpt import GPT  # noqa: E402
from export import CONFIG  # noqa: E402  (the same config the ONNX model was exported with)
import onnx_pb  # noqa: E402


def build_model():
    """Rebuilds the model exactly as export.py does and checks it against model.onnx."""
    torch.manual_seed(0)
    model = GPT(CONFIG)
    model.train()
    inits = onnx_pb.load_initializers(os.path.join(HERE, "model.onnx"))
    state = model.state_dict()
    # state_dict lists the tied LM head (lm_head.weight) as well; the export keeps only
    # wte.weight, so a torch-only name is allowed when it aliases an exported tensor.
    exported_ptrs = {state[n].data_ptr() for n in inits if n in state}
    extra = [n for n in state if n not in inits and state[n].data_ptr() not in exported_ptrs]
    missing = [n for n in inits if n not in state]
    if extra or missing:
        raise SystemExit(f"state_dict/initializer names differ: only in torch {extra}, "
                         f"only in ONNX {missing}")
    for name in inits:
        tensor = state[name]
        ref = inits[name]
        mine = tensor.detach().numpy()
        if mine.shape != ref.shape or mine.dtype != ref.dtype:
            raise SystemExit(f"{name}: torch {mine.dtype}{list(mine.shape)} vs "
                             f"ONNX {ref.dtype}{list(ref.shape)}")
        diff = float(np.max(np.abs(mine - ref))) if mine.size else 0.0
        if diff != 0.0:
            raise SystemExit(f"{name}: rebuilt weights differ from model.onnx (max abs {diff})")
    print(f"rebuilt model matches all {len(inits)} initializers of model.onnx exactly")
    return model


def roll_labels(input_ids):
    # Next-token targets; the last position wraps to the first token so every position
    # has a label and the loss is a mean over exactly B*T terms.
    return torch.roll(input_ids, shifts=-1, dims=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-o", "--out-dir", default=os.path.join(HERE, "grad_golden"))
    args = parser.parse_args()

    model = build_model()
    _, ids = onnx_pb.load_tensor(os.path.join(HERE, "test_data_set_0", "input_0.pb"))
    input_ids = torch.from_numpy(ids.copy())
    assert input_ids.dtype == torch.int64 and tuple(input_ids.shape) == (2, 64), input_ids.shape
    labels = roll_labels(input_ids)
    assert torch.equal(labels[:, :-1], input_ids[:, 1:])
    assert torch.equal(labels[:, -1], input_ids[:, 0])

    model.zero_grad(set_to_none=True)
    logits = model(input_ids)  # (B, T, V) float32
    # Sanity: the forward pass is the one the inference golden was made with.
    _, ref_logits = onnx_pb.load_tensor(os.path.join(HERE, "test_data_set_0", "output_0.pb"))
    fwd_diff = float(np.max(np.abs(logits.detach().numpy() - ref_logits)))
    if fwd_diff > 1e-6:
        raise SystemExit(f"logits differ from test_data_set_0/output_0.pb by {fwd_diff}")
    loss = F.cross_entropy(logits.reshape(-1, CONFIG.vocab), labels.reshape(-1))  # mean
    loss.backward()  # wte.weight.grad sums the embedding and the tied LM-head uses

    os.makedirs(args.out_dir, exist_ok=True)
    onnx_pb.save_tensor(labels.numpy(), "labels", os.path.join(args.out_dir, "labels.pb"))
    onnx_pb.save_tensor(np.array(loss.item(), dtype=np.float32), "loss",
                        os.path.join(args.out_dir, "loss.pb"))
    count = 0
    for name, p in model.named_parameters():  # a tied tensor is listed once
        if p.grad is None:
            raise SystemExit(f"parameter {name} got no gradient")
        grad = p.grad.detach().numpy().astype(np.float32)
        onnx_pb.save_tensor(grad, f"{name}_grad", os.path.join(args.out_dir, f"{name}_grad.pb"))
        count += 1
    print(f"loss = {loss.item():.9g} (ln 256 = {np.log(256):.6f}); "
          f"logits match output_0.pb to {fwd_diff:.1e}")
    print(f"wrote labels.pb, loss.pb and {count} gradient files to {args.out_dir}")


if __name__ == "__main__":
    main()
