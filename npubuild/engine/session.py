"""One build session for every entry point and executor: plan -> executor -> outcome, with progress on the way.

An executor (doit's local processes, a Dask cluster) only runs stage tasks and
tells the session what became of each (`started`, `finished`); the session
shows progress (a result line per build as soon as its last task is done) and,
when the executor is done, hands its `RunOutcome` (what became of every task)
to its reporter, the layer above the engine that writes the reports
(report/run.py), and back to the caller. So `npubuild build`, plain `doit` and
`--executor dask` report a run the same way, and the engine knows nothing of
what a report holds.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from npubuild.engine.plan import BuildPlan
from npubuild.engine.progress import LiveDisplay, StageProgress
from npubuild.errors import plain_message
from npubuild.records.build import Outcome

OUTCOMES = tuple(o.value for o in Outcome)


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


@dataclass
class RunOutcome:
    """What became of every task of a run: the engine's account of it, which the reports are made from."""

    plan: BuildPlan
    run_id: str
    executor: str  # doit or dask
    tasks: dict[str, list[str]]  # outcome (ran, from-cache, cached, failed, blocked, not-run) -> task names
    started: float  # time.perf_counter() when the session started (the closing summary's elapsed time)
    executor_code: int = 0  # non-zero: the executor itself failed (not a task)
    messages: dict[str, str] = field(default_factory=dict)  # failed task -> its error
    jobs: int | None = None  # tasks run at once, as the executor was given them (None: a cluster's own size)
    stopped: str | None = None  # why the run ended before reaching every task (the first failure, Ctrl-C)

    _by_task: dict[str, Outcome] | None = field(default=None, init=False, repr=False, compare=False)

    def outcome(self, task: str) -> Outcome:
        """What became of `task` in this run; NOT_RUN if the run never reached it."""
        if self._by_task is None:
            self._by_task = {name: Outcome(o) for o, names in self.tasks.items() for name in names}
        return self._by_task.get(task, Outcome.NOT_RUN)

    def is_current(self, task: str) -> bool:
        """Whether the task's record is this run's word on it (Outcome.current): only then may a report
        show its figures; any other record is an earlier run's, whatever its key says."""
        return self.outcome(task).current

    @property
    def executed(self) -> list[str]:
        """Ran here or restored from the shared cache."""
        return sorted(self.tasks["ran"] + self.tasks["from-cache"])

    @property
    def cached(self) -> list[str]:
        """Up to date in the build dir."""
        return sorted(self.tasks["cached"])

    @property
    def failed(self) -> list[str]:
        return self.tasks["failed"]

    @property
    def from_cache(self) -> list[str]:
        return sorted(self.tasks["from-cache"])

    @property
    def blocked(self) -> list[str]:
        """Not run: an upstream task failed."""
        return sorted(self.tasks["blocked"])

    @property
    def not_run(self) -> list[str]:
        """Not reached: the run stopped first (a failure without --keep-going, Ctrl-C, the executor failed)."""
        return sorted(self.tasks[Outcome.NOT_RUN])

    def run_json(self) -> dict:
        """run.json: which tasks ran, were restored, up to date, failed, blocked or not reached."""
        return {"run_id": self.run_id, "executor": self.executor, "jobs": self.jobs, "executed": self.executed,
                "from_cache": self.from_cache, "cached": self.cached, "failed": self.failed,
                "blocked": self.blocked, "not_run": self.not_run}


@dataclass(frozen=True)
class BuildVerdict:
    """What the reporter says of a finished build: where it failed (its stage, or its gates; None: it passed),
    its result line, and the error lines to print first (a gate that fell short)."""

    failed_at: str | None
    line: str
    errors: tuple[str, ...] = ()


class Reporter(Protocol):
    """The layer above the engine (report/run.py's RunReports): what a finished build's lines say, and what
    becomes of the outcome (the reports). The engine only calls it."""

    def build_done(self, plan: BuildPlan, build_id: str, failed_stage: str | None) -> BuildVerdict:
        """Every task of the build has an outcome (`failed_stage`: the stage of its first failed task)."""
        ...

    def close(self, outcome: RunOutcome, say: Callable[[str], None]) -> None:
        """The run is over: write its reports, `say` what failed (the session's error line), print the
        closing summary."""
        ...


class Session:
    """Progress while the executor runs; the outcome, handed to the reporter, when it is done.

    `quiet`: no per-task lines or live table; `verbose`: a line for each task up to date and each build with
    nothing to do too. Errors go to stderr whatever these say: one line per failed task naming its builds,
    one per gate that fell short (the reporter's), unless `per_build=False` (no line per build at all,
    neither those nor the result lines: `advise`, whose table says it for dozens of configurations).
    `reporter`: the layer above that describes finished builds and writes the reports (None: neither).
    """

    def __init__(self, plan: BuildPlan, reporter: Reporter | None = None, run_id: str | None = None,
                 quiet: bool = False, live: bool | None = None, executor: str = "doit", verbose: bool = False,
                 per_build: bool = True, jobs: int | None = None):
        self.plan = plan
        self.reporter = reporter
        self.per_build = per_build
        self.jobs = jobs  # tasks run at once, as the executor was given them (None: a cluster's own size)
        self.run_id = run_id or new_run_id()
        self.quiet = quiet
        self.verbose = verbose
        self.executor = executor
        self.out = sys.stdout  # the stream of now, not of import time (long-lived processes swap it)
        self.outcomes: dict[str, list[str]] = {o: [] for o in OUTCOMES}
        self.messages: dict[str, str] = {}
        self.progress = StageProgress(plan)
        use_live = (not self.quiet and self.out.isatty()) if live is None else (live and not self.quiet)
        self.live = LiveDisplay(self.progress, self.out) if use_live else None
        self.outcome: RunOutcome | None = None
        self._left: dict[str, set[str]] = {bid: set(chain.values()) for bid, chain in plan.build_tasks.items()}
        self._worked: set[str] = set()  # builds with a task that ran, was restored or failed in this run
        self._cause: dict[str, str] = {}  # build id -> the stage of its first failed task
        self._aborted: str | None = None  # the executor itself failed (Session.abort)
        self._noticed: set[str] = set()  # kinds of warning shown once per run already (Session.notice)

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

    def notice(self, kind: str, text: str) -> None:
        """A warning shown once per run for its `kind` (a shared cache that cannot take outputs: every task
        meets it, one line says it)."""
        if kind not in self._noticed:
            self._noticed.add(kind)
            sys.stderr.write(f"warning: {text}\n")
            sys.stderr.flush()

    def _build_finished(self, build_id: str) -> None:
        """Every task of the build has an outcome: say whether it passed, as soon as it is known. Each failure's
        text is printed once, as its `error:` line (a failed task's when it failed, naming every build it
        stops; a gate's now, from the reporter); the result line names only where it failed."""
        stage = self._cause.get(build_id)
        if self.reporter is not None:
            verdict = self.reporter.build_done(self.plan, build_id, stage)
        else:
            verdict = BuildVerdict(stage, f"FAILED {build_id} ({stage})" if stage else f"ok     {build_id}")
        for line in verdict.errors:  # a failing gate fails the build even when nothing ran: always said
            self._error(line)
        where = verdict.failed_at
        self.progress.build_finished(build_id, where)
        if (build_id not in self._worked and not self.verbose) or not self.per_build:
            return  # up to date: the closing summary counts it, no line each
        text = verdict.line
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

    # ------------------------------------------------------------------ the end of the run

    def close(self, executor_code: int = 0) -> RunOutcome:
        """The run's outcome, handed to the reporter once.

        doit's reporter closes the session when doit ends its run (plain `doit` has no other hook); the
        executor's own exit code arrives with the second call (`npubuild build`), and a failure there wins."""
        if self.outcome is not None:
            self.outcome.executor_code = self.outcome.executor_code or executor_code
            return self.outcome
        self._stop_live()
        settled = {t for names in self.outcomes.values() for t in names}
        self.outcomes[Outcome.NOT_RUN] = [t for t in self.plan.tasks if t not in settled]
        self.outcome = RunOutcome(self.plan, self.run_id, self.executor, self.outcomes, self.progress.start,
                                  executor_code, self.messages, self.jobs,
                                  self._stop_reason() if self.outcomes[Outcome.NOT_RUN] else None)
        if self.reporter is not None:
            self.reporter.close(self.outcome, self._error)
        return self.outcome

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
        self._aborted = self._aborted or text
        sys.stderr.write(f"error: {text}\n")

    def _stop_reason(self) -> str:
        """Why the run ended before reaching every task: what the tasks not reached say in the report."""
        if isinstance(sys.exc_info()[1], KeyboardInterrupt):  # closed by doit on its way out of a Ctrl-C
            return "the run was interrupted (Ctrl-C) before it"
        if self._aborted is not None:
            return f"the run stopped before it: {plain_message(self._aborted)}"
        failed = self.outcomes["failed"]
        if failed:
            return f"the run stopped at the first failure ({failed[0]}) before it; --keep-going builds the rest"
        return "the run ended before it"


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
