"""Run builds: plan them through the stages the caller hands in, hold the build dir's lock, run the plan with an
executor (doit or Dask) under a session, and return the session's outcome.

The caller (the command line, a test, a bench script) chooses the stages (npubuild.stages.STAGES) and the
reporter (report/run.py's RunReports, which writes the reports); the engine knows neither.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from npubuild.engine.lock import locked
from npubuild.engine.plan import BuildPlan, make_plan
from npubuild.engine.session import Reporter, RunOutcome, Session
from npubuild.engine.stage import Stage
from npubuild.engine.uptodate import forget_hashes
from npubuild.longlived import long_lived

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class RunOptions:
    """How a run goes (not what it builds): the executor and its parallelism, the shared cache, the display."""

    jobs: int = 1  # tasks at once (doit's processes; a Dask build's local cluster has this many workers, at least 2)
    keep_going: bool = False  # go on with other builds after a failure
    debug: bool = False  # tracebacks, and Dask's own log lines
    wait: bool = False  # wait for a build dir another build holds (else fail at once)
    cache: str | None = None  # --cache: a URL, 'off', or None for $NPUBUILD_CACHE / the project's .npubuild/cache
    executor: Literal["doit", "dask"] = "doit"
    scheduler: str | None = None  # the Dask scheduler's address (None: a local cluster)
    quiet: bool = False  # no per-task lines or live table
    live: bool | None = None  # the per-stage progress table (None: when stdout is a terminal)
    verbose: bool = False  # a line for each task up to date too
    per_build: bool = True  # lines per build (failed tasks, gates, results); False: none (advise's table says it)


class Executor(Protocol):
    """Runs a plan's tasks in dependency order, reporting each task's outcome to the session."""

    name: str
    jobs: int | None  # tasks it runs at once (None: a cluster's own size, not set here)

    def run(self, plan: BuildPlan, session: Session) -> int:
        """Run every task; returns a non-zero code if the executor itself failed."""
        ...


def run_plan(plan: BuildPlan, executor: Executor, options: RunOptions | None = None,
             reporter: Reporter | None = None) -> RunOutcome:
    """Run the plan with `executor`, holding the build dir's lock (`options.wait` for it, else fail at once if
    busy); the reporter gets the outcome before the lock is let go."""
    options = options or RunOptions()
    with locked(plan.build_dir, options.wait):
        session = Session(plan, reporter, quiet=options.quiet, live=options.live, executor=executor.name,
                          verbose=options.verbose, jobs=executor.jobs, per_build=options.per_build)
        code = executor.run(plan, session)
        sys.stdout.flush()
        return session.close(code)


def build(builds: list[Build], build_dir: Path, stages: tuple[Stage, ...], options: RunOptions | None = None,
          reporter: Reporter | None = None, client: Any = None) -> RunOutcome:
    """Plan and run builds through `stages` (npubuild.stages.STAGES, in run order); `client`: a Dask client to
    run on (tests and benches; `options.scheduler` names one by address)."""
    from npubuild.engine.cache import resolve_cache
    from npubuild.engine.capacity import clamp_jobs, stage_workers_for

    options = options or RunOptions()
    forget_hashes()  # the files' hashes are remembered for one build (uptodate.content_hash)
    try:
        with long_lived():  # the plan and the executor's modules (with the report's, and Vela): kept for the run
            plan = make_plan(builds, build_dir, stages)
            cache_url = resolve_cache(options.cache, plan.build_dir)
            if options.executor == "dask":
                from npubuild.engine.dask_executor import DaskExecutor

                jobs = options.jobs if options.jobs > 1 else 2
                if options.scheduler is None and client is None:  # the local cluster's workers are processes here
                    jobs = clamp_jobs(jobs, plan, None if options.jobs > 1 else "a local Dask cluster of 2 workers")
                ex: Executor = DaskExecutor(cache_url, options.debug, options.scheduler, jobs, client,
                                            options.keep_going)
            else:
                from npubuild.engine.doit_executor import DoitExecutor

                jobs = clamp_jobs(options.jobs, plan)  # doit starts a process per job slot: no more than fit
                ex = DoitExecutor(cache_url, options.debug, jobs, options.keep_going)
        with stage_workers_for(jobs):  # the stage worker pools share the cores among the tasks run at once
            return run_plan(plan, ex, options, reporter)
    finally:
        forget_hashes()
        gc.unfreeze()  # what long_lived froze for this build's forks: collectable again in a process that goes on
