"""Command-line error paths: one line and exit 2 for bad input, with or without --debug."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npbtest import run_cli


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_exit_2(tmp_path: Path, capsys, where: str):
    """`validate --debug` was a traceback and exit 1 (issue 16 finding 8): now --debug goes on either side of
    the subcommand, adds the traceback above the one line and keeps the exit code."""
    missing = str(tmp_path / "missing.yaml")
    args = ["--debug", "validate", missing] if where == "before" else ["validate", missing, "--debug"]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "Traceback" in err
    assert err.strip().splitlines()[-1] == f"{missing}: error: no such file or directory"
    code, _, err = run_cli(["validate", missing], capsys)
    assert code == 2 and _one_line(err) == f"{missing}: error: no such file or directory"


def test_debug_after_the_subcommand_on_a_good_spec_is_a_normal_run(project: Path, capsys):
    code, out, err = run_cli(["validate", "--debug"], capsys, cwd=project)
    assert code == 0 and not err and out.startswith("ok: 1 spec(s), 3 build(s)"), out + err


def _report(tmp_path: Path, builds) -> Path:
    p = tmp_path / "old" / "report.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps({"builds": builds, "versions": {"npubuild": "0"}}))
    return p


ENTRY = {"spec": "kws", "model": "ds_cnn", "target": "ethos-u55-128", "status": "passed", "metrics": {},
         "stages": {}, "gates": [], "errors": []}


@pytest.mark.parametrize("broken, problem", [
    ({k: v for k, v in ENTRY.items() if k != "metrics"}, "builds[0] has no 'metrics'"),
    ({**ENTRY, "metrics": None}, "builds[0] 'metrics' is not a dict"),
    ({**ENTRY, "gates": [{"limit": 1}]}, "builds[0] has a gate without 'name' and 'ok'"),
    ("kws", "builds[0] is not a mapping"),
], ids=["no-metrics", "metrics-null", "gate-fields", "not-a-mapping"])
def test_a_baseline_with_broken_entries_is_one_line_exit_2(tmp_path: Path, capsys, broken, problem):
    build_dir = tmp_path / "build"
    current = _report(tmp_path, [ENTRY])
    build_dir.mkdir()
    (build_dir / "report.json").write_text(current.read_text())
    baseline = _report(tmp_path, [broken])
    code, _, err = run_cli(["report", "--build-dir", str(build_dir), "--baseline", str(baseline)], capsys)
    line = _one_line(err)
    assert code == 2 and line == f"{baseline}: error: not a valid report: {problem}", line
