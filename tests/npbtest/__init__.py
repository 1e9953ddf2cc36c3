"""Shared test helpers: a throwaway product repo around the shipped example, and CLI runners."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npubuild.cli import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A product config repo (own dodo marker, configs/, models) that uses the shipped targets."""
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    shutil.copy(REPO / "configs" / "kws.yaml", root / "configs" / "kws.yaml")
    shutil.copy(REPO / "configs" / "models" / "ds_cnn.onnx", root / "configs" / "models" / "ds_cnn.onnx")
    return root


def run_cli(args: list[str], capsys, cwd: Path | None = None) -> tuple[int, str, str]:
    """Run `npubuild ARGS` in-process; returns (exit code, stdout, stderr)."""
    import os

    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        code = main(args)
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    return code, out.out, out.err


def compile_builds(model: Path, targets: list[str], build_dir: Path, capsys) -> list[dict]:
    """`npubuild compile MODEL --target T ...` in process: asserts exit 0, returns its report's build entries."""
    args = ["compile", str(model), *[a for t in targets for a in ("--target", t)], "--build-dir", str(build_dir)]
    code, out, err = run_cli(args, capsys)
    assert code == 0, out + err
    return read_report(build_dir / "compile")["builds"]


def run_subprocess(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npubuild", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def read_report(build_dir: Path) -> dict:
    return json.loads((build_dir / "report.json").read_text())


def read_run(build_dir: Path) -> dict:
    return json.loads((build_dir / "run.json").read_text())
