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
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from npubuild.engine.cache import StageCache, cache_key
from npubuild.engine.isolate import isolation_possible, run_isolated
from npubuild.engine.notice import warn
from npubuild.engine.stage import Stage, StageTask, companion_inputs, stage_named, stage_of
from npubuild.engine.uptodate import (
    ERROR_NAME,
    INPUTS_NAME,
    check_producers,
    clear_debris,
    fingerprint,
    hash_outputs,
    read_record,
    upstream_digests,
    write_inputs,
)
from npubuild.errors import (
    DiskFull,
    InputError,
    InternalError,
    NpubuildError,
    StageError,
    describe_disk,
    is_disk_full,
    is_out_of_memory,
    nearly_full,
    one_line,
    written_path,
)
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
              preload: tuple[str, ...] = (), notices: list[Notice] | None = None) -> dict:
    """What every executor runs for a task: clear a killed run's debris, run (or restore) the stage, and
    record the inputs it was built from, with the files they name beside them (Stage.companions; the
    up-to-date check reads them). Raises NpubuildError (one line). `notices`: where warnings the run shows
    once go (a shared cache that cannot take outputs), None to print each here."""
    try:
        clear_debris(task)
        inputs = {**task.inputs, **companion_inputs(task)}  # found once: the import's parses the user's model
        fp = fingerprint(inputs)
        hashes = {name: v[2] for name, v in fp.items()}
        corrupted = check_producers(task, hashes)
        upstream = upstream_digests(task)  # after check_producers: the records hold for the files on disk
    except OSError as exc:  # an input vanished under us (another process, a clean)
        raise StageError(f"stage {task.stage}: cannot read an input: {exc}") from None
    if corrupted is not None:
        raise StageError(f"stage {task.stage}: {corrupted}")
    cache = open_cache(cache_url, task, notices) if cache_url and stage_of(task).cached else None
    try:
        record = execute(task, run_id, debug, cache, hashes, cache_key(task.config, inputs, hashes, upstream),
                         preload=preload, upstream=upstream, notices=notices)
        write_inputs(task, fp, record.get("outputs"), upstream)
    except OSError as exc:  # writing the stage dir (its records, a restored entry)
        raise output_error(task, exc) from None
    return record


@dataclass(frozen=True)
class Notice:
    """A warning a run shows once however many tasks meet it (`kind`), with the first task's words."""

    kind: str
    text: str


def output_error(task: StageTask, exc: BaseException) -> NpubuildError:
    """A write into the stage dir that failed, in one line: the full disk named, or the OS's reason."""
    if is_disk_full(exc):
        return DiskFull(written_path(exc) or task.dir, f"the outputs of {task.name}")
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return StageError(f"stage {task.stage}: cannot write its outputs in {task.dir}: {why}")


def cache_trouble(cache_url: str, task: StageTask, exc: BaseException, doing: str) -> Notice:
    why = f"{describe_disk(cache_url)} is full" if is_disk_full(exc) and "://" not in cache_url else (
        "no space left" if is_disk_full(exc) else (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                                   else f"{type(exc).__name__}: {exc}"))
    return Notice("cache", f"the shared stage cache {cache_url} {doing} ({why}; first for {task.name}): "
                           "this build goes on without it")


def _tell(notices: list[Notice] | None, notice: Notice) -> None:
    if notices is None:
        warn(notice.text)
    else:
        notices.append(notice)


def open_cache(cache_url: str, task: StageTask, notices: list[Notice] | None) -> StageCache | None:
    """The shared cache, or None (with a notice) where it cannot even be opened: a full disk, no permission."""
    try:
        return StageCache(cache_url)
    except OSError as exc:
        _tell(notices, cache_trouble(cache_url, task, exc, "cannot be opened"))
        return None


def _full_disk_behind(task: StageTask, exc: BaseException) -> DiskFull | None:
    """A stage failure said as the full disk it most likely is: the stage dir's or the temp dir's filesystem
    left with almost nothing (errors.nearly_full) when the stage failed, whatever the failure says."""
    for where in (task.dir, Path(tempfile.gettempdir())):
        if nearly_full(where):
            said = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            return DiskFull(where, f"the outputs of {task.name} (the stage failed with: {said})")
    return None


def _record_error(path: Path, record: dict) -> None:
    """error.json, where it can be written: on a full disk the one line on screen (and the session's report,
    which keeps every failed task's line) is all there is."""
    try:
        write_json(path, record)
    except OSError:
        pass


def execute(task: StageTask, run_id: str, debug: bool = False, cache: StageCache | None = None,
            input_hashes: dict[str, str] | None = None, key: str | None = None,
            preload: tuple[str, ...] = (), upstream: dict[str, str] | None = None,
            notices: list[Notice] | None = None, cache_required: bool = False) -> dict:
    """Run one stage task (or restore it from the shared cache); returns its record.

    `input_hashes`: the sha256 of every input and companion (computed here if None); `upstream`: the digests
    of the upstream stages' outputs (uptodate.upstream_digests); `key`: the task's cache key where the caller
    has it (a Dask worker: the client's). A cache that cannot be read or written is a warning (`notices`) and
    the stage runs without it, unless `cache_required` (a Dask worker: the cache is how outputs travel).
    Raises NpubuildError (one line) on failure; OSError where the stage dir cannot be written.
    """
    record_path = task.outputs["record"]
    err_path = error_path(task)
    for p in (record_path, err_path):
        p.unlink(missing_ok=True)
    task.dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if key is None:
        inputs = {**task.inputs, **companion_inputs(task)}
        key = cache_key(task.config, inputs, input_hashes, upstream)  # config + every file it reads
    required = {p.name for n, p in task.outputs.items() if n != "record"}
    entry = None
    if cache is not None:
        try:
            entry = cache.get(key, task.dir, required)
        except OSError as exc:
            if is_disk_full(exc) or cache_required:  # the build dir full: not the cache's trouble
                raise
            _tell(notices, cache_trouble(cache.url, task, exc, "cannot be read"))
    if entry is not None:
        return write_record(task, run_id, start, entry.metrics, key, from_cache=True)
    try:
        metrics = run_stage_function(task, preload)
    except DiskFull as exc:  # the child's write into the stage dir (or a tool's temp dir) found the disk full
        full = DiskFull(exc.path or task.dir, f"the outputs of {task.name}")
        _record_error(err_path, {"kind": "stage", "message": str(full), "run_id": run_id})
        raise full from None
    except NpubuildError as exc:
        full = _full_disk_behind(task, exc)
        if full is not None:
            _record_error(err_path, {"kind": "stage", "message": str(full), "run_id": run_id})
            raise full from None
        _record_error(err_path, {"kind": exc.kind, "message": str(exc), "run_id": run_id, **exc.detail})
        raise
    except Exception as exc:  # a bug or a tool crash: keep the traceback on disk, one line on screen
        if is_disk_full(exc):  # in process (the report stage)
            raise output_error(task, exc) from None
        full = _full_disk_behind(task, exc)
        if full is not None:
            _record_error(err_path, {"kind": "stage", "message": str(full), "run_id": run_id})
            raise full from None
        if is_out_of_memory(exc):  # a model whose tensors do not fit this machine: the traceback is no help
            oom = StageError(f"stage {task.stage} ran out of host memory")
            _record_error(err_path, {"kind": "stage", "message": str(oom), "run_id": run_id})
            raise oom from None
        detail = getattr(exc, "child_traceback", None) or traceback.format_exc()  # run_isolated's child
        internal = InternalError(f"stage {task.stage}: {one_line(f'{type(exc).__name__}: {exc}')} (traceback in "
                                 f"{err_path})")
        _record_error(err_path, {"kind": "internal", "message": str(internal), "traceback": detail,
                                 "run_id": run_id})
        if debug:
            raise
        raise internal from exc
    if cache is not None:
        try:
            cache.put(key, task.dir, metrics, exclude={record_path.name, err_path.name, INPUTS_NAME})
        except OSError as exc:
            if cache_required:
                if is_disk_full(exc):
                    raise StageError(f"stage {task.stage}: the shared stage cache {cache.url} is full (no space "
                                     "left on device): the worker cannot publish its outputs") from None
                raise
            _tell(notices, cache_trouble(cache.url, task, exc, "cannot take outputs"))
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
