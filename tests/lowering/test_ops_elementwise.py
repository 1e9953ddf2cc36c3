"""Binary elementwise ops (Add, Sub, Mul, Div, Min, Max): FP vs onnxruntime on the float op, INT vs
onnxruntime on the QDQ op (in LSB), INT compiled by Vela for U55 and U85 with every op on the NPU."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_fp, check_int, io_dict, rand, single_op_model, vela_op_counts
from onnx import TensorProto, helper

ACCELS = ("ethos-u55-128", "ethos-u85-256")
BINARY = ["Add", "Sub", "Mul", "Div", "Min", "Max"]
X = [1, 4, 6, 6]


def _ops(lowered) -> list[str]:
    return [op for ops in lowered.node_ops.values() for op in ops]


def _assert_on_npu(lowered) -> None:
    for accel in ACCELS:
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, accel


# second operand: an activation of this shape (broadcast against X), low end of its range
ACTIVATION_B = {"same": [1, 4, 6, 6], "per-channel": [1, 4, 1, 1], "rank-1": [6]}


@pytest.mark.parametrize("b_kind", list(ACTIVATION_B))
@pytest.mark.parametrize("op", BINARY)
def test_two_activations(op, b_kind):
    b_shape = ACTIVATION_B[b_kind]
    b_low = 0.5 if op == "Div" else -2.0  # a divisor away from 0
    model = single_op_model(op, {"a": X, "b": b_shape}, {"y": None})
    feeds = {"a": rand(X, 1), "b": rand(b_shape, 2, b_low, 2.0)}
    check_fp(model, feeds)
    cal = {**calib("a", X), **calib("b", b_shape, seed=5, low=b_low, high=2.0)}
    lowered, _ = check_int(model, cal, feeds, max_lsb=1)
    assert "TRANSPOSE" not in _ops(lowered)
    _assert_on_npu(lowered)


CONSTANTS = {
    "scalar": np.array(1.7, np.float32),
    "negative-scalar": np.array(-0.6, np.float32),
    "per-channel": np.array([0.5, 1.25, 2.0, 0.8], np.float32).reshape(4, 1, 1),
    "mixed-sign-per-channel": np.array([0.5, -1.25, 2.0, -0.8], np.float32).reshape(4, 1, 1),
    "along-width": np.linspace(0.6, 1.9, 6).astype(np.float32),
    "full": np.random.default_rng(3).uniform(0.5, 2.0, X[1:]).astype(np.float32),
}


@pytest.mark.parametrize("const", list(CONSTANTS))
@pytest.mark.parametrize("op", BINARY)
def test_with_constant(op, const):
    c = CONSTANTS[const]
    model = single_op_model(op, {"a": X}, {"y": None}, {"c": c})
    check_fp(model, {"a": rand(X, 1)})
    lowered, _ = check_int(model, calib("a", X), {"a": rand(X, 2)}, max_lsb=1)
    if op in ("Mul", "Div") and const in ("scalar", "per-channel"):
        assert _ops(lowered) == ["RESCALE"]  # a positive scale per tensor or per channel folds into one RESCALE
    if op in ("Mul", "Div") and const == "negative-scalar":
        assert _ops(lowered) == ["TABLE"]  # any other scalar: one exact TABLE
    if op in ("Min", "Max") and "scalar" in const:
        assert _ops(lowered)[-1] == "CLAMP"
    assert "TRANSPOSE" not in _ops(lowered)
    _assert_on_npu(lowered)


def test_constant_first_operand():
    """1 - x and 2 * x: the constant on the left."""
    for op in ("Sub", "Mul"):
        model = single_op_model(op, {"a": X}, {"y": None}, {"c": np.array(1.5, np.float32)}, node_inputs=["c", "a"])
        check_fp(model, {"a": rand(X, 1)})
        check_int(model, calib("a", X), {"a": rand(X, 2)}, max_lsb=1)


@pytest.mark.parametrize("shape", [[2, 16], [1, 3, 10]])
@pytest.mark.parametrize("op", ["Sub", "Mul", "Min"])
def test_low_rank(op, shape):
    model = single_op_model(op, {"a": shape, "b": shape}, {"y": None})
    feeds = {"a": rand(shape, 1), "b": rand(shape, 2, -1.5, 1.5)}
    check_fp(model, feeds)
    cal = {**calib("a", shape), **calib("b", shape, seed=5, low=-1.5, high=1.5)}
    check_int(model, cal, feeds, max_lsb=1)


@pytest.mark.parametrize("op", ["Min", "Max"])
def test_variadic_min_max(op):
    model = single_op_model(op, {"a": X, "b": X, "c": [1, 4, 1, 1]}, {"y": None})
    feeds = {"a": rand(X, 1), "b": rand(X, 2, -2, 2), "c": rand([1, 4, 1, 1], 3, -0.5, 0.5)}
    check_fp(model, feeds)
    cal = {**calib("a", X), **calib("b", X, seed=5, low=-2, high=2), **calib("c", [1, 4, 1, 1], seed=6, low=-0.5,
                                                                              high=0.5)}
    lowered, _ = check_int(model, cal, feeds, max_lsb=1)
    _assert_on_npu(lowered)


# General int8 Div: the divisor's reciprocal as a ~15-bit int32 from two int8 TABLEs (high and low byte), then an
# exact int32 Mul and one RESCALE. Measured <= 1 LSB against onnxruntime for every range below (a single int8
# reciprocal table measured 16 LSB on [0.5, 2], since onnxruntime's range for b always includes 0).
@pytest.mark.parametrize("b_range", [(0.5, 2.0), (0.1, 3.0), (-2.0, -0.5), (0.02, 1.0)], ids=str)
def test_div_general(b_range):
    model = single_op_model("Div", {"a": X, "b": X}, {"y": None})
    feeds = {"a": rand(X, 1, -3, 3), "b": rand(X, 2, *b_range)}
    cal = {**calib("a", X, low=-3, high=3), **calib("b", X, seed=5, low=b_range[0], high=b_range[1])}
    lowered, _ = check_int(model, cal, feeds, max_lsb=1)
    # the reciprocal's mantissa bytes and exponent: three TABLEs, a product and a per-element shift
    assert _ops(lowered).count("TABLE") == 3 and "MUL" in _ops(lowered) and "ARITHMETIC_RIGHT_SHIFT" in _ops(lowered)
    _assert_on_npu(lowered)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


def test_squeeze_excite_mul():
    """x * sigmoid(mean(x)): the MobileNetV3 gate, a per-channel activation broadcast over H and W."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="gap"),
             helper.make_node("Sigmoid", ["p"], ["s"], name="gate"),
             helper.make_node("Mul", ["x", "s"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, X)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    check_fp(model, {"x": rand(X, 1, -2, 2)})
    lowered, _ = check_int(model, calib("x", X, low=-2, high=2), {"x": rand(X, 2, -2, 2)}, max_lsb=1)
    assert lowered.node_ops["gate"] == ["TABLE"] and "TRANSPOSE" not in _ops(lowered)
    _assert_on_npu(lowered)


def test_mul_of_same_tensor():
    model = single_op_model("Mul", {"a": X}, {"y": None}, node_inputs=["a", "a"])
    check_fp(model, {"a": rand(X, 1)})
    check_int(model, calib("a", X), {"a": rand(X, 2)}, max_lsb=1)
