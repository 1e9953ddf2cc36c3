"""Run a build plan on a Dask cluster: the same stage tasks, submitted with their dependencies.

Workers run `stages.execute`, which takes results from (and gives them to) the
shared stage cache named by NPUBUILD_CACHE, so a stage computed on any machine
is never computed again. Without a scheduler address a LocalCluster (loopback,
no dashboard) is started. Workers must see the build directory at the same
path (LocalCluster, or a shared filesystem). A worker that dies mid-stage is
replaced and its task retried by Dask; outputs are atomic and completion is
marked by stage.json written last, so the retry starts clean.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from npubuild.errors import NpubuildError
from npubuild.fileio import write_json
from npubuild.build.plan import BuildPlan, StageTask
from npubuild.report.summary import write_reports

TASK_RETRIES = 3


def run_task(task: StageTask, run_id: str, debug: bool, cache_url: str | None, *upstream: dict) -> dict:
    """Worker side: skip if an upstream failed, reuse if up to date, else execute (cache first).

    The cache URL travels with the task: workers started elsewhere, or before
    the client chose a cache, still use the client's cache.
    """
    from npubuild.build.cache import StageCache
    from npubuild.build.execute import execute, is_up_to_date

    if any(u["status"] in ("failed", "skipped") for u in upstream):
        return {"task": task.name, "status": "skipped"}
    if is_up_to_date(task):
        return {"task": task.name, "status": "cached"}
    try:
        cache = StageCache(cache_url) if cache_url and task.stage != "report" else None
        rec = execute(task, run_id, debug, cache)
    except NpubuildError as exc:
        return {"task": task.name, "status": "failed", "message": str(exc)}
    return {"task": task.name, "status": "from-cache" if rec.get("from_cache") else "ran"}


def run_plan_dask(plan: BuildPlan, run_id: str, scheduler: str | None = None, workers: int = 2,
                  quiet: bool = False, debug: bool = False, client=None) -> dict:
    """Submit every task of the plan; returns run info {executed, cached, failed, from_cache}."""
    from dask.distributed import Client, LocalCluster, as_completed

    plan.build_dir.mkdir(parents=True, exist_ok=True)
    cache_url = os.environ.get("NPUBUILD_CACHE") or str(plan.build_dir.resolve() / "cache")
    cluster = None
    own_client = client is None
    if client is None:
        if scheduler:
            client = Client(scheduler)
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0")
            client = Client(cluster)
    try:
        futures = {}
        for name, task in plan.tasks.items():  # plan order is dependency order
            deps = [futures[d] for d in task.deps]
            futures[name] = client.submit(run_task, task, run_id, debug, cache_url, *deps, key=f"{name}@{run_id}",
                                          pure=False, retries=TASK_RETRIES)
        results: dict[str, dict] = {}
        total = len(futures)
        for future in as_completed(list(futures.values())):
            res = future.result()
            results[res["task"]] = res
            if not quiet:
                print(f"[{len(results):>3}/{total}] {res['status']:<10} {res['task']}", flush=True)
            if res["status"] == "failed":
                print(res["message"], file=sys.stderr, flush=True)
    finally:
        if own_client:
            client.close()
            if cluster is not None:
                cluster.close()
    info = {
        "run_id": run_id,
        "executor": "dask",
        "executed": sorted(n for n, r in results.items() if r["status"] in ("ran", "from-cache")),
        "from_cache": sorted(n for n, r in results.items() if r["status"] == "from-cache"),
        "cached": sorted(n for n, r in results.items() if r["status"] == "cached"),
        "failed": sorted(n for n, r in results.items() if r["status"] == "failed"),
    }
    write_reports(plan, run_id, plan.build_dir)
    write_json(Path(plan.build_dir) / "run.json", info)
    return info


def build_dask(builds, build_dir: Path, scheduler: str | None = None, workers: int = 2, quiet: bool = False,
               debug: bool = False, client=None):
    """`npubuild build --executor dask`: plan, run on Dask, and return the same RunResult as the doit runner."""
    from npubuild.build.doit_executor import new_run_id
    from npubuild.fileio import read_json
    from npubuild.build.plan import make_plan
    from npubuild.build.session import RunResult

    plan = make_plan(builds, build_dir)
    info = run_plan_dask(plan, new_run_id(), scheduler, workers, quiet, debug, client)
    report = read_json(plan.build_dir / "report.json")
    return RunResult(plan, info["run_id"], report, info["executed"], info["cached"], info["failed"],
                     1 if info["failed"] else 0)
