"""Run a build plan through doit's API (what `npubuild build` and `npubuild compile` do)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from npubuild.build.lock import locked
from npubuild.config.load import Build
from npubuild.build.doit_executor import doit_config, make_reporter, new_run_id, task_dicts
from npubuild.build.plan import BuildPlan, make_plan


@dataclass
class RunResult:
    plan: BuildPlan
    run_id: str
    report: dict
    executed: list[str]
    cached: list[str]
    failed: list[str]
    doit_code: int

    @property
    def exit_code(self) -> int:
        """2 if any failure was bad input, 1 for any other failure or failed gate, else 0."""
        builds = self.report["builds"]
        if any("input" in b.get("error_kinds", []) for b in builds):
            return 2
        if self.doit_code != 0 or any(b["status"] != "passed" for b in builds):
            return 1
        return 0


def namespace(plan: BuildPlan, run_id: str, quiet: bool = False, debug: bool = False,
              live: bool | None = None) -> dict:
    reporter = make_reporter(plan, run_id, plan.build_dir, quiet, live)
    ns: dict = dict(task_dicts(plan, run_id, debug))
    ns["DOIT_CONFIG"] = doit_config(plan.build_dir, reporter)
    ns["_npubuild_reporter"] = reporter
    return ns


def run_plan(plan: BuildPlan, jobs: int = 1, keep_going: bool = False, quiet: bool = False,
             debug: bool = False, wait: bool = False, live: bool | None = None) -> RunResult:
    """Run the plan with doit, holding the build dir's lock (`wait` for it, else fail at once if busy)."""
    from npubuild.fileio import read_json

    with locked(plan.build_dir, wait):
        run_id = new_run_id()
        ns = namespace(plan, run_id, quiet, debug, live)
        args = ["run"]
        if jobs > 1:
            args += ["-n", str(jobs), "-P", "process"]
        if keep_going:
            args.append("--continue")
        code = DoitMain(ModuleTaskLoader(ns), extra_config={"GLOBAL": {}}).run(args)
        sys.stdout.flush()
        report = read_json(plan.build_dir / "report.json")
        run = read_json(plan.build_dir / "run.json")
    return RunResult(plan, run_id, report, run["executed"], run["cached"], run["failed"], code)


def build(builds: list[Build], build_dir: Path, jobs: int = 1, keep_going: bool = False, quiet: bool = False,
          debug: bool = False, wait: bool = False, live: bool | None = None) -> RunResult:
    """`live`: the per-stage progress table (None: when stdout is a terminal)."""
    return run_plan(make_plan(builds, build_dir), jobs, keep_going, quiet, debug, wait, live)
