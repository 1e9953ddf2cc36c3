"""Keep sympy out of a build until something really uses it.

onnx_ir (the import stage's passes) imports sympy at module level (`onnx_ir._core`) and reads `sympy.Max` and
friends when `onnx_ir._symbolic_shapes` is imported, only to parse symbolic dimension expressions
(`SymbolicDim` arithmetic), which npubuild never asks for: its models have static shapes by the time the
passes run. Importing sympy is ~0.3 CPU s of a ~2 s cold compile (bench/compile_speed.md), so `defer()` puts a
stand-in module for each in `sys.modules`: the first attribute read from one imports the real module
(which then replaces the stand-in in `sys.modules`) and every read is forwarded to it, so code that does use
sympy behaves exactly as before, only its import happens later.

importlib.util.LazyLoader does not do here: on Python 3.11 the `import sympy` statement itself reads the lazy
module's `__spec__` and so loads it at once.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

# the modules deferred, in import order: a stand-in only for one that is not imported yet
DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")
_LOCK = threading.RLock()


class DeferredModule(types.ModuleType):
    """Stands in for module `name` in sys.modules until an attribute is read; then imports it and forwards."""

    def __init__(self, name: str, spec: importlib.machinery.ModuleSpec):
        super().__init__(name)
        self.__spec__ = spec  # what the import statement checks (`_initializing`) without loading it
        self.__dict__["_deferred_real"] = None

    def __getattr__(self, attr: str) -> Any:  # only called for what the stand-in itself does not have
        return getattr(self._deferred_load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._deferred_load())

    def _deferred_load(self) -> types.ModuleType:
        with _LOCK:
            real = self.__dict__["_deferred_real"]
            if real is None:
                if sys.modules.get(self.__name__) is self:
                    del sys.modules[self.__name__]
                real = importlib.import_module(self.__name__)
                self.__dict__["_deferred_real"] = real
            return real


def _spec_of(name: str) -> importlib.machinery.ModuleSpec | None:
    """The module's spec without importing it or its parent package (importing onnx_ir would load both)."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    parent_spec = _spec_of(parent)
    if parent_spec is None or not parent_spec.submodule_search_locations:
        return None
    return importlib.machinery.PathFinder.find_spec(name, list(parent_spec.submodule_search_locations))


def defer() -> None:
    """Install the stand-ins (once per process; a module already imported, or not installed, is left alone)."""
    with _LOCK:
        for name in DEFERRED:
            if name in sys.modules:
                continue
            spec = _spec_of(name)
            if spec is not None:
                sys.modules[name] = DeferredModule(name, spec)
