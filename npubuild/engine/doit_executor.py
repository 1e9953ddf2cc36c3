"""The plan as doit tasks, run by doit in local processes: `npubuild build` and plain `doit` (dodo.py).

Both load the same task dicts (`namespace`; a project's dodo.py gets them through npubuild.dodo_namespace)
and share the same stage dirs, so the same cache: a task is up to date when its stage dir says so
(npubuild.engine.uptodate), whoever ran it. doit's reporter only forwards task events to the build
session, which hands the outcome to its reporter (the reports) when doit ends the run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from doit.exceptions import TaskFailed, UnmetDependency

from npubuild.engine.execute import Notice, run_stage, stage_modules, was_restored
from npubuild.engine.plan import BuildPlan
from npubuild.engine.session import Session
from npubuild.engine.stage import StageTask
from npubuild.engine.uptodate import is_done
from npubuild.errors import InputError, NpubuildError


def doit_action(task: StageTask, run_id: str, debug: bool, cache_url: str | None,
                preload: tuple[str, ...] = ()) -> TaskFailed | dict | None:
    """doit python-action: run the stage; a failure is one line, never a traceback. Its warnings that a run
    shows once (Notice) travel back as the task's doit values, from a `-n` worker process too, to the
    session, which prints the first of each kind."""
    notices: list[Notice] = []
    try:
        run_stage(task, run_id, debug, cache_url, preload, notices)
    except NpubuildError as exc:
        return TaskFailed(str(exc))
    return {"notices": [[n.kind, n.text] for n in notices]} if notices else None


def stage_done(stage_task: StageTask) -> bool:
    """doit uptodate check (npubuild.engine.uptodate: survives a killed run, unlike doit's database).

    Not named `task`: doit would pass its own Task object for a first argument of that name.
    """
    return is_done(stage_task)


def depth_first(plan: BuildPlan) -> list[str]:
    """doit's default tasks: each build's last task, build by build. doit runs a selected task's
    dependencies before the next selected task, so builds finish one after another (results early, a failure
    seen at once) instead of every import, then every quantize, ...; the tasks and their outputs are the same.
    Any task no build ends with (none today) is appended."""
    order: dict[str, None] = {}
    for chain in plan.build_tasks.values():
        if chain:
            order[list(chain.values())[-1]] = None
    reached: set[str] = set()
    stack = list(order)
    while stack:
        name = stack.pop()
        if name not in reached:
            reached.add(name)
            stack.extend(plan.tasks[name].deps)
    return [*order, *(n for n in plan.tasks if n not in reached)]


def doit_config(plan: BuildPlan, reporter: type) -> dict:
    return {
        # doit's dependency database in memory: npubuild's tasks have no file_dep, their up-to-date check is
        # npubuild's own (stage_done), so doit only ever writes it; on disk it was one more file a full disk
        # turned into a sqlite traceback at the end of the run (issue 34), and one a killed run left stale
        "backend": "sqlite3",
        "dep_file": ":memory:",
        "reporter": reporter,
        "verbosity": 0,
        "default_tasks": depth_first(plan) or [s.name for s in plan.stages],
    }


def task_dicts(plan: BuildPlan, run_id: str, debug: bool, cache_url: str | None) -> dict[str, Iterator[dict]]:
    """doit task generators keyed by stage (`task_<stage>` functions for a loader namespace)."""
    names = [s.name for s in plan.stages]
    by_stage: dict[str, list[StageTask]] = {s: [] for s in names}
    for t in plan.tasks.values():
        by_stage[t.stage].append(t)
    preload = stage_modules(plan.stages)

    def generator(stage: str):
        def gen() -> Iterator[dict]:
            yield {"basename": stage, "name": None, "doc": f"npubuild {stage} stage"}
            for t in by_stage[stage]:
                yield {
                    "basename": stage,
                    "name": t.sub,
                    "actions": [(doit_action, [t, run_id, debug, cache_url, preload])],
                    "targets": [str(p) for p in t.outputs.values()],
                    "task_dep": list(t.deps),
                    "uptodate": [(stage_done, [t], {})],
                    "doc": f"{stage} for {', '.join(t.builds[:3])}{' ...' if len(t.builds) > 3 else ''}",
                    "verbosity": 0,
                }
        gen.__name__ = f"task_{stage.replace('-', '_')}"
        gen.basename = stage
        return gen

    return {f"task_{s.replace('-', '_')}": generator(s) for s in names}


def make_reporter(session: Session) -> type:
    """A doit reporter class that forwards every task event to `session` and closes it at the end."""
    tasks = session.plan.tasks

    class NpubuildReporter:
        desc = "npubuild progress"

        def __init__(self, outstream, options):
            pass

        def initialize(self, tasks, selected_tasks):
            pass

        def get_status(self, task):
            pass

        def execute_task(self, task):
            if task.actions:
                session.started(task.name)

        def add_success(self, task):
            for kind, text in (task.values or {}).get("notices", ()):
                session.notice(kind, text)
            if task.actions:
                restored = task.name in tasks and was_restored(tasks[task.name])
                session.finished(task.name, "from-cache" if restored else "ran")

        def add_failure(self, task, fail):
            if not task.actions:  # a stage's group task: its failed member was reported already
                return
            if isinstance(fail, UnmetDependency):  # an upstream task failed (--keep-going): not run, not a new error
                session.finished(task.name, "blocked")
                return
            msg = fail.get_msg().strip().splitlines()
            text = msg[-1] if msg else fail.get_name()
            if isinstance(fail, TaskFailed) and fail.message:
                text = fail.message
            session.finished(task.name, "failed", text)

        def skip_uptodate(self, task):
            if task.actions:
                session.finished(task.name, "cached")

        def skip_ignore(self, task):
            pass

        def cleanup_error(self, exception):
            sys.stderr.write(exception.get_msg())

        def runtime_error(self, msg):
            first = msg.strip().splitlines()[-1] if msg.strip() else msg
            session.abort(first)

        def teardown_task(self, task):
            pass

        def complete_run(self):
            session.close(1 if session.outcomes["failed"] else 0)

    return NpubuildReporter


def namespace(plan: BuildPlan, session: Session, debug: bool, cache_url: str | None) -> dict:
    """What a doit loader reads: the task generators and DOIT_CONFIG with the session's reporter."""
    ns: dict = dict(task_dicts(plan, session.run_id, debug, cache_url))
    ns["DOIT_CONFIG"] = doit_config(plan, make_reporter(session))
    return ns


class DoitExecutor:
    """Local processes through doit's API (`-n JOBS` runs tasks in parallel processes)."""

    name = "doit"

    def __init__(self, cache_url: str | None, debug: bool = False, jobs: int = 1, keep_going: bool = False):
        self.cache_url, self.debug, self.jobs, self.keep_going = cache_url, debug, jobs, keep_going

    def run(self, plan: BuildPlan, session: Session) -> int:
        from doit.cmd_base import ModuleTaskLoader
        from doit.doit_cmd import DoitMain

        args = ["run"]
        if self.jobs > 1:  # npubuild.engine.run.build clamped it to what the machine and the plan hold
            args += ["-n", str(self.jobs), "-P", "process"]
        if self.keep_going:
            args.append("--continue")
        ns = namespace(plan, session, self.debug, self.cache_url)
        return DoitMain(ModuleTaskLoader(ns), extra_config={"GLOBAL": {}}).run(args)


def check_doit_jobs(jobs: int, plan: BuildPlan) -> None:
    """Plain `doit -n N`: doit starts its N worker processes itself (one per job slot, ready task or not), so
    npubuild cannot run fewer as `npubuild build -n` does (engine/capacity.py); more than the machine holds
    is refused in one line instead of forking them."""
    from npubuild.engine.capacity import plan_width
    from npubuild.machine import Capacity

    capacity = Capacity.here()
    bound = max(1, min(capacity.tasks, plan_width(plan)))
    if jobs > bound:
        raise InputError(f"doit -n {jobs}: this machine and plan hold {bound} task(s) at a time "
                         f"({capacity.describe()}; at most {plan_width(plan)} of the plan's {len(plan.tasks)} tasks "
                         f"can run at once): give -n {bound} or less (npubuild build -n clamps it itself)")


def doit_jobs(argv: list[str]) -> int:
    """The `-n N` / `--process=N` a plain `doit` command line runs tasks with (1 if none, or unreadable)."""
    for k, arg in enumerate(argv):
        text = None
        if arg in ("-n", "--process") and k + 1 < len(argv):
            text = argv[k + 1]
        elif arg.startswith("--process="):
            text = arg.split("=", 1)[1]
        elif arg.startswith("-n") and len(arg) > 2:
            text = arg[2:]
        if text is not None:
            return int(text) if text.isdigit() else 1
    return 1
