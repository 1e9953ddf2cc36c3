"""Atomic file output and content hashing: an interrupted stage never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from itertools import repeat
from json.encoder import INFINITY
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file (mkstemp gives 0600)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it over `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, FILE_MODE)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    write_text(path, dumps_indented(obj) + "\n")


def dumps_indented(obj: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`json.dumps(obj, indent=2, default=...)` to the byte (default: numpy values and paths as JSON), ~1.7x
    faster: one recursive call per container instead of the standard library's generator per value. A
    MobileViT-xxs build's records carry Vela's 11616 layers (~10 MB of JSON), written five or six times."""
    out: list[str] = []
    app = out.append
    fallback = default or _json_default

    def enc(o: Any, ind: str) -> None:
        t = type(o)
        if t is str:
            app(_json_str(o))
        elif o is None or t is bool:
            app("true" if o is True else "false" if o is False else "null")
        elif isinstance(o, (dict, list, tuple)):
            is_dict = isinstance(o, dict)
            if not o:
                app("{}" if is_dict else "[]")
                return
            inner = ind + "  "
            keys = [(_json_str(k) if type(k) is str else _json_key(k)) + ": " for k in o] if is_dict else repeat("")
            sep = ("{" if is_dict else "[") + inner
            for key, v in zip(keys, o.values() if is_dict else o, strict=False):  # repeat("") for a list
                head = sep + key
                tv = type(v)  # the common leaves inline: one call per container, not per value
                if tv is str:
                    app(head + _json_str(v))
                elif tv is int:
                    app(head + int.__repr__(v))
                elif tv is float:
                    app(head + _json_float(v))
                else:
                    app(head)
                    enc(v, inner)
                sep = "," + inner
            app(ind + ("}" if is_dict else "]"))
        elif isinstance(o, str):
            app(_json_str(o))
        elif isinstance(o, int):
            app(int.__repr__(o))
        elif isinstance(o, float):
            app(_json_float(o))
        else:
            enc(fallback(o), ind)

    enc(obj, "\n")
    return "".join(out)


def _json_float(o: float) -> str:
    """As json.dumps writes a float (allow_nan)."""
    if o != o:
        return "NaN"
    if o == INFINITY:
        return "Infinity"
    if o == -INFINITY:
        return "-Infinity"
    return float.__repr__(o)


def _json_key(k: Any) -> str:
    """A dict key as json.dumps writes it (skipkeys off)."""
    if isinstance(k, str):
        return _json_str(k)
    if isinstance(k, float):
        return _json_str(_json_float(k))
    if k is True or k is False or k is None:
        return '"true"' if k is True else '"false"' if k is False else '"null"'
    if isinstance(k, int):
        return _json_str(int.__repr__(k))
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def stable_hash(obj: Any, length: int = 10) -> str:
    """A short hash of a JSON-able object, independent of dict order."""
    text = json.dumps(obj, sort_keys=True, default=_json_default, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
