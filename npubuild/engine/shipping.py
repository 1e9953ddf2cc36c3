"""The client's half of a share-nothing Dask build: inputs into the shared cache, stage outputs back out.

A worker gets only content addresses (npubuild.engine.worker), so before a task leaves the client every
file it reads must be a cache entry: a user input (a model with its companions, the external data beside it:
Stage.companions; calibration and evaluation arrays, the FVP runner) becomes an entry of its own, keyed by
its name and content, when the build starts; an upstream stage's outputs are the entry its run published (or, for a stage up to date in
the build dir from a run without this cache, one published from its stage dir on first use). When a
worker is done the client restores the task's entry into the stage dir and writes stage.json and
inputs.json as `run_stage` does for doit, so the build dir, the up-to-date checks and the reports cannot
tell which executor ran it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from npubuild.engine.cache import KEY_ENV, StageCache, cache_key
from npubuild.engine.execute import error_path, write_record
from npubuild.engine.plan import BuildPlan
from npubuild.engine.stage import Companions, StageTask, companion_inputs, stage_of
from npubuild.engine.uptodate import (
    BOOKKEEPING,
    check_producers,
    clear_debris,
    fingerprint,
    read_record,
    upstream_digests,
    write_inputs,
)
from npubuild.engine.worker import Address, RemoteResult, RemoteTask
from npubuild.errors import StageError
from npubuild.fileio import file_hash, stable_hash, write_json


@dataclass
class Prepared:
    """A task about to leave the client: its inputs' fingerprints (for inputs.json) and the worker's task."""

    fp: dict[str, list]
    key: str  # the task's cache key (config + input contents + the upstream stages' outputs)
    remote: RemoteTask | None  # None: restored from the cache here, nothing to run
    upstream: dict[str, str] = field(default_factory=dict)  # uptodate.upstream_digests, for inputs.json


class Shipping:
    """Content addresses for a plan's task inputs, and the tasks' outputs restored from the shared cache."""

    def __init__(self, plan: BuildPlan, cache: StageCache):
        self.plan, self.cache = plan, cache
        self.producer: dict[Path, tuple[StageTask, str]] = {
            p: (t, p.relative_to(t.dir).as_posix())
            for t in plan.tasks.values() for n, p in t.outputs.items() if n != "record"}
        self.user: dict[Path, Address] = {}
        self.published: set[str] = set()  # entries known to be in the cache in this run

    # ------------------------------------------------------------------ into the cache

    def publish_user_inputs(self) -> int:
        """Every input file no task of the plan writes, as its own cache entry; returns how many files."""
        for t in self.plan.tasks.values():
            if t.per_build:
                continue  # the report stage runs on the client, from this build dir's records
            companions = stage_of(t).companions
            for name, p in t.inputs.items():
                if p not in self.producer and p not in self.user:
                    self.user[p] = self._publish_file(p, companions.get(name))
        return len(self.user)

    def _publish_file(self, path: Path, companions: Companions | None = None) -> Address:
        """One user input as a cache entry, with the files it names beside it (an ONNX model's external data)."""
        files = {path.name: path, **(companions(path) if companions is not None else {})}
        digests = {name: file_hash(f) for name, f in files.items()}
        key = stable_hash({"user-input": path.name, "files": digests}, 40)
        if key not in self.published and not self.cache.has(key, set(files)):
            self.cache.put_files(key, files, {})
        self.published.add(key)
        return Address(key, path.name, digests[path.name])

    def _entry_of(self, producer: StageTask) -> str:
        """The cache entry holding an upstream task's outputs, published from its stage dir if it is not there
        (a stage up to date from a build with another cache, or none)."""
        rec = read_record(producer)
        if rec is None or not rec.get("cache_key"):
            raise StageError(f"{producer.name} has no completion record in the build dir")
        key = rec["cache_key"]
        if key not in self.published:
            required = {p.name for n, p in producer.outputs.items() if n != "record"}
            if not self.cache.has(key, required):
                self.cache.put(key, producer.dir, rec.get("metrics", {}), exclude=set(BOOKKEEPING))
            self.published.add(key)
        return key

    def prepare(self, task: StageTask, run_id: str) -> Prepared:
        """What `run_stage` does before running a stage, here: clear debris, fingerprint the inputs, check the
        producers, restore a cache hit; else the worker's task. Raises NpubuildError (one line)."""
        clear_debris(task)
        try:
            fp = fingerprint({**task.inputs, **companion_inputs(task)})
        except OSError as exc:
            raise StageError(f"stage {task.stage}: cannot read an input: {exc}") from None
        hashes = {name: v[2] for name, v in fp.items()}
        corrupted = check_producers(task, hashes)
        if corrupted is not None:
            raise StageError(f"stage {task.stage}: {corrupted}")
        upstream = upstream_digests(task)
        for p in (task.outputs["record"], error_path(task)):
            p.unlink(missing_ok=True)
        task.dir.mkdir(parents=True, exist_ok=True)
        key = cache_key(task.config, {**task.inputs, **companion_inputs(task)}, hashes, upstream)
        start = time.perf_counter()
        entry = self.cache.get(key, task.dir, self._required(task))
        if entry is not None:
            record = write_record(task, run_id, start, entry.metrics, key, from_cache=True)
            write_inputs(task, fp, record["outputs"], upstream)
            self.published.add(key)
            return Prepared(fp, key, None, upstream)
        companions = stage_of(task).companions
        inputs = {name: self._address(p, hashes[name], companions.get(name), upstream.get(name))
                  for name, p in task.inputs.items()}
        remote = RemoteTask(task.name, task.stage, task.module, task.label, task.config, inputs,
                            {n: p.relative_to(task.dir).as_posix() for n, p in task.outputs.items() if n != "record"},
                            key, list(task.builds))
        return Prepared(fp, key, remote, upstream)

    def _address(self, path: Path, sha256: str, companions: Companions | None = None,
                 upstream: str | None = None) -> Address:
        if path in self.producer:
            producer, rel = self.producer[path]
            return Address(self._entry_of(producer), rel, sha256, upstream)
        addr = self.user.get(path)
        if addr is None or addr.sha256 != sha256:  # not published yet, or edited since: publish what is there
            addr = self.user[path] = self._publish_file(path, companions)
        return addr

    # ------------------------------------------------------------------ out of the cache

    def finish(self, task: StageTask, prepared: Prepared, result: RemoteResult, run_id: str) -> str | None:
        """Restore a worker's outputs into the stage dir and write its records; None if done, else the failure
        (the error record written as a local run would leave it, with the worker's paths put back as ours)."""
        if result.status == "failed":
            error = dict(result.error or {"kind": "stage", "message": "failed"})
            for k in ("message", "traceback"):
                if isinstance(error.get(k), str):
                    error[k] = self._client_paths(task, error[k], result.worker_paths)
            write_json(error_path(task), {**error, "run_id": run_id})
            return error["message"]
        start = time.perf_counter()
        entry = self.cache.get(result.cache_key or prepared.key, task.dir, self._required(task))
        if entry is None:
            message = (f"error: stage {task.stage}: the worker published its outputs to the shared cache "
                       f"{self.cache.url} (entry {result.cache_key}) but they cannot be restored from there: lost, "
                       f"corrupted, or not signed with this build's cache key (${KEY_ENV} must be the workers' too)")
            write_json(error_path(task), {"kind": "stage", "message": message, "run_id": run_id})
            return message
        self.published.add(entry.key)
        record = write_record(task, run_id, start, entry.metrics, entry.key, from_cache=result.status == "from-cache",
                              seconds=result.seconds if result.status == "ran" else None)
        write_inputs(task, prepared.fp, record["outputs"], prepared.upstream)
        return None

    @staticmethod
    def _required(task: StageTask) -> set[str]:
        return {p.name for n, p in task.outputs.items() if n != "record"}

    @staticmethod
    def _client_paths(task: StageTask, text: str, worker_paths: dict[str, str]) -> str:
        """A worker's message with its temporary paths replaced by the client's (the user's model, the stage
        dir), longest first so that a file inside the stage dir maps to the stage dir's file."""
        for wpath in sorted(worker_paths, key=len, reverse=True):
            name = worker_paths[wpath]
            ours = task.dir if name == "" else task.inputs.get(name)
            if ours is not None:
                text = text.replace(wpath, str(ours))
        return text
