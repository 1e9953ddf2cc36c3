"""Versions of npubuild and the tools each stage calls: part of every stage's cache key."""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

import npubuild

DISTRIBUTIONS = {
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnx-ir": "onnx-ir",
    "tosa-tools": "tosa-tools",
    "ethos-u-vela": "ethos-u-vela",
    "numpy": "numpy",
}


@functools.cache
def source_fingerprint() -> str:
    """Hash of npubuild's own source: a code change (not only a release) invalidates cached stages."""
    h = hashlib.sha256()
    root = Path(npubuild.__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


@functools.cache
def tool_version(tool: str) -> str:
    if tool == "npubuild":
        return f"{npubuild.__version__}+{source_fingerprint()}"
    try:
        return metadata.version(DISTRIBUTIONS.get(tool, tool))
    except metadata.PackageNotFoundError:
        return "missing"


def versions(tools: tuple[str, ...]) -> dict[str, str]:
    return {t: tool_version(t) for t in ("npubuild", *tools)}


def all_versions() -> dict[str, str]:
    return versions(tuple(DISTRIBUTIONS))
