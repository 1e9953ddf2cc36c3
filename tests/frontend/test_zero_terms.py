"""torch's `+ sr * 0` (Silero VAD's 16 kHz export keeps its sample-rate input alive so): the int64 product and
its Cast split the graph around a host partition; an integer times zero is zero and x + 0 is x
(frontend/passes/zero_terms.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest import compile_builds
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def kept_alive_model(x_type: int = TensorProto.INT64) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.array(0, onnx.helper.tensor_dtype_to_np_dtype(x_type)), "zero")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Mul", ["sr", "zero"], ["sr0"], name="/Mul"),
             helper.make_node("Cast", ["sr0"], ["sr0f"], to=TensorProto.FLOAT, name="/Cast"),
             helper.make_node("Add", ["r", "sr0f"], ["y"], name="/Add")]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                             helper.make_tensor_value_info("sr", x_type, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_integer_times_zero_added_is_gone_and_the_model_runs_wholly_on_the_npu(tmp_path: Path, capsys):
    model = kept_alive_model()
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "vad.onnx")
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Relu"]
    feeds = {"x": np.random.default_rng(1).normal(size=(1, 8)).astype(np.float32), "sr": np.array(16000, np.int64)}
    np.testing.assert_array_equal(OnnxSession(out.SerializeToString())(feeds)["y"],
                                  OnnxSession(model.SerializeToString())(feeds)["y"])
    path = tmp_path / "vad.onnx"
    onnx.save(model, path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    assert build["status"] == "passed" and build["metrics"]["npu_offload"] == 1.0  # before: Mul, Cast on the host


def test_a_float_times_zero_stays():
    """inf * 0 is NaN: a float product with zero is not zero."""
    out = normalise(kept_alive_model(TensorProto.FLOAT), {}, "vad.onnx")
    assert "Mul" in [n.op_type for n in out.graph.node]
