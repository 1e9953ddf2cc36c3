"""Cache hygiene: a tool upgrade re-runs exactly the stages that call it (and what consumes their output),
`npubuild clean [--stale]`, and `npubuild init` scaffolding a repo that builds out of the box."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest import REPO, read_report, read_run, run_cli

import npubuild.engine.versions

# tool -> stages that must stay cached when only that tool's version changes (they neither call it nor
# consume anything that did)
UNTOUCHED = {
    "ethos-u-vela": {"import", "quantize"},  # the lower stage measures its family choices with Vela
    "tosa-tools": {"import", "quantize"},
    "onnxruntime": {"import"},
}


def _affected(project: Path, tool: str) -> set[str]:
    """Tasks of the plan whose stage calls `tool` (Stage.tools), and every task downstream of one."""
    from npubuild.config.load import load_specs
    from npubuild.engine.plan import make_plan
    from npubuild.stages import BY_NAME, STAGES

    plan = make_plan(load_specs([project / "configs"]), project / "build", STAGES)
    hit = {n for n, t in plan.tasks.items() if tool in BY_NAME[t.stage].tools}
    changed = True
    while changed:
        more = {n for n, t in plan.tasks.items() if n not in hit and hit & set(t.deps)}
        hit |= more
        changed = bool(more)
    return hit


@pytest.mark.parametrize("edited, untouched, rerun", [
    ("lowering/ops/conv.py", {"import", "quantize"}, {"lower", "tosa-check", "vela", "npu-sim", "report"}),
    ("frontend/quantize.py", {"import"}, {"quantize", "lower", "tosa-check", "vela", "npu-sim", "report"}),
    # the lower stage compiles its measured family choices with the vela stage's own command line (measured.py)
    ("ethosu/vela.py", {"import", "quantize"}, {"lower", "tosa-check", "vela", "npu-sim", "report"}),
])
def test_editing_npubuild_source_reruns_the_stages_that_run_it(project: Path, tmp_path: Path, edited: str,
                                                              untouched: set[str], rerun: set[str]):
    """Each stage's key holds the fingerprint of the code it runs: an edit to an op lowering re-runs lower and
    what consumes it, never import or quantize (a copy of npubuild is edited, in subprocesses)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "npubuild", src / "npubuild", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("targets", "pipelines"):  # what the shipped root holds beside the package
        shutil.copytree(REPO / d, src / d)
    env = {k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"} | {"PYTHONPATH": str(src)}

    def build() -> dict:
        proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--cache", "off"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return read_run(project / "build")

    first = build()
    assert {n.split(":")[0] for n in first["executed"]} >= untouched | rerun
    with open(src / "npubuild" / edited, "a") as f:
        f.write("\n# an edit\n")
    run = build()
    assert {n.split(":")[0] for n in run["executed"]} == rerun
    assert untouched <= {n.split(":")[0] for n in run["cached"]}


@pytest.mark.parametrize("tool", sorted(UNTOUCHED))
def test_a_tool_upgrade_reruns_exactly_the_stages_that_call_it(project: Path, capsys, monkeypatch, tool: str):
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    first = set(read_run(project / "build")["executed"])
    affected = _affected(project, tool)
    assert affected and affected < first
    real = npubuild.engine.versions.tool_version
    assert real(tool) != "99.0.0"
    monkeypatch.setattr(npubuild.engine.versions, "tool_version", lambda t: "99.0.0" if t == tool else real(t))

    code, _, err = run_cli(["build", "-q"], capsys, cwd=project)
    assert code == 0, err
    run = read_run(project / "build")
    stage = lambda name: name.split(":")[0]  # noqa: E731
    # the same tasks re-run (under new names: their config, so their key, now holds the new version) ...
    assert sorted(map(stage, run["executed"])) == sorted(map(stage, affected))
    # ... and every other task is the very same one, still cached
    assert set(run["cached"]) == first - affected
    assert UNTOUCHED[tool] <= {stage(n) for n in run["cached"]}
    assert not UNTOUCHED[tool] & {stage(n) for n in run["executed"]}
    assert read_report(project / "build")["versions"][tool] == "99.0.0"


def test_clean_stale_removes_only_what_the_plan_no_longer_uses(project: Path, capsys):
    (project / "targets").mkdir()
    profile = project / "targets" / "ethos-u55-128.yaml"
    profile.write_text("extends: ethos-u55-128\n")
    build_dir = project / "build"
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    old_dirs = {p for p in build_dir.glob("stages/*/*")}
    base = project / "night1.json"
    base.write_text((build_dir / "report.json").read_text())
    profile.write_text("extends: ethos-u55-128\nclock_mhz: 250\n")
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    current = {p for p in build_dir.glob("stages/*/*")}
    replaced = {p for p in old_dirs if p.name.startswith("ds_cnn-ethos-u55-128-")} - {
        p for p in current if p not in old_dirs}
    assert len(current - old_dirs) >= 1 and replaced  # a new u55 vela dir, the old one now unused

    code, out, _ = run_cli(["clean", "--stale", "--dry-run"], capsys, cwd=project)
    assert code == 0 and all(str(p.relative_to(build_dir)) in out for p in replaced)
    assert {p for p in build_dir.glob("stages/*/*")} == current  # a dry run removes nothing
    code, out, _ = run_cli(["clean", "--stale"], capsys, cwd=project)
    assert code == 0 and f"removed {len(replaced)} stale task dir(s), 0 temp file(s) of killed runs and " in out
    assert {p for p in build_dir.glob("stages/*/*")} == current - replaced
    # plots: `report --history` drew the history of inference_ms (u55 got slower between the two runs); the
    # next build's report.html no longer shows it
    history = project / "history"
    history.mkdir()
    (history / "0-night1.json").write_text(base.read_text())
    assert run_cli(["report", "--history", str(history)], capsys, cwd=project)[0] == 0
    drawn = set(build_dir.glob(".cache/plots/history-*.png"))
    assert len(drawn) == 1
    old = (build_dir / "report.html").stat().st_mtime - 10  # plot staleness is by mtime against report.html
    for plot in drawn:
        os.utime(plot, (old, old))
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    code, out, _ = run_cli(["clean", "--stale"], capsys, cwd=project)
    assert code == 0 and "removed 0 stale task dir(s), 0 temp file(s) of killed runs and 1 plot(s)" in out
    # a build's report.html draws its charts as SVG: the history plot was the only PNG, and it is gone
    assert not set(build_dir.glob(".cache/plots/*.png"))
    assert "data:image/png" not in (build_dir / "report.html").read_text()
    code, _, err = run_cli(["build", "-q"], capsys, cwd=project)
    assert code == 0, err
    assert read_run(build_dir)["executed"] == []  # nothing the plan uses was removed

    code, out, _ = run_cli(["clean"], capsys, cwd=project)
    assert code == 0 and [p.name for p in build_dir.iterdir()] in ([], [".lock"])
    code, _, err = run_cli(["clean", "--build-dir", "nowhere"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1


def test_init_scaffolds_a_repo_that_builds_out_of_the_box(tmp_path: Path, capsys):
    root = tmp_path / "doorbell"
    code, out, err = run_cli(["init", str(root)], capsys)
    assert code == 0, err
    assert (root / "dodo.py").is_file() and (root / "configs" / "models" / "ds_cnn.onnx").is_file()
    profile = (root / "targets" / "doorbell-u55.yaml").read_text()
    assert "extends: ethos-u55-128" in profile
    code, _, err = run_cli(["validate"], capsys, cwd=root)
    assert code == 0, err
    code, _, err = run_cli(["build", "-q"], capsys, cwd=root)
    assert code == 0, err
    first = read_run(root / "build")
    builds = {b["target"]: b for b in read_report(root / "build")["builds"]}
    assert set(builds) == {"doorbell-u55", "ethos-u85-256"}
    assert all(b["status"] == "passed" for b in builds.values())
    pools = {p["pool"]: p for p in builds["doorbell-u55"]["metrics"]["pools"]}
    assert pools["sram"]["size_kib"] == 512  # the custom profile's override took effect
    # plain `doit` works in the new repo too (its dodo.py loads the same specs into the same build dir)
    proc = subprocess.run([sys.executable, "-m", "doit"], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run = read_run(root / "build")
    assert not run["failed"] and len(run["executed"]) + len(run["cached"]) == len(first["executed"])
    code, _, err = run_cli(["init", str(root)], capsys)
    assert code == 2 and "already exists" in err and err.count("\n") == 1
    assert (root / "dodo.py").read_text() == (REPO / "dodo.py").read_text()  # one dodo.py body, not two
