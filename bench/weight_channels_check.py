"""frontend/weight_channels.py against onnxruntime's own per-channel loops on every weight of real models.

    PYTHONPATH=<tree> .venv/bin/python bench/weight_channels_check.py MODEL.onnx|BUILD_DIR ...

A check script, not part of npubuild. A BUILD_DIR stands for its import stage's float model. Every float32
initializer of rank >= 1, on every axis, every 8/16-bit type, reduce_range off and on: the zero points and
scales as compute_data_quant_params gives them channel by channel, and the int initializer as
quantize_onnx_initializer gives it, byte for byte. Prints the counts and exits 1 on any difference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import quant_utils

from npubuild.frontend.weight_channels import FAST_TYPES, channel_params, fast_quantize_onnx_initializer


def _models(args: list[str]) -> list[Path]:
    paths = [Path(a) for a in args]
    return [next((p / "stages" / "import").glob("*/model.onnx")) if p.is_dir() else p for p in paths]


def _own_params(data: np.ndarray, axis: int, quant_type: int, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    pairs = [quant_utils.compute_data_quant_params(data.take(i, axis).ravel(), quant_type, True,
                                                   reduce_range=reduce_range) for i in range(data.shape[axis])]
    return np.asarray([p[0] for p in pairs]), np.asarray([p[1] for p in pairs])


def check(model: onnx.ModelProto) -> tuple[int, int, int]:
    """(cases, fast cases, differences) over the model's weights."""
    cases = fast_cases = bad = 0
    fast_init = fast_quantize_onnx_initializer(quant_utils.quantize_onnx_initializer)
    for tensor in model.graph.initializer:
        data = numpy_helper.to_array(tensor)
        if data.dtype != np.float32 or data.ndim == 0 or data.size == 0:
            continue
        for axis in range(data.ndim):
            for quant_type in sorted(FAST_TYPES):
                for reduce_range in (False, True):
                    cases += 1
                    want = _own_params(data, axis, quant_type, reduce_range)
                    got = channel_params(data, axis, quant_type, reduce_range, None)
                    fast_cases += got is not None
                    if got is not None and any(a.dtype != b.dtype or a.tobytes() != b.tobytes()
                                               for a, b in zip(got, want, strict=True)):
                        bad += 1
                    args = (tensor, quant_type, want[0], want[1], axis)
                    if fast_init(*args).SerializeToString() != quant_utils.quantize_onnx_initializer(*args) \
                            .SerializeToString():
                        bad += 1
    return cases, fast_cases, bad


def main() -> None:
    total_bad = 0
    for path in _models(sys.argv[1:]):
        cases, fast_cases, bad = check(onnx.load(path))
        total_bad += bad
        print(f"{path}: {cases} cases, {fast_cases} on the fast path, {bad} differences")
    sys.exit(1 if total_bad else 0)


if __name__ == "__main__":
    main()
