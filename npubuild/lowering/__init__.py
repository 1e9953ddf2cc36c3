"""ONNX -> TOSA 1.0 lowering: a driver walking the graph and one module per op family."""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    """Import every ops_* module so that their @lowers registrations run."""
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("ops_"):
            importlib.import_module(f"{__name__}.{info.name}")
