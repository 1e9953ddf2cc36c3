"""Run TOSA graphs on the TOSA reference model and onnx models on onnxruntime, in ONNX's layout."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import onnxruntime as ort

from npubuild.errors import StageError
from npubuild.tosa.iospec import GraphIO


@contextmanager
def _quiet_stdio():
    """The reference model prints version warnings on the C stdout/stderr: keep them off the user's screen."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def run_tosa(tosa: bytes, io: GraphIO, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feed ONNX-layout float inputs (quantized here for int8 graphs); returns ONNX-layout outputs.

    Integer outputs are returned as raw integers; callers dequantize with their IOSpec.
    """
    import tosa_reference_model as trm

    arrays = [spec.to_tosa(feeds[spec.onnx_name]) for spec in io.inputs]
    with _quiet_stdio():
        outputs, status = trm.run(tosa, arrays)
    if "VALID" not in str(status):
        raise StageError(f"TOSA reference model rejected the graph: {status}")
    return {spec.onnx_name: spec.from_tosa(y) for spec, y in zip(io.outputs, outputs, strict=True)}


def run_onnx(model_path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))
