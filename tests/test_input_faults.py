"""Each input fault a hardening round found answered with an internal error (exit 1) or nothing is one line and
exit 2 naming what to fix; a damaged baseline metric fails the comparison instead of switching it off
(issue 34, findings 6, 7 and 10)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from npbtest import REPO, run_cli
from onnx import TensorProto, helper


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    return lines[0]


def test_a_target_name_that_is_a_path_is_bad_input(tmp_path: Path, capsys):
    model = REPO / "configs" / "models" / "ds_cnn.onnx"
    for flag, value in (("--target", "../../../../etc/passwd"), ("--pipeline", "../x")):
        args = ["compile", str(model), "--build-dir", str(tmp_path / "b"), "--target", "ethos-u55-128", flag, value]
        code, _, err = run_cli(args, capsys, cwd=tmp_path)
        assert code == 2 and f"'{value}' is not a {flag[2:]} name" in _one_line(err)


@pytest.mark.parametrize("value, said", [("1000000000", "1000000000 is not between 1 and 1000"),
                                         ("0", "0 is not between 1 and 1000"), ("x", "'x' is not a whole number")])
def test_debug_numerics_samples_are_bounded(project: Path, capsys, value: str, said: str):
    code, _, err = run_cli(["debug-numerics", "configs/kws.yaml", "--target", "ethos-u55-128", "--samples", value],
                           capsys, cwd=project)
    assert code == 2 and said in _one_line(err)  # was a MemoryError for 1.78 TiB, exit 1


def _reports(tmp_path: Path, baseline_text: str) -> tuple[Path, Path]:
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    entry = {"spec": "kws", "model": "ds_cnn", "target": "ethos-u55-128", "status": "passed",
             "metrics": {"inference_ms": 1.0, "tosa_snr_db": 40.0}, "stages": {}, "gates": [], "errors": []}
    (build_dir / "report.json").write_text(json.dumps({"builds": [entry], "versions": {"npubuild": "0"}}))
    baseline = tmp_path / "old.json"
    baseline.write_text(baseline_text.replace("ENTRY", json.dumps(entry)))
    return build_dir, baseline


def test_a_baseline_nested_past_json_recursion_is_bad_input(tmp_path: Path, capsys):
    build_dir, baseline = _reports(tmp_path, "[" * 100000 + "]" * 100000)
    code, _, err = run_cli(["report", "--build-dir", str(build_dir), "--baseline", str(baseline)], capsys)
    assert code == 2 and _one_line(err) == f"{baseline}: error: not a valid report: nested too deeply to be one"


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"fast"', "true"])
def test_a_baseline_metric_that_is_not_a_finite_number_fails_the_comparison(tmp_path: Path, capsys, value: str):
    """NaN compares false with everything: a damaged baseline said `No regression.` and exit 0."""
    text = '{"versions": {"npubuild": "0"}, "builds": [ENTRY]}'
    build_dir, baseline = _reports(tmp_path, text)
    data = baseline.read_text().replace('"tosa_snr_db": 40.0', f'"tosa_snr_db": {value}')
    baseline.write_text(data)
    code, out, err = run_cli(["report", "--build-dir", str(build_dir), "--baseline", str(baseline)], capsys)
    assert code == 2 and "No regression" not in out
    assert _one_line(err).startswith(f"{baseline}: error: build kws/ds_cnn/ethos-u55-128: metric tosa_snr_db is ")
    assert "not a finite number" in err


def test_a_missing_cache_key_file_is_one_line_before_any_task(project: Path, capsys, monkeypatch, tmp_path: Path):
    monkeypatch.delenv("NPUBUILD_CACHE_KEY", raising=False)
    monkeypatch.setenv("NPUBUILD_CACHE_KEY_FILE", str(tmp_path / "no-such-key"))
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project)
    assert code == 2 and _one_line(err) == (f"{tmp_path / 'no-such-key'}: error: cannot read the cache key file "
                                            "($NPUBUILD_CACHE_KEY_FILE): No such file or directory")
    assert not (project / "build" / "stages").exists()  # was: every build's import failed with it


def _flipped_models(root: Path) -> list[str]:
    """ds_cnn.onnx with one byte of its first 64 flipped, one model each: the header holds the producer name
    and the first node's names, strings a flipped byte can leave not UTF-8."""
    data = (REPO / "configs" / "models" / "ds_cnn.onnx").read_bytes()
    names = []
    for i in range(64):
        flipped = bytearray(data)
        flipped[i] ^= 0xFF
        (root / "configs" / "models" / f"f{i}.onnx").write_bytes(bytes(flipped))
        names.append(f"f{i}")
    return names


def test_a_byte_flipped_model_header_is_bad_input_never_an_internal_error(project: Path, capsys):
    names = _flipped_models(project)
    (project / "configs" / "kws.yaml").unlink()
    (project / "configs" / "flip.yaml").write_text(
        "version: 1\nname: flip\nmodels:\n" + "".join(f"  {n}: {{path: models/{n}.onnx, input_shapes: "
                                                      "{input: [1, 1, 49, 10]}}\n" for n in names)
        + "targets: [ethos-u55-128]\nverify: {tosa: false}\n")
    code, _, err = run_cli(["build", "-q", "--keep-going", "--cache", "off", "--only", "*/*/*"], capsys, cwd=project)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 64 and "internal error" not in err and "Traceback" not in err, err
    assert all(": import: " in ln for ln in lines)
    assert sum("is not UTF-8" in ln for ln in lines) >= 10  # the producer name, node names, inputs and outputs


def test_a_model_that_computes_nothing_is_bad_input(tmp_path: Path, capsys):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    model = helper.make_model(helper.make_graph([], "g", [x], [x]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "passthrough.onnx"
    onnx.save(model, path)
    code, _, err = run_cli(["compile", str(path), "--target", "ethos-u55-128", "--build-dir", str(tmp_path / "b")],
                           capsys, cwd=tmp_path)
    assert code == 2, err  # was: Vela's "RawWriter expects graph with 1 operation", exit 1
    assert "the model computes nothing: its outputs ('x') are its inputs or constants" in err
    assert "RawWriter" not in err


def test_junit_to_a_directory_names_the_directory_not_a_temp_file(project: Path, capsys, tmp_path: Path):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))
    assert run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)[0] == 0
    code, _, err = run_cli(["report", "--junit", str(tmp_path)], capsys, cwd=project)
    line = _one_line(err)
    assert code == 2 and line == (f"{tmp_path}: error: is a directory: --junit takes the XML file's path "
                                  "(e.g. DIR/junit.xml)")


def test_validate_on_a_directory_without_specs_is_bad_input(tmp_path: Path, capsys):
    (tmp_path / "configs").mkdir()
    (tmp_path / "dodo.py").write_text("")
    for args in (["validate"], ["validate", "configs"], ["build"]):
        code, out, err = run_cli(args, capsys, cwd=tmp_path)
        assert code == 2 and "ok: 0 spec(s)" not in out
        assert _one_line(err).endswith("configs: error: no compile spec here (*.yaml, *.yml)")


@pytest.mark.parametrize("data, where, byte", [
    (b"version: 1\nname: k\xe9ws\n", ":2:8:", "0xE9"),
    (b"version: 1\nname: \"\xc3\xa9\xe9\"\n", ":2:9:", "0xE9"),  # the column counts characters, not bytes
    (b"\xff\xfev\x00e\x00r\x00", ":1:1:", "0xFF"),
    (b"version: 1\n# \x80 in a comment\n", ":2:3:", "0x80"),
])
def test_invalid_utf8_yaml_is_one_line_with_its_position(tmp_path: Path, capsys, data: bytes, where: str, byte: str):
    spec = tmp_path / "bad.yaml"
    spec.write_bytes(data)
    code, _, err = run_cli(["validate", str(spec)], capsys, cwd=tmp_path)
    line = _one_line(err)
    assert code == 2 and line.startswith(f"{spec}{where} error: invalid YAML: byte {byte} is not UTF-8"), line

