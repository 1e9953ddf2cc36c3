"""One build session for every entry point and executor: lock -> plan -> executor -> reports -> run.json -> result.

An executor (doit's local processes, a Dask cluster) only runs stage tasks and
tells the session what became of each (`started`, `finished`); the session
shows progress (a result line per build as soon as its last task is done),
and when the executor is done writes report.json/md/html and run.json, names
each gate that fell short and prints the closing summary. So `npubuild build`,
plain `doit` and `--executor dask` report a run the same way; `compile` writes
its reports elsewhere and the side commands none (Session's `reports`).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from npubuild.config.load import Build
from npubuild.engine.lock import locked
from npubuild.engine.plan import BuildPlan, make_plan
from npubuild.engine.progress import LiveDisplay, StageProgress, format_seconds
from npubuild.engine.stage import Stage
from npubuild.fileio import write_json
from npubuild.longlived import long_lived
from npubuild.records.build import Outcome
from npubuild.report.status import Status, passed

OUTCOMES = tuple(o.value for o in Outcome)
BUILD_DIR = "build-dir"  # `reports=`: the project's reports in the build dir (every other value is a path or None)


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def warnings_block(report: dict) -> str:
    """The builds' warnings (most of the model on the host, ...) as the lines above the closing summary; ''
    when none warns."""
    warned = [(f"{b['spec']}/{b['model']}/{b['target']}", w) for b in report["builds"] for w in b.get("warnings") or []]
    if not warned:
        return ""
    return f"warnings ({len(warned)}):\n" + "".join(f"  warning: {bid}: {w}\n" for bid, w in warned)


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
    report_dir: Path | None = None  # where report.json/md/html and run.json went (None: not written)
    seconds: float = 0.0  # the run's wall time

    def summary_line(self) -> str:
        """The closing line: `10 ran, 0 cached, 0 failed, 0 restored from the shared cache; builds: 3 passed, ...`"""
        counts = {s: sum(1 for b in self.report["builds"] if b["status"] == s) for s in Status}
        hosted = counts[Status.HOST_ONLY] + counts[Status.MOSTLY_HOST]
        host_note = f" ({counts[Status.HOST_ONLY]} host only, {counts[Status.MOSTLY_HOST]} mostly host)" if hosted else ""
        where = f"report: {self.report_dir / 'report.json'}" if self.report_dir is not None else "no report written"
        ran = len(self.executed) - len(self.from_cache)
        return (f"{ran} ran, {len(self.cached)} cached, {len(self.failed)} failed, {len(self.from_cache)} restored "
                f"from the shared cache; builds: {counts[Status.PASSED] + hosted} passed{host_note}, "
                f"{counts[Status.FAILED]} failed, {counts[Status.SKIPPED]} skipped ({format_seconds(self.seconds)}); "
                f"{where}")

    @property
    def exit_code(self) -> int:
        """2 if any failure was bad input, 1 for any other failure or failed gate, else 0."""
        builds = self.report["builds"]
        if any("input" in b.get("error_kinds", []) for b in builds):
            return 2
        if self.executor_code != 0 or self.failed or any(not passed(b["status"]) for b in builds):
            return 1
        return 0


class Executor(Protocol):
    """Runs a plan's tasks in dependency order, reporting each task's outcome to the session."""

    name: str

    def run(self, plan: BuildPlan, session: Session) -> int:
        """Run every task; returns a non-zero code if the executor itself failed."""
        ...


class Session:
    """Progress while the executor runs; reports, run.json and the summary when it is done.

    `reports`: where report.json/md/html and run.json go: BUILD_DIR (the project's, for `build` and plain
    doit), another directory (`compile`'s own), or None (side commands such as `offloads` and
    `debug-numerics`: they read what they need from the result and leave the project's reports alone).
    `quiet`: no per-task lines or live table, the closing summary still; `summary=False`: no closing summary
    either, nothing on stdout (the command prints its own output). Errors go to stderr whatever these say:
    one line per failed task naming its builds, one per gate that fell short, unless `per_build=False` (no
    line per build at all, neither those nor the result lines: `advise`, whose table says it for dozens of
    configurations). `selection`: what was asked for (the spec arguments and --only), kept in report.json so
    that a baseline comparison can tell a build not asked for from one lost.
    """

    def __init__(self, plan: BuildPlan, run_id: str | None = None, quiet: bool = False, live: bool | None = None,
                 executor: str = "doit", reports: Path | str | None = BUILD_DIR, selection: dict | None = None,
                 summary: bool = True, verbose: bool = False, per_build: bool = True):
        self.plan = plan
        self.per_build = per_build
        self.run_id = run_id or new_run_id()
        self.quiet = quiet
        self.summary = summary
        self.verbose = verbose
        self.executor = executor
        self.report_dir: Path | None = plan.build_dir if reports == BUILD_DIR else (
            None if reports is None else Path(reports))
        self.selection = selection
        self.out = sys.stdout  # the stream of now, not of import time (long-lived processes swap it)
        self.outcomes: dict[str, list[str]] = {o: [] for o in OUTCOMES}
        self.messages: dict[str, str] = {}
        self.progress = StageProgress(plan)
        use_live = (not self.quiet and self.out.isatty()) if live is None else (live and not self.quiet)
        self.live = LiveDisplay(self.progress, self.out) if use_live else None
        self.result: RunResult | None = None
        self._left: dict[str, set[str]] = {bid: set(chain.values()) for bid, chain in plan.build_tasks.items()}
        self._worked: set[str] = set()  # builds with a task that ran, was restored or failed in this run
        self._cause: dict[str, str] = {}  # build id -> the stage of its first failed task
        self._gates_said: set[str] = set()  # builds whose failed gates have had their lines

    # ------------------------------------------------------------------ events from the executor

    def started(self, task_name: str) -> None:
        self._event(task_name, "running")
        self._line(f"[{self._done() + 1:>3}/{len(self.plan.tasks)}] run     {task_name}")

    def finished(self, task_name: str, outcome: str, message: str | None = None) -> None:
        """`outcome`: ran, from-cache, cached, failed or blocked (an upstream task failed: not a new error)."""
        self.outcomes[outcome].append(task_name)
        task = self.plan.tasks.get(task_name)
        builds = task.builds if task is not None else []
        self._event(task_name, {"from-cache": "restored"}.get(outcome, outcome))
        if outcome == "cached" and self.verbose:
            self._line(f"[{self._done():>3}/{len(self.plan.tasks)}] cached  {task_name}")
        elif outcome == "failed":
            text = (message or "failed").strip()
            self.messages[task_name] = text
            stage = task.stage if task is not None else task_name.split(":", 1)[0]
            for bid in builds:
                self._cause.setdefault(bid, stage)
            self._line(f"[{self._done():>3}/{len(self.plan.tasks)}] failed  {task_name}")
            self._error(error_line(text, _ids(builds) or task_name, stage))
        if outcome != "cached":
            self._worked.update(builds)
        for bid in builds:
            left = self._left.get(bid)
            if left is not None and task_name in left:
                left.discard(task_name)
                if not left:
                    self._build_finished(bid)

    def _build_finished(self, build_id: str) -> None:
        """Every task of the build has an outcome: say whether it passed, as soon as it is known. Each failure's
        text is printed once, as its `error:` line (a failed task's when it failed, naming every build it
        stops; a gate's now); the result line names only where it failed."""
        from npubuild.report.brief import gate_text, result_line

        stage = self._cause.get(build_id)
        where, entry = stage, {}
        if stage is None:
            entry = self._entry(build_id)
            bad = [g for g in entry.get("gates", []) if not g.get("ok")]
            for g in bad:  # a failing gate fails the build even when nothing ran: always said
                self._error(f"error: {build_id}: {gate_text(g)}")
            self._gates_said.add(build_id)
            where = ", ".join(f"gate {g['name']}" for g in bad) or None
        self.progress.build_finished(build_id, where)
        if (build_id not in self._worked and not self.verbose) or not self.per_build:
            return  # up to date: the closing summary counts it, no line each
        text = result_line(build_id, {"status": "passed", **entry}, where)
        if self.live is not None:
            self.live.print(text, "red" if where else "green")
        else:
            self._line(text)

    def _error(self, line: str) -> None:
        """A failure's one line: on stderr, or above the live table when that is where stderr shows (the same
        terminal), whole rather than cut at its width."""
        if not self.per_build:
            return
        if self.live is not None and _same_terminal(self.out, sys.stderr):
            self.live.print(line, "red")
            return
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def _entry(self, build_id: str) -> dict:
        """The build's report-stage entry (metrics and gates), {} if it is not there."""
        from npubuild.fileio import read_json

        name = self.plan.build_tasks[build_id].get("report")
        path = self.plan.tasks[name].outputs.get("entry") if name else None
        try:
            return read_json(path) if path is not None else {}
        except (OSError, ValueError):
            return {}

    # ------------------------------------------------------------------ the end of the run

    def close(self, executor_code: int = 0) -> RunResult:
        """Write the reports and run.json once; name each build that failed and why, print the closing line.

        doit's reporter closes the session when doit ends its run (plain `doit` has no other hook); the
        executor's own exit code arrives with the second call (`npubuild build`), and a failure there wins."""
        if self.result is not None:
            self.result.executor_code = self.result.executor_code or executor_code
            return self.result
        from npubuild.report.summary import make_report, write_reports

        self._stop_live()
        report = make_report(self.plan, self.run_id, self.selection)
        o = self.outcomes
        executed = sorted(o["ran"] + o["from-cache"])
        if self.report_dir is not None:
            write_reports(report, self.report_dir, plot_cache=self.plan.build_dir / ".cache" / "plots")
            write_json(self.report_dir / "run.json", {
                "run_id": self.run_id, "executor": self.executor, "executed": executed,
                "from_cache": sorted(o["from-cache"]), "cached": sorted(o["cached"]), "failed": o["failed"],
                "blocked": sorted(o["blocked"])})
            if self.report_dir == self.plan.build_dir:
                from npubuild.config.schema import write_schemas

                write_schemas(self.plan.build_dir)
        from npubuild.report.brief import gate_text

        for b in report["builds"]:  # the gates of builds the run stopped before finishing (no --keep-going)
            bid = f"{b['spec']}/{b['model']}/{b['target']}"
            if bid not in self._gates_said:
                for g in b["gates"]:
                    if not g["ok"]:
                        self._error(f"error: {bid}: {gate_text(g)}")
        if self.summary:  # what passed but is not what it seems (most of it on the host): said even with -q
            self.out.write(warnings_block(report))
        self.result = RunResult(self.plan, self.run_id, report, executed, sorted(o["cached"]), o["failed"],
                                sorted(o["from-cache"]), sorted(o["blocked"]), executor_code, self.report_dir,
                                time.perf_counter() - self.progress.start)
        if self.summary:
            self.out.write(self.result.summary_line() + "\n")
            self.out.flush()
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


def _same_terminal(a, b) -> bool:
    """Whether two streams write to the same terminal (stdout and stderr of an interactive shell)."""
    try:
        if not (a.isatty() and b.isatty()):
            return False
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)


def error_line(text: str, builds: str, stage: str) -> str:
    """A failed task's one stderr line, naming its builds and stage: `error: kws/ds_cnn/ethos-u55-128: vela:
    pool 'sram' ...` (a message with a position keeps it first: `spec.yaml:3:5: error: ...`)."""
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    where, sep, rest = first.partition("error: ")
    if not sep:
        where, rest = "", first
    return f"{where}error: {builds}: {stage}: {rest}"


def _ids(builds: list[str], shown: int = 3) -> str:
    return ", ".join(builds[:shown]) + (f" (+{len(builds) - shown} more)" if len(builds) > shown else "")


def run_build(plan: BuildPlan, executor: Executor, wait: bool = False, quiet: bool = False,
              live: bool | None = None, reports: Path | str | None = BUILD_DIR, selection: dict | None = None,
              summary: bool = True, verbose: bool = False, per_build: bool = True) -> RunResult:
    """Run the plan with `executor`, holding the build dir's lock (`wait` for it, else fail at once if busy)."""
    with locked(plan.build_dir, wait):
        session = Session(plan, quiet=quiet, live=live, executor=executor.name, reports=reports,
                          selection=selection, summary=summary, verbose=verbose, per_build=per_build)
        code = executor.run(plan, session)
        sys.stdout.flush()
        return session.close(code)


def build(builds: list[Build], build_dir: Path, stages: tuple[Stage, ...], jobs: int = 1, keep_going: bool = False,
          quiet: bool = False, debug: bool = False, wait: bool = False, live: bool | None = None, cache: str | None = None,
          executor: str = "doit", scheduler: str | None = None, client=None,
          reports: Path | str | None = BUILD_DIR, selection: dict | None = None, summary: bool = True,
          verbose: bool = False, per_build: bool = True) -> RunResult:
    """Plan and run builds through `stages` (npubuild.stages.STAGES, in run order). `live`: the per-stage
    progress table (None: when stdout is a terminal);
    `cache`: --cache (a URL, 'off', or None for $NPUBUILD_CACHE / the project's .npubuild/cache);
    `reports`, `selection`, `summary`: see Session."""
    from npubuild.engine.cache import resolve_cache

    try:
        with long_lived():  # the plan and the executor's modules (with the report's, and Vela): kept for the run
            plan = make_plan(builds, build_dir, stages)
            cache_url = resolve_cache(cache, plan.build_dir)
            if executor == "dask":
                from npubuild.engine.dask_executor import DaskExecutor

                ex: Executor = DaskExecutor(cache_url, debug, scheduler, jobs if jobs > 1 else 2, client, keep_going)
            else:
                from npubuild.engine.doit_executor import DoitExecutor

                ex = DoitExecutor(cache_url, debug, jobs, keep_going)
        return run_build(plan, ex, wait, quiet, live, reports, selection, summary, verbose, per_build)
    finally:
        gc.unfreeze()  # what long_lived froze for this build's forks: collectable again in a process that goes on
