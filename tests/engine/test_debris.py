"""What a killed run leaves in a stage's subdirectories (vela's firmware/, or a nested dir of its own) goes when the task reruns and
with `clean --stale`, as at the stage dir's top level (issue 34: clear_debris looked at the top level only)."""

from __future__ import annotations

from pathlib import Path

from npbtest import read_run, run_cli

from npubuild.ethosu import vela_cache
from npubuild.store import MANIFEST


def _one_target(project: Path) -> None:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))


def _plant(vela_dir: Path) -> list[Path]:
    """Temp files and a work dir as a killed Vela stage leaves them, at every depth of its stage dir."""
    debris = [vela_dir / "firmware" / ".npubuild_part0.c.k3j2.tmp", vela_dir / "firmware" / "part1" / ".model.npz.x81.part",
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
    assert (vela_dir / "firmware").is_dir()
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


def test_clean_stale_prunes_the_build_dirs_vela_cache_as_it_prunes_itself(project: Path, capsys, monkeypatch):
    """.cache/vela: a killed writer's debris goes whatever its age (the lock is held), and the least recently used
    entries past the cache's bound (here set to nothing) go; the stage dirs stay, so the next build runs nothing."""
    _one_target(project)
    build_dir = project / "build"
    assert run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)[0] == 0
    cache = build_dir / ".cache" / "vela"
    entries = sorted(m.parent for m in cache.glob(f"??/*/{MANIFEST}"))
    assert entries  # the measured choices' compiles, the vela stage's restored from them
    killed = [entries[0] / "0a1b2c3d4e5f", entries[0] / f".{MANIFEST}.0a1b2c3d4e5f"]  # a writer's dir, temp manifest
    killed[0].mkdir()
    (killed[0] / "stdout").write_bytes(b"half written")
    killed[1].write_bytes(b"{")
    code, out, _ = run_cli(["clean", "--stale", "--dry-run"], capsys, cwd=project)
    assert code == 0 and "would remove 0 stale task dir(s), 2 temp file(s) of killed runs and 0 plot(s), 0" in out
    assert all(str(p.relative_to(build_dir)) in out for p in killed) and all(p.exists() for p in killed)

    monkeypatch.setattr(vela_cache, "MAX_BYTES", 1)
    code, out, _ = run_cli(["clean", "--stale", "--dry-run"], capsys, cwd=project)
    assert code == 0 and f"and 0 plot(s), {len(entries)} cached Vela compile(s) past its bound" in out
    assert len(list(cache.glob(f"??/*/{MANIFEST}"))) == len(entries)  # a dry run removes nothing
    code, out, _ = run_cli(["clean", "--stale"], capsys, cwd=project)
    assert code == 0 and "removed 0 stale task dir(s), 2 temp file(s) of killed runs" in out
    assert f"{len(entries)} cached Vela compile(s) past its bound" in out
    assert not any(p.exists() for p in killed) and not list(cache.glob("??/*"))
    code, _, _ = run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)
    assert code == 0 and read_run(build_dir)["executed"] == []
