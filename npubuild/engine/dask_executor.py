"""Run a build plan on a Dask cluster whose workers share nothing with the client but the stage cache URL.

The client walks the plan in dependency order. A task whose upstream tasks are settled is decided here
as doit decides it: blocked if one failed, cached if up to date in the build dir, restored if the shared
cache has its entry; the report stage (this build dir's records) runs here. Every other task goes to a
worker as content addresses (npubuild.engine.worker): the worker fetches its inputs from the cache, runs
the stage in a temporary dir of its own and publishes the outputs; the client restores them into the
stage dir as each result arrives (npubuild.engine.shipping). So a worker needs no path of the client's:
autoscaled workers, containers, a Kubernetes or SLURM deployment with only an object store in common.

Without a scheduler address a LocalCluster (loopback, no dashboard) is started, once a task needs a
worker (a build with nothing to run starts none). A worker that dies mid-stage is replaced and its task
retried by Dask; a task publishes its entry only when complete (manifest last), so the retry starts clean. The team cache key ($NPUBUILD_CACHE_KEY) is each worker's
own environment: it never travels with a task.

Each task runs in a child of the worker (a forkserver's, as the worker's tasks run on a thread) under the
same memory limit as doit's: the LocalCluster's workers are started non-daemonic for that; a worker started
elsewhere as a daemon (Dask's default) runs tasks in process.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from npubuild.engine.cache import StageCache
from npubuild.engine.execute import output_error, run_stage, stage_modules
from npubuild.engine.plan import BuildPlan
from npubuild.engine.session import Session
from npubuild.engine.shipping import Prepared, Shipping
from npubuild.engine.uptodate import is_done
from npubuild.engine.worker import run_remote
from npubuild.errors import InputError, NpubuildError, is_disk_full

TASK_RETRIES = 3
CONNECT_TIMEOUT_S = 30


class SchedulerUnreachable(NpubuildError):
    """--scheduler names no scheduler this client can connect to."""


def is_loopback(address: str) -> bool:
    """Whether a Dask scheduler address is on this machine (its workers can be too), e.g. tcp://127.0.0.1:8786."""
    if address.startswith("inproc://"):
        return True
    host = urlsplit(address if "://" in address else f"tcp://{address}").hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def require_shared_cache(cache_url: str | None, scheduler: str | None, own_cluster: bool) -> None:
    """The workers' only way to the inputs and back: a cache they can reach, or one line (exit 2) saying why not.

    `scheduler`: the address of the cluster the build runs on (None: a LocalCluster started here);
    `own_cluster`: the workers are processes started here (an in-memory cache is not theirs)."""
    if cache_url is None:
        raise InputError("--executor dask needs the shared stage cache (its workers take every input from it and "
                         "put every output there), but it is off (--cache off or NPUBUILD_CACHE=off): give --cache "
                         "a directory or URL the workers reach")
    protocol = cache_url.split("://", 1)[0] if "://" in cache_url else None
    if protocol == "memory" and (own_cluster or (scheduler is not None and not scheduler.startswith("inproc://"))):
        raise InputError(f"--cache {cache_url} is in this process's memory, which Dask workers in other processes "
                         "cannot reach: give --cache a directory or URL they share")
    if protocol is None and scheduler is not None and not is_loopback(scheduler):
        raise InputError(f"--cache {cache_url} is a directory on this machine, which the workers of the Dask "
                         f"scheduler at {scheduler} cannot reach: give --cache a URL they share (s3://bucket/path, "
                         "or file:///path on a filesystem every worker mounts)")


# Dask's own log lines (a worker's heartbeat that timed out on a loaded machine, with its traceback; a comm
# closed at shutdown) are not the build's: npubuild reports every task's outcome and an unreachable scheduler
# itself. They show with --debug.
DASK_LOG_LEVEL, DASK_LOG_LEVEL_DEBUG = logging.CRITICAL, logging.WARNING


@contextmanager
def quiet_distributed(debug: bool) -> Iterator[None]:
    """distributed's loggers in this process at DASK_LOG_LEVEL for the run (its workers': LocalCluster's
    silence_logs), restored after. Its config gives some child loggers levels of their own, and a record
    passes the handlers of the loggers above its own whatever their levels: each is set."""
    import distributed  # noqa: F401 - configures its loggers on import: set them after that

    loggers = [logging.getLogger("distributed")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("distributed.") and isinstance(logger, logging.Logger) and logger.level]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(DASK_LOG_LEVEL_DEBUG if debug else DASK_LOG_LEVEL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, saved, strict=True):
            logger.setLevel(level)


class DaskExecutor:
    """Ready tasks submitted as their upstream tasks settle; outcomes reported to the session as they come."""

    name = "dask"

    def __init__(self, cache_url: str | None, debug: bool = False, scheduler: str | None = None, workers: int = 2,
                 client=None, keep_going: bool = False):
        address = scheduler or (client.scheduler.address if client is not None else None)
        require_shared_cache(cache_url, address, own_cluster=client is None and scheduler is None)
        assert cache_url is not None
        self.cache_url, self.debug, self.scheduler, self.workers, self.client = \
            cache_url, debug, scheduler, workers, client
        self.jobs = workers if scheduler is None and client is None else None  # a cluster's own size otherwise
        self.keep_going = keep_going  # False: start no task after the first failure, as doit without --continue
        self._own = self._cluster = None  # the client and LocalCluster this executor started

    def run(self, plan: BuildPlan, session: Session) -> int:
        import dask
        import distributed  # noqa: F401 - its config defaults in place first: dask.config.set records a section
        # that is not there yet as its own and removes it whole on exit (a process's first Dask build, with
        # nothing to run, left it without any `distributed` config: the next LocalCluster failed)

        # Workers that may have children, so each task runs isolated in one (engine/isolate.py); the nanny
        # reads this whenever it (re)starts a worker, so it holds for the whole run.
        with dask.config.set({"distributed.worker.daemon": False}), quiet_distributed(self.debug):
            return self._run(plan, session)

    def _run(self, plan: BuildPlan, session: Session) -> int:
        plan.build_dir.mkdir(parents=True, exist_ok=True)
        shipping = Shipping(plan, StageCache(self.cache_url))
        shipping.publish_user_inputs()
        walk = _Walk(plan, session, shipping, self._connect, self.cache_url, self.debug, self.keep_going)
        try:
            walk.run()
        except SchedulerUnreachable as exc:  # the executor failed, not a task: say why, report what was done
            session.abort(exc.message)
            return 1
        finally:
            self._disconnect()
        return 0

    def _connect(self):
        """The Dask client, connected (and a LocalCluster started) on the first task a worker must run: a
        build with everything up to date or in the cache starts no cluster."""
        if self.client is None:
            from dask.distributed import Client, LocalCluster

            if self.scheduler:
                try:
                    self._own = Client(self.scheduler, timeout=CONNECT_TIMEOUT_S)
                except (OSError, TimeoutError) as exc:
                    raise SchedulerUnreachable(f"cannot reach the Dask scheduler at {self.scheduler}: "
                                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
            else:
                self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                             host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                             silence_logs=DASK_LOG_LEVEL_DEBUG if self.debug else DASK_LOG_LEVEL)
                self._own = Client(self._cluster)
            self.client = self._own
        return self.client

    def _disconnect(self) -> None:
        if self._own is not None:
            self._own.close()
            self.client = self._own = None
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


class _Walk:
    """One run's walk over the plan: each task settled once its upstream tasks are, in plan order."""

    def __init__(self, plan: BuildPlan, session: Session, shipping: Shipping, connect: Callable[[], Any],
                 cache_url: str, debug: bool, keep_going: bool):
        self.plan, self.session, self.shipping, self.connect = plan, session, shipping, connect
        self.cache_url, self.debug, self.keep_going = cache_url, debug, keep_going
        self.stopped = False  # a task failed without keep_going: the running tasks finish, no new one starts
        self.waiting = {name: len(t.deps) for name, t in plan.tasks.items()}
        self.dependents: dict[str, list[str]] = {name: [] for name in plan.tasks}
        for name, t in plan.tasks.items():
            for d in t.deps:
                self.dependents[d].append(name)
        self.outcome: dict[str, str] = {}
        self.ready = deque(name for name, n in self.waiting.items() if n == 0)
        self.running: dict[str, tuple[str, Prepared]] = {}  # future key -> (task name, what it was sent with)

    def run(self) -> None:
        from dask.distributed import as_completed

        pending = None  # as_completed needs a client: made with the first future
        while len(self.outcome) < len(self.plan.tasks):
            while self.ready and not self.stopped:
                future = self._start(self.ready.popleft())
                if future is not None and pending is None:
                    pending = as_completed([future])
                elif future is not None:
                    pending.add(future)
            if not self.running or pending is None:
                break  # every task settled, or stopped after a failure (or a cycle, which make_plan cannot make)
            self._arrived(next(pending))

    def _settle(self, name: str, outcome: str, message: str | None = None) -> None:
        self.outcome[name] = outcome
        self.session.finished(name, outcome, message)
        if outcome == "failed" and not self.keep_going:
            self.stopped = True
        for d in self.dependents[name]:
            self.waiting[d] -= 1
            if self.waiting[d] == 0:
                self.ready.append(d)

    def _start(self, name: str) -> Any:
        """Settle the task here if it can be (blocked, cached, restored, the report); else its future."""
        task = self.plan.tasks[name]
        if any(self.outcome[d] in ("failed", "blocked") for d in task.deps):
            self._settle(name, "blocked")
            return None
        if is_done(task):
            self._settle(name, "cached")
            return None
        self.session.started(name)
        try:
            if task.per_build:  # the report stage: it gathers this build dir's records
                run_stage(task, self.session.run_id, self.debug, None)
                self._settle(name, "ran")
                return None
            prepared = self.shipping.prepare(task, self.session.run_id)
        except (NpubuildError, OSError) as exc:  # OSError: the cache unreachable while restoring a hit
            self._settle(name, "failed", str(output_error(task, exc) if is_disk_full(exc) else exc))
            return None
        if prepared.remote is None:
            self._settle(name, "from-cache")
            return None
        future = self.connect().submit(run_remote, prepared.remote, self.cache_url, self.session.run_id, self.debug,
                                       stage_modules(self.plan.stages), key=f"{name}@{self.session.run_id}",
                                       pure=False, retries=TASK_RETRIES)
        self.running[future.key] = (name, prepared)
        return future

    def _arrived(self, future) -> None:
        name, prepared = self.running.pop(future.key)
        task = self.plan.tasks[name]
        try:
            result = future.result()
        except Exception as exc:  # the worker died on every retry, or the cluster went away
            if self.debug:
                raise
            self._settle(name, "failed", f"error: stage {task.stage}: the Dask task failed: {type(exc).__name__}: "
                                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
            return
        try:
            failure = self.shipping.finish(task, prepared, result, self.session.run_id)
        except (NpubuildError, OSError) as exc:
            failure = str(output_error(task, exc) if is_disk_full(exc) else exc)
        if failure is not None:
            self._settle(name, "failed", failure)
        else:
            self._settle(name, result.status)
