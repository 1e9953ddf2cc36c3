"""What a Dask worker runs for one stage task when it shares nothing with the client but the cache URL.

The client sends a `RemoteTask`: the stage, its config and each input as a content address (the key of a
cache entry and a file inside it), never a path of the client's. The worker restores those entries into a
temporary directory of its own, runs the stage there through the same `execute` as doit's processes
(which publishes the outputs to the cache under the task's cache key), and returns that key with the
metrics; the client then restores the outputs into its build dir (npubuild.engine.shipping).

An upstream entry is restored whole, not just the file named: a stage reads files beside its input
(tosa-check reads the partitions io.json lists, fvp the Vela model beside summary.json), as it does in
the client's stage dirs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from npubuild.engine.cache import StageCache
from npubuild.engine.execute import execute, read_error
from npubuild.engine.stage import StageTask
from npubuild.engine.uptodate import RECORD_NAME, forget_hashes
from npubuild.errors import NpubuildError, StageError
from npubuild.fileio import stable_hash


@dataclass(frozen=True)
class Address:
    """Where one input file is in the shared cache, and its content (which is part of the task's key)."""

    entry: str  # the cache key of the entry holding the file
    file: str  # its path inside the entry
    sha256: str
    # an upstream stage's output: the digest of every file of its entry (uptodate.upstream_digests), which is
    # part of the task's key; the worker reads the files beside this one too, so all must be what was keyed
    upstream: str | None = None


@dataclass
class RemoteTask:
    """A stage task as a worker gets it: what to run and where its inputs are in the cache, no client path."""

    name: str
    stage: str
    module: str  # the stage module (npubuild.engine.stage.stage_of)
    label: str
    config: dict
    inputs: dict[str, Address]  # an input's companions (Stage.companions) travel in its entry, beside it
    outputs: dict[str, str]  # output name -> file name in the stage dir
    cache_key: str  # the client's: config + the content of every input and companion
    builds: list[str] = field(default_factory=list)


@dataclass
class RemoteResult:
    """What became of a RemoteTask: its outputs are in the cache under `cache_key` (status ran, from-cache)."""

    task: str
    status: str  # ran, from-cache or failed
    cache_key: str | None = None
    metrics: dict = field(default_factory=dict)
    seconds: float = 0.0
    error: dict | None = None  # the error.json the stage left (status failed)
    worker_paths: dict[str, str] = field(default_factory=dict)  # worker path -> input name ("" the stage dir)


def run_remote(task: RemoteTask, cache_url: str, run_id: str, debug: bool = False,
               preload: tuple[str, ...] = ()) -> RemoteResult:
    """Worker side: restore the inputs from the cache, run the stage in a temporary dir, publish its outputs.
    `preload`: what the worker's forkserver imports for every task (execute.stage_modules)."""
    try:
        return _run_in_temp_dir(task, cache_url, run_id, debug, preload)
    finally:
        forget_hashes()  # a long-lived worker: the hashes of its task's temporary files, kept for no later task


def _run_in_temp_dir(task: RemoteTask, cache_url: str, run_id: str, debug: bool,
                     preload: tuple[str, ...]) -> RemoteResult:
    cache = StageCache(cache_url)
    with tempfile.TemporaryDirectory(prefix="npubuild-task-") as tmp:
        root = Path(tmp)
        out = root / "out"
        paths = {str(out): ""}
        try:
            inputs = fetch_inputs(task, cache, root / "in")
        except StageError as exc:
            return RemoteResult(task.name, "failed", error={"kind": "stage", "message": str(exc), "run_id": run_id})
        paths.update({str(p): name for name, p in inputs.items()})
        local = StageTask(task.stage, task.module, task.label, task.config, inputs,
                          {**{n: out / f for n, f in task.outputs.items()}, "record": out / RECORD_NAME},
                          builds=list(task.builds))
        try:
            record = execute(local, run_id, debug, cache, key=task.cache_key, preload=preload, cache_required=True)
        except NpubuildError as exc:
            error = read_error(local) or {"kind": "stage", "message": str(exc), "run_id": run_id}
            return RemoteResult(task.name, "failed", error={**error, "message": str(exc)}, worker_paths=paths)
        return RemoteResult(task.name, "from-cache" if record["from_cache"] else "ran", record["cache_key"],
                            record["metrics"], record["seconds"], worker_paths=paths)


def entry_digest(files: dict[str, dict]) -> str:
    """The digest of an entry's files as uptodate.upstream_digests takes it from the stage's record."""
    return stable_hash({name: info.get("sha256") for name, info in files.items()}, 64)


def fetch_inputs(task: RemoteTask, cache: StageCache, dest: Path) -> dict[str, Path]:
    """Every input's entry restored (verified) under `dest/<entry key>/`; input name -> its file there."""
    restored: dict[str, dict] = {}
    out: dict[str, Path] = {}
    for name, addr in sorted(task.inputs.items()):
        if addr.entry not in restored:
            entry = cache.get(addr.entry, dest / addr.entry, {addr.file})
            if entry is None:
                raise StageError(f"stage {task.stage}: input '{name}' is not in the shared cache "
                                 f"{cache.url} (entry {addr.entry}); the next build publishes it again")
            restored[addr.entry] = entry.files
        info = restored[addr.entry].get(addr.file)
        if info is None or info.get("sha256") != addr.sha256 or (
                addr.upstream is not None and entry_digest(restored[addr.entry]) != addr.upstream):
            raise StageError(f"stage {task.stage}: input '{name}' in the shared cache (entry {addr.entry}) "
                             f"is not the file the client planned with (sha256 differs)")
        out[name] = dest / addr.entry / addr.file
    return out
