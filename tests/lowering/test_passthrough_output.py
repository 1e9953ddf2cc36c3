"""A graph output that is a graph input passed through (an Identity, which eliminate_identity drops) beside outputs
the graph computes: one IDENTITY writes it, as a TOSA graph output must be written by an operator. It was
`graph output 'xcopy' is not computed by the lowered graph`, exit 2, for a valid model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from npbtest import compile_builds
from npbtest.lowering import ops
from npbtest.ops import calib, quantize_model
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.passes import run_passes
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import OnnxSession, run_tosa

PIPELINE_PASSES = ["eliminate_identity", "eliminate_dropout", "remove_unused", "topological_sort"]  # default

def passthrough_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Identity", ["x"], ["xcopy"])]
    graph = helper.make_graph(nodes, "pass", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("xcopy", TensorProto.FLOAT, [1, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_passed_input_is_one_identity_and_both_outputs_match_onnxruntime():
    qdq = quantize_model(passthrough_model(), calib("x", [1, 4]))
    model = ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(qdq), PIPELINE_PASSES))
    assert "Identity" not in [n.op_type for n in model.graph.node]  # the lower stage's input: xcopy is DQ(Q(x))
    lowered = lower_model(model, "int")
    assert {o.onnx_name for o in lowered.outputs} == {"y", "xcopy"} and ops(lowered).count("IDENTITY") == 1
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 4)).astype(np.float32)}
    want = OnnxSession(model.SerializeToString())(feeds)
    got = run_tosa(lowered.tosa, lowered, feeds)
    for spec in lowered.outputs:
        assert np.abs(spec.lsb_error(want[spec.onnx_name], got[spec.onnx_name])).max() == 0, spec.onnx_name


def test_a_model_passing_its_input_through_builds(tmp_path: Path, capsys):
    path = tmp_path / "pass.onnx"
    onnx.save(passthrough_model(), path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    assert build["status"] == "passed" and build["metrics"]["host_ops"] == 0
