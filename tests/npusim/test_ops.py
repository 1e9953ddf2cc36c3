"""npu-sim runs Vela's POOL, ELEMENTWISE and LUT ops bit-exactly against the TOSA reference model."""

from __future__ import annotations

import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import rand, single_op_model

S = [1, 16, 8, 8]


def _model(name: str):
    if name == "maxpool":
        return single_op_model("MaxPool", {"x": S}, {"y": None}, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    if name == "avgpool":
        return single_op_model("AveragePool", {"x": S}, {"y": None}, kernel_shape=[2, 2], strides=[2, 2])
    if name == "avgpool_padded":
        return single_op_model("AveragePool", {"x": S}, {"y": None}, kernel_shape=[3, 3], pads=[1] * 4,
                               count_include_pad=0)
    if name == "global_avgpool":
        return single_op_model("GlobalAveragePool", {"x": S}, {"y": None})
    if name in ("Add", "Sub", "Mul", "Max", "Min"):
        return single_op_model(name, {"x": S, "x2": S}, {"y": None})
    if name == "add_broadcast":
        return single_op_model("Add", {"x": S, "x2": [1, 16, 1, 1]}, {"y": None})
    if name == "add_constant":
        return single_op_model("Add", {"x": S}, {"y": None}, {"c": rand((1, 16, 1, 1), 5)})
    if name == "leaky_relu":
        return single_op_model("LeakyRelu", {"x": S}, {"y": None}, alpha=0.1)
    return single_op_model(name, {"x": S}, {"y": None})


@pytest.mark.parametrize("name", ["maxpool", "avgpool", "avgpool_padded", "global_avgpool"])
def test_pooling_bitexact(name):
    compile_and_check(_model(name), S)


@pytest.mark.parametrize("name", ["Add", "Sub", "Mul", "Max", "Min", "add_broadcast", "add_constant"])
def test_elementwise_bitexact(name):
    compile_and_check(_model(name), S)


@pytest.mark.parametrize("name", ["Sigmoid", "Tanh", "leaky_relu", "Abs"])
def test_lut_bitexact(name):
    compile_and_check(_model(name), S)


@pytest.mark.parametrize("shape", [[1, 10], [2, 6, 16]])
def test_softmax_bitexact(shape):
    """Softmax becomes ~27 NPU ops: max pool, LUTs, int32 MUL/SUB chains, REDUCE_SUM over depth, CLZ, SHL, SHR."""
    compile_and_check(single_op_model("Softmax", {"x": shape}, {"y": None}, axis=-1), shape)


def test_matmul_bitexact():
    """A float MatMul against a constant: Vela's MUL + REDUCE_SUM or CONV lowering."""
    m = single_op_model("MatMul", {"x": [1, 4, 16]}, {"y": None}, {"w": rand((16, 8), 9)})
    compile_and_check(m, [1, 4, 16])


def test_two_input_matmul_bitexact():
    """Activations times activations (attention): Vela's transposes, MUL and REDUCE_SUM over depth."""
    m = single_op_model("MatMul", {"x": [1, 4, 16], "x2": [1, 16, 8]}, {"y": None})
    compile_and_check(m, [1, 4, 16])


def test_elementwise_on_u65_512():
    compile_and_check(_model("add_broadcast"), S, "ethos-u65-512")
