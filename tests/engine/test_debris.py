"""What a killed run leaves in a stage's subdirectories (vela's firmware/ and raw/) goes when the task reruns and
with `clean --stale`, as at the stage dir's top level (issue 34: clear_debris looked at the top level only)."""

from __future__ import annotations

from pathlib import Path

from npbtest import read_run, run_cli


def _one_target(project: Path) -> None:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))


def _plant(vela_dir: Path) -> list[Path]:
    """Temp files and a work dir as a killed Vela stage leaves them, at every depth of its stage dir."""
    debris = [vela_dir / "firmware" / ".npubuild_part0.c.k3j2.tmp", vela_dir / "raw" / ".model.npz.x81.part",
              vela_dir / ".vela-a1b2" / "u55_model.tosa", vela_dir / ".summary.json.q9.tmp"]
    for p in debris:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half written")
    return debris


def test_a_rerun_clears_debris_in_the_stage_dirs_subdirectories(project: Path, capsys):
    _one_target(project)
    build_dir = project / "build"
    assert run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)[0] == 0
    (vela_dir,) = (build_dir / "stages" / "vela").iterdir()
    assert (vela_dir / "firmware").is_dir() and (vela_dir / "raw").is_dir()
    debris = _plant(vela_dir)
    (vela_dir / "stage.json").unlink()  # the task reruns, as after the kill
    code, _, err = run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)
    assert code == 0, err
    assert f"vela:{vela_dir.name}" in read_run(build_dir)["executed"]
    assert not any(p.exists() for p in debris) and not (vela_dir / ".vela-a1b2").exists()
    assert not [p for p in vela_dir.rglob(".*")]


def test_clean_stale_removes_debris_in_the_task_dirs_it_keeps(project: Path, capsys):
    _one_target(project)
    build_dir = project / "build"
    assert run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)[0] == 0
    (vela_dir,) = (build_dir / "stages" / "vela").iterdir()
    debris = _plant(vela_dir) + [build_dir / ".report.json.u7w1.tmp"]
    debris[-1].write_bytes(b"{")
    code, out, _ = run_cli(["clean", "--stale", "--dry-run"], capsys, cwd=project)
    assert code == 0 and "would remove 0 stale task dir(s), 5 temp file(s) of killed runs" in out
    assert all(p.exists() for p in debris)
    code, out, _ = run_cli(["clean", "--stale"], capsys, cwd=project)
    assert code == 0 and "removed 0 stale task dir(s), 5 temp file(s) of killed runs" in out
    assert not any(p.exists() for p in debris)
    assert (build_dir / ".lock").exists()  # the build dir's own, not debris
    code, _, _ = run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)
    assert code == 0 and read_run(build_dir)["executed"] == []  # nothing a task wrote was taken for debris
