"""Paddle2ONNX's conv bias as a separate Add, folded into the convolution (frontend/passes/conv_bias.py), and a
BatchNormalization after a ConvTranspose folded too (fold_batchnorm): PP-OCR's classifier and detector head."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def paddle_model(bias_shape=(1, 6, 1, 1), group: int = 2, op: str = "Add") -> onnx.ModelProto:
    """x -> Conv (no bias) -> Add c1 -> Relu -> ConvTranspose (group 2, no bias) -> Add c2 -> BatchNorm -> Relu."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(size=bias_shape).astype(np.float32), "c1"),
             numpy_helper.from_array(rng.normal(size=(6, 4 // group, 2, 2)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(size=(1, 4, 1, 1)).astype(np.float32), "c2"),
             *(numpy_helper.from_array(v.astype(np.float32), n) for n, v in
               (("gamma", rng.uniform(0.5, 2, 4)), ("beta", rng.normal(size=4)), ("mean", rng.normal(size=4)),
                ("var", rng.uniform(0.5, 2, 4))))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="p2o.Conv.0"),
             helper.make_node(op, ["c", "c1"], ["cb"], name="p2o.Add.0"),
             helper.make_node("Relu", ["cb"], ["r"], name="p2o.Relu.0"),
             helper.make_node("ConvTranspose", ["r", "w2"], ["t"], strides=[2, 2], group=group, name="p2o.ConvTranspose.0"),
             helper.make_node("Add", ["t", "c2"], ["tb"], name="p2o.Add.1"),
             helper.make_node("BatchNormalization", ["tb", "gamma", "beta", "mean", "var"], ["n"], name="p2o.BN.0"),
             helper.make_node("Relu", ["n"], ["y"], name="p2o.Relu.1")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _check(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    x = np.random.default_rng(1).normal(size=(1, 4, 8, 8)).astype(np.float32)
    want = OnnxSession(model.SerializeToString())({"x": x})["y"]
    np.testing.assert_allclose(OnnxSession(out.SerializeToString())({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Add", "Sub"])
def test_the_bias_add_and_the_batchnorm_fold_into_the_convolutions(op: str):
    model = paddle_model(op=op)
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "det.onnx")
    assert [n.op_type for n in out.graph.node] == ["Conv", "Relu", "ConvTranspose", "Relu"]
    _check(model, out)


def test_a_constant_that_varies_over_the_pixels_is_no_bias():
    model = paddle_model(bias_shape=(1, 6, 8, 8))
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "det.onnx")
    assert [n.op_type for n in out.graph.node].count("Add") == 1
    _check(model, out)
