"""What a stage is, in one place: its name, the tools it calls, how it is planned for a build, how it runs.

Each module in npubuild/stages/ defines one `STAGE = Stage(...)`; npubuild.stages lists them in run order.
`plan(build, chain)` sees the tasks already planned for the build (by stage name) and returns the task to
add (`TaskSpec`), a `Skip` with the reason the report shows, or None where the stage has no part in this
build (an FP build has no quantize stage). `run(task)` turns input files into output files and metrics.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npubuild.config.load import Build
    from npubuild.engine.plan import StageTask


@dataclass(frozen=True)
class TaskSpec:
    """One stage task as a stage plans it; the plan adds the stage name, tool versions and the task's key."""

    label: str
    config: dict
    inputs: dict[str, Path]
    outputs: dict[str, str]  # name -> file name in the stage dir
    deps: tuple[str, ...]  # stages of this build whose tasks must finish first
    # config entries that are what every build sharing the task needs, merged: the plan writes the sorted union
    # over those builds into the config before the key is taken (the lower stage's lowering families)
    union: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Skip:
    """The stage does not run for this build, for a reason the report shows."""

    reason: str


Chain = dict[str, "StageTask"]
PlanFn = Callable[["Build", Chain], TaskSpec | Skip | None]
RunFn = Callable[["StageTask"], dict]


def run_of(module: str) -> RunFn:
    """A stage's `run`: `module.run(task)`, imported when a task runs so that planning stays light."""
    def run(task: StageTask) -> dict:
        return importlib.import_module(module).run(task)

    run.__qualname__ = f"run_of({module!r})"
    return run


@dataclass(frozen=True)
class Stage:
    name: str
    module: str  # the implementation: its source fingerprint (with what it imports) is in every task's key
    tools: tuple[str, ...]  # distributions whose versions are part of every task's key
    plan: PlanFn
    run: RunFn
    per_build: bool = False  # one task per build in builds/<build id>/ (the report), not a keyed stage dir
    # what its implementation imports only inside the functions a run calls (kept out of its module so that
    # other commands stay light), as "module" or "module:function" (a registry's load_all): the build process
    # imports them before it forks the task's child (execute.prepare_stage), so that they are imported once per
    # build, not again in the child of every stage that uses them (~0.15 CPU s of a cold DS-CNN compile)
    preload: tuple[str, ...] = ()
