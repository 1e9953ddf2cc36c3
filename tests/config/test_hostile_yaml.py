"""Hostile or broken YAML is one line and exit 2, fast and small; `extends:` never leaves the project."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest import run_cli

BASE = """version: 1
name: kws
models:
  ds_cnn:
    path: models/ds_cnn.onnx
    input_shapes: {input: [1, 1, 49, 10]}
targets: [ethos-u55-128]
"""


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def alias_bomb(depth: int) -> str:
    """Nested anchors, nine aliases each: 9**depth strings from a few hundred bytes."""
    text, prev = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a0"
    for i in range(1, depth + 1):
        text += f"a{i}: &a{i} [{', '.join([f'*{prev}'] * 9)}]\n"
        prev = f"a{i}"
    return text


def _limit_memory() -> None:  # today's loader would take 8 GB on the bomb: keep a failing run small
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_an_alias_bomb_fails_fast_with_one_line(project: Path):
    bomb = alias_bomb(8)
    assert len(bomb) < 600
    spec = project / "configs" / "kws.yaml"
    spec.write_text(BASE + "description: x\n" + bomb.replace("a0:", "junk:\n  a0:").replace("\na", "\n  a"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "npubuild", "validate", str(spec)], cwd=project,
                          capture_output=True, text=True, timeout=600, preexec_fn=_limit_memory)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    line = _one_line(proc.stderr)
    assert proc.returncode == 2 and line.startswith(f"{spec}:") and "expands to more than" in line, line
    # the CPU the child spent, which the machine's load does not stretch as it does wall-clock time: not a
    # speed assertion, a bound that separates "refused" (about a second) from "expanded" (8^8 nodes)
    assert cpu_s < 60


@pytest.mark.parametrize("text, where, message", [
    (BASE + "description: a\x07b\n", ":8:15:", "U+0007 is not allowed"),
    (BASE + "expect: " + "[" * 600 + "]" * 600 + "\n", ":8:", "nested more than"),
    (BASE + "expect:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(600)) + "  " * 601 + "v: 1\n",
     ":", "nested more than"),
    (BASE + "description: &d [1, *d]\n", ":8:", "refers to a value that contains it"),
    (BASE + "? &k [1]\n: x\n", ":8:", "mapping keys must be plain scalars"),
], ids=["control-character", "deep-flow", "deep-block", "recursive-alias", "collection-key"])
def test_broken_yaml_is_one_line_with_its_position(project: Path, capsys, text: str, where: str, message: str):
    spec = project / "configs" / "kws.yaml"
    spec.write_text(text)
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_line(err)
    assert code == 2 and line.startswith(f"{spec}{where}") and message in line, line


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the project (not inside it) with a YAML file whose keys must never be merged."""
    d = tmp_path / "outside"
    (d / "targets").mkdir(parents=True)
    (d / "evil.yaml").write_text("verify: {samples: 99}\n")
    (d / "targets" / "ethos-u55-128.yaml").write_text("extends: ethos-u85-256\nname: ethos-u55-128\n")
    return d


def _escape(project: Path, outside: Path, how: str) -> Path:
    spec = project / "configs" / "kws.yaml"
    if how == "dotdot":
        spec.write_text("extends: ../../outside/evil.yaml\n" + BASE)
    elif how == "absolute":
        spec.write_text(f"extends: {outside / 'evil.yaml'}\n" + BASE)
    elif how == "symlinked-dir":
        (project / "configs" / "shared").symlink_to(outside)
        spec.write_text("extends: shared/evil.yaml\n" + BASE)
    elif how == "inline-target":
        spec.write_text(BASE.replace("targets: [ethos-u55-128]",
                                     "targets: [{extends: ../../outside/targets/ethos-u55-128.yaml, name: t}]"))
    elif how == "symlinked-targets":
        (project / "targets").symlink_to(outside / "targets")
        spec.write_text(BASE)
    return spec


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlinked-dir", "inline-target", "symlinked-targets"])
def test_extends_cannot_pull_yaml_from_outside_the_project(project: Path, outside: Path, capsys, how: str):
    spec = _escape(project, outside, how)
    code, _, err = run_cli(["validate", str(spec)], capsys)
    line = _one_line(err)
    assert code == 2 and "outside the project directory" in line and line.startswith(f"{spec}:"), line


def test_extends_inside_the_project_and_shipped_profiles_still_resolve(project: Path, capsys):
    (project / "configs" / "common").mkdir()
    (project / "configs" / "common" / "base.yaml").write_text("verify: {samples: 3}\n")
    (project / "targets").mkdir()
    (project / "targets" / "small.yaml").write_text("extends: ethos-u55-128\npools: {sram: {size_kib: 256}}\n")
    spec = project / "configs" / "kws.yaml"
    spec.write_text("extends: common/base.yaml\n" + BASE.replace("[ethos-u55-128]", "[small, ethos-u85-256]"))
    from npubuild.config.load import load_spec

    builds = load_spec(spec)
    assert builds[0].spec.verify.samples == 3 and [b.target.name for b in builds] == ["small", "ethos-u85-256"]
    assert builds[0].target.pools["sram"].size_kib == 256
