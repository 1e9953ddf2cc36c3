"""The engine's old import path, kept for one release: `npubuild.build.X` is `npubuild.engine.X`.

The package was renamed (a directory called build is ignored by common .gitignore files, skipped by
pytest and taken for output by tools). Importing anything here warns once and hands back the engine's
own module, the same object, so classes and module state are shared, never loaded twice; but for
`npubuild.build.doit_executor`, the module an older project's dodo.py imported `dodo_namespace(__file__)`
from: its `dodo_namespace` is npubuild.dodo_namespace (every other name is the engine's doit_executor's).
A project's dodo.py should say `from npubuild import dodo_namespace`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

OLD, NEW = "npubuild.build", "npubuild.engine"

warnings.warn(f"{OLD} is renamed {NEW} and this path goes in the next release; a dodo.py should say "
              "`from npubuild import dodo_namespace`", FutureWarning, stacklevel=2)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `npubuild.build.X` as the already imported (or now imported) `npubuild.engine.X`."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name[len(OLD):])
        if spec.name == OLD_DODO_MODULE:
            module = _old_dodo_module(module)
        spec.loader_state = module.__spec__  # the import system sets __spec__ to ours: exec puts the engine's back
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state


OLD_DODO_MODULE = f"{OLD}.doit_executor"


def _old_dodo_module(engine_module: ModuleType) -> ModuleType:
    """`npubuild.build.doit_executor` as an older dodo.py uses it: `dodo_namespace(__file__)` (the engine's
    one takes the stages now, so it left the engine); every other name is the engine module's."""
    import npubuild

    old = ModuleType(OLD_DODO_MODULE, engine_module.__doc__)
    old.__spec__ = engine_module.__spec__
    old.dodo_namespace = npubuild.dodo_namespace  # type: ignore[attr-defined]
    old.__getattr__ = lambda name: getattr(engine_module, name)  # type: ignore[method-assign]
    return old


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


def __getattr__(name: str) -> ModuleType:
    """`npubuild.build.session` as an attribute, as the old package's submodules were once imported."""
    try:
        return importlib.import_module(f"{OLD}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {OLD!r} has no attribute {name!r}") from None
