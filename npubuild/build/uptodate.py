"""Whether a stage task is done, from files in its own stage dir only (not doit's database).

doit keeps its dependency database in memory and saves it when a run ends, so
a build killed with SIGKILL forgets every task it finished. Deciding
up-to-dateness from each task's `stage.json` (written last, carrying the
config key) and `inputs.json` (the size, mtime and sha256 of each input when
the stage ran) keeps finished work across a crash and never takes a half-done
stage as done.
"""

from __future__ import annotations

import os
from pathlib import Path

from npubuild.fileio import file_hash, read_json, write_json
from npubuild.build.plan import StageTask

INPUTS_NAME = "inputs.json"


_JSON_CACHE: dict[Path, tuple[tuple[int, int, int], dict]] = {}


def read_json_cached(path: Path) -> dict:
    """read_json, memoised per (inode, mtime, size): the up-to-date checks and the report read the same
    records in one process, and files are replaced atomically (a new inode) when rewritten."""
    st = os.stat(path)
    sig = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _JSON_CACHE.get(path)
    if hit is not None and hit[0] == sig:
        return hit[1]
    data = read_json(path)
    _JSON_CACHE[path] = (sig, data)
    return data


def read_record(task: StageTask) -> dict | None:
    """The task's stage.json if it carries the task's current key (memoised: the up-to-date checks and the
    report read the same records in one process)."""
    try:
        rec = read_json_cached(task.outputs["record"])
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("key") == task.key else None


def fingerprint(inputs: dict[str, Path]) -> dict[str, list]:
    """name -> [size, mtime_ns, sha256] for each input file."""
    out = {}
    for name, p in sorted(inputs.items()):
        st = os.stat(p)
        out[name] = [st.st_size, st.st_mtime_ns, file_hash(p)]
    return out


def write_inputs(task: StageTask, fp: dict[str, list]) -> None:
    write_json(task.dir / INPUTS_NAME, {"key": task.key, "inputs": fp})


def _same(path: Path, saved: list) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_size != saved[0]:
        return False
    return st.st_mtime_ns == saved[1] or file_hash(path) == saved[2]


def is_done(task: StageTask) -> bool:
    """True if the task completed with its current config and its inputs are unchanged since."""
    rec = read_record(task)
    if rec is None:
        return False
    try:
        saved = read_json_cached(task.dir / INPUTS_NAME)
    except (OSError, ValueError):
        return False
    if saved.get("key") != task.key:
        return False
    fp = saved.get("inputs", {})
    if set(fp) != set(task.inputs):
        return False
    if not all(_same(p, fp[name]) for name, p in task.inputs.items()):
        return False
    return all(p.exists() for p in task.outputs.values())


def clear_debris(task: StageTask) -> None:
    """Remove temp files and dirs a killed run left in the stage dir (names starting with '.')."""
    import shutil

    if not task.dir.is_dir():
        return
    for p in task.dir.iterdir():
        if p.name.startswith("."):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
