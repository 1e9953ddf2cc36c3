"""Versions of npubuild and the tools each stage calls: part of every stage's cache key.

npubuild's own version includes a fingerprint of the source a stage runs (the
stage module and everything in npubuild it imports, directly or lazily), so
editing the lowering re-runs lower and what follows it, but not import or
quantize, and two machines with the same code share cache entries.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import metadata
from pathlib import Path

from npubuild.version import __version__

DISTRIBUTIONS = {
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnx-ir": "onnx-ir",
    "tosa-tools": "tosa-tools",
    "ethos-u-vela": "ethos-u-vela",
    "numpy": "numpy",
}
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Packages that import their modules dynamically (registries): using any part pulls in all of it.
REGISTRY_PACKAGES = ("npubuild.lowering.ops", "npubuild.frontend.passes")
# Orchestration, not computation: stage implementations import these for types and plumbing only, and a
# change there (a new stage in the plan, a new executor) must not invalidate every cached result: the
# npubuild.engine package, the stage registry (npubuild.stages itself; npubuild.records is the contract), and the
# worker pool (npubuild.fanout: the same results in process or over workers).
ORCHESTRATION = frozenset({"npubuild", "npubuild.stages", "npubuild.fanout"})
ORCHESTRATION_PACKAGE = "npubuild.engine"


def _orchestration(name: str) -> bool:
    return name in ORCHESTRATION or name == ORCHESTRATION_PACKAGE or name.startswith(ORCHESTRATION_PACKAGE + ".")


@functools.cache
def tool_version(tool: str) -> str:
    if tool == "npubuild":
        return __version__
    try:
        return metadata.version(DISTRIBUTIONS.get(tool, tool))
    except metadata.PackageNotFoundError:
        return "missing"


@functools.cache
def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    if not parts:
        return PACKAGE_ROOT / "__init__.py"
    rel = Path(*parts)
    for candidate in (PACKAGE_ROOT / rel.with_suffix(".py"), PACKAGE_ROOT / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# a module-level `if TYPE_CHECKING:` block: imports for type hints only, which never run (a stage module's
# plan-time types, e.g. config.load's Build, are not what its tasks compute)
_TYPE_ONLY_RE = re.compile(r"^if TYPE_CHECKING:[ \t]*\n(?:[ \t]+.*\n|[ \t]*\n)*", re.MULTILINE)
# `from npubuild.x import a, b` (or a parenthesised list) / `import npubuild.x`, at any indentation
_IMPORT_RE = re.compile(r"^[ \t]*(?:from[ \t]+(npubuild[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)"
                        r"|import[ \t]+(npubuild[\w.]*))", re.MULTILINE)


@functools.cache
def _imports(path: Path) -> frozenset[str]:
    """npubuild modules a file imports anywhere (top level or inside functions), but for type hints only.

    A line scan rather than ast: parsing every module made planning cost a second on each build (the
    no-op rebuild's largest part). An import-like line inside a string only adds a dependency (safe).
    """
    names: set[str] = set()
    for m in _IMPORT_RE.finditer(_TYPE_ONLY_RE.sub("", path.read_text(encoding="utf-8"))):
        if m.group(3):
            names.add(m.group(3))
            continue
        module = m.group(1)
        names.add(module)
        for part in m.group(2).strip().strip("()").replace("\\\n", " ").split(","):
            part = part.split("#")[0].strip()
            if part:
                names.add(f"{module}.{part.split()[0]}")
    return frozenset(names)


def _closure(module: str) -> list[Path]:
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a module's parent packages run too
            prefix = ".".join(parts[:i])
            if _orchestration(prefix) and prefix != module:
                continue
            f = _module_file(prefix)
            if f is None or f in seen:
                continue
            seen.add(f)
            todo.extend(_imports(f))
            if prefix in REGISTRY_PACKAGES:
                pkg_dir = f.parent
                todo.extend(f"{prefix}.{p.stem}" for p in pkg_dir.glob("*.py") if p.stem != "__init__")
    return sorted(seen)


@functools.cache
def source_fingerprint(module: str) -> str:
    h = hashlib.sha256()
    for f in _closure(module):
        h.update(str(f.relative_to(PACKAGE_ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:10]


def versions(tools: tuple[str, ...], stage_module: str | None = None) -> dict[str, str]:
    """Versions for a stage's cache key; `stage_module` adds the fingerprint of the code it runs."""
    out = {t: tool_version(t) for t in ("npubuild", *tools)}
    if stage_module is not None:
        out["npubuild"] = f"{out['npubuild']}+{source_fingerprint(stage_module)}"
    return out


def all_versions() -> dict[str, str]:
    return versions(tuple(DISTRIBUTIONS))
