"""A real torch export, as its wheel ships it, imported with nothing but input_shapes (tests/frontend/real/README.md
says why this one file is kept): Silero VAD 6.2.3's 16 kHz model. Before: 'import passes failed: ValueError:
Value ... is already an output of a different graph' (exit 2); with the dynamic dims: 'dynamic dim 'batch' at
axis 1' for its state even with input's batch set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from npubuild.frontend.normalise import load_onnx, normalise
from npubuild.tosa.run import OnnxSession

SILERO = Path(__file__).parent / "real" / "silero_vad_16k_op15.onnx"


@pytest.fixture(scope="module")
def imported() -> onnx.ModelProto:
    return normalise(load_onnx(SILERO), {"input": [1, 576]}, str(SILERO))


def test_silero_16k_imports_without_control_flow_and_with_static_shapes(imported: onnx.ModelProto):
    ops = [n.op_type for n in imported.graph.node]
    assert not {"If", "Loop", "LSTM", "Shape", "Cast"} & set(ops), ops
    assert ops.count("Conv") == 6 and ops.count("MatMul") == 2  # the encoder and the LSTM cell, unrolled
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in imported.graph.input}
    assert shapes == {"input": [1, 576], "state": [2, 1, 128], "sr": []}


@pytest.mark.parametrize("sr", [16000, 8000])
def test_silero_16k_computes_what_the_export_does(imported: onnx.ModelProto, sr: int):
    rng = np.random.default_rng(0)
    feeds = {"input": (rng.normal(size=(1, 576)) * 0.1).astype(np.float32),
             "state": rng.normal(size=(2, 1, 128)).astype(np.float32), "sr": np.array(sr, np.int64)}
    want = OnnxSession(SILERO.read_bytes())(feeds)
    got = OnnxSession(imported.SerializeToString())(feeds)
    for name in ("output", "stateN"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
