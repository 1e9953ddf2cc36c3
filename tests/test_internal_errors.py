"""An exception inside npubuild is an internal error: exit 1, error kind `internal`, the node it was working on
named, "please report", the traceback kept in the stage's error.json. Never `input` (exit 2), which says the
user's model is at fault: Silero VAD's valid export crashed an import pass and was reported as bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.passes import exporter_idioms
from npubuild.lowering import load_all, registry


def small_model(path: Path) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
                               helper.make_node("Relu", ["h"], ["y"], name="act")], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _broken_pass(self, model):
    for node in model.graph:  # noqa: B007 - `node` is what the error line names
        if node.op_type == "MatMul":
            raise ValueError("a bug in an import pass")
    raise AssertionError("unreachable")


def _broken_lowering(ctx):
    raise KeyError("a bug in a lowering")


@pytest.mark.parametrize("where", ["import-pass", "lowering"])
def test_a_bug_inside_npubuild_is_an_internal_error_naming_the_node(where: str, tmp_path: Path, capsys,
                                                                     monkeypatch):
    if where == "import-pass":  # the stage runs in a forked child: it inherits the patch
        monkeypatch.setattr(exporter_idioms.ExporterIdioms, "call", _broken_pass)
        stage, node = "import", "node 'fc' (MatMul)"
    else:
        load_all()
        monkeypatch.setitem(registry.LOWERINGS, registry.op_key("", "MatMul"), _broken_lowering)
        stage, node = "lower", "node 'fc' (MatMul)"
    model = small_model(tmp_path / "m.onnx")
    code, out, err = run_cli(["compile", str(model), "--target", "ethos-u55-128", "--build-dir", str(tmp_path / "b")],
                             capsys)
    assert code == 1, out + err
    (build,) = read_report(tmp_path / "b" / "compile")["builds"]
    assert build["status"] == "failed" and build["error_kinds"] == ["internal"]
    (line,) = build["errors"]
    assert "internal error" in line and node in line and "please report" in line and "\n" not in line
    error_json = next((tmp_path / "b" / "stages" / stage).glob("*/error.json"))
    recorded = json.loads(error_json.read_text())
    assert recorded["kind"] == "internal" and "Traceback" in recorded["traceback"]
