"""Issue 7: the shared stage cache and the Dask executor, run for real on a 2-worker LocalCluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from npbtest import read_report, read_run

from npubuild.config.load import load_specs
from npubuild.engine.cache import StageCache
from npubuild.stages import STAGES


def _stage_records(build_dir: Path) -> dict[str, dict]:
    import json

    return {json.loads(p.read_text())["task"]: json.loads(p.read_text())
            for p in (build_dir / "stages").glob("*/*/stage.json")}


def _build(project: Path, build_dir: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    """A separate process, like a second machine: it shares nothing with the others but the cache URL."""
    env = {**os.environ, "NPUBUILD_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(build_dir), "-q", *extra],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import Client, LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0")
    client = Client(c)
    yield client
    client.close()
    c.close()


def test_doit_and_dask_give_identical_metrics_and_a_second_machine_takes_everything_from_cache(
        project: Path, cluster, monkeypatch):
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import build_and_report

    doit_dir, dask_dir, third_dir = project / "b-doit", project / "b-dask", project / "b-third"
    proc = _build(project, doit_dir, project / "cache-doit")
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("NPUBUILD_CACHE", str(project / "cache-dask"))
    monkeypatch.chdir(project)
    result = build_and_report(load_specs([project / "configs"]), dask_dir, STAGES,
                              RunOptions(quiet=True, executor="dask"), client=cluster)
    assert result.exit_code == 0
    by_doit = {(b["model"], b["target"]): b["metrics"] for b in read_report(doit_dir)["builds"]}
    by_dask = {(b["model"], b["target"]): b["metrics"] for b in read_report(dask_dir)["builds"]}
    assert by_doit == by_dask and len(by_doit) == 3
    assert all(not r["from_cache"] for r in _stage_records(dask_dir).values())  # its own cache was empty

    proc = _build(project, third_dir, project / "cache-dask", "--executor", "dask")
    assert proc.returncode == 0, proc.stderr
    records = _stage_records(third_dir)
    assert records and [t for t, r in records.items() if not r["from_cache"]] == []
    assert read_run(third_dir)["from_cache"] == sorted(records)
    third = {(b["model"], b["target"]): b["metrics"] for b in read_report(third_dir)["builds"]}
    assert third == by_dask


def test_corrupt_entry_is_detected_discarded_and_recomputed(project: Path):
    cache_dir = project / "cache"
    assert _build(project, project / "b1", cache_dir).returncode == 0
    cache = StageCache(str(cache_dir))
    # truncate one stored file of the lower stage's entry (the TOSA flatbuffer)
    lower_key = next(r["cache_key"] for t, r in _stage_records(project / "b1").items() if t.startswith("lower:"))
    stored = next(p for p in (cache_dir / lower_key[:2] / lower_key).glob("*/model.tosa"))
    stored.write_bytes(stored.read_bytes()[:100])

    proc = _build(project, project / "b2", cache_dir)
    assert proc.returncode == 0, proc.stderr
    records = _stage_records(project / "b2")
    lower = next(r for t, r in records.items() if t.startswith("lower:"))
    assert lower["from_cache"] is False  # recomputed, not served corrupt
    assert all(r["from_cache"] for t, r in records.items() if not t.startswith("lower:"))
    assert (project / "b2" / "stages" / "lower").glob("*/model.tosa")
    total, bad = cache.verify()
    assert bad == [] and total == len(records)

    # a corrupted byte (same size) is caught by `npubuild cache verify`, which exits 1
    victim = next(p for p in cache_dir.glob("*/*/*/numerics.json"))
    data = bytearray(victim.read_bytes())
    data[5] ^= 0xFF
    victim.write_bytes(bytes(data))
    proc = subprocess.run([sys.executable, "-m", "npubuild", "cache", "verify", "--cache", str(cache_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "1 bad" in proc.stdout


def test_a_worker_killed_mid_stage_costs_a_retry_and_corrupts_nothing(project: Path, cluster, monkeypatch):
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import build_and_report

    cache_dir = project / "cache-kill"
    monkeypatch.setenv("NPUBUILD_CACHE", str(cache_dir))
    monkeypatch.chdir(project)
    pids = cluster.run(os.getpid)
    killed: list[tuple[str, str]] = []

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            for worker, keys in cluster.processing().items():
                if keys and worker in pids:
                    os.kill(pids[worker], signal.SIGKILL)
                    killed.append((worker, str(keys[0])))
                    return
            time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    result = build_and_report(load_specs([project / "configs"]), project / "b", STAGES,
                              RunOptions(quiet=True, executor="dask"), client=cluster)
    t.join()
    assert killed, "no task was ever seen running"
    assert result.exit_code == 0
    assert all(b["status"] == "passed" for b in read_report(project / "b")["builds"])
    total, bad = StageCache(str(cache_dir)).verify()
    assert bad == [] and total >= 7
    cluster.wait_for_workers(2, timeout=60)


def test_dasks_own_log_lines_stay_off_the_users_screen_unless_debug():
    """A worker's heartbeat that times out on a loaded machine made distributed print a traceback to stderr
    (CI saw it beside the one-line stage error); npubuild reports tasks itself, so distributed's loggers are
    quiet for the run, loud again after it and under --debug."""
    import logging

    from npubuild.engine.dask_executor import quiet_distributed

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(f"{record.name}: {record.getMessage()}")

    top = logging.getLogger("distributed")
    keep = Keep()
    top.addHandler(keep)
    try:
        with quiet_distributed(debug=False):
            logging.getLogger("distributed.worker").error("Failed to communicate with scheduler during heartbeat.")
            logging.getLogger("distributed.client").error("comm closed")
        assert seen == []
        with quiet_distributed(debug=True):
            logging.getLogger("distributed.worker").warning("shown with --debug")
        logging.getLogger("distributed.client").error("shown after the run")
        assert seen == ["distributed.worker: shown with --debug", "distributed.client: shown after the run"]
    finally:
        top.removeHandler(keep)
