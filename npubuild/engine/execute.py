"""Run one stage task for any executor: the completion record, the shared cache, the error record.

`execute` wraps a stage for any executor: it clears the old completion record,
runs the stage, and writes `stage.json` (config, metrics, seconds, run id, the
size and sha256 of every file the stage wrote) last, so a task killed
mid-stage has no record and is never taken as done, and a later change to an
output is seen (npubuild.engine.uptodate).
"""

from __future__ import annotations

import functools
import importlib
import time
import traceback
from pathlib import Path

from npubuild.engine.cache import StageCache, cache_key
from npubuild.engine.isolate import isolation_possible, run_isolated
from npubuild.engine.stage import Stage, StageTask, companion_inputs, stage_named, stage_of
from npubuild.engine.uptodate import (
    ERROR_NAME,
    INPUTS_NAME,
    check_producers,
    clear_debris,
    fingerprint,
    hash_outputs,
    read_record,
    write_inputs,
)
from npubuild.errors import InputError, InternalError, NpubuildError, StageError, is_out_of_memory, one_line
from npubuild.fileio import read_json, write_json
from npubuild.longlived import long_lived


def prepare_stage(module: str) -> None:
    """Import the stage's implementation (and what its run imports: Stage.preload) and quiet onnxruntime: done
    before the isolated child's memory limit, so that a tight limit fails the stage's work, not its imports, and
    a forked child finds them loaded instead of importing them again for every task."""
    stage = stage_named(module)
    with long_lived():  # imports: objects for the life of the process, not for the collector to walk
        importlib.import_module(stage.implementation)
        for entry in stage.preload:
            name, _, function = entry.partition(":")
            loaded = importlib.import_module(name)
            if function:
                getattr(loaded, function)()
    if "onnxruntime" in stage.tools:
        quiet_onnxruntime()


def run_stage_function(task: StageTask, preload: tuple[str, ...] = ()) -> dict:
    """The stage's own work, in a child process (engine/isolate.py): a native crash, the memory limit or a hang
    in onnx, onnxruntime, the TOSA reference model or Vela is one error for this task, not the end of the
    build. doit's processes fork it; a Dask worker's thread gets it from a forkserver started with `preload`
    (the plan's stage modules: stage_modules). The report stage (records only) runs in process, and so does a
    task in a daemonic process (one that may not have children: a Dask worker started without
    `distributed.worker.daemon: False`). A stage with an `untrusted_input` has a crash blamed on that file."""
    stage = stage_of(task)
    if task.per_build or not isolation_possible():
        prepare_stage(task.module)
        return stage.run(task)
    blamed = task.inputs.get(stage.untrusted_input) if stage.untrusted_input else None
    return run_isolated(run_in_child, task, what=f"the {task.stage} stage", where=str(blamed) if blamed else None,
                        failure=InputError if blamed else StageError,
                        prepare=functools.partial(prepare_stage, task.module), preload=preload)


def stage_modules(stages: tuple[Stage, ...]) -> tuple[str, ...]:
    """What a forkserver preloads for all the tasks it will serve: this module, every stage's module and its
    implementation."""
    return ("npubuild.engine.execute", *(m for s in stages for m in (s.module, s.implementation)))


def run_in_child(task: StageTask) -> dict:
    """What the isolated child runs (module level: a forkserver's child receives it pickled)."""
    return stage_of(task).run(task)


def quiet_onnxruntime() -> None:
    """onnxruntime logs each error in colour on stderr before raising it; the stage reports it as one line,
    so only its fatal messages are logged."""
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)


def error_path(task: StageTask) -> Path:
    return task.dir / ERROR_NAME


def run_stage(task: StageTask, run_id: str, debug: bool = False, cache_url: str | None = None,
              preload: tuple[str, ...] = ()) -> dict:
    """What every executor runs for a task: clear a killed run's debris, run (or restore) the stage, and
    record the inputs it was built from, with the files they name beside them (Stage.companions; the
    up-to-date check reads them). Raises NpubuildError (one line)."""
    clear_debris(task)
    try:
        fp = fingerprint({**task.inputs, **companion_inputs(task)})
        hashes = {name: v[2] for name, v in fp.items()}
        corrupted = check_producers(task, hashes)
        if corrupted is not None:
            raise StageError(f"stage {task.stage}: {corrupted}")
        cache = StageCache(cache_url) if cache_url and stage_of(task).cached else None
        record = execute(task, run_id, debug, cache, hashes, preload=preload)
    except OSError as exc:  # an input vanished under us (another process, a clean)
        raise StageError(f"stage {task.stage}: cannot read an input: {exc}") from None
    write_inputs(task, fp, record.get("outputs"))
    return record


def execute(task: StageTask, run_id: str, debug: bool = False, cache: StageCache | None = None,
            input_hashes: dict[str, str] | None = None, key: str | None = None,
            preload: tuple[str, ...] = ()) -> dict:
    """Run one stage task (or restore it from the shared cache); returns its record.

    `input_hashes`: the sha256 of every input and companion (computed here if None); `key`: the task's cache
    key where the caller has it (a Dask worker: the client's). Raises NpubuildError (one line) on failure.
    """
    record_path = task.outputs["record"]
    err_path = error_path(task)
    for p in (record_path, err_path):
        p.unlink(missing_ok=True)
    task.dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if key is None:
        inputs = {**task.inputs, **companion_inputs(task)}
        key = cache_key(task.config, inputs, input_hashes)  # config + input contents
    required = {p.name for n, p in task.outputs.items() if n != "record"}
    entry = cache.get(key, task.dir, required) if cache is not None else None
    if entry is not None:
        return write_record(task, run_id, start, entry.metrics, key, from_cache=True)
    try:
        metrics = run_stage_function(task, preload)
    except NpubuildError as exc:
        write_json(err_path, {"kind": exc.kind, "message": str(exc), "run_id": run_id, **exc.detail})
        raise
    except Exception as exc:  # a bug or a tool crash: keep the traceback on disk, one line on screen
        if is_out_of_memory(exc):  # a model whose tensors do not fit this machine: the traceback is no help
            oom = StageError(f"stage {task.stage} ran out of host memory")
            write_json(err_path, {"kind": "stage", "message": str(oom), "run_id": run_id})
            raise oom from None
        detail = getattr(exc, "child_traceback", None) or traceback.format_exc()  # run_isolated's child
        internal = InternalError(f"stage {task.stage}: {one_line(f'{type(exc).__name__}: {exc}')} (traceback in "
                                 f"{err_path})")
        write_json(err_path, {"kind": "internal", "message": str(internal), "traceback": detail, "run_id": run_id})
        if debug:
            raise
        raise internal from exc
    if cache is not None:
        cache.put(key, task.dir, metrics, exclude={record_path.name, err_path.name, INPUTS_NAME})
    return write_record(task, run_id, start, metrics, key, from_cache=False)


def write_record(task: StageTask, run_id: str, start: float, metrics: dict, cache_key: str | None,
                 from_cache: bool, seconds: float | None = None) -> dict:
    """stage.json, written last: its presence (with the task's key) is what marks the task complete.
    `seconds`: the stage's time where it ran elsewhere (a Dask worker), else the time since `start`."""
    record = {
        "stage": task.stage,
        "task": task.name,
        "key": task.key,
        "cache_key": cache_key,
        "from_cache": from_cache,
        "run_id": run_id,
        "seconds": round(time.perf_counter() - start if seconds is None else seconds, 4),
        "metrics": metrics,
        "config": task.config,
        "outputs": hash_outputs(task),
    }
    write_json(task.outputs["record"], record)
    return record


def was_restored(task: StageTask) -> bool:
    """Whether the task's last run took its outputs from the shared cache instead of computing them."""
    rec = read_record(task)
    return bool(rec and rec.get("from_cache"))


def read_error(task: StageTask) -> dict | None:
    path = error_path(task)
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None
