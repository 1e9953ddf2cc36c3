"""MobileViT-xxs as ONNX for bench/compile_speed.py: timm's `mobilevit_xxs`, random weights, 1x3x256x256.

The compile-time figures of issue 33 name this model; it is not in the repository (5.2 MB) and nothing may be
downloaded at run time, so it is made from timm's code with seeded random weights (compile time does not
depend on the weights' values). timm needs torchvision, which does not import beside the project's torch
2.13.0, so run this from a scratch venv of its own:

    python3.11 -m venv V && V/bin/pip install torch==2.14.1 torchvision==0.29.1 && \
        V/bin/pip install timm onnx onnxruntime
    V/bin/python bench/mobilevit_xxs.py OUT.onnx

TorchScript exporter, opset 17, static shapes (645 nodes with timm 1.0.31 and torch 2.14.1); checked with
onnx's full check and against torch on onnxruntime.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import timm
import torch


def export(out: Path) -> onnx.ModelProto:
    torch.manual_seed(0)
    model = timm.create_model("mobilevit_xxs", pretrained=False).eval()
    x = torch.randn(1, 3, 256, 256)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["output"])
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(out))
    with torch.no_grad():
        want = model(x).numpy()
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})[0]
    err = float(np.abs(got - want).max())
    if err > 1e-4:  # float32 arithmetic in a different order: 1e-7 measured
        raise SystemExit(f"error: onnxruntime differs from torch by {err}")
    print(f"{out}: {len(m.graph.node)} nodes, opset {m.opset_import[0].version}, onnxruntime within {err:.1e} of torch")
    return m


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    export(ap.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
