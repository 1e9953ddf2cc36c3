"""Stages: pure functions (input files, resolved config) -> output files + a metrics dict.

`execute` wraps a stage for any executor: it clears the old completion record,
runs the stage, and writes `stage.json` (config, metrics, seconds, run id)
last, so a task killed mid-stage has no record and is never taken as done.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from npubuild.errors import NpubuildError
from npubuild.fileio import read_json, write_json
from npubuild.plan import StageTask

MODULES = {
    "import": "npubuild.stages.importer",
    "quantize": "npubuild.stages.quantize",
    "lower": "npubuild.stages.lower",
    "tosa-check": "npubuild.stages.tosa_check",
    "vela": "npubuild.stages.vela",
    "report": "npubuild.stages.report",
}
StageFn = Callable[[StageTask], dict]


def stage_function(stage: str) -> StageFn:
    return importlib.import_module(MODULES[stage]).run


def error_path(task: StageTask) -> Path:
    return task.dir / "error.json"


def execute(task: StageTask, run_id: str, debug: bool = False) -> dict:
    """Run one stage task; returns its record. Raises NpubuildError (one line) on failure."""
    record_path = task.outputs["record"]
    err_path = error_path(task)
    for p in (record_path, err_path):
        p.unlink(missing_ok=True)
    task.dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        metrics = stage_function(task.stage)(task)
    except NpubuildError as exc:
        write_json(err_path, {"kind": "input" if exc.exit_code == 2 else "stage", "message": str(exc),
                              "run_id": run_id})
        raise
    except Exception as exc:  # a bug or a tool crash: keep the traceback on disk, one line on screen
        detail = traceback.format_exc()
        write_json(err_path, {"kind": "internal", "message": f"error: {type(exc).__name__}: {exc}",
                              "traceback": detail, "run_id": run_id})
        if debug:
            raise
        raise NpubuildError(f"internal error in stage {task.stage}: {type(exc).__name__}: {exc} "
                            f"(traceback in {err_path})") from exc
    record = {
        "stage": task.stage,
        "task": task.name,
        "key": task.key,
        "run_id": run_id,
        "seconds": round(time.perf_counter() - start, 4),
        "metrics": metrics,
        "config": task.config,
    }
    write_json(record_path, record)
    return record


def read_record(task: StageTask) -> dict | None:
    """The completion record of a task, if it completed with its current config."""
    path = task.outputs["record"]
    if not path.is_file():
        return None
    try:
        rec = read_json(path)
    except (OSError, ValueError):
        return None
    return rec if rec.get("key") == task.key else None


def read_error(task: StageTask) -> dict | None:
    path = error_path(task)
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None
