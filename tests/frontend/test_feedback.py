"""A recurrent state fed back (`models.<m>.feedback: {stateN: state}`): the input on its output's grid, so the
device copies the output's codes straight back (frontend/qdq_feedback.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.config.schema import Calibration, Quantization
from npubuild.errors import InputError
from npubuild.frontend.quantize import quantize_model

STEPS = 40


def _recurrent_step(tmp_path: Path) -> Path:
    """stateN = tanh(x Wx + state Ws), y = stateN Wy: one step of a recurrent layer with its state as I/O."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Gemm", ["x", "wx"], ["a"]), helper.make_node("Gemm", ["state", "ws"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["pre"]), helper.make_node("Tanh", ["pre"], ["stateN"]),
             helper.make_node("Gemm", ["stateN", "wy"], ["y"])]
    inits = [numpy_helper.from_array(rng.normal(0, 0.6, (4, 8)).astype(np.float32), "wx"),
             numpy_helper.from_array(rng.normal(0, 0.4, (8, 8)).astype(np.float32), "ws"),
             numpy_helper.from_array(rng.normal(0, 0.5, (8, 2)).astype(np.float32), "wy")]
    g = helper.make_graph(nodes, "step", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                          helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2]),
                           helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "step.onnx"
    onnx.save(model, path)
    return path


def _quantised(tmp_path: Path, feedback: dict[str, str] | None) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(4)
    # states recorded off a float run lie in tanh's (-1, 1); these calibration states spread wider, as a
    # state's calibration often does (zeros, other streams): the input then calibrates a grid of its own
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.uniform(-1, 1, (24, 1, 4)).astype(np.float32),
             state=rng.uniform(-1.6, 1.6, (24, 1, 8)).astype(np.float32))
    out = tmp_path / f"qdq_{bool(feedback)}.onnx"
    metrics = quantize_model(_recurrent_step(tmp_path), Quantization(method="minmax", bias_correction=False,
                                                                     equalization=False),
                             Calibration(npy="calib.npz"), calib, out, feedback=feedback)
    return onnx.load(out), metrics


def _params(qdq: onnx.ModelProto, tensor: str, op: str) -> tuple[float, int]:
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    node = next(n for n in qdq.graph.node if n.op_type == op and (n.input[0] == tensor or n.output[0] == tensor))
    return float(inits[node.input[1]]), int(inits[node.input[2]])


def _stream(qdq: onnx.ModelProto, copy_codes: bool) -> np.ndarray:
    """The QDQ model run over STEPS inputs, its state fed back: as the output's int8 codes copied into the
    input's buffer (what a device does without a requantisation loop), or dequantised and quantised again."""
    s_out, z_out = _params(qdq, "stateN", "DequantizeLinear")
    s_in, z_in = _params(qdq, "state", "QuantizeLinear")
    sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = np.random.default_rng(5).uniform(-1, 1, (STEPS, 1, 4)).astype(np.float32)
    state, ys = np.zeros((1, 8), np.float32), []
    for x in xs:
        y, state_n = sess.run(["y", "stateN"], {"x": x, "state": state})
        ys.append(y)
        if copy_codes:  # the input buffer holds the output's codes, read on the input's grid
            codes = np.clip(np.round(state_n / s_out) + z_out, -128, 127)
            state = ((codes - z_in) * s_in).astype(np.float32)
        else:
            state = state_n
    return np.concatenate(ys)


def test_a_fed_back_state_shares_its_outputs_grid(tmp_path: Path):
    """With `feedback` the state's input is quantised on stateN's grid, so copying the output's codes back is
    the same stream as a float round trip; without it the grids differ and copied codes give another stream."""
    tied, metrics = _quantised(tmp_path, {"stateN": "state"})
    assert metrics["quantization"]["feedback"] == {"stateN": "state"}
    assert _params(tied, "state", "QuantizeLinear") == _params(tied, "stateN", "DequantizeLinear")
    np.testing.assert_array_equal(_stream(tied, copy_codes=True), _stream(tied, copy_codes=False))

    apart, metrics = _quantised(tmp_path, None)
    assert "feedback" not in metrics["quantization"]
    assert _params(apart, "state", "QuantizeLinear") != _params(apart, "stateN", "DequantizeLinear")
    assert not np.array_equal(_stream(apart, copy_codes=True), _stream(apart, copy_codes=False))


def test_feedback_names_an_output_and_an_input_of_one_shape(tmp_path: Path):
    with pytest.raises(InputError, match="'hidden' is not an output of the model"):
        _quantised(tmp_path, {"hidden": "state"})
    with pytest.raises(InputError, match="output 'y' .* and input 'state' .* differ"):
        _quantised(tmp_path, {"y": "state"})
