"""The plan as doit tasks: one task per stage per distinct config, plus a reporter that writes report.json.

Both `doit` (through dodo.py) and `npubuild build` (through doit's API) load
tasks from here and share the same stage dirs, so the same cache: a task is up
to date when its stage dir says so (npubuild.build.uptodate), whoever ran it.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from doit.exceptions import TaskFailed, UnmetDependency

from npubuild.errors import NpubuildError
from npubuild.fileio import write_json
from npubuild.build.plan import STAGES, BuildPlan, StageTask
from npubuild.build.progress import LiveDisplay, StageProgress
from npubuild.build.execute import execute
from npubuild.report.summary import write_reports
from npubuild.build.uptodate import clear_debris, fingerprint, is_done, write_inputs


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"


def run_stage(task: StageTask, run_id: str, debug: bool = False) -> TaskFailed | None:
    """doit python-action: run the stage; a failure is one line, never a traceback."""
    clear_debris(task)
    try:
        fp = fingerprint(task.inputs)
        execute(task, run_id, debug)
    except NpubuildError as exc:
        return TaskFailed(str(exc))
    except OSError as exc:  # an input vanished under us (another process, a clean)
        return TaskFailed(f"error: stage {task.stage}: cannot read an input: {exc}")
    write_inputs(task, fp)
    return None


def stage_done(stage_task: StageTask) -> bool:
    """doit uptodate check (see npubuild.build.uptodate: survives a killed run, unlike doit's database).

    Not named `task`: doit would pass its own Task object for a first argument of that name.
    """
    return is_done(stage_task)


def doit_config(build_dir: Path, reporter: type) -> dict:
    return {
        "backend": "sqlite3",
        "dep_file": str(build_dir / ".doit.db"),
        "reporter": reporter,
        "verbosity": 0,
        "default_tasks": list(STAGES),
    }


def task_dicts(plan: BuildPlan, run_id: str, debug: bool = False) -> dict[str, Iterator[dict]]:
    """doit task generators keyed by stage (`task_<stage>` functions for a loader namespace)."""
    by_stage: dict[str, list[StageTask]] = {s: [] for s in STAGES}
    for t in plan.tasks.values():
        by_stage[t.stage].append(t)

    def generator(stage: str):
        def gen() -> Iterator[dict]:
            yield {"basename": stage, "name": None, "doc": f"npubuild {stage} stage"}
            for t in by_stage[stage]:
                yield {
                    "basename": stage,
                    "name": t.sub,
                    "actions": [(run_stage, [t, run_id, debug])],
                    "targets": [str(p) for p in t.outputs.values()],
                    "task_dep": list(t.deps),
                    "uptodate": [(stage_done, [t], {})],
                    "doc": f"{stage} for {', '.join(t.builds[:3])}{' ...' if len(t.builds) > 3 else ''}",
                    "verbosity": 0,
                }
        gen.__name__ = f"task_{stage.replace('-', '_')}"
        gen.basename = stage
        return gen

    return {f"task_{s.replace('-', '_')}": generator(s) for s in STAGES}


def make_reporter(plan: BuildPlan, run_id: str, build_dir: Path, quiet: bool = False,
                  live: bool | None = None) -> type:
    """A doit reporter: a live per-stage table on a terminal (`live`, default: when the output is one),
    else one line per task (ran / cached / failed); report.json at the end."""
    total = len(plan.tasks)

    class NpubuildReporter:
        desc = "npubuild progress"
        executed: list[str] = []
        cached: list[str] = []
        failed: list[tuple[str, str]] = []
        blocked: list[str] = []

        def __init__(self, outstream, options):
            # not doit's `outstream`: its default is the sys.stdout of when doit was imported, which in a
            # long-lived process (tests, benchmarks) may be a stream closed since
            outstream = self.out = sys.stdout
            self.started: dict[str, float] = {}
            self.progress = StageProgress(plan)
            use_live = (not quiet and outstream.isatty()) if live is None else live
            self.live = LiveDisplay(self.progress, outstream) if use_live else None

        def _line(self, text: str) -> None:
            if not quiet and self.live is None:
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

        def _done(self) -> int:
            return len(self.executed) + len(self.cached) + len(self.failed)

        def initialize(self, tasks, selected_tasks):
            pass

        def get_status(self, task):
            pass

        def execute_task(self, task):
            if task.actions:
                self.started[task.name] = time.perf_counter()
                self._event(task.name, "running")
                self._line(f"[{self._done() + 1:>3}/{total}] run     {task.name}")

        def add_success(self, task):
            if task.actions:
                self.executed.append(task.name)
                self._event(task.name, "ran")

        def add_failure(self, task, fail):
            if not task.actions:  # a stage's group task: its failed member was reported already
                return
            if isinstance(fail, UnmetDependency):  # an upstream task failed (--keep-going): not run, not a new error
                self.blocked.append(task.name)
                return
            msg = fail.get_msg().strip().splitlines()
            text = msg[-1] if msg else fail.get_name()
            if isinstance(fail, TaskFailed) and fail.message:
                text = fail.message
            self.failed.append((task.name, text))
            self._event(task.name, "failed")
            sys.stderr.write(f"{text}\n")
            sys.stderr.flush()

        def skip_uptodate(self, task):
            if task.actions:
                self.cached.append(task.name)
                self._event(task.name, "cached")
                self._line(f"[{self._done():>3}/{total}] cached  {task.name}")

        def skip_ignore(self, task):
            pass

        def cleanup_error(self, exception):
            sys.stderr.write(exception.get_msg())

        def runtime_error(self, msg):
            self._stop_live()
            first = msg.strip().splitlines()[-1] if msg.strip() else msg
            sys.stderr.write(f"error: {first}\n")

        def teardown_task(self, task):
            pass

        def complete_run(self):
            self._stop_live()
            report = write_reports(plan, run_id, build_dir)
            write_json(build_dir / "run.json", {"run_id": run_id, "executed": sorted(self.executed),
                                                "cached": sorted(self.cached),
                                                "failed": [n for n, _ in self.failed],
                                                "blocked": sorted(self.blocked)})
            for b in report["builds"]:  # a gate that fell short is a failure: say which, its limit and value
                for g in b["gates"]:
                    if not g["ok"]:
                        sys.stderr.write(f"{b['spec']}/{b['model']}/{b['target']}: gate {g['name']} failed: "
                                         f"limit {g['limit']}, value {g['value']}\n")
            counts = {s: sum(1 for b in report["builds"] if b["status"] == s) for s in ("passed", "failed", "skipped")}
            self._line(f"{len(self.executed)} ran, {len(self.cached)} cached, {len(self.failed)} failed; "
                       f"builds: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; "
                       f"report: {build_dir / 'report.json'}")

    return NpubuildReporter
