"""Versions of npubuild and the tools each stage calls: part of every stage's cache key.

npubuild's own version includes a fingerprint of the source a stage runs (the
stage module and everything in npubuild it imports, directly or lazily), so
editing the lowering re-runs lower and what follows it, but not import or
quantize, and two machines with the same code share cache entries.
"""

from __future__ import annotations

import functools
import hashlib
import os
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
def _module_files() -> dict[str, Path]:
    """Every npubuild module's name -> its file (a package's __init__.py; a module file before a package of the
    same name, as `_module_file` looks), found in one walk of the source tree."""
    found: dict[str, Path] = {}
    packages: dict[str, Path] = {}
    for folder, dirs, files in os.walk(PACKAGE_ROOT):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, PACKAGE_ROOT)
        base = "npubuild" if rel == "." else "npubuild." + rel.replace(os.sep, ".")
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(folder, name)
            if name == "__init__.py":
                packages[base] = path
            else:
                found[f"{base}.{name[:-3]}"] = path
    return {**packages, **found}


def _module_file(name: str) -> Path | None:
    return _module_files().get(name)


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
    text = path.read_text(encoding="utf-8")
    if "if TYPE_CHECKING:" in text:  # the substitution scans every line: most files have no such block
        text = _TYPE_ONLY_RE.sub("", text)
    for m in _IMPORT_RE.finditer(text):
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


def _closure_by_name(module: str) -> list[Path]:
    """The files `module` runs: walked name by name (what `_closure` computes, the reference it is tested
    against, and the walk for a root inside the orchestration, which `_file_deps` leaves out)."""
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
def _name_files(name: str) -> tuple[Path, ...]:
    """The files a reference to `name` runs itself: its own and its parent packages', outside the
    orchestration."""
    parts = name.split(".")
    out = []
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if not _orchestration(prefix):
            f = _module_file(prefix)
            if f is not None:
                out.append(f)
    return tuple(out)


@functools.cache
def _file_deps(f: Path) -> frozenset[Path]:
    """The files one file makes run directly: what it imports (with their packages), and, for a registry
    package's __init__, every module of the package."""
    deps = {d for name in _imports(f) for d in _name_files(name)}
    if f.name == "__init__.py" and f.parent != PACKAGE_ROOT:
        package = "npubuild." + ".".join(f.parent.relative_to(PACKAGE_ROOT).parts)
        if package in REGISTRY_PACKAGES:
            deps.update(d for p in f.parent.glob("*.py") if p.stem != "__init__" for d in _name_files(f"{package}.{p.stem}"))
    return frozenset(deps)


def _closure(module: str) -> list[Path]:
    """The files `module` runs (it, its packages and what they import, transitively; the orchestration left
    out): the same set as the name-by-name walk (`_closure_by_name`), walked over files whose direct
    dependencies are found once a process (`_file_deps`), not once a stage (the walk was a planning cost)."""
    if _orchestration(module):
        return _closure_by_name(module)
    seen: set[Path] = set()
    todo = list(_name_files(module))
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(_file_deps(f))
    return sorted(seen)


@functools.cache
def _source(f: Path) -> tuple[bytes, bytes]:
    """A source file's path in the package and its bytes, read once a process: the stages' closures share most
    of their files."""
    return str(f.relative_to(PACKAGE_ROOT)).encode(), f.read_bytes()


@functools.cache
def source_fingerprint(module: str) -> str:
    h = hashlib.sha256()
    for f in _closure(module):
        for part in _source(f):
            h.update(part)
    return h.hexdigest()[:10]


def versions(tools: tuple[str, ...], stage_module: str | None = None) -> dict[str, str]:
    """Versions for a stage's cache key; `stage_module` adds the fingerprint of the code it runs."""
    out = {t: tool_version(t) for t in ("npubuild", *tools)}
    if stage_module is not None:
        out["npubuild"] = f"{out['npubuild']}+{source_fingerprint(stage_module)}"
    return out


def all_versions() -> dict[str, str]:
    return versions(tuple(DISTRIBUTIONS))
