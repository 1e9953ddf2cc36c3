"""CLI subcommands: each module here has `register(subparsers)`; cli.py loads them all.

Add a command by adding a module; no central list to edit.
"""

from __future__ import annotations

import importlib
import pkgutil


def register_all(sub) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}").register(sub)
