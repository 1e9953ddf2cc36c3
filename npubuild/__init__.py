"""npubuild: a declarative, cached build system from ONNX models to Arm Ethos-U NPUs."""

from npubuild import deferred_imports
from npubuild.version import __version__

__all__ = ["__version__", "dodo_namespace"]

deferred_imports.defer()  # before anything imports onnx_ir: sympy only when used (deferred_imports.py says why)


def dodo_namespace(dodo_file: str) -> dict:
    """The whole body of a project's dodo.py: `globals().update(dodo_namespace(__file__))`.

    The stable entry for users' dodo.py files (what is behind it may move); imported lazily so that
    `import npubuild` stays light. See npubuild.commands.build.dodo_namespace.
    """
    from npubuild.commands.build import dodo_namespace as namespace

    return namespace(dodo_file)
