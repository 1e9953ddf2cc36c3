"""Min/Max/Clip with an infinite bound on the side it leaves alone (frontend/passes/infinite_bounds.py).

openWakeWord's mel front end is tf.clip_by_value(x, 1e-10, inf) before its log: Min(x, +inf) then
Max(x, 1e-10). The import refused it ("initializer 'Const1' ... holds inf values"); now the bound goes and
the model builds. An infinity anywhere else is still refused with that line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import compile_builds
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError
from npubuild.frontend.model_checks import check_model
from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def clip_model(op: str = "Min", bound: float = np.inf, clip_inputs: tuple[str, ...] = ()) -> onnx.ModelProto:
    """y = log(max(op(x @ w, bound), 1e-3)), as tf2onnx writes clip_by_value before a log."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.abs(rng.normal(size=(8, 8))).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([bound], np.float32), "bound"),
             numpy_helper.from_array(np.array([1e-3], np.float32), "floor")]
    first = helper.make_node("Clip", ["h", *clip_inputs], ["clipped"], name="clip") if op == "Clip" else \
        helper.make_node(op, ["h", "bound"], ["clipped"], name="clip_by_value/Minimum")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mel"), first,
             helper.make_node("Max", ["clipped", "floor"], ["floored"], name="clip_by_value"),
             helper.make_node("Log", ["floored"], ["y"], name="log")]
    graph = helper.make_graph(nodes, "mel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op, bound, clip_inputs", [("Min", np.inf, ()), ("Max", -np.inf, ()),
                                                    ("Clip", np.inf, ("floor", "bound")),
                                                    ("Clip", -np.inf, ("bound",))],
                         ids=["min-plus-inf", "max-minus-inf", "clip-max-inf", "clip-min-inf"])
def test_an_infinite_bound_on_the_identity_side_is_removed(op: str, bound: float, clip_inputs):
    model = clip_model(op, bound, clip_inputs)
    check_model(model, "m.onnx")  # before: "initializer 'bound' ... holds inf values"
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "m.onnx")
    assert not any(np.isinf(numpy_helper.to_array(t)).any() for t in out.graph.initializer)
    x = np.random.default_rng(1).normal(size=(1, 8)).astype(np.float32)
    want = OnnxSession(model.SerializeToString())({"x": x})["y"]
    np.testing.assert_allclose(OnnxSession(out.SerializeToString())({"x": x})["y"], want, rtol=1e-6)


@pytest.mark.parametrize("op, bound", [("Min", -np.inf), ("Max", np.inf), ("Add", np.inf)])
def test_an_infinity_that_changes_the_result_is_still_refused(op: str, bound: float):
    with pytest.raises(InputError, match=r"initializer 'bound' \(input of node '.*' \(\w+\)\) holds -?inf values"):
        check_model(clip_model(op, bound), "m.onnx")


def test_the_mel_front_end_form_builds_on_the_npu(tmp_path: Path, capsys):
    path = tmp_path / "mel.onnx"
    onnx.save(clip_model(), path)
    (build,) = compile_builds(path, ["ethos-u55-128"], tmp_path / "b", capsys)
    assert build["status"] == "passed" and build["metrics"]["npu_offload"] == 1.0
