"""Builds at scale: --keep-going, --only, the build-dir lock, and a build killed mid-stage."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
from npbtest import read_report, read_run, run_cli

from npubuild.config.selection import matches

TINY = "{extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 1}}}"


def _with_tiny_target_first(project: Path) -> None:
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128,", f"targets: [{TINY}, ethos-u55-128,"))


def test_keep_going_builds_the_others_and_reports_the_failure(project: Path, capsys):
    _with_tiny_target_first(project)
    code, _, err = run_cli(["build", "--build-dir", "stop", "-q"], capsys, cwd=project)
    assert code == 1
    stopped = {b["target"]: b["status"] for b in read_report(project / "stop")["builds"]}
    assert stopped["u55-tiny"] == "failed"
    assert "skipped" in stopped.values()  # without --keep-going doit stops at the first failure

    code, _, err = run_cli(["build", "--build-dir", "go", "-q", "--keep-going"], capsys, cwd=project)
    assert code == 1
    builds = {b["target"]: b for b in read_report(project / "go")["builds"]}
    assert builds["u55-tiny"]["status"] == "failed"
    assert "pool 'sram'" in builds["u55-tiny"]["errors"][0]
    assert [ln for ln in err.splitlines() if "pool 'sram'" in ln]  # reported on stderr, one line
    assert "Traceback" not in err
    assert {t: b["status"] for t, b in builds.items() if t != "u55-tiny"} == {
        "ethos-u55-128": "passed", "ethos-u65-256": "passed", "ethos-u85-256": "passed"}
    failed = read_run(project / "go")["failed"]
    assert len(failed) == 1 and failed[0].startswith("vela:ds_cnn-u55-tiny-")


@pytest.mark.parametrize("pattern, expected", [
    ("kws/ds_cnn/ethos-u55-128", True), ("kws/*", True), ("kws/ds_cnn", True), ("*/*/ethos-u85-*", False),
    ("ethos-u55-*", True), ("ds_cnn", True), ("kws", True), ("ds", False), ("other/*", False),
    ("*/ethos-u55-128", False),  # the second part is the model
])
def test_only_matches_whole_ids_leading_parts_or_any_part(pattern: str, expected: bool):
    assert matches("kws/ds_cnn/ethos-u55-128", pattern) is expected


def test_progress_table_shows_each_stage_state(project: Path, capsys):
    code, out, err = run_cli(["build", "--progress", "live", "--only", "ethos-u85-*"], capsys, cwd=project)
    assert code == 0, err
    table = out[out.rindex("stage"):]
    for header in ("done", "ran", "cached", "failed", "running"):
        assert header in table.splitlines()[0]
    rows = {ln.split()[1]: ln.split()[3:8:2] for ln in table.splitlines() if ln.startswith("│")}
    assert rows["vela"] == ["1/1", "1", "0"] and rows["import"] == ["1/1", "1", "0"]
    assert re.match(r"\d+ ran, 0 cached, 0 failed", out.rstrip().splitlines()[-1])
    code, out, _ = run_cli(["build", "--progress", "live", "--only", "ethos-u85-*"], capsys, cwd=project)
    rows = {ln.split()[1]: ln.split()[3:8:2] for ln in out[out.rindex("stage"):].splitlines() if ln.startswith("│")}
    assert code == 0 and rows["vela"] == ["1/1", "0", "1"]  # second time: cached


def test_only_builds_the_selected_target(project: Path, capsys):
    code, _, err = run_cli(["build", "--build-dir", "b", "-q", "--only", "ethos-u85-*"], capsys, cwd=project)
    assert code == 0, err
    assert [b["target"] for b in read_report(project / "b")["builds"]] == ["ethos-u85-256"]
    code, _, err = run_cli(["build", "--build-dir", "b", "-q", "--only", "kws/nomodel"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1 and "--only 'kws/nomodel' matches no build" in err


def _env() -> dict[str, str]:
    """This environment without a shared stage cache another test may have named: builds here start cold."""
    return {k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"}


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C at its default, as in a terminal's foreground job: a runner that starts the suite in the
    background of a non-interactive shell (`.ci/run &`, nohup) has SIGINT ignored, every child inherits that,
    and a build that ignores SIGINT finishes instead of being interrupted (the CI failure of issue 34)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _npubuild(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "npubuild", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=_env(),
                            preexec_fn=_as_a_terminal_starts_it)


def test_a_busy_build_dir_stops_a_second_build_with_one_line(project: Path):
    build_dir = project / "build"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from npubuild.engine.lock import acquire; acquire(Path(sys.argv[1])); "
                               "print('locked', flush=True); time.sleep(60)", str(build_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = _npubuild(["build", "-q"], project)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 2
        assert err.count("\n") == 1 and f"in use by another npubuild build (pid {holder.pid})" in err
        assert not (build_dir / "stages").exists()  # it wrote nothing
        waiting = _npubuild(["build", "-q", "--wait"], project)
        said = waiting.stderr.readline()  # the event: it found the build dir busy and waits (one line says so)
        assert said == f"{build_dir}: waiting for another npubuild build (pid {holder.pid}) to finish\n", said
        assert waiting.poll() is None  # and it waits: the holder has not let go
    finally:
        holder.kill()
        holder.wait()
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert all(b["status"] == "passed" for b in read_report(build_dir)["builds"])


def test_two_concurrent_builds_in_one_dir_run_one_after_the_other(project: Path):
    a = _npubuild(["build", "--wait"], project)
    b = _npubuild(["build", "--wait"], project)
    outs = [p.communicate(timeout=600) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, outs
    summaries = sorted(next(ln for ln in out.splitlines() if " ran, " in ln) for out, _ in outs)
    # the first does all the work, the second finds everything done: no task ran twice or half
    assert summaries[0].startswith("0 ran, 14 cached") and summaries[1].startswith("14 ran, 0 cached")


def _complete(stage_dir: Path) -> bool:
    """A stage dir whose stage.json and inputs.json carry the key its name ends with (see npubuild.engine.uptodate)."""
    try:
        rec = json.loads((stage_dir / "stage.json").read_text())
        inputs = json.loads((stage_dir / "inputs.json").read_text())
    except (OSError, ValueError):
        return False
    return rec["key"].startswith(stage_dir.name.rsplit("-", 1)[1]) and inputs["key"] == rec["key"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_a_build_killed_during_vela_leaves_nothing_taken_as_done(project: Path, sig: int):
    # subprocesses throughout: the killed build and the rerun must plan from the same code
    build_dir = project / "build"
    for _attempt in range(5):  # a Vela stage takes ~0.2 s: the signal can land after the build has ended (a zombie)
        proc = _npubuild(["build", "-q", "--cache", "off", "--build-dir", str(build_dir)], project)  # a retry runs Vela
        deadline = time.monotonic() + 300
        running = []
        while not running and proc.poll() is None and time.monotonic() < deadline:
            running = glob.glob(str(build_dir / "stages" / "vela" / "*" / ".vela-*"))
            time.sleep(0.002)
        assert running, f"the build ended before a Vela stage could be caught running: {proc.communicate()}"
        os.killpg(proc.pid, sig)  # the build and the Vela it started, as a terminal's Ctrl-C would
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            break
        shutil.rmtree(build_dir)  # the kill missed: the whole build had finished; catch it again from scratch
    if sig == signal.SIGINT:
        assert proc.returncode != 0 and "Traceback" not in err, err
    killed_dir = Path(running[0]).parent
    assert not _complete(killed_dir)
    stage_dirs = [Path(p) for p in glob.glob(str(build_dir / "stages" / "*" / "*"))]
    done_before = {f"{d.parent.name}:{d.name}" for d in stage_dirs if _complete(d)}
    assert {"import", "quantize", "lower"} <= {n.split(":")[0] for n in done_before}

    rerun = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--build-dir", str(build_dir)],
                           cwd=project, capture_output=True, text=True, timeout=600, env=_env())
    assert rerun.returncode == 0, rerun.stderr
    run = read_run(build_dir)
    assert f"vela:{killed_dir.name}" in run["executed"]
    assert done_before <= set(run["cached"])  # nothing finished before the kill was lost or redone
    assert len(run["executed"]) + len(run["cached"]) == 14 and not run["failed"]
    assert all(b["status"] == "passed" for b in read_report(build_dir)["builds"])
    for name in run["executed"] + run["cached"]:  # every artifact complete, no debris of the killed run
        stage, sub = name.split(":", 1)
        d = build_dir / ("builds" if stage == "report" else f"stages/{stage}") / sub
        assert stage == "report" or _complete(d), name
        assert not [p.name for p in d.iterdir() if p.name.startswith(".")], name
        for p in d.iterdir():
            if p.is_file():
                assert p.stat().st_size > 0, p
            if p.suffix == ".onnx":
                onnx.checker.check_model(onnx.load(str(p)))
    tflites = list(build_dir.glob("stages/vela/*/*_vela.tflite"))
    assert len(tflites) == 3 and all(p.read_bytes()[4:8] == b"TFL3" for p in tflites)
