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


NODE_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


@pytest.mark.parametrize("test", [
    "test_resize_downsample_scales_cubic",  # lower: the partition check fed uniform values as Resize's scales
    "test_expand_dim_changed",  # ... and as Expand's shape
    "test_center_crop_pad_pad_expanded",  # tosa-check: int64 shape tensors exposed as float outputs
    "test_split_to_sequence_2",  # lower: a sequence output (KeyError: 0)
    "test_group_normalization_epsilon",  # vela: Vela's raw output lists fewer inputs than the TOSA graph
])
def test_onnx_node_tests_that_crashed_npubuild_now_end_without_an_internal_error(test: str, tmp_path: Path, capsys):
    """ONNX's node tests as they are (shapes and scales as graph inputs, the test's own data as calibration), through
    the CLI (bench/conformance_cli.py --selection all): each was an internal error."""
    from onnx import numpy_helper

    model = onnx.load(str(NODE_DIR / test / "model.onnx"))
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    files = sorted((NODE_DIR / test / "test_data_set_0").glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    arrays = {n: numpy_helper.to_array(onnx.load_tensor(str(f))) for n, f in zip(names, files, strict=False)}
    root = tmp_path / "p"
    root.mkdir()
    (root / "pyproject.toml").touch()
    onnx.save(model, root / "m.onnx")
    np.savez(root / "data.npz", **arrays)
    (root / "m.yaml").write_text("version: 1\nname: node\nmodels:\n  m:\n    path: m.onnx\n"
                                 "    calibration: {npy: data.npz}\ntargets: [ethos-u85-256]\n"
                                 "verify: {tosa: true, samples: 1}\n")
    code, out, err = run_cli(["build", str(root / "m.yaml"), "--build-dir", str(root / "build"), "-q"], capsys,
                             cwd=root)
    (build,) = read_report(root / "build")["builds"]
    assert "internal" not in build["error_kinds"] and code in (0, 1, 2), out + err
    assert all("\n" not in e for e in build["errors"])
