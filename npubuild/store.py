"""A content-addressed store of file entries: what the shared stage cache (engine/cache.py) and the build dir's
Vela cache (ethosu/vela_cache.py) keep their entries in.

An entry is addressed by a key (40 to 64 hex digits, the caller's hash of what the entry stands for). Layout
under the store's root (a local directory, or any file system with fsspec's calls):

    <key[:2]>/<key>/<writer-id>/<files>     written first
    <key[:2]>/<key>/manifest.json           written last, in one put

The manifest names the writer directory and the sha256 and size of each file, so a reader never uses a
half-written entry; every file is verified as it is read (streamed, never past its manifest's size), and an
entry that fails (truncated, corrupted, missing files) is discarded, a miss. Concurrent writers of one key each
write their own writer directory; whichever manifest lands last wins, and both are complete. A writer killed
mid-put leaves its directory and temp manifest behind: `verify`, `prune` and `prune_size` remove such debris
once it is older than DEBRIS_GRACE_S (a writer still at work is younger).

With a key (`Store(..., key=...)`) every manifest carries an HMAC-SHA256 over all of it, and only entries whose
MAC verifies are read: who gives the key, and whether a store needs one, is the caller's (engine/cache.py).

Two bounds, each the caller's to apply: `prune` by age (an entry's creation), `prune_size` by size (each entry's
size the sum its manifest gives; the least recently used go first: a read touches a local entry's manifest).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npubuild.fileio import FILE_MODE

MANIFEST = "manifest.json"
DEBRIS_GRACE_S = 3600.0  # a writer directory without a manifest this old is a killed writer's, not a live one
MAX_MANIFEST_BYTES = 16 << 20  # a real manifest is a few KiB (one line per file)
# the largest file an entry may hold: ONNX's protobuf limit is 2 GiB, and an Ethos-U model's Vela output, the
# user inputs a Dask build ships (calibration arrays are refused past 1 GiB) are far smaller
MAX_FILE_BYTES = 4 << 30
CHUNK = 1 << 20  # what an entry file is streamed in
_KEY = re.compile(r"[0-9a-f]{40,64}")
_WRITER = re.compile(r"[0-9a-f]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def manifest_mac(manifest: dict, key: bytes) -> str:
    """HMAC-SHA256 over the whole manifest but its `mac`, in a canonical JSON form."""
    body = {k: v for k, v in manifest.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def safe_output_name(name: object, reserved: frozenset[str] = frozenset()) -> bool:
    """A file name an entry may restore into a directory: relative, '/'-separated, every part a plain name (no
    '..', no hidden or temp file, no absolute path), not `reserved`: what `put` writes, never a path out."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name or name in reserved:
        return False
    parts = name.split("/")
    return all(part and not part.startswith(".") for part in parts)


def manifest_problem(key: str, manifest: object, reserved: frozenset[str] = frozenset()) -> str | None:
    """Why a manifest is not one `put` could have written for `key` (None: well formed). Checked before
    anything it names is read or written: a manifest is data from whoever can write to the store, and a file
    entry is only ever `<writer>/<name>` inside the entry's own directory."""
    if not isinstance(manifest, dict) or not manifest:
        return "unreadable manifest"
    if manifest.get("key") != key:
        return "manifest of another key"
    writer, files = manifest.get("writer"), manifest.get("files")
    if not isinstance(writer, str) or not _WRITER.fullmatch(writer):
        return "manifest without a valid writer"
    if not isinstance(files, dict) or not isinstance(manifest.get("metrics", {}), dict):
        return "manifest without a files or metrics mapping"
    for name, info in files.items():
        if not safe_output_name(name, reserved):
            return f"manifest names a file outside the stage dir or reserved: {str(name)[:80]!r}"
        if not isinstance(info, dict) or info.get("path") != f"{writer}/{name}" \
                or not isinstance(info.get("sha256"), str) or not _SHA256.fullmatch(info["sha256"]) \
                or not isinstance(info.get("size"), int) or isinstance(info["size"], bool) or info["size"] < 0:
            return f"manifest entry for {name!r} is malformed"
    return None


@dataclass
class CacheEntry:
    key: str
    files: dict[str, dict]  # file name -> {"path": relative path, "sha256", "size"}
    metrics: dict
    created: float


class LocalFiles:
    """fsspec's local file system (what `fsspec.core.url_to_fs` gives for an absolute directory path) for the
    calls a store makes, done as it does them without importing fsspec: fsspec and the asyncio it imports were
    ~0.03 CPU s of a small model's cold compile (bench/compile_split.py). Any other call goes to fsspec's own
    LocalFileSystem, imported then."""

    protocol = ("file", "local")  # LocalFileSystem's: Store.local tells a local store by it

    def __init__(self) -> None:
        self._fs: Any = None

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def open(self, path: str, mode: str = "rb"):
        if "b" not in mode:  # text modes: fsspec's own wrapper
            return self._real().open(path, mode)
        return open(path, mode)

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        shutil.move(path1, path2)

    def ls(self, path: str, detail: bool = True) -> list:
        """A directory's entries (a file: itself), full paths, or fsspec's info dicts with `detail`."""
        names = [f"{path.rstrip('/')}/{n}" for n in os.listdir(path)] if os.path.isdir(path) else [path]
        return [self.info(n) for n in names] if detail else names

    def info(self, path: str) -> dict:
        """fsspec's name, size, type and mtime of a path (a symlink's target's, where it has one)."""
        st = os.stat(path, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            try:
                st = os.stat(path)
            except OSError:
                pass
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
        return {"name": path, "size": st.st_size, "type": kind, "mtime": st.st_mtime}

    def rm(self, path: str, recursive: bool = False) -> None:
        if os.path.isdir(path) and not os.path.islink(path) and recursive:
            shutil.rmtree(path)
        else:
            os.remove(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def du(self, path: str) -> int:
        """The bytes of every file under `path`."""
        return sum(os.lstat(f"{d}/{f}").st_size for d, _, files in os.walk(path) for f in files)

    def _real(self) -> Any:
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (a copy, an unpickled instance): never fsspec's privates
            raise AttributeError(name)
        return getattr(self._real(), name)


class Store:
    """Get and put entries by key under `root`, on `fs` (LocalFiles: `root` a local directory); with `key`,
    only entries signed with it are read. `reserved`: file names no entry may hold (a subclass's)."""

    reserved: frozenset[str] = frozenset()

    def __init__(self, root: str | os.PathLike, fs: Any = None, key: bytes | None = None):
        self.fs = fs if fs is not None else LocalFiles()
        self.root = str(root) if fs is not None else str(root).rstrip("/") or "/"
        self.key = key
        self.fs.makedirs(self.root, exist_ok=True)

    def warn(self, text: str) -> None:
        """A bad entry met on a read (the store says nothing: it is a miss; a subclass may tell the user)."""

    @property
    def local(self) -> bool:
        return "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def trusted(self, key: str, manifest: dict) -> bool:
        """Without a key every well-formed manifest; with one, only a manifest for `key` whose MAC holds."""
        if manifest.get("key") != key:
            return False
        if self.key is None:
            return True
        mac = manifest.get("mac")
        return isinstance(mac, str) and hmac.compare_digest(mac, manifest_mac(manifest, self.key))

    def entry_dir(self, key: str) -> str:
        """Where the entry of `key` lives (<root>/<key[:2]>/<key>): the one place the layout is written."""
        return f"{self.root}/{key[:2]}/{key}"

    def _read_manifest(self, key: str) -> dict | None:
        path = f"{self.entry_dir(key)}/{MANIFEST}"
        try:
            with self.fs.open(path, "rb") as f:
                data = f.read(MAX_MANIFEST_BYTES + 1)
            if len(data) > MAX_MANIFEST_BYTES:
                return {}
            manifest = json.loads(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):
            return {}  # unreadable manifest: treat as corrupt
        return manifest if isinstance(manifest, dict) else {}

    def _usable(self, key: str, required: set[str]) -> dict | None:
        """The manifest of an entry a read may use (trusted, well formed, holding `required`, no file over
        MAX_FILE_BYTES), or None: a miss, the entry discarded if it is bad."""
        manifest = self._read_manifest(key)
        if manifest is None:
            return None
        if self.key is not None and isinstance(manifest, dict) and manifest and not self.trusted(key, manifest):
            self.warn(f"cache entry {key} is not signed with this build's cache key: not restored")
            return None  # not ours: do not use it (a put will replace it)
        problem = manifest_problem(key, manifest, self.reserved)
        if problem is not None:
            if manifest:  # an empty {} is a torn write: no news
                self.warn(f"cache entry {key}: {problem}: discarded")
            self.discard(key)
            return None
        if not required <= set(manifest["files"]):
            self.discard(key)
            return None
        too_big = [n for n, info in manifest["files"].items() if info["size"] > MAX_FILE_BYTES]
        if too_big:
            self.warn(f"cache entry {key}: {too_big[0]} is {manifest['files'][too_big[0]]['size'] / 2**30:.1f} GiB, "
                      f"over the {MAX_FILE_BYTES / 2**30:.0f} GiB a stage output may be: discarded")
            self.discard(key)
            return None
        return manifest

    def get(self, key: str, dest: Path, required: set[str]) -> CacheEntry | None:
        """Restore a verified entry's files into `dest` (each atomically); None on a miss or a bad entry.

        `required` are file names the entry must hold (the task's declared outputs).
        """
        manifest = self._usable(key, required)
        if manifest is None:
            return None
        staged: list[tuple[Path, Path]] = []  # (final path, verified temp file beside it)
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for name, info in manifest["files"].items():
                # staged in the stage dir itself (hidden: a killed restore's debris is cleared), so that a bad
                # entry leaves not even a subdirectory behind
                fd, tmp = tempfile.mkstemp(prefix=f".{Path(name).name}.", suffix=".part", dir=dest)
                os.fchmod(fd, FILE_MODE)
                os.close(fd)
                staged.append((dest / name, Path(tmp)))
                if not self._fetch(key, info, Path(tmp)):
                    self.discard(key)
                    return None
            for final, tmp in staged:  # every file verified: only now does any of them replace an output
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, final)
        finally:
            for _, tmp in staged:
                tmp.unlink(missing_ok=True)
        self._used(key)
        return CacheEntry(key, manifest["files"], manifest.get("metrics", {}), manifest.get("created", 0.0))

    def read(self, key: str, required: set[str], max_bytes: int) -> dict[str, bytes] | None:
        """A verified entry's files in memory (name -> bytes), for entries small enough to hold whole; None on a
        miss, a bad entry (discarded) or one over `max_bytes` in all (left, unread)."""
        manifest = self._usable(key, required)
        if manifest is None or sum(info["size"] for info in manifest["files"].values()) > max_bytes:
            return None
        files = {}
        for name, info in manifest["files"].items():
            src, data = self._open_entry_file(key, info), bytearray()
            if src is None:
                self.discard(key)
                return None
            with src:
                ok = _matches(src, info, data.extend)
            if not ok:
                self.discard(key)
                return None
            files[name] = bytes(data)
        self._used(key)
        return files

    def _used(self, key: str) -> None:
        """A local entry's manifest touched on a read: prune_size removes the least recently used first (an
        object store's manifests keep the time they were written)."""
        if self.local:
            try:
                os.utime(f"{self.entry_dir(key)}/{MANIFEST}")
            except OSError:  # a store this process may read but not write
                pass

    def _fetch(self, key: str, info: dict, out: Path) -> bool:
        """Stream an entry file into `out` (fsync'd), hashing as it comes; False if it is absent, longer or
        shorter than its manifest says, or hashes otherwise. Never more than CHUNK bytes in memory, never more
        than the manifest's size (+1) read: a planted 5 GiB file cost 5.3 GB of RSS when entries were read
        whole (issue 34)."""
        src = self._open_entry_file(key, info)
        if src is None:
            return False
        with src, open(out, "wb") as f:
            ok = _matches(src, info, f.write)
            f.flush()
            os.fsync(f.fileno())
        return ok

    def has(self, key: str, required: set[str] = frozenset()) -> bool:
        """Whether a trusted entry for `key` holding `required` is there (its manifest only: files unread)."""
        manifest = self._read_manifest(key)
        return isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) \
            and required <= set(manifest["files"]) and self.trusted(key, manifest)

    def put(self, key: str, src: Path, metrics: dict, exclude: set[str]) -> None:
        """Upload every file of `src` (but `exclude`) under a writer-private directory, then the manifest."""
        files: dict[str, Path | bytes] = {}
        for path in sorted(src.rglob("*")):  # subdirectories too (the vela stage's raw/ and firmware/)
            name = path.relative_to(src).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in name.split("/")) or name in exclude:
                continue
            files[name] = path
        self.put_files(key, files, metrics)

    def put_files(self, key: str, files: Mapping[str, Path | bytes], metrics: dict) -> None:
        """Upload `files` (entry name -> a local file, or its bytes) under a writer-private directory, then the
        manifest. Each file is streamed and hashed as it goes (never read whole)."""
        writer = uuid.uuid4().hex[:12]
        base = self.entry_dir(key)
        try:
            self._put(key, base, writer, files, metrics)
        except BaseException:  # a full disk, a lost connection: take back what this writer wrote
            for path in (f"{base}/{writer}", f"{base}/.{MANIFEST}.{writer}"):
                try:
                    self.fs.rm(path, recursive=True)
                except (FileNotFoundError, OSError):
                    pass
            try:  # the key's dir, if this writer made it and nothing else is there
                if not self.fs.ls(base, detail=False):
                    self.fs.rmdir(base)
            except (FileNotFoundError, OSError):
                pass
            raise

    def _put(self, key: str, base: str, writer: str, files: Mapping[str, Path | bytes], metrics: dict) -> None:
        self.fs.makedirs(f"{base}/{writer}", exist_ok=True)
        stored = {}
        for name, source in files.items():
            rel = f"{writer}/{name}"
            if "/" in name:
                self.fs.makedirs(f"{base}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
            digest, size = hashlib.sha256(), 0
            with self.fs.open(f"{base}/{rel}", "wb") as f:
                for chunk in _chunks(source):
                    digest.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
            stored[name] = {"path": rel, "sha256": digest.hexdigest(), "size": size}
        body = {"key": key, "files": stored, "metrics": metrics, "created": time.time(), "writer": writer}
        if self.key is not None:
            body["mac"] = manifest_mac(body, self.key)
        tmp = f"{base}/.{MANIFEST}.{writer}"
        with self.fs.open(tmp, "wb") as f:
            f.write(json.dumps(body).encode())
        self.fs.mv(tmp, f"{base}/{MANIFEST}")

    def discard(self, key: str) -> None:
        try:
            self.fs.rm(self.entry_dir(key), recursive=True)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ maintenance

    def keys(self) -> list[str]:
        out = []
        for prefix in self.fs.ls(self.root, detail=False):
            for entry in self.fs.ls(prefix, detail=False):
                out.append(entry.rstrip("/").rsplit("/", 1)[-1])
        return sorted(k for k in out if _KEY.fullmatch(k))

    def stats(self) -> dict:
        keys = self.keys()
        total = 0
        for k in keys:
            m = self._read_manifest(k)
            if manifest_problem(k, m, self.reserved) is None:
                total += sum(f["size"] for f in m["files"].values())
        return {"entries": len(keys), "bytes": total, "debris_bytes": sum(size for _, size in self.debris(grace_s=0.0))}

    def verify(self) -> tuple[int, list[str]]:
        """Check every entry's files against its manifest (and its MAC, with a key); discard and return the bad
        ones; remove killed writers' debris."""
        bad = []
        keys = self.keys()
        for k in keys:
            m = self._read_manifest(k)
            ok = manifest_problem(k, m, self.reserved) is None and self.trusted(k, m) \
                and all(self._file_ok(k, info) for info in m["files"].values())
            if not ok and m is not None:
                bad.append(k)
                self.discard(k)
        self.remove_debris()
        return len(keys), bad

    def debris(self, grace_s: float = DEBRIS_GRACE_S) -> list[tuple[str, int]]:
        """(path, bytes) of what killed writers left, older than `grace_s`: writer dirs no manifest names, temp
        manifests, key dirs without a manifest."""
        out: list[tuple[str, int]] = []
        now = time.time()
        for k in self._key_dirs():
            base = self.entry_dir(k)
            m = self._read_manifest(k)
            live = m.get("writer") if isinstance(m, dict) else None
            for child in self.fs.ls(base, detail=True):
                name = child["name"].rstrip("/").rsplit("/", 1)[-1]
                if name == MANIFEST or name == live:
                    continue
                if now - _mtime(self.fs, child) >= grace_s:
                    out.append((child["name"], self._size(child)))
        return out

    def remove_debris(self, grace_s: float = DEBRIS_GRACE_S) -> int:
        removed = 0
        for path, _ in self.debris(grace_s):
            try:
                self.fs.rm(path, recursive=True)
                removed += 1
            except FileNotFoundError:
                pass
        for k in self._key_dirs():  # a key dir left empty
            try:
                if not self.fs.ls(self.entry_dir(k), detail=False):
                    self.fs.rmdir(self.entry_dir(k))
            except (FileNotFoundError, OSError):
                pass
        return removed

    def _key_dirs(self) -> list[str]:
        out = []
        for prefix in self.fs.ls(self.root, detail=False):
            if not self.fs.isdir(prefix):
                continue
            for entry in self.fs.ls(prefix, detail=False):
                name = entry.rstrip("/").rsplit("/", 1)[-1]
                if _KEY.fullmatch(name) and self.fs.isdir(entry):
                    out.append(name)
        return sorted(out)

    def _size(self, info: dict) -> int:
        if info.get("type") == "directory":
            return self.fs.du(info["name"]) if self.fs.exists(info["name"]) else 0
        return int(info.get("size") or 0)

    def _open_entry_file(self, key: str, info: dict):
        """An entry file opened for reading, None if absent or, on a local store, if a symlink leads out of the
        entry's directory (a planted link would read the builder's files)."""
        path = f"{self.entry_dir(key)}/{info['path']}"
        if self.local:
            entry = os.path.realpath(self.entry_dir(key))
            if not os.path.realpath(path).startswith(entry + os.sep):
                return None
        try:
            return self.fs.open(path, "rb")
        except (FileNotFoundError, OSError):
            return None

    def _file_ok(self, key: str, info: dict) -> bool:
        """Whether an entry file is there with its manifest's size and sha256 (streamed, size-bounded)."""
        src = self._open_entry_file(key, info)
        if src is None:
            return False
        with src:
            return _matches(src, info)

    def prune(self, older_than_s: float) -> int:
        """Remove entries created before `older_than_s` ago, and killed writers' debris."""
        cutoff = time.time() - older_than_s
        removed = 0
        for k in self.keys():
            m = self._read_manifest(k)
            if m is None:
                continue  # no manifest: a writer's (debris below, once old)
            created = m.get("created", 0.0) if isinstance(m, dict) else 0.0
            if not isinstance(created, (int, float)) or created < cutoff:
                self.discard(k)
                removed += 1
        self.remove_debris(min(DEBRIS_GRACE_S, older_than_s))
        return removed

    def prune_size(self, max_bytes: int, to_bytes: int | None = None, grace_s: float = DEBRIS_GRACE_S) -> int:
        """Past `max_bytes` over all entries, remove the least recently used until `to_bytes` (default
        max_bytes) are left (over_size), and killed writers' debris older than `grace_s`; the entries removed."""
        self.remove_debris(grace_s)
        victims = self.over_size(max_bytes, to_bytes)
        for key, _ in victims:
            self.discard(key)
        return len(victims)

    def over_size(self, max_bytes: int, to_bytes: int | None = None) -> list[tuple[str, int]]:
        """(key, bytes) of the entries prune_size would remove: none within `max_bytes` over all entries, else
        the least recently used (their manifests' times) until `to_bytes` are left. Each entry's size is the sum
        its manifest gives; one whose manifest is absent (a writer's) or malformed (a read discards it) is not
        counted."""
        entries = []
        for info in self._manifests():
            key = info["name"].rstrip("/").rsplit("/", 2)[-2]
            m = self._read_manifest(key)
            if manifest_problem(key, m, self.reserved) is None:
                entries.append((_mtime(self.fs, info), sum(f["size"] for f in m["files"].values()), key))
        total, out = sum(size for _, size, _ in entries), []
        if total <= max_bytes:
            return out
        for _, size, key in sorted(entries):
            if total <= (max_bytes if to_bytes is None else to_bytes):
                break
            out.append((key, size))
            total -= size
        return out

    def _manifests(self) -> Iterator[dict]:
        """The listing entries (name, mtime...) of every entry's manifest."""
        for k in self._key_dirs():
            for child in self.fs.ls(self.entry_dir(k), detail=True):
                if child["name"].rstrip("/").rsplit("/", 1)[-1] == MANIFEST:
                    yield child


def _chunks(source: Path | bytes) -> Iterator[bytes]:
    """A file's bytes CHUNK by CHUNK (bytes given: themselves, whole)."""
    if isinstance(source, bytes):
        yield source
        return
    with open(source, "rb") as src:
        yield from iter(lambda: src.read(CHUNK), b"")


def _matches(src, info: dict, sink: Callable[[bytes], Any] | None = None) -> bool:
    """Whether the stream holds exactly the manifest's size and sha256, read CHUNK by CHUNK and never past
    size + 1 bytes (each chunk handed to `sink` too, when given)."""
    digest, size, limit = hashlib.sha256(), 0, info["size"]
    while size <= limit:
        chunk = src.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            break
        size += len(chunk)
        digest.update(chunk)
        if sink is not None:
            sink(chunk)
    return size == limit and digest.hexdigest() == info["sha256"]


def _mtime(fs, info: dict) -> float:
    """A listing entry's modification time in seconds (local files say mtime, object stores LastModified);
    now if the file system says nothing, so that unknown debris is never taken as old."""
    for field in ("mtime", "LastModified", "last_modified", "created"):
        v = info.get(field)
        if isinstance(v, (int, float)):
            return float(v)
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
    if info.get("type") == "directory":  # a local directory's listing may lack mtime: ask its entries
        try:
            times = [_mtime(fs, c) for c in fs.ls(info["name"], detail=True)]
            return max(times) if times else 0.0
        except (FileNotFoundError, OSError):
            return time.time()
    return time.time()
