"""Typos get the closest valid name (issue 35): options, YAML keys, target and pipeline names, metric names in a
thresholds file (an unknown one is an error, never silently ignored); `init` does not nest a project."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npbtest import run_cli


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_mistyped_option_names_the_closest_one_of_its_command(capsys):
    code, _, err = run_cli(["build", "--keepgoing"], capsys)
    assert code == 2
    assert _one_line(err) == ("error: npubuild build: unrecognized argument: --keepgoing; "
                              "did you mean '--keep-going'?")
    code, _, err = run_cli(["report", "--junti", "x.xml", "--histroy=h"], capsys)
    assert code == 2 and _one_line(err) == ("error: npubuild report: unrecognized arguments: --junti (did you mean "
                                            "'--junit'?), x.xml, --histroy=h (did you mean '--history'?)")
    code, out, _ = run_cli(["-V"], capsys)
    assert code == 0 and out.startswith("npubuild ")


@pytest.mark.parametrize("edit, where, message", [
    (("verify: {", "verfy: {"), ":14:1:", "(top level): unknown key 'verfy'; did you mean 'verify'?"),
    (("per_channel", "per_chanel"), ":13:16:", "quantization: unknown key 'per_chanel'; did you mean 'per_channel'?"),
    (("ethos-u85-256]", "ethos-u85-265]"), ":11:41:", "unknown target 'ethos-u85-265'; did you mean 'ethos-u85-256'?"),
    (("pipeline: default", "pipeline: defualt"), ":12:11:", "unknown pipeline 'defualt'; did you mean 'default'?"),
    (("samples: 32", "sampels: 32"), ":10:28:",
     "models.ds_cnn.calibration.random: unknown key 'sampels'; did you mean 'samples'?"),
], ids=["top-level-key", "nested-key", "target", "pipeline", "deep-key"])
def test_a_mistyped_spec_name_says_where_and_what_was_meant(project: Path, capsys, edit, where, message):
    spec = project / "configs" / "kws.yaml"
    assert edit[0] in spec.read_text()
    spec.write_text(spec.read_text().replace(edit[0], edit[1], 1))
    code, _, err = run_cli(["validate"], capsys, cwd=project)
    assert code == 2 and _one_line(err) == f"{spec}{where} error: {message}"


def test_a_mistyped_target_profile_key_and_an_unknown_name_without_a_close_one(project: Path, capsys):
    (project / "targets").mkdir()
    board = project / "targets" / "board.yaml"
    board.write_text("extends: ethos-u55-128\npools:\n  sram: {size_kb: 256}\n")
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("ethos-u85-256]", "board]"))
    code, _, err = run_cli(["validate"], capsys, cwd=project)
    assert code == 2 and _one_line(err) == (
        f"{board}:3:10: error: pools.sram: unknown key 'size_kb'; did you mean 'size_kib'?")
    spec.write_text(spec.read_text().replace("board]", "xyzzy]"))
    code, _, err = run_cli(["validate"], capsys, cwd=project)
    assert code == 2 and "unknown target 'xyzzy' (known: " in _one_line(err)  # nothing close: the list


def test_an_unknown_metric_in_the_thresholds_file_is_an_error_with_its_position(tmp_path: Path, capsys):
    """A typo'd metric (`acuracy:`) was silently ignored: that metric was never checked."""
    entry = {"spec": "kws", "model": "ds_cnn", "target": "ethos-u55-128", "status": "passed", "stages": {},
             "gates": [], "errors": [], "metrics": {"accuracy": 0.9}}
    build = tmp_path / "build"
    build.mkdir()
    (build / "report.json").write_text(json.dumps({"versions": {}, "builds": [entry]}))
    thresholds = tmp_path / "regressions.yaml"
    thresholds.write_text("version: 1\nmetrics:\n  inference_ms: {max_increase_pct: 2}\n  acuracy: {max_decrease: 0}\n")
    args = ["report", "--build-dir", str(build), "--baseline", str(build / "report.json"), "--thresholds",
            str(thresholds)]
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert _one_line(err) == f"{thresholds}:4:3: error: metrics: unknown metric 'acuracy'; did you mean 'accuracy'?"
    thresholds.write_text("version: 1\nmetrics:\n  accuracy: {max_decrease: 0}\n")
    assert run_cli(args, capsys)[0] == 0


def test_init_refuses_to_nest_a_project_without_force(project: Path, capsys):
    """`npubuild init configs` inside a project silently nested a second one, whose dodo.py then won discovery
    from configs/ (issue 35)."""
    inner = project / "configs"
    code, _, err = run_cli(["init", "configs"], capsys, cwd=project)
    assert code == 2
    line = _one_line(err)
    assert line.startswith(f"configs: error: inside the project at {project} (its dodo.py)") and "--force" in line
    assert not (inner / "dodo.py").exists()
    code, out, err = run_cli(["init", "configs", "--force", "--name", "nested"], capsys, cwd=project)
    assert code == 0, err
    assert (inner / "dodo.py").is_file() and (inner / "configs" / "nested.yaml").is_file()
    # a directory that is its own repository is not nested, whatever holds it
    (project / "own").mkdir()
    (project / "own" / ".git").mkdir()
    assert run_cli(["init", "own"], capsys, cwd=project)[0] == 0
