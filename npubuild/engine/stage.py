"""What a stage is, in one place: its name, the tools it calls, how it is planned for a build, how it runs.

Each module in npubuild/stages/ defines one `STAGE = Stage(...)` with its `plan` and `run`; the caller of the
engine hands it the list (npubuild.stages.STAGES), in run order. `plan(build, chain)` sees the tasks already
planned for the build (by stage name) and returns the task to add (`TaskSpec`), a `Skip` with the reason the
report shows, or None where the stage has no part in this build (an FP build has no quantize stage).
`run(task)` turns input files into output files and metrics. A task names its stage module, so a forked
child or a Dask worker finds the stage (`stage_of`) without a registry of the engine's own.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.fileio import stable_hash
from npubuild.records.build import Skip

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class TaskSpec:
    """One stage task as a stage plans it; the plan adds the stage name, tool versions and the task's key."""

    label: str
    config: dict
    inputs: dict[str, Path]
    outputs: dict[str, str]  # name -> file name in the stage dir
    deps: tuple[str, ...]  # stages of this build whose tasks must finish first
    # config entries that are what every build sharing the task needs, merged: the plan writes the union over
    # those builds into the config, sorted (`union_order`), before the key is taken (the lower stage's
    # lowering families, the early pool check's targets)
    union: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)


def union_order(value: Any) -> str:
    """The order of a merged `union` entry's values: a string by itself, anything else by its canonical JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class StageTask:
    stage: str
    module: str  # the stage module defining its Stage (stage_of)
    label: str
    config: dict
    inputs: dict[str, Path]
    outputs: dict[str, Path]
    deps: list[str] = field(default_factory=list)  # names of upstream tasks
    builds: list[str] = field(default_factory=list)
    per_build: bool = False  # lives in builds/<label>/, not in a keyed stage dir

    @cached_property
    def key(self) -> str:  # cached: hashing the config is most of planning time on a big matrix
        return stable_hash(self.config)

    @property
    def name(self) -> str:
        return f"{self.stage}:{self.sub}"

    @property
    def sub(self) -> str:
        return self.label if self.per_build else f"{self.label}-{self.key[:8]}"

    @property
    def dir(self) -> Path:
        return self.outputs["record"].parent


Chain = dict[str, StageTask]
PlanFn = Callable[["Build", Chain], TaskSpec | Skip | None]
RunFn = Callable[[StageTask], dict]
Companions = Callable[[Path], dict[str, Path]]


@dataclass(frozen=True)
class Stage:
    name: str
    # the stage module (npubuild.stages.<name>), which defines this STAGE, `plan` and `run`: its source
    # fingerprint, with everything it imports (its implementation, imported inside `run`), is in every task's key
    module: str
    # the module doing the work, which `run` imports: imported by the build process before it forks a task's
    # child (and by a forkserver before its first), so that it is imported once, not in every child
    implementation: str
    tools: tuple[str, ...]  # distributions whose versions are part of every task's key
    plan: PlanFn
    run: RunFn
    per_build: bool = False  # one task per build in builds/<build id>/ (the report), not a keyed stage dir
    cached: bool = True  # in the shared cache (the report is not: it reads this build dir's records)
    # the input native code parses as it is (the user's model): a crash, hang or the memory limit in the
    # stage's child is that file's doing, bad input (exit 2) naming it, not an internal error
    untrusted_input: str | None = None
    # input name -> the files it names beside it (an ONNX model's external data), found when the task runs:
    # inputs too (in the cache key and inputs.json, checked for changes), and shipped with it to a Dask worker
    companions: Mapping[str, Companions] = field(default_factory=dict)
    # what its implementation imports only inside the functions a run calls (kept out of its module so that
    # other commands stay light), as "module" or "module:function" (a registry's load_all): the build process
    # imports them before it forks the task's child (execute.prepare_stage), so that they are imported once per
    # build, not again in the child of every stage that uses them (~0.15 CPU s of a cold DS-CNN compile)
    preload: tuple[str, ...] = ()


@functools.cache
def stage_named(module: str) -> Stage:
    """The Stage a stage module defines (its `STAGE`)."""
    return importlib.import_module(module).STAGE


def stage_of(task: StageTask) -> Stage:
    """The stage a task belongs to, wherever it runs (a forked child, a Dask worker): its module's STAGE."""
    return stage_named(task.module)


def companion_inputs(task: StageTask) -> dict[str, Path]:
    """The files the task's inputs name beside them (Stage.companions), as `<input>/<relative path>`."""
    out: dict[str, Path] = {}
    for name, find in stage_of(task).companions.items():
        path = task.inputs.get(name)
        if path is not None:
            out.update({f"{name}/{rel}": p for rel, p in find(path).items()})
    return out
