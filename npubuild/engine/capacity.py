"""How much parallel work this machine can hold: `-n`, Dask's local workers and the stage worker pools, bounded.

A flag asks; the machine answers (npubuild/machine.py: its cores and memory). Each stage task runs in a child that may add up to the stage memory limit
($NPUBUILD_STAGE_MEMORY_MIB) to the build process, and does CPU-bound work (onnxruntime, the TOSA reference
model, Vela), so more tasks at once than cores, or than the machine's memory holds at that limit, only
makes the build slower or takes the host down (`-n 100000` forked ~4,000 processes and took 17 of 23 GiB
before it was killed; doit starts a process per job slot whether or not a task is ready). The bounds are the
machine's (its cores, its total memory or its cgroup's), never its momentary load, so a build does the same
thing on a busy machine as on an idle one. Asking for more is not an error: the build runs with what fits
and says so in one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from npubuild.errors import InputError
from npubuild.machine import MEMORY_ENV, WORKERS_ENV, Capacity

if TYPE_CHECKING:
    from npubuild.engine.plan import BuildPlan


def plan_width(plan: BuildPlan) -> int:
    """At most how many of the plan's tasks can run at once: no two tasks on one dependency path can, so the
    task count less the longest path's, plus one (an upper bound on the widest set of independent tasks)."""
    depth: dict[str, int] = {}
    for name, task in plan.tasks.items():  # in dependency order (make_plan)
        depth[name] = 1 + max((depth.get(d, 0) for d in task.deps), default=0)
    return max(1, len(plan.tasks) - max(depth.values(), default=1) + 1)


def note(text: str) -> None:
    sys.stderr.write(f"note: {text}\n")
    sys.stderr.flush()


def clamp_jobs(asked: int, plan: BuildPlan, what: str | None = None, capacity: Capacity | None = None) -> int:
    """`asked` tasks at a time, or what the machine and the plan hold (one line on stderr saying so, naming
    `what` asked: `-n N` by default)."""
    capacity = capacity or Capacity.here()
    width = plan_width(plan)
    used = max(1, min(asked, capacity.tasks, width))
    if used < asked:
        why = [f"this machine holds {capacity.tasks} ({capacity.describe()})"] if capacity.tasks < asked else []
        if width < asked:
            why.append(f"at most {width} of this plan's {len(plan.tasks)} tasks can run at once")
        note(f"{what or f'-n {asked}'}: running {used} at a time ({'; '.join(why)})")
    return used


def requested_stage_workers(environ: Mapping[str, str] = os.environ) -> int | None:
    """$NPUBUILD_STAGE_WORKERS as a count, None if unset; anything but a positive integer is bad input."""
    text = environ.get(WORKERS_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"${WORKERS_ENV} must be a whole number of worker processes, at least 1; got {text[:40]!r}")
    return int(text)


def check_memory_setting(environ: Mapping[str, str] = os.environ) -> None:
    """$NPUBUILD_STAGE_MEMORY_MIB must be a positive whole number of MiB when set (else bad input)."""
    text = environ.get(MEMORY_ENV, "").strip()
    if text and (not text.isdigit() or int(text) < 1):
        raise InputError(f"${MEMORY_ENV} must be a whole number of MiB, at least 1; got {text[:40]!r}")


def stage_workers_setting(jobs: int, capacity: Capacity | None = None) -> int | None:
    """$NPUBUILD_STAGE_WORKERS for a run of `jobs` tasks at a time: the user's count bounded by the machine (one
    line when it asks for more), else the cores shared among the tasks (None: one task at a time and no
    count given, the stage pools use what the machine holds)."""
    capacity = capacity or Capacity.here()
    check_memory_setting()
    asked = requested_stage_workers()
    if asked is None:
        return max(1, capacity.tasks // jobs) if jobs > 1 else None
    if asked > capacity.tasks:
        note(f"${WORKERS_ENV}={asked}: each stage uses {capacity.tasks} worker process(es) at most (this machine "
             f"holds {capacity.tasks}: {capacity.describe()})")
    return min(asked, capacity.tasks)


@contextmanager
def stage_workers_for(jobs: int, capacity: Capacity | None = None) -> Iterator[int | None]:
    """stage_workers_setting in $NPUBUILD_STAGE_WORKERS for the run, the variable as it was after: the stage
    worker pools (npubuild/fanout.py) read it in every task's process, and a process that goes on (tests, a
    notebook) keeps its own setting."""
    workers = stage_workers_setting(jobs, capacity)
    saved = os.environ.get(WORKERS_ENV)
    if workers is not None:
        os.environ[WORKERS_ENV] = str(workers)
    try:
        yield workers
    finally:
        if saved is None:
            os.environ.pop(WORKERS_ENV, None)
        else:
            os.environ[WORKERS_ENV] = saved
