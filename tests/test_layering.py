"""npubuild's packages in layers: each imports only from the layers below it, and no module takes part in an
import circle, counting the imports inside functions and those for type hints only (they are still a
dependency a reader has to follow).

The order is written down once, here (README's Layout describes it). A new package goes into a layer;
a package that needs one above it is a sign that the code is in the wrong place (move it down, or hand
the upper layer's work in from above, as the engine is handed its stages and its reporter).
"""

from __future__ import annotations

import ast
from pathlib import Path

import npubuild

PACKAGE = Path(npubuild.__file__).resolve().parent

# Bottom first. A unit is a package or a top-level module of npubuild (a subpackage only where it is its own
# layer). Units in one layer are siblings: neither imports the other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "deferred_imports", "longlived", "version", "suggest", "machine"),  # the ground: no npubuild imports
    ("fileio", "fanout"),  # files written whole; a stage's work over forked workers
    ("records", "store"),  # the typed records stages write and readers read; entries of files stored by content
    ("frontend.passes",),  # the onnx-ir passes pipelines name (config checks a pipeline's names against them)
    ("config",),  # specs, profiles, the accelerator facts, metrics and gates
    ("tosa", "models"),
    ("frontend",),  # ONNX -> ONNX
    ("lowering",),  # ONNX -> TOSA
    ("npusim",),
    ("deploy",),  # the deployable .tflite (host partitions as TFLite ops) and the virtual device running it
    ("verify",),
    ("ethosu", "engine"),  # the Ethos-U stage work; the task graph, which knows no stage
    ("report",),  # reads the engine's plan and outcome and the stages' records
    ("stages",),  # each stage's plan and run, over the domain packages and the engine
    ("advise",),  # the configuration sweep over the stages and its table, chart and page (npubuild advise)
    ("commands",),  # the command line's subcommands (and plain doit's, commands/build.py)
    ("cli", "npubuild"),  # the command line; the package's own entry (npubuild.dodo_namespace)
    ("__main__", "build"),  # `python -m npubuild`; the engine's old import path (one release)
)
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def module_files() -> dict[str, tuple[Path, bool]]:
    """npubuild module name -> (file, is a package's __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["npubuild", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


MODULES = module_files()


def _known(name: str) -> str | None:
    """The npubuild module `name` is, or is inside (`npubuild.x.f` for a function f of npubuild.x)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The npubuild modules `module` imports anywhere in its file: at the top, in functions, for type hints."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.update(m for m in map(_known, (n for n in names if n.split(".")[0] == "npubuild")) if m)
    found.discard(module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: its longest listed prefix below npubuild (the package's own
    __init__ is the unit `npubuild`)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER_OF:
            return ".".join(parts[:n])
    return "npubuild" if not parts else parts[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    unplaced = sorted({unit_of(m) for m in MODULES} - set(LAYER_OF))
    assert not unplaced, f"put these in LAYERS (tests/test_layering.py): {unplaced}"


def test_no_package_imports_one_above_it():
    upward = sorted(f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
                    if unit_of(t) != unit_of(m) and LAYER_OF.get(unit_of(t), -1) >= LAYER_OF.get(unit_of(m), -1))
    assert not upward, "imports of a layer above or beside (LAYERS in tests/test_layering.py):\n" + "\n".join(upward)


def test_no_import_circle():
    assert not cycles(GRAPH), cycles(GRAPH)


def test_the_checks_see_what_they_look_for():
    """The walk finds imports inside functions and under TYPE_CHECKING, relative ones, and circles."""
    assert "npubuild.config.load" in GRAPH["npubuild.stages.lower"]  # `if TYPE_CHECKING:` only
    assert "npubuild.stages" in GRAPH["npubuild.commands.build"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert unit_of("npubuild.frontend.passes.fold") == "frontend.passes" and unit_of("npubuild") == "npubuild"
