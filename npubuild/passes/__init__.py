"""Graph passes on ONNX models (onnx-ir pass classes), selected by name from pipelines.

Each pass module registers its class with `@register("name")`. The import
stage runs a fixed normalisation list; a pipeline's `passes:` list runs at the
lower stage, before lowering.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import onnx_ir as ir

from npubuild.errors import InputError, Location

PASSES: dict[str, type[ir.passes.PassBase]] = {}


def register(name: str) -> Callable[[type[ir.passes.PassBase]], type[ir.passes.PassBase]]:
    def add(cls: type[ir.passes.PassBase]) -> type[ir.passes.PassBase]:
        if name in PASSES:
            raise RuntimeError(f"pass '{name}' registered twice")
        cls.pass_name = name
        PASSES[name] = cls
        return cls

    return add


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def check_pass_names(pipeline, where: Location) -> None:
    load_all()
    for name in pipeline.passes:
        if name not in PASSES:
            known = ", ".join(sorted(PASSES))
            raise InputError(f"pipeline '{pipeline.name}': unknown pass '{name}' (known: {known})", where)


def run_passes(model: ir.Model, names: list[str]) -> ir.Model:
    load_all()
    manager = ir.passes.PassManager([PASSES[n]() for n in names])
    return manager(model).model
