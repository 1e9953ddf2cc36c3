"""A content-addressed cache of Vela compiles (an action cache): the same graph, .ini and command line compiled
once per build dir, whichever stage asks.

The lower stage's measured choices (ethosu/measured.py) compile each candidate whole graph on the shipped profile
its family is measured on, and the vela stage then compiled the chosen one again, the same bytes and options,
for a build on that profile (0.2-0.3 CPU s a target on palm detection: bench/compile_real.md). With this cache
the measured choices compile with the vela stage's command line (ethosu/vela.stage_command) and keep what Vela
wrote; the vela stage restores it instead of compiling. The precision search (`precision: auto`, ethosu/cost.py)
compiles its candidates in the precision stage's dir with this cache too: the vela stage of the candidate it
keeps restores the search's compile.

Key: sha256 over Vela's and numpy's versions, the .tosa's and the .ini's sha256, and Vela's arguments with
their paths taken out: the work dir (the .tosa's dir, holding the output dir) as `<work>`, the .ini as
`<ini>`. The .tosa's file name stays in: Vela names its outputs and its report's network after it. A command
naming any other path is not cached.

Entry: an entry of a store (npubuild/store.py) at <root>: stdout, stderr and every file Vela wrote in the output
dir (out/...), with the work dir's path replaced by a marker (Vela writes its output dir into its report and
debug database) that a hit puts back for its own work dir, so a hit gives the bytes a compile there gives. The
store writes an entry whole (its manifest last) and verifies every file's size and sha256 on every read; one
that does not verify (truncated, edited, half removed) is a miss: discarded, compiled again and replaced. Any
failure of the cache itself (a full disk, a removed dir) is a miss or an entry not written, never a failed
compile.

Where: <build dir>/.cache/vela, beside the report's plots (for_stage_dir): a cache of the build dir's own,
removed with it by `npubuild clean`. A stage run in a temp dir of its own (a Dask worker's) has none and
compiles as before. Bound: MAX_BYTES over all entries; a write past it removes the least recently used
entries (a hit touches its manifest: Store.prune_size) down to three quarters of it, and `npubuild clean
--stale` applies it too (prune). An entry is Vela's output for one graph (palm detection: 1.5 MiB, its tflite
and debug database): a build's own compiles fill a few tens of MiB.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from npubuild.store import DEBRIS_GRACE_S, Store

MARK = b"\x00npubuild-vela-work\x00"  # the work dir's path in a stored file (NUL: in no path, no Vela text)
# what an entry holds, in every key; kept at 1 when the entries moved into npubuild/store.py: an entry of the
# layout before (no writer in its manifest) is then found, discarded as malformed and replaced, not left behind
FORMAT = 1
MAX_BYTES = 256 << 20
STREAMS = ("stdout", "stderr")


@functools.cache
def _versions() -> dict[str, str]:
    """The distributions Vela's output depends on besides its inputs: Vela itself and numpy (its arrays)."""
    return {name: metadata.version(name) for name in ("ethos-u-vela", "numpy")}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Action:
    """One Vela command line as the cache sees it: its work dir, output dir, and key."""

    cmd: list[str]
    work: Path
    out: Path
    key: str

    @staticmethod
    def of(cmd: list[str]) -> Action | None:
        """The action of a vela_command line (`python -m ethosu.vela TOSA --config INI ... --output-dir OUT`), or
        None where it cannot be keyed: an output dir outside the .tosa's dir, another path, a file unreadable."""
        args = cmd[3:]
        try:
            tosa, ini = Path(args[0]), Path(args[args.index("--config") + 1])
            out = Path(args[args.index("--output-dir") + 1])
            work = tosa.parent
            if not tosa.is_absolute() or out.parent != work:
                return None
            norm = [_relative(a, work, ini) for a in args]
            if any(a is None for a in norm):
                return None
            material = {"format": FORMAT, "versions": _versions(), "args": norm,
                        "tosa": _sha256(tosa.read_bytes()), "ini": _sha256(ini.read_bytes())}
        except (ValueError, IndexError, OSError):
            return None
        key = _sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode())
        return Action(cmd, work, out, key)


def _text(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _relative(arg: str, work: Path, ini: Path) -> str | None:
    """An argument with the work dir's and the .ini's paths taken out; None for any other path."""
    if arg == str(ini):
        return "<ini>"
    if arg == str(work) or arg.startswith(f"{work}/"):
        return "<work>" + arg[len(str(work)):]
    return None if arg.startswith("/") else arg


@dataclass
class VelaCache:
    """The Vela action cache at `root`; `hits` and `misses` count this process's lookups (a miss compiled)."""

    root: Path
    max_bytes: int = MAX_BYTES
    hits: int = 0
    misses: int = 0
    _store: Store | None = field(default=None, init=False, repr=False)

    @property
    def store(self) -> Store:
        """The entries' store, made on first use (a stage that compiles nothing makes no cache dir)."""
        if self._store is None:
            self._store = Store(self.root)
        return self._store

    def get(self, action: Action) -> subprocess.CompletedProcess | None:
        """The compile `action` stands for, its output files written into its output dir, or None (a miss: no
        entry, or one that does not verify)."""
        work = str(action.work).encode()
        try:
            files = self.store.read(action.key, set(STREAMS), self.max_bytes)
            if files is None or not _complete(files):
                self.misses += 1
                return None
            for rel, data in files.items():
                if rel not in STREAMS:
                    dest = action.out / rel.removeprefix("out/")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(data.replace(MARK, work))
        except OSError:
            shutil.rmtree(action.out, ignore_errors=True)
            self.misses += 1
            return None
        self.hits += 1
        stdout, stderr = (files[s].replace(MARK, work).decode() for s in STREAMS)
        return subprocess.CompletedProcess(action.cmd, 0, stdout, stderr)

    def put(self, action: Action, proc: subprocess.CompletedProcess) -> None:
        """Keep a successful compile of `action` (its output dir as Vela left it; an entry of the key already
        there is replaced), then bound the cache. Not kept where a file holds a path the key does not cover,
        or the cache cannot be written."""
        if proc.returncode != 0:
            return
        try:
            files = self._collect(action, proc)
            if files is not None and _complete(files):
                self.store.put_files(action.key, files, {})
                self.prune()
        except OSError:
            pass

    def prune(self, grace_s: float = DEBRIS_GRACE_S) -> int:
        """The bound: past max_bytes, the least recently used entries removed down to 3/4 of it (over_bound);
        killed writers' debris older than `grace_s` too. The entries removed."""
        return self.store.prune_size(self.max_bytes, self.max_bytes * 3 // 4, grace_s)

    def over_bound(self) -> list[tuple[str, int]]:
        """(key, bytes) of the entries `prune` would remove now."""
        return self.store.over_size(self.max_bytes, self.max_bytes * 3 // 4)

    def entry(self, key: str) -> Path:
        """The dir of the entry of `key` (the store's layout, for `npubuild clean --stale --dry-run` to list)."""
        return Path(self.store.entry_dir(key))

    def _collect(self, action: Action, proc: subprocess.CompletedProcess) -> dict[str, bytes] | None:
        """What an entry holds: the streams and output files (out/...) with the work dir's path marked; None where
        a file already holds the marker, holds the path but is not text (a path's length would move its bytes),
        or still names a path of the command line (the .ini's) after marking."""
        work = str(action.work).encode()
        files = {"stdout": (proc.stdout or "").encode(), "stderr": (proc.stderr or "").encode()}
        files.update({f"out/{p.relative_to(action.out).as_posix()}": p.read_bytes()
                      for p in sorted(action.out.rglob("*")) if p.is_file()})
        others = [a.encode() for a in action.cmd[3:] if a.startswith("/") and not a.startswith(str(action.work))]
        marked = {}
        for rel, data in files.items():
            if MARK in data or (work in data and not _text(data)):
                return None
            data = data.replace(work, MARK)
            if any(o in data for o in others):
                return None
            marked[rel] = data
        return marked


def _complete(files: dict[str, bytes]) -> bool:
    """Whether an entry's files are a compile to replay: the two streams and Vela's output files, nothing else. A
    compile that wrote no output file is none (a Vela child that lost its outputs to a full disk exited 0 once,
    and its empty entry then failed every later build of that graph)."""
    outputs = [rel for rel in files if rel not in STREAMS]
    return bool(outputs) and all(rel.startswith("out/") for rel in outputs)


def for_stage_dir(stage_dir: Path) -> VelaCache | None:
    """The cache of the build dir holding `stage_dir` (<build>/stages/<stage>/<task>), or None for a stage dir
    elsewhere (a Dask worker's temp dir, a test's): such a stage compiles every graph itself."""
    stage_dir = Path(stage_dir)
    if len(stage_dir.parts) < 4 or stage_dir.parent.parent.name != "stages":
        return None
    return for_build_dir(stage_dir.parents[2])


def for_build_dir(build_dir: Path) -> VelaCache:
    """The Vela cache of a build dir (its dir made only when an entry is looked up or written)."""
    return VelaCache(Path(build_dir) / ".cache" / "vela", MAX_BYTES)
