"""The shared stage cache: a task's outputs kept by its full cache key, between build dirs, machines and nights.

An entry is addressed by the stage's full cache key (cache_key): its resolved config (which embeds tool
versions) plus the sha256 of every input file. The entries live in a store (npubuild/store.py: the layout,
the manifest checked on every read, writes that land whole, the sweep after killed writers) under the cache
root, a local directory or any fsspec URL; what is the engine's own is here: the key, where the cache is
(resolve_cache), the stage dir's records an entry never holds (RESERVED), and who is trusted.

Trust: the sha256s catch accidents, not an adversary, since whoever can write to the cache can replace a file
and its manifest together. With a team key (`$NPUBUILD_CACHE_KEY`, or a file named by
`$NPUBUILD_CACHE_KEY_FILE`) every manifest carries an HMAC-SHA256 over all of it (the cache key, every file's
sha256 and size, the metrics), and a build restores only entries whose MAC verifies under its key: write
access to the storage alone can no longer plant an entry. The key is never written to the cache, a build dir
or a report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from npubuild.engine.notice import warn
from npubuild.errors import InputError
from npubuild.fileio import file_hash, stable_hash
from npubuild.store import LocalFiles, Store

KEY_ENV, KEY_FILE_ENV = "NPUBUILD_CACHE_KEY", "NPUBUILD_CACHE_KEY_FILE"
UNKEYED_ENV = "NPUBUILD_CACHE_UNKEYED"  # =1: a URL cache used without a key, every writer trusted (require_trust)
RESERVED = frozenset({"stage.json", "inputs.json", "error.json"})  # a stage dir's own records: never restored


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


def url_to_fs(url: str) -> tuple[Any, str]:
    """The file system and root of a cache URL: LocalFiles for an absolute local path (as fsspec would give it:
    the path without trailing slashes), else fsspec's own."""
    if url.startswith("/") and "::" not in url:
        return LocalFiles(), url.rstrip("/") or "/"
    import fsspec

    return fsspec.core.url_to_fs(url)


class StageCache(Store):
    """Get and put stage outputs by key; `url` is a directory path or an fsspec URL. The team key is taken from
    the environment unless given (or `use_env_key` is False); a bad entry met is one warning line."""

    reserved = RESERVED

    def __init__(self, url: str | os.PathLike, key: bytes | None = None, use_env_key: bool = True):
        self.url = str(url)
        fs, root = url_to_fs(self.url)
        super().__init__(root, fs, key if key is not None or not use_env_key else team_key())

    def warn(self, text: str) -> None:
        warn(text)

    def stats(self) -> dict:
        return {"url": self.url, **super().stats()}


def parse_age(text: str) -> float:
    """'30d', '12h', '45m', '90s' -> seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if not text or text[-1] not in units or not text[:-1].isdigit():
        raise InputError(f"age '{text}' must be a number followed by d, h, m or s (e.g. 30d)")
    return int(text[:-1]) * units[text[-1]]
