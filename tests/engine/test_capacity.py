"""engine/capacity: `-n`, the local Dask cluster and the stage worker pools bounded by what the machine holds
(its cores, its memory at the stage memory limit per task) and by the work the plan has; one line when a
flag asked for more (issue 34: `-n 100000` forked ~4,000 processes and took 17 of 23 GiB)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest import REPO, read_run, run_cli

from npubuild.config.load import load_specs
from npubuild.engine.capacity import clamp_jobs, plan_width, stage_workers_for
from npubuild.engine.plan import make_plan
from npubuild.fanout import stage_workers
from npubuild.machine import WORKERS_ENV, Capacity, total_memory_bytes
from npubuild.stages import STAGES

GIB = 1 << 30


def _width(project: Path) -> int:
    return plan_width(make_plan(load_specs([project / "configs"]), project / "build", STAGES))


def test_what_the_machine_holds():
    assert Capacity(2, 24 * GIB, 4 * GIB).tasks == 2  # the cores
    assert Capacity(64, 16 * GIB, 4 * GIB).tasks == 4  # the memory at the stage limit per task
    assert Capacity(8, GIB, 4 * GIB).tasks == 1  # always one
    assert Capacity(8, None, 4 * GIB).tasks == 8  # memory unknown (not Linux): the cores


def test_total_memory_is_the_cgroups_when_it_is_smaller(tmp_path: Path):
    (tmp_path / "meminfo").write_text("MemTotal:       24576000 kB\nMemFree: 1 kB\n")
    (tmp_path / "max").write_text("max\n")
    assert total_memory_bytes(str(tmp_path / "meminfo"), (str(tmp_path / "max"),)) == 24576000 * 1024
    (tmp_path / "max").write_text(f"{2 * GIB}\n")
    assert total_memory_bytes(str(tmp_path / "meminfo"), (str(tmp_path / "max"),)) == 2 * GIB


def test_the_plan_bounds_the_jobs_too(project: Path, capsys):
    plan = make_plan(load_specs([project / "configs"]), project / "build", STAGES)
    # kws: import, early-fit, quantize, lower, tosa-check, 3 vela, 3 npu-sim, 3 reports; the longest path
    # (import, early-fit, quantize, lower, vela, npu-sim, report) has 7
    assert len(plan.tasks) == 14 and plan_width(plan) == 8
    big = Capacity(64, 1024 * GIB, 4 * GIB)
    assert clamp_jobs(4, plan, capacity=big) == 4 and capsys.readouterr().err == ""
    assert clamp_jobs(50, plan, capacity=big) == 8
    err = capsys.readouterr().err
    assert err == "note: -n 50: running 8 at a time (at most 8 of this plan's 14 tasks can run at once)\n"
    assert clamp_jobs(100000, plan, capacity=Capacity(2, 24 * GIB, 4 * GIB)) == 2
    err = capsys.readouterr().err
    assert err.startswith("note: -n 100000: running 2 at a time (this machine holds 2 (2 core(s), 24.0 GiB of "
                          "memory for stage tasks of up to 4.0 GiB each ($NPUBUILD_STAGE_MEMORY_MIB)); at most 8 ")
    assert err.count("\n") == 1


def test_stage_workers_are_bounded_and_restored(monkeypatch, capsys):
    small = Capacity(2, 24 * GIB, 4 * GIB)
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    with stage_workers_for(1, small) as workers:
        assert workers is None and WORKERS_ENV not in os.environ  # one task at a time: the pools use the cores
    with stage_workers_for(4, small) as workers:
        assert workers == 1 and os.environ[WORKERS_ENV] == "1"  # tasks at once share the cores
    assert WORKERS_ENV not in os.environ  # the process's own setting after the run (was: set for good)
    monkeypatch.setenv(WORKERS_ENV, "5000")
    with stage_workers_for(1, small) as workers:
        assert workers == 2 and os.environ[WORKERS_ENV] == "2"
    assert os.environ[WORKERS_ENV] == "5000"
    err = capsys.readouterr().err
    assert err.startswith("note: $NPUBUILD_STAGE_WORKERS=5000: each stage uses 2 worker process(es) at most")
    assert stage_workers() <= Capacity.here().tasks  # a pool never forks more than the machine holds


@pytest.mark.parametrize(("name", "value"), [(WORKERS_ENV, "lots"), (WORKERS_ENV, "0"),
                                             ("NPUBUILD_STAGE_MEMORY_MIB", "4G")])
def test_a_malformed_setting_is_one_line_exit_2(project: Path, capsys, monkeypatch, name: str, value: str):
    monkeypatch.setenv(name, value)
    code, _, err = run_cli(["build", "-q", "--cache", "off"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1 and f"${name} must be a whole number" in err, err
    assert not (project / "build" / "stages").exists()


def test_build_n_100000_runs_what_the_machine_holds(project: Path, capsys):
    """The real thing, on this machine: the build runs, with one line saying how many at a time, and doit is
    given that many job slots (run.json's `jobs`), not 100000."""
    held = min(Capacity.here().tasks, _width(project))
    code, _, err = run_cli(["build", "-q", "--cache", "off", "-n", "100000"], capsys, cwd=project)
    assert code == 0, err
    assert err.startswith(f"note: -n 100000: running {held} at a time (") and err.count("\n") == 1, err
    assert read_run(project / "build")["jobs"] == held


def test_plain_doit_with_more_jobs_than_the_machine_holds_is_refused(project: Path):
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_")},
           "PYTHONPATH": str(REPO)}  # this checkout's npubuild
    proc = subprocess.run([sys.executable, "-m", "doit", "-n", "100000"], cwd=project, capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: doit -n 100000: this machine and plan hold ") and "give -n" in proc.stderr
    assert not (project / "build" / "stages").exists()  # nothing forked, nothing built


def test_dasks_local_cluster_is_bounded_the_same_way(project: Path, capsys):
    held = min(Capacity.here().tasks, _width(project))
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0  # all up to date next: Dask starts no worker
    code, _, err = run_cli(["build", "-q", "--executor", "dask", "-n", "64"], capsys, cwd=project)
    assert code == 0, err
    assert err.startswith(f"note: -n 64: running {held} at a time (") and err.count("\n") == 1, err
    assert read_run(project / "build")["jobs"] == held
