"""Graph passes on ONNX models (onnx-ir pass classes), selected by name from pipelines.

Each pass module registers its class with `@register("name")`. The import
stage runs a fixed normalisation list; a pipeline's `passes:` list runs at the
lower stage, before lowering.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from npubuild.errors import InputError, Location

if TYPE_CHECKING:  # onnx-ir is imported where passes run: it takes ~0.7 s, too slow for checking a spec
    import onnx_ir as ir

PASSES: dict[str, type[ir.passes.PassBase]] = {}
HOST_REASON = "npubuild host reason: "  # a node's doc_string: why the import left it to run whole on the host
CONTROL_FLOW_RULE = "control-flow"  # the placement rule of such a node (an If or Loop the data decides)
KEPT_FLOAT = "the spec keeps its output in float (quantization.layers)"  # a host reason the precision stage gives
KEPT_FLOAT_RULE = "kept-float"  # the placement rule of such a node


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


_REGISTER_RE = re.compile(r"^@register\(\s*[\"']([^\"']+)[\"']\s*\)", re.MULTILINE)


def known_names() -> set[str]:
    """Registered pass names, read from the pass modules' `@register("name")` lines without importing them."""
    names = set(PASSES)
    for path in Path(__path__[0]).glob("*.py"):
        if not path.name.startswith("_"):
            names.update(_REGISTER_RE.findall(path.read_text(encoding="utf-8")))
    return names


def check_pass_names(pipeline, where: Location) -> None:
    names = known_names()
    for name in pipeline.passes:
        if name not in names:
            known = ", ".join(sorted(names))
            raise InputError(f"pipeline '{pipeline.name}': unknown pass '{name}' (known: {known})", where)


def run_passes(model: ir.Model, names: list[str]) -> ir.Model:
    import onnx_ir as ir

    if not names:  # a pipeline with no passes (onnx-ir's PassManager refuses an empty list)
        return model
    load_all()
    manager = ir.passes.PassManager([PASSES[n]() for n in names])
    return manager(model).model


def run_passes_modified(model: ir.Model, names: list[str]) -> ir.Model | None:
    """The passes `names` run on `model`; None if none of them changed it."""
    import onnx_ir as ir

    load_all()
    result = ir.passes.PassManager([PASSES[n]() for n in names])(model)
    return result.model if result.modified else None
