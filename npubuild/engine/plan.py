"""The build plan: builds (spec x model x target) expanded into a graph of stage tasks.

A stage task is identified by the hash of its resolved config (which embeds
its upstream task's hash and the versions of the tools it calls), so builds
that share a model, quantisation and pipeline share their import, quantize,
lower and tosa-check tasks, and a target change touches only that target's
vela and report tasks. Each stage plans its own tasks (npubuild.engine.stage); the
caller hands the planner the stages (npubuild.stages.STAGES), and executors (doit,
Dask) only run this plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.engine.stage import Stage, StageTask, TaskSpec, union_order
from npubuild.engine.versions import versions
from npubuild.fileio import stable_hash
from npubuild.records.build import Skip

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass
class BuildPlan:
    build_dir: Path
    stages: tuple[Stage, ...]  # in run order
    builds: list[Build]
    tasks: dict[str, StageTask]  # by name, in dependency order
    build_tasks: dict[str, dict[str, str]]  # build id -> stage -> task name
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # build id -> stage -> why it is not run


def make_plan(builds: list[Build], build_dir: Path, stages: tuple[Stage, ...]) -> BuildPlan:
    """Every stage plans its task for every build, in run order (`stages`: npubuild.stages.STAGES), a stage for
    all the builds before the next: a task's `union` entries are merged over every build sharing it before its
    key is taken, and the next stage's keys embed that key. `tasks` is in build order, each build's in stage
    order."""
    build_dir = build_dir.resolve()
    tasks: dict[str, StageTask] = {}
    chains: dict[str, dict[str, StageTask]] = {b.id: {} for b in builds}
    skipped: dict[str, dict[str, str]] = {}
    for stage in stages:
        planned: list[tuple[Build, TaskSpec]] = []
        for b in builds:
            spec = stage.plan(b, chains[b.id])
            if isinstance(spec, Skip):
                skipped.setdefault(b.id, {})[stage.name] = spec.reason
            elif spec is not None:
                planned.append((b, spec))
        for b, spec in merge_unions(planned):
            chains[b.id][stage.name] = _task(tasks, stage, spec, chains[b.id], build_dir, b.id)
    build_tasks: dict[str, dict[str, str]] = {}
    ordered: dict[str, StageTask] = {}
    for b in builds:
        chain = chains[b.id]
        build_tasks[b.id] = {name: t.name for name, t in chain.items()}
        for t in chain.values():
            ordered.setdefault(t.name, t)
    return BuildPlan(build_dir, tuple(stages), builds, ordered, build_tasks, skipped)


def merge_unions(planned: list[tuple[Build, TaskSpec]]) -> list[tuple[Build, TaskSpec]]:
    """Each spec with its `union` entries, merged over the builds whose specs are otherwise the same task (same
    label and config), written into its config as lists without repeats in `union_order`."""
    merged: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for _, spec in planned:
        if spec.union:
            entries = merged.setdefault((spec.label, stable_hash(spec.config)), {})
            for k, values in spec.union.items():
                entries.setdefault(k, {}).update((union_order(v), v) for v in values)
    out = []
    for b, spec in planned:
        if spec.union:
            entries = merged[(spec.label, stable_hash(spec.config))]
            spec = replace(spec, config={**spec.config, **{k: [v[o] for o in sorted(v)] for k, v in entries.items()}},
                           union={})
        out.append((b, spec))
    return out


def _task(tasks: dict[str, StageTask], stage: Stage, spec: TaskSpec, chain: dict[str, StageTask], build_dir: Path,
          build_id: str) -> StageTask:
    """The task `spec` describes, or the same task already planned for another build (shared work)."""
    config = {"stage": stage.name, **spec.config, "versions": versions(stage.tools, stage.module)}
    key = stable_hash(config)
    d = build_dir / "builds" / spec.label if stage.per_build else build_dir / "stages" / stage.name / f"{spec.label}-{key[:8]}"
    t = StageTask(stage.name, stage.module, spec.label, config, spec.inputs,
                  {k: d / v for k, v in {**spec.outputs, "record": "stage.json"}.items()},
                  [chain[s].name for s in spec.deps], per_build=stage.per_build)
    existing = tasks.get(t.name)
    if existing is not None:
        existing.builds.append(build_id)
        return existing
    t.builds.append(build_id)
    tasks[t.name] = t
    return t
