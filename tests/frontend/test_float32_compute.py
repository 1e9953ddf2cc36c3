"""Half-precision models at import (frontend/passes/float32_compute.py): computed in float32, so that they
quantise and lower; before, a full float16 model failed ("onnxruntime cannot run its host partition")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from npbtest import compile_builds
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.frontend.passes.float32_compute import Float32Compute
from npubuild.tosa.run import OnnxSession

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float16)


def half_model(io: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """Conv -> Relu -> + a Constant -> GlobalAveragePool, every weight and value float16; float32 graph I/O
    with Casts at the edges (as float16 converters keep the I/O types), or float16 I/O (`io`)."""
    half = TensorProto.FLOAT16
    nodes = [helper.make_node("Conv", ["x16", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(0.25, np.float16))),
             helper.make_node("Add", ["r", "k"], ["a"], name="add"),
             helper.make_node("GlobalAveragePool", ["a"], ["y16"], name="gap")]
    if io == TensorProto.FLOAT:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["x16"], to=half, name="in16"))
        nodes.append(helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT, name="out32"))
        x, y = "x", "y"
    else:
        x, y = "x16", "y16"
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info(x, io, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info(y, io, [1, 8, 1, 1])], [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _expected(x: np.ndarray) -> np.ndarray:
    """The function in float64: conv, relu, + 0.25, mean over the plane."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, 8, 16, 16))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 16, j:j + 16], W[:, :, i, j].astype(np.float64))
    return (np.maximum(out, 0) + 0.25).mean(axis=(2, 3), keepdims=True)


@pytest.mark.parametrize("io", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_every_half_value_becomes_float32_and_the_function_is_the_same(io: int):
    out = normalise(half_model(io), {}, "half.onnx")
    types = {vi.type.tensor_type.elem_type for vi in [*out.graph.input, *out.graph.output, *out.graph.value_info]}
    types |= {t.data_type for t in out.graph.initializer}
    types |= {a.i for n in out.graph.node for a in n.attribute if a.name == "to"}
    assert TensorProto.FLOAT16 not in types and TensorProto.FLOAT in types
    x = RNG.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    got = next(iter(OnnxSession(out.SerializeToString())({out.graph.input[0].name: x}).values()))
    np.testing.assert_allclose(got, _expected(x), rtol=1e-5, atol=1e-5)


def test_a_float32_model_is_left_as_it_is():
    model = half_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(W.astype(np.float32), "w"))
    for n in model.graph.node:
        for a in n.attribute:
            if a.name == "to":
                a.i = TensorProto.FLOAT
            if a.name == "value":
                a.t.CopyFrom(numpy_helper.from_array(np.array(0.25, np.float32)))
    assert not Float32Compute()(ir.serde.deserialize_model(model)).modified


@pytest.mark.parametrize("io", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_a_half_precision_model_builds_wholly_on_the_npu(io: int, tmp_path: Path, capsys):
    path = tmp_path / "half.onnx"
    onnx.save(half_model(io), path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    m = build["metrics"]
    assert build["status"] == "passed" and m["host_ops"] == 0 and m["npu_offload"] == 1.0
    assert m["tosa_max_error_lsb"] <= 1


def test_a_float32_models_deliberate_cast_to_half_keeps_its_rounding():
    """No half-precision data: the Cast to float16 is the model's own rounding (ONNX's Cast node tests)."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="round"),
             helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT, name="back")]
    graph = helper.make_graph(nodes, "round", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert not Float32Compute()(ir.serde.deserialize_model(model)).modified
