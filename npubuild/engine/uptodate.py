"""Whether a stage task is done, from files in its own stage dir only (not doit's database).

doit keeps its dependency database in memory and saves it when a run ends, so
a build killed with SIGKILL forgets every task it finished. Deciding
up-to-dateness from each task's `stage.json` (written last, carrying the
config key and the size and sha256 of every file the stage wrote) and
`inputs.json` (the size, mtime and sha256 of each input when the stage ran,
and the stat signature of each output) keeps finished work across a crash and
never takes a half-done stage as done.

Content, not just presence: an output whose size or stat signature (size,
mtime, ctime) differs from what the stage left is re-hashed; a hash that
differs from the record means the output was truncated or edited after the
stage wrote it, so the record is dropped, one line says which file, and the
task reruns. The kernel sets ctime on every write and every utime(), so a
same-size edit with its mtime put back is caught here at the cost of a stat.
What bypasses the kernel (bit rot, a raw device write) is caught when a later
stage consumes the file: `run_stage` hashes every input anyway and compares it
with the producer's record (`check_producers`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from npubuild.engine.notice import warn
from npubuild.engine.stage import StageTask
from npubuild.fileio import file_hash, read_json, stable_hash, write_json

INPUTS_NAME = "inputs.json"
RECORD_NAME = "stage.json"
ERROR_NAME = "error.json"
BOOKKEEPING = frozenset({RECORD_NAME, INPUTS_NAME, ERROR_NAME})  # a stage dir's own records, not outputs

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


_HASHES: dict[Path, tuple[tuple[int, ...], str]] = {}


def content_hash(path: Path) -> tuple[os.stat_result, str]:
    """The file's stat and sha256, the hash remembered for this build by the file's identity and stat signature
    (device, inode, size, mtime, ctime; `forget_hashes` at each build's start and end): a stage's outputs are
    hashed for its record and were hashed again by every consumer, for its fingerprint and its producers'
    check (palm detection: lower's 6.8 MB eight times, ~0.3 CPU s a build). What changes a file through the
    kernel moves its ctime, so only bytes changed under the kernel within one build (the bit rot
    check_producers looks for) go unseen until the next build, which hashes afresh. A file that changes while
    it is hashed is not remembered."""
    st = os.stat(path)
    sig = _identity(st)
    hit = _HASHES.get(path)
    if hit is not None and hit[0] == sig:
        return st, hit[1]
    digest = file_hash(path)
    if _identity(os.stat(path)) == sig:
        _HASHES[path] = (sig, digest)
    return st, digest


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What content_hash keys a file's hash by: which file it is and its stat signature."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def forget_hashes() -> None:
    """Drop the hashes content_hash remembers: a build starts and ends with none."""
    _HASHES.clear()


def stat_signature(st: os.stat_result) -> list[int]:
    """What a file's stat says about its content without reading it: size, mtime and ctime (which no
    user-space call can set back, unlike mtime)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def fingerprint(inputs: dict[str, Path]) -> dict[str, list]:
    """name -> [size, mtime_ns, sha256, ctime_ns] for each input file."""
    out = {}
    for name, p in sorted(inputs.items()):
        st, digest = content_hash(p)
        out[name] = [st.st_size, st.st_mtime_ns, digest, st.st_ctime_ns]
    return out


def output_files(task: StageTask) -> dict[str, Path]:
    """Every file the stage wrote, by path relative to its dir: all of a keyed stage dir (subdirectories too,
    e.g. vela's raw/ and firmware/) but temp files and the bookkeeping records; a per-build task's declared
    outputs (its dir also holds files other commands write, e.g. debug-numerics' layers.json)."""
    if task.per_build:
        return {p.relative_to(task.dir).as_posix(): p for n, p in task.outputs.items() if n != "record"}
    out = {}
    for p in sorted(task.dir.rglob("*")):
        rel = p.relative_to(task.dir).as_posix()
        if rel in BOOKKEEPING or any(part.startswith(".") for part in rel.split("/")) or not p.is_file():
            continue
        out[rel] = p
    return out


def hash_outputs(task: StageTask) -> dict[str, dict]:
    """rel path -> {size, sha256} of every output: what stage.json records."""
    out = {}
    for rel, p in output_files(task).items():
        st, digest = content_hash(p)
        out[rel] = {"size": st.st_size, "sha256": digest}
    return out


def write_inputs(task: StageTask, fp: dict[str, list], outputs: dict[str, dict] | None = None,
                 upstream: dict[str, str] | None = None) -> None:
    """inputs.json: the inputs' fingerprints, the digests of the upstream stages' outputs they came with
    (upstream_digests) and the stat signature of each output named in the record."""
    sigs = {}
    for rel in outputs or {}:
        try:
            sigs[rel] = stat_signature(os.stat(task.dir / rel))
        except OSError:
            pass
    write_json(task.dir / INPUTS_NAME, {"key": task.key, "inputs": fp, "upstream": upstream or {}, "outputs": sigs})


def _input_same(path: Path, saved: list) -> tuple[bool, list | None]:
    """(unchanged, its refreshed fingerprint if only the stat signature moved): same size and mtime/ctime,
    else same size and sha256."""
    try:
        st = os.stat(path)
    except OSError:
        return False, None
    if st.st_size != saved[0]:
        return False, None
    if st.st_mtime_ns == saved[1] and (len(saved) < 4 or st.st_ctime_ns == saved[3]):
        return True, None
    if content_hash(path)[1] != saved[2]:
        return False, None
    return True, [st.st_size, st.st_mtime_ns, saved[2], st.st_ctime_ns]


def changed_output(task: StageTask, outputs: dict, sigs: dict) -> tuple[str | None, dict[str, list]]:
    """(why an output is not what the stage wrote, or None; refreshed signatures of outputs whose stat moved
    but whose content is the recorded one)."""
    refreshed: dict[str, list] = {}
    for rel, info in outputs.items():
        try:
            st = os.stat(task.dir / rel)
        except OSError:
            return f"{rel} is missing", refreshed
        if st.st_size != info["size"]:
            return f"{rel} is {st.st_size} bytes, the stage wrote {info['size']}", refreshed
        sig = stat_signature(st)
        if sig == sigs.get(rel):
            continue
        if content_hash(task.dir / rel)[1] != info["sha256"]:
            return f"{rel} differs from what the stage wrote (sha256)", refreshed
        refreshed[rel] = sig
    return None, refreshed


def invalidate(task: StageTask, why: str) -> None:
    """Drop the task's record (it reruns) and say so in one line."""
    task.outputs["record"].unlink(missing_ok=True)
    warn(f"{task.name}: {why}; rerunning it")


def is_done(task: StageTask) -> bool:
    """True if the task completed with its current config, its inputs are unchanged since, and its outputs
    are what it wrote (else, for a changed output, its record is dropped with one line saying which).
    A record or inputs.json that parses but is not what a stage writes (an edit, a flipped byte) is not
    done: the task reruns and rewrites both, instead of every later build failing on it."""
    try:
        return _is_done(task)
    except (TypeError, KeyError, AttributeError, IndexError, ValueError):
        invalidate(task, "its stage.json or inputs.json is malformed")
        return False


def _is_done(task: StageTask) -> bool:
    rec = read_record(task)
    if rec is None:
        return False
    try:
        saved = read_json_cached(task.dir / INPUTS_NAME)
    except (OSError, ValueError):
        return False
    if not isinstance(saved, dict) or saved.get("key") != task.key:
        return False
    fp = saved.get("inputs", {})
    paths = recorded_inputs(task, fp) if isinstance(fp, dict) else None
    if paths is None:
        return False
    if saved.get("upstream", {}) != upstream_digests(task):  # an upstream stage's files are not those it ran on
        return False
    new_inputs: dict[str, list] = {}
    for name, p in paths.items():
        same, refreshed = _input_same(p, fp[name])
        if not same:
            return False
        if refreshed is not None:
            new_inputs[name] = refreshed
    outputs = rec.get("outputs")
    declared = {p.relative_to(task.dir).as_posix() for n, p in task.outputs.items() if n != "record"}
    if not isinstance(outputs, dict) or not declared <= set(outputs):
        return False  # a record from before outputs were recorded: rebuild once
    sigs = saved.get("outputs", {})
    if not isinstance(sigs, dict):
        return False
    why, new_sigs = changed_output(task, outputs, sigs)
    if why is not None:
        invalidate(task, why)
        return False
    if new_inputs or new_sigs:  # content verified by hash: remember the new signatures (e.g. a copied build dir)
        write_json(task.dir / INPUTS_NAME, {**saved, "inputs": {**fp, **new_inputs},
                                            "outputs": {**sigs, **new_sigs}})
    return True


def recorded_inputs(task: StageTask, fp: dict) -> dict[str, Path] | None:
    """The files inputs.json recorded, by name: the declared inputs and the companions a run found beside them
    (`<input>/<relative path>`, Stage.companions: an ONNX model's external data, so that an edit to one reruns
    the stage); None if the record is not of these inputs."""
    if not set(task.inputs) <= set(fp):
        return None
    paths = dict(task.inputs)
    for name in fp:
        if name not in paths:
            base, sep, rel = name.partition("/")
            if not sep or base not in task.inputs:
                return None
            paths[name] = task.inputs[base].parent / rel
    return paths


def producer_record(stage_dir: Path) -> dict | None:
    """The stage.json in `stage_dir` if it is a stage's completion record (a user's file named stage.json beside
    a model is not), else None."""
    record_path = stage_dir / RECORD_NAME
    if not record_path.is_file():
        return None
    try:
        rec = read_json_cached(record_path)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "stage" in rec and "key" in rec else None


def upstream_digests(task: StageTask) -> dict[str, str]:
    """Input name -> a digest of every file the stage that wrote the input recorded (its stage.json `outputs`:
    each file's sha256), for each input an upstream stage produced. A stage reads files beside its declared
    input (vela and tosa-check read the .tosa graphs io.json names, fvp the Vela model beside summary.json), so
    its cache key and its up-to-date check cover the content of all of them, as Bazel keys an action by the
    digests of its inputs: a changed or planted upstream file reruns the checks that read it. (A task's own
    `key`, its stage dir's name, is its config's, known when the plan is made.)"""
    out: dict[str, str] = {}
    for name, path in sorted(task.inputs.items()):
        if path.name in BOOKKEEPING or path.parent == task.dir:
            continue  # the report reads records only: their own fingerprints are its inputs
        rec = producer_record(path.parent)
        outputs = rec.get("outputs") if rec is not None else None
        if isinstance(outputs, dict):
            out[name] = stable_hash({rel: info.get("sha256") if isinstance(info, dict) else None
                                     for rel, info in outputs.items()}, 64)
    return out


def check_producers(task: StageTask, hashes: dict[str, str]) -> str | None:
    """Before a task consumes its inputs: every file the producing stages recorded must hash to what they
    recorded, the declared inputs (`hashes`, computed anyway) and the files a consumer reads beside them (vela
    and npu-sim declare lower's io.json and read the .tosa partitions it names). On a mismatch the producer's
    record is dropped (the next build reruns it) and the reason returned: the file changed on disk without its
    size or inode times changing (bit rot, a raw write), which the producer's own stat check cannot see."""
    by_path = {path: hashes.get(name) for name, path in task.inputs.items()}
    consumed = {path.parent for path in task.inputs.values() if path.name not in BOOKKEEPING}  # the report
    for producer in sorted(consumed):  # reads only records: the producers' own checks cover the rest
        rec = producer_record(producer) if producer != task.dir else None
        if rec is None:
            continue
        outputs = rec.get("outputs")
        for rel, info in (outputs.items() if isinstance(outputs, dict) else ()):
            if not isinstance(info, dict) or rel in BOOKKEEPING:
                continue
            path = producer / rel
            try:
                actual = by_path[path] if by_path.get(path) else content_hash(path)[1]
            except OSError:
                actual = None
            if actual != info.get("sha256"):
                (producer / RECORD_NAME).unlink(missing_ok=True)
                return (f"{rel} of {rec.get('task', producer.name)} changed on disk after it was built "
                        f"(sha256 differs from its record); its task reruns on the next build")
    return None


def debris_in(directory: Path) -> list[Path]:
    """What killed runs left under a stage dir, at any depth (vela's raw/ and firmware/ too): every file or
    directory whose name starts with '.' (temp files, .vela-* work dirs, restores' .part files), the topmost
    of each, never one inside another."""
    out: list[Path] = []
    if not directory.is_dir():
        return out
    stack = [directory]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(d.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.name.startswith("."):
                out.append(p)
            elif p.is_dir() and not p.is_symlink():
                stack.append(p)
    return out


def remove_debris(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def clear_debris(task: StageTask) -> None:
    """Remove temp files and dirs a killed run left in the stage dir, in its subdirectories too (names
    starting with '.'; they looked at the top level only, so a killed Vela's firmware/.x.tmp survived)."""
    remove_debris(debris_in(task.dir))
