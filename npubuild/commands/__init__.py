"""CLI subcommands: each module here has `register(subparsers)`; cli.py loads them all.

Add a command by adding a module; no central list to edit. The helpers below are the options several
commands share, so they read and default the same way everywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

BUILD_DIR_HELP = ("build directory (default: build/ in the project, the nearest directory up from here with a "
                  "dodo.py, pyproject.toml or .git)")
SPECS_HELP = "compile spec files or directories of them (default: the project's configs/)"


def register_all(sub) -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}").register(sub)


def add_build_dir(parser) -> None:
    parser.add_argument("--build-dir", metavar="DIR", help=BUILD_DIR_HELP)


def build_dir_of(args) -> Path:
    """--build-dir as given (relative to the cwd), else the project's build/."""
    from npubuild.config.load import default_build_dir

    return default_build_dir(args.build_dir)
