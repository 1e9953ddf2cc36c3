"""A full disk anywhere is one line naming the disk and what could not be written, never a traceback nor a
failure blamed on an input; a full shared cache is one warning and a build without it (issue 34: 'cannot read
an input: [Errno 28]' for a cache put, 24-35-line tracebacks for a full build dir, one escaping doit's
reporter from the final report.json write, another from doit's sqlite file).

The real thing where the machine lets us: a tmpfs of a few hundred KiB (root, as CI runs here). Where no
filesystem can be made, the injected-error tests below still run."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest import read_report, read_run, run_cli

from npubuild.engine.cache import StageCache


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_CACHE")}


def _one_target(project: Path) -> None:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("[ethos-u55-128, ethos-u65-256, ethos-u85-256]", "[ethos-u55-128]"))


def _build(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", *args], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def small_disk(tmp_path: Path):
    """make(kib) -> a directory on a tmpfs of that size, unmounted after the test; skips where no tmpfs can be
    mounted (not root)."""
    mounts: list[Path] = []

    def make(kib: int) -> Path:
        where = tmp_path / f"disk{len(mounts)}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()[:80]}): the injected-error tests cover it")
        mounts.append(where)
        return where

    yield make
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _needed_kib(project: Path, tmp_path: Path) -> int:
    """What a whole build of the project takes on disk (its build dir), KiB."""
    assert _build(project, "--cache", "off", "--build-dir", str(tmp_path / "measure")).returncode == 0
    return sum(p.stat().st_size for p in (tmp_path / "measure").rglob("*") if p.is_file()) // 1024


@pytest.mark.parametrize("share", [20, 2], ids=["import-cannot-fit", "later-stage-cannot-fit"])
def test_a_full_build_dir_is_one_line_per_thing_not_written(project: Path, tmp_path: Path, small_disk, share: int):
    _one_target(project)
    disk = small_disk(max(40, _needed_kib(project, tmp_path) // share))
    build_dir = disk / "build"
    proc = _build(project, "--cache", "off", "--build-dir", str(build_dir))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and all(re.match(rf"error: .*no space left on device: {re.escape(str(disk))} \(a .* filesystem\) "
                                  r"is full; could not write ", ln) for ln in lines), proc.stderr
    assert lines[-1].startswith(f"error: no space left on device: {disk}") and "report.json" in lines[-1]
    assert "cannot read an input" not in proc.stderr and "internal error" not in proc.stderr
    assert not (build_dir / "report.json").exists()  # no report, rather than an earlier run's

    # space again: the build completes from what was finished, nothing half-written taken as done
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    proc = _build(project, "--cache", "off", "--build-dir", str(build_dir))
    assert proc.returncode == 0, proc.stderr
    assert all(b["status"] == "passed" for b in read_report(build_dir)["builds"])


def test_a_full_shared_cache_is_one_warning_and_a_build_without_it(project: Path, small_disk):
    project_cfg = project / "configs" / "kws.yaml"
    project_cfg.write_text(project_cfg.read_text().replace("ethos-u65-256, ", ""))
    disk = small_disk(64)
    proc = _build(project, "-n", "2", "--cache", str(disk / "cache"))
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"warning: the shared stage cache {disk / 'cache'} cannot take outputs ({disk} (a ")
    assert line.endswith("): this build goes on without it")
    assert all(b["status"] == "passed" for b in read_report(project / "build")["builds"])
    assert StageCache(disk / "cache", use_env_key=False).debris(grace_s=0) == []  # failed puts took theirs back


# ---------------------------------------------------------------------------------- injected at the write layer

def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_cache_that_cannot_take_outputs_is_one_warning(project: Path, capsys, monkeypatch, tmp_path: Path):
    monkeypatch.setattr(StageCache, "_put", _enospc)
    code, _, err = run_cli(["build", "-q", "--cache", str(tmp_path / "cache")], capsys, cwd=project)
    assert code == 0, err
    (line,) = err.splitlines()
    assert line.startswith(f"warning: the shared stage cache {tmp_path / 'cache'} cannot take outputs (")
    assert "is full; first for import:" in line
    run = read_run(project / "build")
    assert run["executed"] and not run["cached"] and not run["failed"]  # built in full without the cache


def test_reports_that_cannot_be_written_are_one_line_and_exit_1(project: Path, capsys, monkeypatch):
    _one_target(project)
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    assert (project / "build" / "report.json").exists()
    import npubuild.report.summary as summary

    monkeypatch.setattr(summary, "write_html", _enospc)  # report.json and report.md land, the page does not
    code, out, err = run_cli(["build", "-q"], capsys, cwd=project)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: no space left on device: ") and "could not write this run's report.json" in err
    assert "the earlier run reports there are removed" in err
    assert not any((project / "build" / n).exists() for n in ("report.json", "report.md", "report.html", "run.json"))
    assert out.rstrip().endswith("no report written")


def test_a_stage_whose_write_fails_is_the_full_disk_not_an_internal_error(project: Path, capsys, monkeypatch):
    _one_target(project)
    import npubuild.ethosu.vela as vela

    real = vela.compile_model

    def full(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[3] / "firmware" / "npubuild_part0.c"))

    monkeypatch.setattr(vela, "compile_model", full)
    code, _, err = run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)
    assert code == 1 and "Traceback" not in err, err
    (line,) = err.splitlines()
    assert re.match(r"error: kws/ds_cnn/ethos-u55-128: vela: no space left on device: .* is full; could not write "
                    r"the outputs of vela:ds_cnn-ethos-u55-128-\w+ \(.*npubuild_part0.c\)$", line), line
    entry = read_report(project / "build")["builds"][0]
    assert entry["status"] == "failed" and entry["error_kinds"] == ["stage"]
