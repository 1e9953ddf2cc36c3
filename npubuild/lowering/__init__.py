"""ONNX -> TOSA 1.0 lowering: a driver walking the graph and one module per op family (lowering/ops/).

The rest of this package is what those modules share: the context (layout and quantisation per tensor),
the registry, the options a family's lowering takes, and the emit helpers.
"""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    """Import every op module so that their @lowers registrations run."""
    from npubuild.lowering import ops

    for info in pkgutil.iter_modules(ops.__path__):
        importlib.import_module(f"{ops.__name__}.{info.name}")
