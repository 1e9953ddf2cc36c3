"""A constant multiplied into a convolution's output, folded into its weights and bias at import
(frontend/passes/conv_scale.py): PP-LCNetV3's learnable affine after each conv, `conv * s + t` as Paddle2ONNX
writes it, becomes the one convolution (the Add then folds as conv_bias's bias)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def affine_model(op: str = "Conv", scale_shape: tuple[int, ...] = (1,), group: int = 1,
                 extra_reader: bool = False, bias: bool = True) -> onnx.ModelProto:
    """x -> Conv / ConvTranspose (with a bias) -> Mul s -> Add t -> Relu (and, with `extra_reader`, the conv's
    output read by a second Relu too)."""
    rng = np.random.default_rng(0)
    w_shape = (6, 4 // group, 3, 3) if op == "Conv" else (4, 6 // group, 2, 2)
    inits = [numpy_helper.from_array(rng.normal(size=w_shape).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "b"),
             numpy_helper.from_array(rng.uniform(-2, 2, size=scale_shape).astype(np.float32), "s"),
             numpy_helper.from_array(rng.normal(size=(1,)).astype(np.float32), "t")]
    attrs = {"pads": [1, 1, 1, 1]} if op == "Conv" else {"strides": [2, 2]}
    nodes = [helper.make_node(op, ["x", "w", "b"] if bias else ["x", "w"], ["c"], group=group, name="p2o.Conv.0",
                              **attrs),
             helper.make_node("Mul", ["s", "c"], ["m"], name="p2o.Mul.0"),
             helper.make_node("Add", ["m", "t"], ["a"], name="p2o.Add.0"),
             helper.make_node("Relu", ["a"], ["y"], name="p2o.Relu.0")]
    size = 8 if op == "Conv" else 16
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, size, size])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["z"], name="other"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 6, size, size]))
    graph = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _same_function(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    x = np.random.default_rng(1).normal(size=(1, 4, 8, 8)).astype(np.float32)
    want = OnnxSession(model.SerializeToString())({"x": x})
    got = OnnxSession(out.SerializeToString())({"x": x})
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("op", "scale_shape", "group", "bias"), [
    ("Conv", (1,), 1, True), ("Conv", (1, 6, 1, 1), 2, True), ("Conv", (), 1, False),
    ("ConvTranspose", (1,), 1, True), ("ConvTranspose", (1, 6, 1, 1), 2, True)])
def test_the_scale_and_then_the_shift_fold_into_the_convolution(op: str, scale_shape, group: int, bias: bool):
    """Scalar and per-output-channel scales, grouped convolutions (a ConvTranspose's output channel g * C / group
    + j sits in group g's rows, column j of its weights), with and without a bias."""
    model = affine_model(op, scale_shape, group, bias=bias)
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "det.onnx")
    assert [n.op_type for n in out.graph.node] == [op, "Relu"]
    _same_function(model, out)


@pytest.mark.parametrize("case", ["other reader", "varies over pixels"])
def test_a_scale_the_convolution_cannot_take_stays(case: str):
    """The conv's output read elsewhere too (that reader needs it unscaled), or a constant that varies over the
    pixels (no one value per channel): the Mul stays."""
    model = affine_model(extra_reader=True) if case == "other reader" else affine_model(scale_shape=(1, 1, 8, 8))
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "det.onnx")
    assert [n.op_type for n in out.graph.node].count("Mul") == 1
    _same_function(model, out)
