#!/usr/bin/env python3
# Checks sample models against their PyTorch goldens with onnxruntime.
# Run with a Python that has onnx, onnxruntime and numpy (no torch needed):
#   python3 models/check_models.py [--tol 1e-5] [MODEL_DIR ...]   (default: every model here)
# For each <dir>/model.onnx: onnx.checker, opset, op histogram, parameter count, and for each
# <dir>/test_data_set_*/ the max abs difference between ORT's outputs and output_*.pb.
import argparse
import collections
import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def op_histogram(graph):
    hist = collections.Counter(n.op_type for n in graph.node)
    return ", ".join(f"{op} {n}" for op, n in sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def check_model(model_dir, tol):
    """Returns True when every golden output matches within tol."""
    path = os.path.join(model_dir, "model.onnx")
    model = onnx.load(path)
    onnx.checker.check_model(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    print(f"{os.path.relpath(model_dir, HERE)}: opset {opset}, {params} parameters, "
          f"{os.path.getsize(path)} bytes")
    print(f"  ops: {op_histogram(model.graph)}")

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    ok = True
    for data_dir in sorted(glob.glob(os.path.join(model_dir, "test_data_set_*"))):
        feeds = dict(load_pb(p) for p in sorted(glob.glob(os.path.join(data_dir, "input_*.pb"))))
        expected = [load_pb(p) for p in sorted(glob.glob(os.path.join(data_dir, "output_*.pb")))]
        got = session.run([name for name, _ in expected], feeds)
        for (name, want), have in zip(expected, got):
            err = float(np.max(np.abs(want.astype(np.float64) - have.astype(np.float64))))
            good = have.shape == want.shape and err <= tol
            ok &= good
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
            print(f"  {os.path.basename(data_dir)}: {shapes} -> {name} {list(have.shape)}: "
                  f"max abs err {err:.3g} {'ok' if good else 'FAIL'} (tol {tol:g})")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="*")
    parser.add_argument("--tol", type=float, default=1e-5)
    args = parser.parse_args()
    dirs = args.dirs or sorted(os.path.dirname(p) for p in
                               glob.glob(os.path.join(HERE, "**", "model.onnx"), recursive=True))
    results = [check_model(os.path.abspath(d), args.tol) for d in dirs]
    print(f"ort {ort.__version__}, onnx {onnx.__version__}: "
          f"{sum(results)}/{len(results)} models match their goldens")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
