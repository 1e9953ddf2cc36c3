"""The vela stage runs Vela's main() in forked children of the stage (its import paid once, by the build
process): what they write is byte for byte what `python -m ethosu.vela` writes on the same command line, and a
command line Vela refuses fails the stage with Vela's own last line."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from npbtest.ops import ROOT, calib, quantize_model, single_op_model

from npubuild.config.load import default_search_path, load_target
from npubuild.errors import StageError
from npubuild.ethosu.vela import _run_vela_all, vela_command
from npubuild.ethosu.vela_ini import render_ini
from npubuild.lowering.driver import lower_model


def _graph(tmp_path: Path) -> tuple[Path, Path, object]:
    w = np.random.default_rng(5).uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32)
    model = quantize_model(single_op_model("Conv", {"x": [1, 4, 8, 8]}, {"y": None}, {"w": w}, pads=[1, 1, 1, 1]),
                           calib("x", [1, 4, 8, 8]))
    src, ini = tmp_path / "m.tosa", tmp_path / "system.ini"
    src.write_bytes(lower_model(model, "int").tosa)
    profile, _ = load_target("ethos-u55-128", default_search_path(ROOT), None)
    ini.write_text(render_ini(profile))
    return src, ini, profile


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_forked_vela_writes_what_the_vela_command_writes(tmp_path: Path):
    src, ini, profile = _graph(tmp_path)
    forked = [vela_command(src, ini, tmp_path / "fork", profile, profile.vela),
              vela_command(src, ini, tmp_path / "fork-raw", profile, profile.vela, "raw")]
    procs = _run_vela_all(forked, profile.accelerator, tmp_path)
    assert [p.returncode for p in procs] == [0, 0]
    assert "NPU operators" in procs[0].stdout  # Vela's report, read for the op counts
    for cmd, out in zip(forked, ("fork", "fork-raw"), strict=True):
        ref_dir = tmp_path / f"{out}-ref"
        ref_cmd = [ref_dir if a == str(tmp_path / out) else a for a in cmd]
        proc = subprocess.run([str(a) for a in ref_cmd], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert _files(tmp_path / out) == _files(ref_dir)
    assert procs[0].stdout.replace(str(tmp_path / "fork"), "OUT") == \
        subprocess.run([str(a) for a in [*forked[0][:-1], str(tmp_path / "again")]], capture_output=True,
                       text=True, timeout=300).stdout.replace(str(tmp_path / "again"), "OUT")


def test_a_command_line_vela_refuses_fails_with_its_last_line(tmp_path: Path):
    src, ini, profile = _graph(tmp_path)
    bad = vela_command(src, ini, tmp_path / "out", profile, profile.vela) + ["--optimise", "Nonsense"]
    proc = subprocess.run(bad, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]  # Vela's own crash, as the subprocess it was printed it
    with pytest.raises(StageError) as exc:
        _run_vela_all([bad], profile.accelerator, tmp_path)
    assert str(exc.value).endswith(f"Vela failed (ethos-u55-128): {last}") and "Nonsense" in last


def test_a_process_running_other_threads_spawns_vela_instead_and_gets_the_same_outputs(tmp_path: Path):
    src, ini, profile = _graph(tmp_path)
    forked = vela_command(src, ini, tmp_path / "fork", profile, profile.vela)
    spawned = vela_command(src, ini, tmp_path / "spawn", profile, profile.vela)
    _run_vela_all([forked], profile.accelerator, tmp_path)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # e.g. a Dask worker's threads: fork without exec is unsafe
    other.start()
    try:
        (proc,) = _run_vela_all([spawned], profile.accelerator, tmp_path)
    finally:
        stop.set()
        other.join()
    assert proc.returncode == 0 and "NPU operators" in proc.stdout
    assert _files(tmp_path / "spawn") == _files(tmp_path / "fork")


def test_vela_logs_stay_in_the_build_dir_whatever_the_system_temp_dir(tmp_path: Path, monkeypatch):
    """The logs Vela's output is read from are written where the stage writes (its temp dir in the build dir),
    never in the system's: /tmp on another, fuller disk failed a build whose own disk had room ('No usable
    temporary directory found')."""
    src, ini, profile = _graph(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))  # the system's: unusable
    (proc,) = _run_vela_all([vela_command(src, ini, tmp_path / "out", profile, profile.vela)], profile.accelerator,
                            tmp_path)
    assert proc.returncode == 0 and "NPU operators" in proc.stdout


def test_a_vela_child_that_raises_exits_failed_and_never_runs_on(tmp_path: Path):
    """What a forked child raises (its logs flushed onto a full disk did) is its exit 1: it never returns into
    the stage's code as a second copy of the stage, which then took the missing outputs for a compile."""
    script = (
        "import errno, os, sys, tempfile, time\n"
        "from npubuild.ethosu import vela\n"
        "def no_space(argv, out_fd, err_fd):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "vela._vela_child = no_space\n"
        "logs = [(tempfile.TemporaryFile('w+'), tempfile.TemporaryFile('w+'))]\n"
        "try:\n"
        "    print('exit codes', vela._fork_all([['python', '-m', 'ethosu.vela']], logs, time.monotonic() + 60))\n"
        "except OSError:\n"
        "    print('a child ran on')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.stdout.splitlines() == ["exit codes [1]"], proc.stdout + proc.stderr
