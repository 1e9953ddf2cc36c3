"""npubuild/fanout: a stage's independent reference-model runs on forked workers, with the results, the errors and
the crashes exactly as the runs in process give them."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from npbtest.ops import calib, quantize_model

from npubuild import fanout
from npubuild.engine.doit_executor import doit_jobs
from npubuild.errors import Location, StageError
from npubuild.fanout import WORKERS_ENV, fan_out, stage_workers
from npubuild.models.builder import GraphBuilder
from npubuild.verify.node_errors import node_errors

PASSES = ["eliminate_identity", "remove_unused", "topological_sort"]


def test_the_runs_are_made_by_workers_and_come_back_in_order():
    parent = os.getpid()
    got = fan_out(lambda i: (i * i, os.getpid()), 12, workers=2)
    assert [v for v, _ in got] == [i * i for i in range(12)]
    assert parent not in {pid for _, pid in got}  # every run was a worker's


def test_work_too_small_or_one_worker_stays_in_process():
    parent = os.getpid()
    assert {pid for pid in fan_out(lambda i: os.getpid(), 4, expected_s=0.1, workers=2)} == {parent}
    assert {pid for pid in fan_out(lambda i: os.getpid(), 4, workers=1)} == {parent}
    assert fan_out(lambda i: i, 0, workers=2) == []


def test_a_stage_error_in_a_worker_is_raised_as_itself():
    def run(i: int) -> int:
        if i == 3:
            raise StageError("TOSA reference model rejected the graph: ERROR", Location("m.tosa", 3))
        return i

    with pytest.raises(StageError) as caught:
        fan_out(run, 6, workers=2)
    assert str(caught.value) == "m.tosa:3: error: TOSA reference model rejected the graph: ERROR"
    assert type(caught.value) is StageError and caught.value.exit_code == 1


def test_a_worker_that_dies_makes_every_run_again_in_process():
    """A native crash (here a real SIGKILL of the worker) must not hang the stage nor lose a run: the map is
    made again in the stage's own process, where a crash is the one line engine/isolate.py reports."""
    parent = os.getpid()

    def run(i: int) -> tuple[int, int]:
        if os.getpid() != parent and i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return i + 1, os.getpid()

    got = fan_out(run, 5, workers=2)
    assert got == [(i + 1, parent) for i in range(5)]


def test_a_worker_does_not_start_workers_of_its_own():
    inner = fan_out(lambda i: fan_out(lambda j: os.getpid(), 3, workers=2), 2, workers=2)
    for pids in inner:
        assert len(set(pids)) == 1  # each outer run's inner map ran in that worker alone


def test_how_many_workers(monkeypatch):
    held = fanout.Capacity.here().tasks
    monkeypatch.setenv(WORKERS_ENV, "1")
    assert stage_workers() == 1
    monkeypatch.setenv(WORKERS_ENV, "zero")
    assert stage_workers() == held >= 1
    monkeypatch.setenv(WORKERS_ENV, "100000")
    assert stage_workers() == held  # never more than the machine holds (engine/capacity.py)
    assert [doit_jobs(a) for a in (["-n", "4"], ["-n4"], ["--process=3"], ["run"], ["-n", "x"])] == [4, 4, 3, 1, 1]


def test_a_containers_cpu_quota_caps_the_workers(tmp_path):
    def files(v2: str | None = None, v1: tuple[str, str] | None = None):
        out = []
        if v2 is not None:
            (tmp_path / "cpu.max").write_text(v2)
            out.append((str(tmp_path / "cpu.max"), None))
        if v1 is not None:
            (tmp_path / "quota").write_text(v1[0])
            (tmp_path / "period").write_text(v1[1])
            out.append((str(tmp_path / "quota"), str(tmp_path / "period")))
        return tuple(out)

    assert fanout.cgroup_cpu_quota(files(v2="200000 100000\n")) == 2.0
    assert fanout.cgroup_cpu_quota(files(v2="max 100000\n")) is None
    assert fanout.cgroup_cpu_quota(files(v1=("-1\n", "100000\n"))) is None
    assert fanout.cgroup_cpu_quota(files(v1=("150000\n", "100000\n"))) == 1.5
    assert fanout.cgroup_cpu_quota(((str(tmp_path / "none"), None),)) is None


def _model():
    g = GraphBuilder("chain", seed=4)
    y = g.relu(g.conv(g.input("x", [1, 4, 12, 12]), 4, 8, (3, 3)))
    y = g.node("Sigmoid", [g.conv(y, 8, 8, (3, 3), group=8)])
    g.output(g.conv(y, 8, 4, (1, 1)), [1, 4, 12, 12])
    return g.model()


def test_the_per_node_check_is_the_same_on_workers(monkeypatch):
    qdq = quantize_model(_model(), calib("x", [1, 4, 12, 12], n=16))
    samples = calib("x", [1, 4, 12, 12], n=3, seed=7)
    monkeypatch.setenv(WORKERS_ENV, "1")
    alone = node_errors(qdq, PASSES, samples, expected_s=float("inf"))
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert fanout.can_fan_out()  # the map below is made by two workers
    spread = node_errors(qdq, PASSES, samples, expected_s=float("inf"))
    assert len(alone.nodes) == 4 and alone.unchecked == []
    assert spread.to_json() == alone.to_json()
    assert np.isfinite(alone.worst.max_error_lsb)


def test_the_checks_reference_model_runs_are_the_same_on_workers(tmp_path, monkeypatch):
    """tosa-check's runs of model.tosa on every sample and the per-node cuts, made at once over two workers,
    give what the runs one by one in process give (the integers compared, not a tolerance)."""
    from npubuild.ethosu.families import lower_families
    from npubuild.verify.node_errors import prepare_node_check
    from npubuild.verify.tosa_check import graph_runner, reference_model_runs

    qdq = quantize_model(_model(), calib("x", [1, 4, 12, 12], n=16))
    io, _ = lower_families(qdq, "int", tmp_path, [])
    samples = calib("x", [1, 4, 12, 12], n=3, seed=9)
    feeds_of = [{"x": samples["x"][i]} for i in range(3)]
    made = {}
    for workers in ("1", "2"):
        monkeypatch.setenv(WORKERS_ENV, workers)
        check = prepare_node_check(qdq, PASSES, samples)
        made[workers] = reference_model_runs(graph_runner(io, tmp_path), feeds_of, True, {}, check, 1.0)
    alone, spread = made["1"], made["2"]
    assert len(spread.samples) == 3 and spread.nodes is not None
    for a, b in zip(alone.samples, spread.samples, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert spread.nodes.to_json() == alone.nodes.to_json() and len(alone.nodes.nodes) == 4
    (out,) = alone.samples[0]
    assert not np.array_equal(alone.samples[0][out], alone.samples[1][out])  # three samples, three answers
