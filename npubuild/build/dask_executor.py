"""Run a build plan on a Dask cluster: the same stage tasks, submitted with their dependencies.

Workers run the same `execute.run_stage` and up-to-date check as doit's
processes, and take results from (and give them to) the shared stage cache,
so a stage computed on any machine is never computed again. Without a
scheduler address a LocalCluster (loopback, no dashboard) is started. Workers
must see the build directory at the same path (LocalCluster, or a shared
filesystem). A worker that dies mid-stage is replaced and its task retried by
Dask; outputs are atomic and completion is marked by stage.json written last,
so the retry starts clean. Each task runs in a child of the worker (a forkserver's, as the worker's
tasks run on a thread) under the same memory limit as doit's: the LocalCluster's workers are started
non-daemonic for that; a worker started elsewhere as a daemon (Dask's default) runs tasks in process.
"""

from __future__ import annotations

from npubuild.build.plan import BuildPlan, StageTask
from npubuild.build.session import Session
from npubuild.errors import NpubuildError

TASK_RETRIES = 3


def run_task(task: StageTask, run_id: str, debug: bool, cache_url: str | None, *upstream: dict) -> dict:
    """Worker side: blocked if an upstream failed, cached if up to date, else run (cache first).

    The cache URL travels with the task: workers started elsewhere, or before
    the client chose a cache, still use the client's cache.
    """
    from npubuild.build.execute import run_stage
    from npubuild.build.uptodate import is_done

    if any(u["status"] in ("failed", "blocked") for u in upstream):
        return {"task": task.name, "status": "blocked"}
    if is_done(task):
        return {"task": task.name, "status": "cached"}
    try:
        rec = run_stage(task, run_id, debug, cache_url)
    except NpubuildError as exc:
        return {"task": task.name, "status": "failed", "message": str(exc)}
    return {"task": task.name, "status": "from-cache" if rec.get("from_cache") else "ran"}


class DaskExecutor:
    """Every task submitted at once with its upstream futures; outcomes reported as they complete."""

    name = "dask"

    def __init__(self, cache_url: str | None, debug: bool = False, scheduler: str | None = None, workers: int = 2,
                 client=None):
        self.cache_url, self.debug, self.scheduler, self.workers, self.client = \
            cache_url, debug, scheduler, workers, client

    def run(self, plan: BuildPlan, session: Session) -> int:
        import dask

        # Workers that may have children, so each task runs isolated in one (build/isolate.py); the nanny
        # reads this whenever it (re)starts a worker, so it holds for the whole run.
        with dask.config.set({"distributed.worker.daemon": False}):
            return self._run(plan, session)

    def _run(self, plan: BuildPlan, session: Session) -> int:
        from dask.distributed import Client, LocalCluster, as_completed

        plan.build_dir.mkdir(parents=True, exist_ok=True)
        client, cluster = self.client, None
        if client is None:
            if self.scheduler:
                client = Client(self.scheduler)
            else:
                cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address="127.0.0.1:0")
                client = Client(cluster)
        try:
            futures = {}
            for name, task in plan.tasks.items():  # plan order is dependency order
                deps = [futures[d] for d in task.deps]
                futures[name] = client.submit(run_task, task, session.run_id, self.debug, self.cache_url, *deps,
                                              key=f"{name}@{session.run_id}", pure=False, retries=TASK_RETRIES)
            for future in as_completed(list(futures.values())):
                res = future.result()
                session.finished(res["task"], res["status"], res.get("message"))
        finally:
            if self.client is None:
                client.close()
                if cluster is not None:
                    cluster.close()
        return 0
