"""One build session for every entry point and executor: lock -> plan -> executor -> reports -> run.json -> result.

An executor (doit's local processes, a Dask cluster) only runs stage tasks and
tells the session what became of each (`started`, `finished`); the session
shows progress, and when the executor is done writes report.json/md/html and
run.json, names each gate that fell short and prints the closing summary. So
`npubuild build`, `npubuild compile`, plain `doit` and `--executor dask` report
a run the same way.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from npubuild.build.lock import locked
from npubuild.build.plan import BuildPlan, make_plan
from npubuild.build.progress import LiveDisplay, StageProgress
from npubuild.config.load import Build
from npubuild.fileio import write_json

OUTCOMES = ("ran", "from-cache", "cached", "failed", "blocked")


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass
class RunResult:
    plan: BuildPlan
    run_id: str
    report: dict
    executed: list[str]  # ran here or restored from the shared cache
    cached: list[str]  # up to date in the build dir
    failed: list[str]
    from_cache: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)  # not run: an upstream task failed
    executor_code: int = 0

    @property
    def exit_code(self) -> int:
        """2 if any failure was bad input, 1 for any other failure or failed gate, else 0."""
        builds = self.report["builds"]
        if any("input" in b.get("error_kinds", []) for b in builds):
            return 2
        if self.executor_code != 0 or self.failed or any(b["status"] != "passed" for b in builds):
            return 1
        return 0


class Executor(Protocol):
    """Runs a plan's tasks in dependency order, reporting each task's outcome to the session."""

    name: str

    def run(self, plan: BuildPlan, session: Session) -> int:
        """Run every task; returns a non-zero code if the executor itself failed."""
        ...


class Session:
    """Progress while the executor runs; reports, run.json and the summary when it is done."""

    def __init__(self, plan: BuildPlan, run_id: str | None = None, quiet: bool = False, live: bool | None = None,
                 executor: str = "doit"):
        self.plan = plan
        self.run_id = run_id or new_run_id()
        self.quiet = quiet
        self.executor = executor
        self.out = sys.stdout  # the stream of now, not of import time (long-lived processes swap it)
        self.outcomes: dict[str, list[str]] = {o: [] for o in OUTCOMES}
        self.messages: dict[str, str] = {}
        self.progress = StageProgress(plan)
        use_live = (not quiet and self.out.isatty()) if live is None else live
        self.live = LiveDisplay(self.progress, self.out) if use_live else None
        self.result: RunResult | None = None

    # ------------------------------------------------------------------ events from the executor

    def started(self, task_name: str) -> None:
        self._event(task_name, "running")
        self._line(f"[{self._done() + 1:>3}/{len(self.plan.tasks)}] run     {task_name}")

    def finished(self, task_name: str, outcome: str, message: str | None = None) -> None:
        """`outcome`: ran, from-cache, cached, failed or blocked (an upstream task failed: not a new error)."""
        self.outcomes[outcome].append(task_name)
        if outcome == "blocked":
            return
        self._event(task_name, {"from-cache": "ran"}.get(outcome, outcome))
        if outcome == "cached":
            self._line(f"[{self._done():>3}/{len(self.plan.tasks)}] cached  {task_name}")
        elif outcome == "failed":
            self.messages[task_name] = message or "failed"
            sys.stderr.write(f"{self.messages[task_name]}\n")
            sys.stderr.flush()

    # ------------------------------------------------------------------ the end of the run

    def close(self, executor_code: int = 0) -> RunResult:
        """Write the reports and run.json once; print failed gates and the closing line.

        doit's reporter closes the session when doit ends its run (plain `doit` has no other hook); the
        executor's own exit code arrives with the second call (`npubuild build`), and a failure there wins."""
        if self.result is not None:
            self.result.executor_code = self.result.executor_code or executor_code
            return self.result
        from npubuild.report.summary import write_reports

        self._stop_live()
        build_dir = self.plan.build_dir
        report = write_reports(self.plan, self.run_id, build_dir)
        o = self.outcomes
        executed = sorted(o["ran"] + o["from-cache"])
        write_json(build_dir / "run.json", {"run_id": self.run_id, "executor": self.executor, "executed": executed,
                                            "from_cache": sorted(o["from-cache"]), "cached": sorted(o["cached"]),
                                            "failed": o["failed"], "blocked": sorted(o["blocked"])})
        for b in report["builds"]:  # a gate that fell short is a failure: say which, its limit and value
            for g in b["gates"]:
                if not g["ok"]:
                    sys.stderr.write(f"{b['spec']}/{b['model']}/{b['target']}: gate {g['name']} failed: "
                                     f"limit {g['limit']}, value {g['value']}\n")
        counts = {s: sum(1 for b in report["builds"] if b["status"] == s) for s in ("passed", "failed", "skipped")}
        self._line(f"{len(executed)} ran, {len(o['cached'])} cached, {len(o['failed'])} failed; "
                   f"builds: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; "
                   f"report: {build_dir / 'report.json'}")
        self.result = RunResult(self.plan, self.run_id, report, executed, sorted(o["cached"]), o["failed"],
                                sorted(o["from-cache"]), sorted(o["blocked"]), executor_code)
        return self.result

    # ------------------------------------------------------------------ display

    def _done(self) -> int:
        o = self.outcomes
        return len(o["ran"]) + len(o["from-cache"]) + len(o["cached"]) + len(o["failed"])

    def _line(self, text: str) -> None:
        if not self.quiet and self.live is None:
            self.out.write(text + "\n")
            self.out.flush()

    def _event(self, task_name: str, state: str) -> None:
        self.progress.mark(task_name, state)
        if self.live is not None:
            self.live.update()

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def abort(self, text: str) -> None:
        """The executor itself failed (not a task): stop the live table, say why in one line."""
        self._stop_live()
        sys.stderr.write(f"error: {text}\n")


def run_build(plan: BuildPlan, executor: Executor, wait: bool = False, quiet: bool = False,
              live: bool | None = None) -> RunResult:
    """Run the plan with `executor`, holding the build dir's lock (`wait` for it, else fail at once if busy)."""
    with locked(plan.build_dir, wait):
        session = Session(plan, quiet=quiet, live=live, executor=executor.name)
        code = executor.run(plan, session)
        sys.stdout.flush()
        return session.close(code)


def build(builds: list[Build], build_dir: Path, jobs: int = 1, keep_going: bool = False, quiet: bool = False,
          debug: bool = False, wait: bool = False, live: bool | None = None, cache: str | None = None,
          executor: str = "doit", scheduler: str | None = None, client=None) -> RunResult:
    """Plan and run builds. `live`: the per-stage progress table (None: when stdout is a terminal);
    `cache`: --cache (a URL, 'off', or None for $NPUBUILD_CACHE / <build-dir>/cache)."""
    from npubuild.build.cache import resolve_cache

    plan = make_plan(builds, build_dir)
    cache_url = resolve_cache(cache, plan.build_dir)
    if executor == "dask":
        from npubuild.build.dask_executor import DaskExecutor

        ex: Executor = DaskExecutor(cache_url, debug, scheduler, jobs if jobs > 1 else 2, client)
    else:
        from npubuild.build.doit_executor import DoitExecutor

        ex = DoitExecutor(cache_url, debug, jobs, keep_going)
    return run_build(plan, ex, wait, quiet, live)
