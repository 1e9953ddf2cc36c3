"""Bad input gives one line naming where the problem is, and exit code 2 (never a traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest import run_cli
from onnx import TensorProto, helper


def _write(project: Path, text: str) -> Path:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(text)
    return spec


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


BASE = """version: 1
name: kws
models:
  ds_cnn:
    path: models/ds_cnn.onnx
    input_shapes: {input: [1, 1, 49, 10]}
targets: [ethos-u55-128]
"""


def test_malformed_yaml_names_line_and_column(project, capsys):
    spec = _write(project, BASE + "expect: {npu_offload: [1.0\n")
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"{spec}:9:") and "invalid YAML" in line


def test_unknown_key_points_at_the_key(project, capsys):
    spec = _write(project, BASE.replace("    input_shapes:", "    input_shape:"))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"{spec}:6:5: error:")
    assert "unknown key 'input_shape'" in line


def test_wrong_type_points_at_the_value(project, capsys):
    spec = _write(project, BASE + "verify: {samples: lots}\n")
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"{spec}:8:19: error: verify.samples:")


def test_missing_model_file(project, capsys):
    spec = _write(project, BASE.replace("models/ds_cnn.onnx", "models/nope.onnx"))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"{spec}:5:11: error:") and "nope.onnx" in line and "not found" in line


def test_model_path_outside_project_is_refused(project, capsys):
    spec = _write(project, BASE.replace("models/ds_cnn.onnx", "../../../../etc/hostname"))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    assert code == 2
    assert "outside the project directory" in _one_error_line(err)


def test_unknown_target_lists_known_ones(project, capsys):
    spec = _write(project, BASE.replace("[ethos-u55-128]", "[my-board]"))
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2 and "unknown target 'my-board' (known: " in line and "ethos-u55-128" in line
    assert line.startswith(f"{spec}:7:")


def test_file_that_is_not_onnx(project, capsys):
    (project / "configs" / "models" / "ds_cnn.onnx").write_bytes(b"this is not a protobuf \x00\x01\x02" * 10)
    spec = project / "configs" / "kws.yaml"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert "not an ONNX model" in line and "ds_cnn.onnx" in line


def test_an_op_nothing_can_run_names_node_and_op_type(project, capsys):
    """No lowering and no onnxruntime kernel: neither the NPU nor the host can run it (a node with no lowering
    alone runs on the host: tests/ethosu/test_host_fallback.py)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Cosine", ["x"], ["y"], name="my_cosine", domain="com.example")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, project / "configs" / "models" / "ds_cnn.onnx")
    spec = _write(project, BASE.replace("{input: [1, 1, 49, 10]}", "{}"))
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert "node 'my_cosine' (com.example:Cosine)" in line


def test_extends_deep_merges_and_later_wins(project, capsys):
    (project / "configs" / "base.yml").write_text(
        "quantization: {per_channel: false, method: minmax}\nverify: {samples: 3, seed: 7}\n")
    spec = _write(project, "extends: base.yml\n" + BASE + "verify: {samples: 5}\n")
    from npubuild.config.load import load_spec

    b = load_spec(spec)[0]
    assert b.spec.verify.samples == 5 and b.spec.verify.seed == 7
    assert b.spec.quantization.per_channel is False


def test_bad_command_line_is_exit_2(capsys):
    code, _, err = run_cli(["build", "--jobs", "many"], capsys)
    assert code == 2 and _one_error_line(err).startswith("error: npubuild build:")


def test_calibration_npy_with_wrong_shape(project, capsys):
    np.save(project / "configs" / "calib.npy", np.zeros((4, 3, 3), np.float32))
    spec = _write(project, BASE.replace("    input_shapes:", "    calibration: {npy: calib.npy}\n    input_shapes:"))
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 2
    assert "calib.npy" in _one_error_line(err) and "expected [N, 1, 1, 49, 10] or [N, 1, 49, 10]" in err


def test_missing_fvp_runner_is_named_by_validate(project, capsys):
    spec = _write(project, BASE + "fvp: {runner: firmware/runner.elf}\n")
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_error_line(err)
    assert code == 2
    assert line.startswith(f"{spec}:8:15: error:") and "fvp.runner 'firmware/runner.elf' not found" in line
