"""A content-addressed cache of Vela compiles (an action cache): the same graph, .ini and command line compiled
once per build dir, whichever stage asks.

The lower stage's measured choices (ethosu/measured.py) compile each candidate whole graph on the shipped profile
its family is measured on, and the vela stage then compiled the chosen one again, the same bytes and options,
for a build on that profile (0.2-0.3 CPU s a target on palm detection: bench/compile_real.md). With this cache
the measured choices compile with the vela stage's command line (ethosu/vela.stage_command) and keep what Vela
wrote; the vela stage restores it instead of compiling.

Key: sha256 over Vela's and numpy's versions, the .tosa's and the .ini's sha256, and Vela's arguments with
their paths taken out: the work dir (the .tosa's dir, holding the output dir) as `<work>`, the .ini as
`<ini>`. The .tosa's file name stays in: Vela names its outputs and its report's network after it. A command
naming any other path is not cached.

Entry: <root>/<key[:2]>/<key>/ holds stdout, stderr and every file Vela wrote in the output dir, with the work
dir's path replaced by a marker (Vela writes its output dir into its report and debug database) that a hit puts
back for its own work dir, so a hit gives the bytes a compile there gives; and manifest.json, each file's
sha256 and size, verified on every read. An entry is written in a temp dir under <root>/tmp and renamed into
place whole; one that does not verify (truncated, edited, half removed) is a miss: compiled again and replaced.
Any failure of the cache itself (a full disk, a removed dir) is a miss or an entry not written, never a
failed compile.

Where: <build dir>/.cache/vela, beside the report's plots (for_stage_dir): a cache of the build dir's own,
removed with it by `npubuild clean`. A stage run in a temp dir of its own (a Dask worker's) has none and
compiles as before. Bound: MAX_BYTES over all entries; a write past it removes the least recently used
entries (a hit touches its manifest) down to three quarters of it. An entry is Vela's output for one graph
(palm detection: 1.5 MiB, its tflite and debug database): a build's own compiles fill a few tens of MiB.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

MARK = b"\x00npubuild-vela-work\x00"  # the work dir's path in a stored file (NUL: in no path, no Vela text)
MANIFEST = "manifest.json"
FORMAT = 1  # the entry layout's version, in every key
MAX_BYTES = 256 << 20
DEBRIS_GRACE_S = 3600.0  # a temp dir this old is a killed writer's, not one at work
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
    _tmp: Path = field(init=False)

    def __post_init__(self) -> None:
        self._tmp = self.root / "tmp"

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, action: Action) -> subprocess.CompletedProcess | None:
        """The compile `action` stands for, its output files written into its output dir, or None (a miss: no
        entry, or one that does not verify)."""
        files = self._read(self.entry(action.key), action.key)
        if files is None:
            self.misses += 1
            return None
        work = str(action.work).encode()
        try:
            for rel, data in files.items():
                if rel in STREAMS:
                    continue
                dest = action.out / rel.removeprefix("out/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data.replace(MARK, work))
            os.utime(self.entry(action.key) / MANIFEST)  # recently used: the last to go (_bound)
        except OSError:
            shutil.rmtree(action.out, ignore_errors=True)
            self.misses += 1
            return None
        self.hits += 1
        stdout, stderr = (files[s].replace(MARK, work).decode() for s in STREAMS)
        return subprocess.CompletedProcess(action.cmd, 0, stdout, stderr)

    def _read(self, entry: Path, key: str) -> dict[str, bytes] | None:
        """An entry's files (relative path -> bytes, the marker still in), only if every one matches its
        manifest and the manifest names this key."""
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
            if manifest.get("key") != key or set(STREAMS) - set(manifest["files"]):
                return None
            files = {}
            for rel, info in manifest["files"].items():
                if rel not in STREAMS and (not rel.startswith("out/") or ".." in Path(rel).parts):
                    return None
                data = (entry / "f" / rel).read_bytes()
                if len(data) != info["size"] or _sha256(data) != info["sha256"]:
                    return None
                files[rel] = data
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return files

    def put(self, action: Action, proc: subprocess.CompletedProcess) -> None:
        """Keep a successful compile of `action` (its output dir as Vela left it); a damaged entry of the key is
        replaced. Not kept where a file holds a path the key does not cover, or the cache cannot be written."""
        if proc.returncode != 0:
            return
        try:
            files = self._collect(action, proc)
            if files is not None:
                self._write(action.key, files)
                self._bound()
        except OSError:
            pass

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

    def _write(self, key: str, files: dict[str, bytes]) -> None:
        """The entry written in a temp dir and renamed into place; a valid entry already there is kept."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp / uuid.uuid4().hex
        for rel, data in files.items():
            path = tmp / "f" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        manifest = {"key": key, "files": {rel: {"sha256": _sha256(d), "size": len(d)} for rel, d in files.items()}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True, indent=1))
        final = self.entry(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, final)
            return
        except OSError:  # an entry is there: another writer's (kept), or a damaged one (replaced)
            if self._read(final, key) is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                return
        self._remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # another writer put one in meanwhile
            shutil.rmtree(tmp, ignore_errors=True)

    def _remove(self, entry: Path) -> None:
        """An entry taken out of place first (a reader then finds none), then deleted."""
        dead = self._tmp / f"dead-{uuid.uuid4().hex}"
        try:
            os.rename(entry, dead)
        except OSError:
            return
        shutil.rmtree(dead, ignore_errors=True)

    def _bound(self) -> None:
        """Past max_bytes, the least recently used entries removed down to 3/4 of it; killed writers' temp dirs
        older than DEBRIS_GRACE_S too."""
        now = time.time()
        for d in self._tmp.iterdir() if self._tmp.is_dir() else ():
            try:
                if now - d.stat().st_mtime > DEBRIS_GRACE_S:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                continue
        entries = []
        for entry in self.root.glob("??/*"):
            try:
                used = (entry / MANIFEST).stat().st_mtime
                size = sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())
            except OSError:
                continue
            entries.append((used, size, entry))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        for _, size, entry in sorted(entries):
            if total <= self.max_bytes * 3 // 4:
                break
            self._remove(entry)
            total -= size


def for_stage_dir(stage_dir: Path) -> VelaCache | None:
    """The cache of the build dir holding `stage_dir` (<build>/stages/<stage>/<task>), or None for a stage dir
    elsewhere (a Dask worker's temp dir, a test's): such a stage compiles every graph itself."""
    stage_dir = Path(stage_dir)
    if len(stage_dir.parts) < 4 or stage_dir.parent.parent.name != "stages":
        return None
    return VelaCache(stage_dir.parents[2] / ".cache" / "vela")
