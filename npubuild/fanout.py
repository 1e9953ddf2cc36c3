"""A stage's independent runs spread over forked worker processes: the TOSA check's arithmetic on several cores.

Most of a large model's compile is the TOSA reference model doing arithmetic the checks need (MobileViT-xxs:
~29 of its tosa-check stage's ~40 CPU s, in 5 whole-graph runs and 1372 per-node runs), one run after
another on one core. The reference model holds the GIL while it runs, so threads do not help; forked workers
do: each is a copy of the stage's process (its model, its onnxruntime results), so nothing is pickled but an
index and a result.

How many: $NPUBUILD_STAGE_WORKERS, else the cores this process may run on, divided by the tasks the build runs
at once (`-n JOBS`: the executor sets the variable so). One worker, a daemonic process (a Dask worker's
forkserver child: it may not fork) or a worker of this module itself: the runs are made in process, as
before. A worker that dies (a native crash, the memory limit) makes the stage make every run again in its
own process, so the crash is reported exactly as it is without workers (engine/isolate.py's one line).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from npubuild.machine import (  # noqa: F401 - re-exported: where the worker count is decided
    CGROUP_FILES,
    WORKERS_ENV,
    Capacity,
    available_cores,
    cgroup_cpu_quota,
)

T = TypeVar("T")
# Work the caller expects to take less than this runs in process: starting the workers and handing results
# back costs ~20-60 ms, which a small model's whole check does not repay (bench/compile_speed.md)
MIN_PARALLEL_S = 0.5

_task: Callable[[int], object] | None = None  # what the workers run: their fork's copy of it
_in_worker = False


def stage_workers() -> int:
    """Worker processes a stage may use: $NPUBUILD_STAGE_WORKERS, else the cores it may run on; never more
    than the machine holds (machine.py; engine/capacity.py says so once when the variable asks for more)."""
    text = os.environ.get(WORKERS_ENV, "").strip()
    held = Capacity.here().tasks
    if text.isdigit() and int(text) > 0:
        return min(int(text), held)
    return held


def _mark_worker() -> None:
    global _in_worker
    _in_worker = True


def _run_index(i: int) -> object:
    assert _task is not None
    return _task(i)


def can_fan_out() -> bool:
    """Whether this process may start workers: it can fork, is no daemonic multiprocessing child, no worker."""
    return hasattr(os, "fork") and not multiprocessing.current_process().daemon and not _in_worker


def fan_out(fn: Callable[[int], T], count: int, expected_s: float = float("inf"),
            workers: int | None = None) -> list[T]:
    """[fn(0), ..., fn(count - 1)]: in `workers` forked processes (stage_workers() by default) when there are
    several and `expected_s`, the caller's estimate of the whole map in process, is at least MIN_PARALLEL_S;
    otherwise in process. Results come in index order, as the map in process gives them. An exception `fn`
    raises in a worker is raised here."""
    global _task
    workers = min(stage_workers() if workers is None else workers, count)
    if workers < 2 or expected_s < MIN_PARALLEL_S or not can_fan_out() or _task is not None:
        return [fn(i) for i in range(count)]
    _task = fn
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_mark_worker)
        try:
            return list(pool.map(_run_index, range(count)))
        except BrokenProcessPool:  # a worker died: again in process, where the crash is the stage's own
            pass
        finally:  # on an error (or Ctrl-C) the runs not yet started are not made
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        _task = None
    return [fn(i) for i in range(count)]
