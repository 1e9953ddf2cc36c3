"""A content-addressed stage cache shared between build dirs, machines and nights.

An entry is addressed by the stage's full cache key: its resolved config
(which embeds tool versions) plus the sha256 of every input file. Layout under
the cache root (a local directory or any fsspec URL):

    <key[:2]>/<key>/<writer-id>/<output files>     written first
    <key[:2]>/<key>/manifest.json                  written last, in one put

The manifest names the writer directory and the sha256 and size of each file,
so a reader never uses a half-written entry; it verifies every file on read,
and an entry that fails (truncated, corrupted, missing files) is discarded and
recomputed. Concurrent writers of one key each write their own writer
directory; whichever manifest lands last wins, and both are complete. A writer
killed mid-put leaves its directory and temp manifest behind: `verify` and
`prune` remove such debris once it is older than DEBRIS_GRACE_S (a writer
still at work is younger).

Trust: the sha256s catch accidents, not an adversary, since whoever can write
to the cache can replace a file and its manifest together. With a team key
(`$NPUBUILD_CACHE_KEY`, or a file named by `$NPUBUILD_CACHE_KEY_FILE`) every
manifest carries an HMAC-SHA256 over all of it (the cache key, every file's
sha256 and size, the metrics), and a build restores only entries whose MAC
verifies under its key: write access to the storage alone can no longer plant
an entry. The key is never written to the cache, a build dir or a report.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npubuild.engine.notice import warn
from npubuild.errors import InputError
from npubuild.fileio import FILE_MODE, file_hash, stable_hash

MANIFEST = "manifest.json"
DEBRIS_GRACE_S = 3600.0  # a writer directory without a manifest this old is a killed writer's, not a live one
KEY_ENV, KEY_FILE_ENV = "NPUBUILD_CACHE_KEY", "NPUBUILD_CACHE_KEY_FILE"
UNKEYED_ENV = "NPUBUILD_CACHE_UNKEYED"  # =1: a URL cache used without a key, every writer trusted (require_trust)
MAX_MANIFEST_BYTES = 16 << 20  # a real manifest is a few KiB (one line per output file)
# the largest file an entry may hold: ONNX's protobuf limit is 2 GiB, and an Ethos-U model's Vela output, the
# user inputs a Dask build ships (calibration arrays are refused past 1 GiB) are far smaller
MAX_FILE_BYTES = 4 << 30
CHUNK = 1 << 20  # what an entry file is streamed in
RESERVED = frozenset({"stage.json", "inputs.json", "error.json"})  # a stage dir's own records: never restored
_WRITER = re.compile(r"[0-9a-f]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def team_key() -> bytes | None:
    """The cache's HMAC key from the environment (the key itself, or a file holding it), or None."""
    text = os.environ.get(KEY_ENV)
    if not text and os.environ.get(KEY_FILE_ENV):
        path = Path(os.environ[KEY_FILE_ENV])
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise InputError(f"cannot read the cache key file (${KEY_FILE_ENV}): {exc.strerror}", str(path)) from None
        if not text:
            raise InputError(f"the cache key file (${KEY_FILE_ENV}) is empty", str(path))
    return text.encode() if text else None


def manifest_mac(manifest: dict, key: bytes) -> str:
    """HMAC-SHA256 over the whole manifest but its `mac`, in a canonical JSON form."""
    body = {k: v for k, v in manifest.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def safe_output_name(name: object) -> bool:
    """A file name an entry may restore into a stage dir: relative, '/'-separated, every part a plain name
    (no '..', no hidden or temp file, no absolute path): what `put` writes, never a path out of the dir."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name or name in RESERVED:
        return False
    parts = name.split("/")
    return all(part and not part.startswith(".") for part in parts)


def manifest_problem(key: str, manifest: object) -> str | None:
    """Why a manifest is not one `put` could have written for `key` (None: well formed). Checked before
    anything it names is read or written: a manifest is data from whoever can write to the cache, and a file
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
        if not safe_output_name(name):
            return f"manifest names a file outside the stage dir or reserved: {str(name)[:80]!r}"
        if not isinstance(info, dict) or info.get("path") != f"{writer}/{name}" \
                or not isinstance(info.get("sha256"), str) or not _SHA256.fullmatch(info["sha256"]) \
                or not isinstance(info.get("size"), int) or isinstance(info["size"], bool) or info["size"] < 0:
            return f"manifest entry for {name!r} is malformed"
    return None


def cache_key(config: dict, inputs: dict[str, Path], hashes: dict[str, str] | None = None,
              upstream: dict[str, str] | None = None) -> str:
    """The full key: resolved config + content of every input file (`hashes`: their sha256, if known) + the
    content of every file the upstream stages wrote beside them (`upstream`: uptodate.upstream_digests)."""
    hashes = hashes if hashes is not None else {k: file_hash(p) for k, p in inputs.items()}
    body: dict = {"config": config, "inputs": {k: hashes[k] for k in sorted(inputs)}}
    if upstream:  # a stage reading only the user's files (the import) keeps the key it had
        body["upstream"] = upstream
    return stable_hash(body, 40)


DEFAULT_CACHE = Path(".npubuild") / "cache"


def default_cache_dir(build_dir: Path) -> Path:
    """`.npubuild/cache` in the project holding the build dir (the nearest directory up from the build dir's
    parent with a dodo.py, pyproject.toml or .git; the parent itself outside any project).

    Not in the build dir: `npubuild clean` (or `rm -rf build`) empties a build dir, and the cache is what
    lets the next build refill it without recomputing; one per project rather than per user: every build dir
    of the project (build/, a nightly's, a scratch one) shares it, its size is visible and removable with
    the project, and tests and scratch builds in a temporary directory stay apart."""
    from npubuild.config.load import find_project_root

    return find_project_root(Path(build_dir).resolve().parent) / DEFAULT_CACHE


def resolve_cache(url: str | None, build_dir: Path) -> str | None:
    """The shared stage cache of a build, the same for every entry point (build, compile, offloads,
    debug-numerics, plain doit): `url` (--cache), else $NPUBUILD_CACHE, else default_cache_dir; 'off': none.
    A cache reached over a URL must be keyed, or said to be trusted unkeyed (require_trust)."""
    url = url or os.environ.get("NPUBUILD_CACHE") or str(default_cache_dir(build_dir))
    if url == "off":
        return None
    require_trust(url)
    return url


LOCAL_PROTOCOLS = frozenset({"memory"})  # in this process's memory: nobody else can write to it


def protocol_of(url: str) -> str | None:
    """The URL's scheme (`s3`, `file`, `memory`...), None for a plain directory path; an fsspec protocol that
    is not installed is bad input (one line), not a ValueError from fsspec."""
    if "://" not in url:
        return None
    protocol = url.split("://", 1)[0].split("::")[-1]
    from fsspec.registry import known_implementations, registry

    if protocol not in registry and protocol not in known_implementations:
        raise InputError(f"the stage cache URL {url!r} names protocol '{protocol}', which fsspec does not know "
                         "(a directory, file:///path, s3://bucket/path, ... or 'off')")
    return protocol


def require_trust(url: str) -> None:
    """A cache reached over a URL (s3://, gs://, file:// on a filesystem every worker mounts...) is shared
    between machines or people, and without a team key every build restores whatever anyone who can write to
    it put there (issue 34: a Vela model and its manifest replaced together shipped as `passed`). Such a cache
    needs $NPUBUILD_CACHE_KEY / $NPUBUILD_CACHE_KEY_FILE, or the explicit opt-out $NPUBUILD_CACHE_UNKEYED=1
    (every writer trusted); a directory path (the project's own cache) may stay unkeyed."""
    protocol = protocol_of(url)
    key = team_key()  # a key file that cannot be read is one line here, before any task (not one per task)
    if protocol is None or protocol in LOCAL_PROTOCOLS:
        return
    if os.environ.get(UNKEYED_ENV) == "1" or key is not None:
        return
    raise InputError(f"the stage cache {url} is reached over a URL, so shared, and has no team key: set "
                     f"${KEY_ENV} (or ${KEY_FILE_ENV}) on every machine that builds, so that a build restores "
                     f"only entries signed with it, or ${UNKEYED_ENV}=1 to trust whatever anyone who can write "
                     "there puts in it")


@dataclass
class CacheEntry:
    key: str
    files: dict[str, dict]  # output name -> {"path": relative path, "sha256", "size"}
    metrics: dict
    created: float


class LocalFiles:
    """fsspec's local file system (what `fsspec.core.url_to_fs` gives for an absolute directory path) for the
    calls a build makes, makedirs, open and mv, done as it does them without importing fsspec: fsspec and the
    asyncio it imports were ~0.03 CPU s of a small model's cold compile (bench/compile_split.py). Any other call
    (the `npubuild cache` listing, du, rm, ...) goes to fsspec's own LocalFileSystem, imported then."""

    protocol = ("file", "local")  # LocalFileSystem's: _open_entry_file tells a local cache by it

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

    def _real(self) -> Any:
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (a copy, an unpickled instance): never fsspec's privates
            raise AttributeError(name)
        return getattr(self._real(), name)


def url_to_fs(url: str) -> tuple[Any, str]:
    """The file system and root of a cache URL: LocalFiles for an absolute local path (as fsspec would give it:
    the path without trailing slashes), else fsspec's own."""
    if url.startswith("/") and "::" not in url:
        return LocalFiles(), url.rstrip("/") or "/"
    import fsspec

    return fsspec.core.url_to_fs(url)


class StageCache:
    """Get and put stage outputs by key; `url` is a directory path or an fsspec URL."""

    def __init__(self, url: str | os.PathLike, key: bytes | None = None, use_env_key: bool = True):
        self.url = str(url)
        self.key = key if key is not None or not use_env_key else team_key()
        self.fs, self.root = url_to_fs(self.url)
        self.fs.makedirs(self.root, exist_ok=True)

    def trusted(self, key: str, manifest: dict) -> bool:
        """Without a team key every well-formed manifest; with one, only a manifest for `key` whose MAC holds."""
        if manifest.get("key") != key:
            return False
        if self.key is None:
            return True
        mac = manifest.get("mac")
        return isinstance(mac, str) and hmac.compare_digest(mac, manifest_mac(manifest, self.key))

    def _dir(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}"

    def _read_manifest(self, key: str) -> dict | None:
        path = f"{self._dir(key)}/{MANIFEST}"
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

    def get(self, key: str, dest: Path, required: set[str]) -> CacheEntry | None:
        """Restore a verified entry's files into `dest` (each atomically); None on a miss or a bad entry.

        `required` are file names the entry must hold (the task's declared outputs).
        """
        manifest = self._read_manifest(key)
        if manifest is None:
            return None
        if self.key is not None and isinstance(manifest, dict) and manifest and not self.trusted(key, manifest):
            warn(f"cache entry {key} is not signed with this build's cache key: not restored")
            return None  # not ours: do not use it (a put will replace it)
        problem = manifest_problem(key, manifest)
        if problem is not None:
            if manifest:  # an empty {} is a torn write: no news
                warn(f"cache entry {key}: {problem}: discarded")
            self.discard(key)
            return None
        if not required <= set(manifest["files"]):
            self.discard(key)
            return None
        too_big = [n for n, info in manifest["files"].items() if info["size"] > MAX_FILE_BYTES]
        if too_big:
            warn(f"cache entry {key}: {too_big[0]} is {manifest['files'][too_big[0]]['size'] / 2**30:.1f} GiB, "
                 f"over the {MAX_FILE_BYTES / 2**30:.0f} GiB a stage output may be: discarded")
            self.discard(key)
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
        return CacheEntry(key, manifest["files"], manifest.get("metrics", {}), manifest.get("created", 0.0))

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
        files = {}
        for path in sorted(src.rglob("*")):  # subdirectories too (the vela stage's raw/ and firmware/)
            name = path.relative_to(src).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in name.split("/")) or name in exclude:
                continue
            files[name] = path
        self.put_files(key, files, metrics)

    def put_files(self, key: str, files: dict[str, Path], metrics: dict) -> None:
        """Upload `files` (entry path -> local file) under a writer-private directory, then the manifest. Each
        file is streamed and hashed as it goes (never read whole)."""
        writer = uuid.uuid4().hex[:12]
        base = self._dir(key)
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

    def _put(self, key: str, base: str, writer: str, files: dict[str, Path], metrics: dict) -> None:
        self.fs.makedirs(f"{base}/{writer}", exist_ok=True)
        stored = {}
        for name, path in files.items():
            rel = f"{writer}/{name}"
            if "/" in name:
                self.fs.makedirs(f"{base}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
            digest, size = hashlib.sha256(), 0
            with open(path, "rb") as src, self.fs.open(f"{base}/{rel}", "wb") as f:
                for chunk in iter(lambda: src.read(CHUNK), b""):
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
            self.fs.rm(self._dir(key), recursive=True)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ maintenance

    def keys(self) -> list[str]:
        out = []
        for prefix in self.fs.ls(self.root, detail=False):
            for entry in self.fs.ls(prefix, detail=False):
                out.append(entry.rstrip("/").rsplit("/", 1)[-1])
        return sorted(k for k in out if len(k) == 40)

    def stats(self) -> dict:
        keys = self.keys()
        total = 0
        for k in keys:
            m = self._read_manifest(k)
            if manifest_problem(k, m) is None:
                total += sum(f["size"] for f in m["files"].values())
        return {"url": self.url, "entries": len(keys), "bytes": total,
                "debris_bytes": sum(size for _, size in self.debris(grace_s=0.0))}

    def verify(self) -> tuple[int, list[str]]:
        """Check every entry's files against its manifest (and its MAC, with a team key); discard and return
        the bad ones; remove killed writers' debris."""
        bad = []
        keys = self.keys()
        for k in keys:
            m = self._read_manifest(k)
            ok = manifest_problem(k, m) is None and self.trusted(k, m) \
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
            base = self._dir(k)
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
                if not self.fs.ls(self._dir(k), detail=False):
                    self.fs.rmdir(self._dir(k))
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
                if len(name) == 40 and self.fs.isdir(entry):
                    out.append(name)
        return sorted(out)

    def _size(self, info: dict) -> int:
        if info.get("type") == "directory":
            return sum(self.fs.du(info["name"], total=False).values()) if self.fs.exists(info["name"]) else 0
        return int(info.get("size") or 0)

    def _open_entry_file(self, key: str, info: dict):
        """An entry file opened for reading, None if absent or, on a local cache, if a symlink leads out of the
        entry's directory (a planted link would read the builder's files)."""
        path = f"{self._dir(key)}/{info['path']}"
        if "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)):
            entry = os.path.realpath(self._dir(key))
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


def _matches(src, info: dict, sink=None) -> bool:
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


def parse_age(text: str) -> float:
    """'30d', '12h', '45m', '90s' -> seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if not text or text[-1] not in units or not text[:-1].isdigit():
        raise InputError(f"age '{text}' must be a number followed by d, h, m or s (e.g. 30d)")
    return int(text[:-1]) * units[text[-1]]
