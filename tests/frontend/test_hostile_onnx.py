"""Bad or hostile ONNX is one line and exit 2 naming the node (or initializer and the node it feeds); a crash
in onnx's C++ ends one build, not the night; external data is read only from beside the model."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO, read_report, run_cli
from npbtest.onnx_cases import CASES, conv, weights
from onnx import TensorProto

from npubuild.engine.isolate import run_isolated
from npubuild.errors import InputError


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "\x1b[" not in err, err  # no onnxruntime colour log
    return lines[0]


CRASHING = {"conv-strides-0", "conv-dilations-0"}  # SIGFPE in onnx shape inference: in-process today, fatal


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_invalid_model_is_one_line_exit_2_naming_what_is_wrong(tmp_path: Path, capsys, case: str):
    build_model, expected = CASES[case]
    model = tmp_path / "models" / f"{case}.onnx"
    model.parent.mkdir()
    model.write_bytes(build_model().SerializeToString())
    args = ["compile", str(model), "--target", "ethos-u55-128", "--build-dir", str(tmp_path / "b"), "--json"]
    if case in CRASHING:
        proc = subprocess.run([sys.executable, "-m", "npubuild", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        code, err = proc.returncode, proc.stderr
    else:
        code, _, err = run_cli(args, capsys, cwd=tmp_path)
    line = _one_line(err)
    assert code == 2 and expected in line, line


def test_a_crash_in_shape_inference_is_one_error_for_that_build(project: Path):
    """A Conv with strides [0, 0] beside the good kws model in a --keep-going night: the crash is isolated
    (whichever check meets it first), the other build passes and report.json is written."""
    onnx.save(conv(strides=[0, 0]), project / "configs" / "models" / "bad.onnx")
    (project / "configs" / "bad.yaml").write_text(
        "version: 1\nname: bad\nmodels:\n  bad:\n    path: models/bad.onnx\ntargets: [ethos-u55-128]\n")
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "--keep-going", "-q"], cwd=project,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert "node 'conv0' (Conv): strides [0, 0]" in _one_line(proc.stderr)
    builds = {b["spec"]: b for b in read_report(project / "build")["builds"]}
    assert builds["kws"]["status"] == "passed" and builds["bad"]["status"] == "failed"


def test_a_native_crash_in_the_isolated_child_is_one_input_error():
    """The backstop for crashes no check foresees: the real SIGFPE of onnx's shape inference, in a child."""
    model = conv(strides=[0, 0])
    with pytest.raises(InputError) as info:
        run_isolated(onnx.shape_inference.infer_shapes, model, what="shape inference", where="m.onnx")
    assert str(info.value) == "m.onnx: error: shape inference crashed on this model (SIGFPE: Floating point exception)"
    inferred = run_isolated(onnx.shape_inference.infer_shapes, conv(), what="shape inference", where="m.onnx")
    assert {vi.name for vi in inferred.graph.value_info} == {"c"}


def _external_model(model_dir: Path, location: str) -> Path:
    """The conv model with its weights stored as external data at `location` (relative to the model)."""
    m = conv()
    onnx.save_model(m, model_dir / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return model_dir / "m.onnx"


def test_external_weights_beside_the_model_work_from_any_directory_and_are_folded(tmp_path: Path, capsys):
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    model = _external_model(model_dir, "weights.bin")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = run_cli(["compile", str(model), "--target", "ethos-u55-128", "--build-dir",
                              str(tmp_path / "b"), "--json"], capsys, cwd=elsewhere)
    assert code == 0, err
    assert json.loads(out)["status"] == "passed"
    (imported,) = (tmp_path / "b").glob("stages/import/*/model.onnx")
    m = onnx.load(str(imported), load_external_data=False)
    assert all(t.data_location == TensorProto.DEFAULT for t in m.graph.initializer)
    w = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w"))
    np.testing.assert_array_equal(w, weights())


def test_external_data_is_never_read_from_outside_the_model_directory(tmp_path: Path, capsys):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    secret = b"AKIA-SECRET-KEY-0123456789" * 24  # exactly the 576 bytes the 4x4x3x3 float weights take
    (home / ".aws" / "credentials").write_bytes(secret)
    model_dir = home / "project" / "models"
    model_dir.mkdir(parents=True)
    cases = {".aws/credentials": "No such file or directory", "../../.aws/credentials": "outside the model's directory",
             str(home / ".aws" / "credentials"): "is an absolute path"}
    for location, expected in cases.items():
        m = conv()
        t = m.graph.initializer[0]
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("length", str(len(secret)))):
            e = t.external_data.add()
            e.key, e.value = k, v
        onnx.save(m, model_dir / "m.onnx")
        build_dir = tmp_path / "b"
        shutil.rmtree(build_dir, ignore_errors=True)
        code, _, err = run_cli(["compile", str(model_dir / "m.onnx"), "--target", "ethos-u55-128", "--build-dir",
                                str(build_dir), "--json"], capsys, cwd=home)  # the secret is at cwd/.aws
        line = _one_line(err)
        assert code == 2 and expected in line and "initializer 'w'" in line, line
        for f in build_dir.rglob("*"):
            assert not f.is_file() or secret[:16] not in f.read_bytes(), f


def _calibration_project(project: Path, array) -> Path:
    np.save(project / "configs" / "calib.npy", array)
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("calibration: {random: {samples: 32, seed: 0, low: -1.0, high: 1.0}}",
                                             "calibration: {npy: calib.npy}")
                    .replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    return spec


CALIBRATION = {
    "empty": (np.zeros((0, 1, 49, 10), np.float32), "has no samples"),
    "nan": (np.full((4, 1, 49, 10), np.nan, np.float32), "has NaN or Inf values (sample 0)"),
    "inf": (np.concatenate([np.zeros((2, 1, 49, 10)), np.full((1, 1, 49, 10), np.inf)]).astype(np.float32),
            "has NaN or Inf values (sample 2)"),
    "complex64": (np.ones((4, 1, 49, 10), np.complex64), "has complex dtype complex64"),
    "wrong-shape": (np.zeros((4, 3, 3), np.float32),
                    "has shape [4, 3, 3]; expected [N, 1, 1, 49, 10] or [N, 1, 49, 10] (N samples of the input's "
                    "shape [1, 1, 49, 10])"),
}


@pytest.mark.parametrize("case", sorted(CALIBRATION))
@pytest.mark.parametrize("command", ["validate", "build"])
def test_bad_calibration_data_is_one_line_exit_2_from_validate_and_build(project: Path, capsys, case: str,
                                                                         command: str):
    array, expected = CALIBRATION[case]
    spec = _calibration_project(project, array)
    args = ["validate", str(spec)] if command == "validate" else ["build", str(spec), "-q"]
    code, _, err = run_cli(args, capsys, cwd=project)
    line = _one_line(err)
    assert code == 2 and expected in line and "calib.npy" in line, line


def test_a_huge_relu_chain_fails_fast_naming_the_quadratic_quantiser(tmp_path: Path, capsys):
    from onnx import helper

    nodes, prev = [], "x"
    for i in range(10_000):
        out = "y" if i == 9_999 else f"r{i}"
        nodes.append(helper.make_node("Relu", [prev], [out], name=f"relu{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "chain.onnx")
    code, _, err = run_cli(["compile", str(tmp_path / "chain.onnx"), "--target", "ethos-u55-128", "--build-dir",
                            str(tmp_path / "b"), "--json"], capsys, cwd=tmp_path)
    line = _one_line(err)
    assert code == 2 and "10000 nodes" in line and "quadratic" in line, line
    records = [json.loads(p.read_text()) for p in (tmp_path / "b").glob("stages/import/*/stage.json")]
    assert records and records[0]["metrics"]["nodes_out"] == 10_000  # it got past import, to quantize


def test_repo_models_still_import(tmp_path: Path):
    """The checks refuse nothing the shipped examples hold (prequantized QDQ and torch exports included)."""
    from npubuild.frontend.normalise import load_onnx

    for f in sorted((REPO / "configs" / "models").glob("*.onnx")):
        load_onnx(f)
