"""A quantisation with chosen ranges skips onnxruntime's moot calibration and writes the same QDQ model."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.quantiser_models import conv_concat_gemm

from npubuild.frontend import quantize as frontend
from npubuild.frontend.ort_quantiser import QuantiserCache
from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.stats import collect

ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the module, not its function
SETTINGS = {"per_channel": True, "symmetric_activations": False, "method": "mse"}


def _quantised(src: Path, arrays: dict[str, np.ndarray], chosen: dict, cache_dir: Path, calibrators: list[int],
               monkeypatch: pytest.MonkeyPatch, moot: bool) -> list[bytes]:
    """Two candidates' QDQ bytes (the chosen ranges, then the same again) sharing one QuantiserCache, with the
    moot calibration written by npubuild (`moot`) or run by onnxruntime; each calibrator made counted."""
    original = ort_quantize.create_calibrator

    def counted(*args, **kwargs):
        calibrators.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(ort_quantize, "create_calibrator", counted)
    if not moot:
        monkeypatch.setattr(frontend, "write_moot_calibration", lambda *args: None)
    cache = QuantiserCache(cache_dir)
    q = {**SETTINGS, "_ranges": chosen}
    out = [frontend.quantize(src, arrays, q, cache).SerializeToString() for _ in range(2)]
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("missing", [False, True])
def test_moot_calibration_writes_onnxruntimes_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: bool):
    """The same bytes with onnxruntime's one-sample calibration run and with npubuild's stand-in for it (no
    calibrator made); with a quantised tensor left out of the chosen ranges, both calibrate it on every sample."""
    rng = np.random.default_rng(3)
    model = conv_concat_gemm(rng)
    src = tmp_path / "float.onnx"
    onnx.save(model, src)
    arrays = {"x": rng.uniform(-1, 1, (6, 1, 3, 16, 16)).astype(np.float32)}
    chosen = ranges.overrides(collect(model, arrays), "mse", False)
    if missing:
        del chosen["x"]  # the graph input: quantised, now with no chosen range
    ort_made: list[int] = []
    ours_made: list[int] = []
    ort = _quantised(src, arrays, chosen, tmp_path / "ort", ort_made, monkeypatch, moot=False)
    ours = _quantised(src, arrays, chosen, tmp_path / "ours", ours_made, monkeypatch, moot=True)
    assert ours == ort
    # the one-sample calibration, then (once: cached for the second candidate) the all-samples one
    assert len(ort_made) == (2 if missing else 1)
    assert len(ours_made) == (1 if missing else 0)
    qdq = onnx.load_from_string(ours[0])
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) > 5
