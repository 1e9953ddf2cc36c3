"""The build dir and its lock: bound to the whole process tree, and an unusable --build-dir is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from npbtest import read_report, run_cli

from npubuild.engine.lock import BuildDirBusy, acquire, release


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"}


def _lock_is_free(build_dir: Path) -> bool:
    try:
        fd = acquire(build_dir)
    except BuildDirBusy:
        return False
    release(fd)
    return True


def test_sigkill_of_the_main_pid_with_jobs_frees_the_lock(project: Path):
    build_dir = project / "build"
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", "build", "-q", "-n", "2", "--cache", "off"],
                            cwd=project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=_env())
    try:
        deadline = time.monotonic() + 300
        while not list(build_dir.glob("stages/*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the doit workers are running the first tasks
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)  # the main pid only, not its workers
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while not _lock_is_free(build_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _lock_is_free(build_dir), "the workers of the killed build still hold the build dir"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything left of the killed build (today: its workers)
        except ProcessLookupError:
            pass
    rerun = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--wait", "--cache", "off"],
                           cwd=project, capture_output=True, text=True, timeout=600, env=_env())
    assert rerun.returncode == 0, rerun.stderr
    assert all(b["status"] == "passed" for b in read_report(build_dir)["builds"])


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("case", ["a-file", "under-a-file", "in-proc", "lock-is-a-dir"])
def test_an_unusable_build_dir_is_one_line_exit_2(project: Path, capsys, case: str):
    if case == "a-file":
        build_dir = project / "afile"
        build_dir.write_text("x")
        expected = "it is a file"
    elif case == "under-a-file":
        (project / "afile").write_text("x")
        build_dir = project / "afile" / "build"
        expected = "a directory above it is a file"
    elif case == "in-proc":
        build_dir = Path("/proc/npubuild-build")
        expected = "cannot use as a build dir"
    else:
        build_dir = project / "build"
        (build_dir / ".lock").mkdir(parents=True)
        expected = "is a directory, not npubuild's lock file"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir)], capsys, cwd=project)
    line = _one_line(err)
    assert code == 2 and expected in line and str(build_dir) in line, line
