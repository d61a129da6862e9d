#!/usr/bin/env python3
# Raises an ONNX model's default-domain opset in place with onnx.version_converter.
# Run with a Python that has onnx: `python3 upgrade_opset.py MODEL.onnx 18`. make_variants.py
# calls it for opsets newer than its torch can export (e.g. opset 18: Reduce* axes as inputs).
import sys

import onnx
from onnx import version_converter


def main():
    path, opset = sys.argv[1], int(sys.argv[2])
    model = version_converter.convert_version(onnx.load(path), opset)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)


if __name__ == "__main__":
    main()
