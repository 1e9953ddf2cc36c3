"""Exporters' spellings of one function, rewritten at import (frontend/passes/exporter_idioms.py).

torch.export writes F.softplus (and Mish through it) as Where(Greater(x, 20), x, Softplus(x)). On U55 and U65
Vela has no GREATER or SELECT, so the graph split around them onto the host; as the one Softplus it is a
TABLE on the NPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import compile_builds
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def mish_model(threshold: float = 20.0, taken: str = "x") -> onnx.ModelProto:
    """Mish as torch.export writes it: x * tanh(softplus(x)), softplus with torch's threshold branch."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    t = numpy_helper.from_array(np.array(threshold, np.float32), "threshold")
    nodes = [helper.make_node("MatMul", ["a", "w"], ["x"], name="fc"),
             helper.make_node("Softplus", ["x"], ["sp"], name="softplus"),
             helper.make_node("Greater", ["x", "threshold"], ["big"], name="greater"),
             helper.make_node("Where", ["big", taken, "sp"], ["softplus_x"], name="where"),
             helper.make_node("Tanh", ["softplus_x"], ["t"], name="tanh"),
             helper.make_node("Mul", ["x", "t"], ["y"], name="mul")]
    graph = helper.make_graph(nodes, "mish", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w, t])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_threshold_branch_becomes_the_softplus_it_stands_for():
    model = mish_model()
    out = normalise(model, {"a": [1, 8]}, "m.onnx")
    ops = [n.op_type for n in out.graph.node]
    assert "Where" not in ops and "Greater" not in ops and ops.count("Softplus") == 1
    tanh = next(n for n in out.graph.node if n.op_type == "Tanh")
    assert tanh.input[0] == "sp"
    rng = np.random.default_rng(1)
    before, after = OnnxSession(model.SerializeToString()), OnnxSession(out.SerializeToString())
    for scale in (0.1, 1.0, 10.0):  # x = a @ w reaches past the threshold at the largest scale
        a = (rng.normal(size=(1, 8)) * scale).astype(np.float32)
        np.testing.assert_allclose(after({"a": a})["y"], before({"a": a})["y"], rtol=1e-6, atol=0)


@pytest.mark.parametrize("threshold, taken", [(5.0, "x"), (20.0, "sp")])
def test_a_branch_that_changes_values_stays(threshold: float, taken: str):
    """Below 15 the branch changes float32 values; a Where that does not pick x is not the idiom."""
    out = normalise(mish_model(threshold, taken), {"a": [1, 8]}, "m.onnx")
    assert "Where" in [n.op_type for n in out.graph.node]


def test_torch_export_mish_builds_wholly_on_the_u55(tmp_path: Path, capsys):
    path = tmp_path / "mish.onnx"
    onnx.save(mish_model(), path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    assert build["status"] == "passed"
    assert build["metrics"]["host_ops"] == 0 and build["metrics"]["npu_offload"] == 1.0


def sub_pixel_model(mode: str = "CRD", extra_reader: bool = False) -> onnx.ModelProto:
    """ESPCN's upsampler: Conv to 3 * 2 * 2 channels -> Relu -> DepthToSpace(2), as torch's pixel_shuffle (CRD)."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.normal(size=(12, 4, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=12).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("DepthToSpace", ["r"], ["y"], blocksize=2, mode=mode, name="shuffle")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16, 16])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 12, 8, 8]))
    graph = helper.make_graph(nodes, "espcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              outputs, [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_pixel_shuffle_after_its_conv_becomes_dcr_with_the_conv_channels_reordered():
    model = sub_pixel_model()
    out = normalise(model, {"x": [1, 4, 8, 8]}, "m.onnx")
    d2s = next(n for n in out.graph.node if n.op_type == "DepthToSpace")
    assert helper.get_attribute_value(next(a for a in d2s.attribute if a.name == "mode")) == b"DCR"
    x = np.random.default_rng(4).normal(size=(1, 4, 8, 8)).astype(np.float32)
    want = OnnxSession(model.SerializeToString())({"x": x})["y"]
    np.testing.assert_allclose(OnnxSession(out.SerializeToString())({"x": x})["y"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_conv_output_read_elsewhere_or_grouped_keeps_its_channel_order(grouped: bool):
    model = sub_pixel_model(extra_reader=not grouped)
    if grouped:  # a grouped conv's output channels read their own group's inputs: no reordering
        conv = model.graph.node[0]
        conv.attribute.append(helper.make_attribute("group", 2))
        w = next(i for i in model.graph.initializer if i.name == "w")
        w.CopyFrom(numpy_helper.from_array(np.random.default_rng(5).normal(size=(12, 2, 3, 3)).astype(np.float32), "w"))
    out = normalise(model, {"x": [1, 4, 8, 8]}, "m.onnx")
    d2s = next(n for n in out.graph.node if n.op_type == "DepthToSpace")
    assert helper.get_attribute_value(next(a for a in d2s.attribute if a.name == "mode")) == b"CRD"


def hard_swish_model(form: str, opset: int, x_also_read: bool = False) -> onnx.ModelProto:
    """x = a @ w, then hard-swish written out: "div" x * Clip(x + 3, 0, 6) / 6 (Paddle2ONNX), "sixth" with the
    / 6 a Mul by 1/6 on the product, "clip_sixth" x * (Clip(3 + x, 0, 6) * 1/6) (tf2onnx's Keras)."""
    inits = [numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w"),
             *(numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
               (("three", 3.0), ("zero", 0.0), ("six", 6.0), ("sixth", 1.0 / 6.0)))]
    add = helper.make_node("Add", ["three", "x"] if form == "clip_sixth" else ["x", "three"], ["x3"], name="add")
    clip = helper.make_node("Clip", ["x3", "zero", "six"], ["r6"], name="clip")
    tail = {"div": [helper.make_node("Mul", ["x", "r6"], ["p"], name="mul"),
                    helper.make_node("Div", ["p", "six"], ["y"], name="div")],
            "sixth": [helper.make_node("Mul", ["r6", "x"], ["p"], name="mul"),
                      helper.make_node("Mul", ["sixth", "p"], ["y"], name="scale")],
            "clip_sixth": [helper.make_node("Mul", ["r6", "sixth"], ["q"], name="scale"),
                           helper.make_node("Mul", ["x", "q"], ["y"], name="mul")]}[form]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["x"], name="fc"), add, clip, *tail]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
    if x_also_read:
        nodes.append(helper.make_node("Relu", ["x3"], ["z"], name="reader"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8]))
    graph = helper.make_graph(nodes, "hard_swish", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("form", ["div", "sixth", "clip_sixth"])
@pytest.mark.parametrize(("opset", "ops"), [(13, ["MatMul", "HardSigmoid", "Mul"]), (14, ["MatMul", "HardSwish"])])
def test_hard_swish_written_out_becomes_the_function(form: str, opset: int, ops: list[str]):
    """One HardSwish from opset 14, x * HardSigmoid(x) before it; the same values over hard-swish's three pieces
    (x below -3, between, above 3), and the graph output keeps its name."""
    model = hard_swish_model(form, opset)
    out = normalise(model, {"a": [1, 8]}, "m.onnx")
    assert [n.op_type for n in out.graph.node] == ops
    assert [o.name for o in out.graph.output] == ["y"]
    before, after = OnnxSession(model.SerializeToString()), OnnxSession(out.SerializeToString())
    rng = np.random.default_rng(2)
    for scale in (0.3, 1.0, 3.0):
        a = (rng.normal(size=(1, 8)) * scale).astype(np.float32)
        np.testing.assert_allclose(after({"a": a})["y"], before({"a": a})["y"], rtol=1e-6, atol=1e-6)


def test_hard_swish_whose_pieces_are_read_elsewhere_stays_written_out():
    """x + 3 read by another node too: removing the Add would take its value from that reader."""
    model = hard_swish_model("div", 14, x_also_read=True)
    out = normalise(model, {"a": [1, 8]}, "m.onnx")
    assert "HardSwish" not in [n.op_type for n in out.graph.node]
