"""A run's reports: what the layer above the engine makes of the engine's outcome.

The engine (engine/run.py, engine/session.py) runs the plan, shows progress and hands back a `RunOutcome`,
what became of every task. `RunReports`, the session's reporter, turns it into report.json/md/html and run.json
where the run's reports go, names each gate that fell short, prints the closing summary and gives the caller
a `RunResult` (the report and the exit code). `compile` writes its reports elsewhere and the side commands
(`offloads`, `debug-numerics`) none: they read what they need from the result.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.engine.plan import BuildPlan
from npubuild.engine.progress import format_seconds
from npubuild.engine.run import RunOptions, build
from npubuild.engine.session import BuildVerdict, RunOutcome
from npubuild.errors import DiskFull, NpubuildError, is_disk_full, written_path
from npubuild.fileio import read_json, write_json
from npubuild.records.build import Status
from npubuild.report.brief import gate_failure_text, result_line
from npubuild.report.status import passed
from npubuild.report.summary import make_report, write_reports

if TYPE_CHECKING:
    from npubuild.config.load import Build
    from npubuild.config.selection import Selection
    from npubuild.engine.stage import Stage

BUILD_DIR = "build-dir"  # `where`: the project's reports in the build dir (every other value is a path or None)
REPORT_STAGE = "report"  # the stage whose task writes a build's report entry (stages/report.py)
REPORT_FILES = ("report.json", "report.md", "report.html", "run.json")  # a run's reports, where they go


@dataclass
class RunResult:
    """A run with its report: the outcome of every task, report.json's content, where the reports went."""

    outcome: RunOutcome
    report: dict
    report_dir: Path | None  # None: not written
    seconds: float = 0.0  # the run's wall time
    unwritten: str | None = None  # why the reports could not be written (a full disk): the run failed

    @property
    def plan(self) -> BuildPlan:
        return self.outcome.plan

    @property
    def run_id(self) -> str:
        return self.outcome.run_id

    @property
    def executed(self) -> list[str]:
        return self.outcome.executed

    @property
    def failed(self) -> list[str]:
        return self.outcome.failed

    @property
    def cached(self) -> list[str]:
        return self.outcome.cached

    @property
    def from_cache(self) -> list[str]:
        return self.outcome.from_cache

    @property
    def blocked(self) -> list[str]:
        return self.outcome.blocked

    @property
    def exit_code(self) -> int:
        """2 if any failure was bad input, 1 for any other failure or failed gate, else 0."""
        builds = self.report["builds"]
        if any("input" in b.get("error_kinds", []) for b in builds):
            return 2
        if self.outcome.executor_code != 0 or self.outcome.failed or self.unwritten is not None or \
                any(not passed(b["status"]) for b in builds):
            return 1
        return 0

    def summary_line(self) -> str:
        """The closing line: `10 ran, 0 cached, 0 failed, 0 restored from the shared cache; builds: 3 passed, ...`"""
        counts = {s: sum(1 for b in self.report["builds"] if b["status"] == s) for s in Status}
        hosted = counts[Status.HOST_ONLY] + counts[Status.MOSTLY_HOST]
        host_note = f" ({counts[Status.HOST_ONLY]} host only, {counts[Status.MOSTLY_HOST]} mostly host)" if hosted else ""
        where = f"report: {self.report_dir / 'report.json'}" if self.report_dir is not None else "no report written"
        t = self.outcome.tasks
        return (f"{len(t['ran'])} ran, {len(t['cached'])} cached, {len(t['failed'])} failed, {len(t['from-cache'])} "
                f"restored from the shared cache; builds: {counts[Status.PASSED] + hosted} passed{host_note}, "
                f"{counts[Status.FAILED]} failed, {counts[Status.SKIPPED]} skipped ({format_seconds(self.seconds)}); "
                f"{where}")


class RunReports:
    """The session's reporter: a finished build's result line, and the reports once the run is over.

    `where`: BUILD_DIR (the project's, for `build` and plain doit), another directory (`compile`'s own), or None
    (side commands: the report is made for the exit code, nothing written). `selection`: what was asked for,
    kept in report.json so that a baseline comparison can tell a build not asked for from one lost.
    `summary=False`: no closing summary on stdout (the command prints its own output); the lines naming each
    gate that fell short go to stderr whatever it says.
    """

    def __init__(self, where: Path | str | None = BUILD_DIR, selection: Selection | None = None,
                 summary: bool = True):
        self.where = where
        self.selection = selection
        self.summary = summary
        self.result: RunResult | None = None
        self._gates_said: set[str] = set()  # builds whose failed gates have had their lines

    def build_done(self, plan: BuildPlan, build_id: str, failed_stage: str | None) -> BuildVerdict:
        """A build's result line; for one whose tasks all succeeded, from its report-stage entry: the gates
        that fell short (an error line each) or its headline figures."""
        if failed_stage is not None:
            return BuildVerdict(failed_stage, result_line(build_id, {}, failed_stage))
        entry = self._entry(plan, build_id)
        bad = [g for g in entry.get("gates", []) if not g.get("ok")]
        self._gates_said.add(build_id)
        where = ", ".join(f"gate {g['name']}" for g in bad) or None
        return BuildVerdict(where, result_line(build_id, {"status": "passed", **entry}, where),
                            tuple(f"error: {build_id}: {gate_failure_text(g, entry.get('metrics') or {})}"
                                  for g in bad))

    @staticmethod
    def _entry(plan: BuildPlan, build_id: str) -> dict:
        """The build's report-stage entry (metrics and gates), {} if it is not there."""
        name = plan.build_tasks[build_id].get(REPORT_STAGE)
        path = plan.tasks[name].outputs.get("entry") if name else None
        try:
            return read_json(path) if path is not None else {}
        except (OSError, ValueError):
            return {}

    def close(self, outcome: RunOutcome, say: Callable[[str], None]) -> None:
        """Write the reports and run.json once; `say` the gates that fell short in builds whose result was not
        yet said (the run stopped before them), print the warnings and the closing line."""
        plan = outcome.plan
        report_dir = plan.build_dir if self.where == BUILD_DIR else (None if self.where is None else Path(self.where))
        report = make_report(plan, outcome.run_id, self.selection.to_json() if self.selection else None, outcome)
        unwritten = None
        if report_dir is not None:
            try:
                write_reports(report, report_dir, plot_cache=plan.build_dir / ".cache" / "plots")
                write_json(report_dir / "run.json", outcome.run_json())
                if report_dir == plan.build_dir:
                    from npubuild.config.schema import write_schemas

                    write_schemas(plan.build_dir)
            except OSError as exc:  # one line, never a traceback out of doit's reporter (exit 1)
                unwritten = unwritable_reports(report_dir, exc)
        for b in report["builds"]:  # the gates of builds the run stopped before finishing (no --keep-going)
            bid = f"{b['spec']}/{b['model']}/{b['target']}"
            if bid not in self._gates_said:
                for g in b["gates"]:
                    if not g["ok"]:
                        say(f"error: {bid}: {gate_failure_text(g, b.get('metrics') or {})}")
        self.result = RunResult(outcome, report, report_dir if unwritten is None else None,
                                time.perf_counter() - outcome.started, unwritten)
        if self.summary:  # what passed but is not what it seems (most of it on the host): said even with -q
            sys.stdout.write(warnings_block(report) + not_built_line(report, outcome) + self.result.summary_line()
                             + "\n")
            sys.stdout.flush()


def unwritable_reports(report_dir: Path, exc: OSError) -> str:
    """The reports could not be written (a full disk, a read-only dir): one line on stderr, and the earlier
    run's reports there removed, since left there they would be taken for this run's. Returns the line."""
    what = "this run's report.json/md/html and run.json"
    error = DiskFull(written_path(exc) or report_dir, what) if is_disk_full(exc) else \
        NpubuildError(f"cannot write {what} in {report_dir}: {exc.strerror or exc}")
    removed = 0
    for name in REPORT_FILES:
        try:
            (report_dir / name).unlink()
            removed += 1
        except OSError:
            pass
    sys.stderr.write(f"{error}{'; the earlier run reports there are removed' if removed else ''}\n")
    sys.stderr.flush()
    return str(error)


def not_built_line(report: dict, outcome: RunOutcome) -> str:
    """`not built (N build(s), M task(s) not reached): why` when the run stopped before finishing builds
    (they are `skipped` in the report, with that reason); '' otherwise."""
    unbuilt = sum(1 for b in report["builds"] if b["status"] == Status.SKIPPED)
    if outcome.stopped is None or not unbuilt:
        return ""
    return f"not built ({unbuilt} build(s), {len(outcome.not_run)} task(s) not reached): {outcome.stopped}\n"


def warnings_block(report: dict) -> str:
    """The builds' warnings (most of the model on the host, ...) as the lines above the closing summary; ''
    when none warns."""
    warned = [(f"{b['spec']}/{b['model']}/{b['target']}", w) for b in report["builds"] for w in b.get("warnings") or []]
    if not warned:
        return ""
    return f"warnings ({len(warned)}):\n" + "".join(f"  warning: {bid}: {w}\n" for bid, w in warned)


def build_and_report(builds: list[Build], build_dir: Path, stages: tuple[Stage, ...],
                     options: RunOptions | None = None, reports: RunReports | None = None,
                     client: Any = None) -> RunResult:
    """Run the builds (engine.run.build) and make their reports (`reports`: the project's, by default)."""
    reports = reports if reports is not None else RunReports()
    build(builds, build_dir, stages, options or RunOptions(), reports, client)
    assert reports.result is not None  # the session hands every run's outcome to its reporter
    return reports.result
