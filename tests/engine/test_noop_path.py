"""The no-op rebuild path stays light: pass names checked without importing onnx-ir, records read once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from npbtest import read_run, run_cli

from npubuild.frontend.passes import PASSES, known_names, load_all


def test_pass_names_known_without_importing_the_passes():
    names = known_names()
    load_all()
    assert names == set(PASSES) and {"fold_constants", "fold_batchnorm"} <= names


def test_unknown_pass_in_a_pipeline_is_one_line_exit_2(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("pipeline: default", "pipeline: {name: mine, profile: int, passes: [fold_cnstants]}"))
    code, _, err = run_cli(["validate"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1
    assert "unknown pass 'fold_cnstants'" in err and "fold_constants" in err


def test_a_noop_rebuild_neither_runs_tasks_nor_imports_onnx_ir(project: Path, capsys):
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "npubuild", "build", "-q"], cwd=project,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_run(project / "build")
    if run["executed"]:  # npubuild's source changed between the two builds (a shared working tree): retry
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "npubuild", "build", "-q"], cwd=project,
                              capture_output=True, text=True, timeout=600)
        run = read_run(project / "build")
    assert run["executed"] == [] and run["cached"]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "npubuild.engine.plan" in imported  # the timing output is there ...
    assert not {"onnx_ir", "sympy", "matplotlib"} & imported  # ... without the heavy ones
