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
directory; whichever manifest lands last wins, and both are complete.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import fsspec

from npubuild.fileio import atomic_path, file_hash, stable_hash

MANIFEST = "manifest.json"


def cache_key(config: dict, inputs: dict[str, Path], hashes: dict[str, str] | None = None) -> str:
    """The full key: resolved config + content of every input file (`hashes`: their sha256, if known)."""
    hashes = hashes if hashes is not None else {k: file_hash(p) for k, p in inputs.items()}
    return stable_hash({"config": config, "inputs": {k: hashes[k] for k in sorted(inputs)}}, 40)


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
    debug-numerics, plain doit): `url` (--cache), else $NPUBUILD_CACHE, else default_cache_dir; 'off': none."""
    url = url or os.environ.get("NPUBUILD_CACHE") or str(default_cache_dir(build_dir))
    return None if url == "off" else url


@dataclass
class CacheEntry:
    key: str
    files: dict[str, dict]  # output name -> {"path": relative path, "sha256", "size"}
    metrics: dict
    created: float


class StageCache:
    """Get and put stage outputs by key; `url` is a directory path or an fsspec URL."""

    def __init__(self, url: str | os.PathLike):
        self.url = str(url)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.fs.makedirs(self.root, exist_ok=True)

    def _dir(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}"

    def _read_manifest(self, key: str) -> dict | None:
        path = f"{self._dir(key)}/{MANIFEST}"
        try:
            with self.fs.open(path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable manifest: treat as corrupt

    def get(self, key: str, dest: Path, required: set[str]) -> CacheEntry | None:
        """Restore a verified entry's files into `dest` (each atomically); None on a miss or a bad entry.

        `required` are file names the entry must hold (the task's declared outputs).
        """
        manifest = self._read_manifest(key)
        if manifest is None:
            return None
        if not manifest or not required <= set(manifest.get("files", {})):
            self.discard(key)
            return None
        staged: list[tuple[Path, bytes]] = []
        for name, info in manifest["files"].items():
            try:
                with self.fs.open(f"{self._dir(key)}/{info['path']}", "rb") as f:
                    data = f.read()
            except (FileNotFoundError, OSError):
                self.discard(key)
                return None
            if len(data) != info["size"] or _sha256(data) != info["sha256"]:
                self.discard(key)
                return None
            staged.append((dest / name, data))
        for path, data in staged:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
        return CacheEntry(key, manifest["files"], manifest.get("metrics", {}), manifest.get("created", 0.0))

    def put(self, key: str, src: Path, metrics: dict, exclude: set[str]) -> None:
        """Upload every file of `src` (but `exclude`) under a writer-private directory, then the manifest."""
        writer = uuid.uuid4().hex[:12]
        base = self._dir(key)
        self.fs.makedirs(f"{base}/{writer}", exist_ok=True)
        files = {}
        for path in sorted(src.rglob("*")):  # subdirectories too (the vela stage's raw/ and firmware/)
            name = path.relative_to(src).as_posix()
            if not path.is_file() or any(part.startswith(".") for part in name.split("/")) or name in exclude:
                continue
            data = path.read_bytes()
            rel = f"{writer}/{name}"
            if "/" in name:
                self.fs.makedirs(f"{base}/{rel.rsplit('/', 1)[0]}", exist_ok=True)
            with self.fs.open(f"{base}/{rel}", "wb") as f:
                f.write(data)
            files[name] = {"path": rel, "sha256": _sha256(data), "size": len(data)}
        manifest = json.dumps({"key": key, "files": files, "metrics": metrics, "created": time.time(),
                               "writer": writer}).encode()
        tmp = f"{base}/.{MANIFEST}.{writer}"
        with self.fs.open(tmp, "wb") as f:
            f.write(manifest)
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
            m = self._read_manifest(k) or {}
            total += sum(f["size"] for f in m.get("files", {}).values())
        return {"url": self.url, "entries": len(keys), "bytes": total}

    def verify(self) -> tuple[int, list[str]]:
        """Check every entry's files against its manifest; discard and return the bad ones."""
        bad = []
        keys = self.keys()
        for k in keys:
            m = self._read_manifest(k)
            ok = bool(m) and all(self._file_ok(k, info) for info in m.get("files", {}).values())
            if not ok:
                bad.append(k)
                self.discard(k)
        return len(keys), bad

    def _file_ok(self, key: str, info: dict) -> bool:
        try:
            with self.fs.open(f"{self._dir(key)}/{info['path']}", "rb") as f:
                data = f.read()
        except (FileNotFoundError, OSError):
            return False
        return len(data) == info["size"] and _sha256(data) == info["sha256"]

    def prune(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        removed = 0
        for k in self.keys():
            m = self._read_manifest(k) or {}
            if m.get("created", 0.0) < cutoff:
                self.discard(k)
                removed += 1
        return removed


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def parse_age(text: str) -> float:
    """'30d', '12h', '45m', '90s' -> seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if not text or text[-1] not in units or not text[:-1].isdigit():
        from npubuild.errors import InputError

        raise InputError(f"age '{text}' must be a number followed by d, h, m or s (e.g. 30d)")
    return int(text[:-1]) * units[text[-1]]
