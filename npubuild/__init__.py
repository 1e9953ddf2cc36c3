"""npubuild: a declarative, cached build system from ONNX models to Arm Ethos-U NPUs."""

from npubuild import deferred_imports

__version__ = "0.1.0"

deferred_imports.defer()  # before anything imports onnx_ir: sympy only when used (deferred_imports.py says why)


def dodo_namespace(dodo_file: str) -> dict:
    """The whole body of a project's dodo.py: `globals().update(dodo_namespace(__file__))`.

    The stable entry for users' dodo.py files (the engine behind it may move); imported lazily so that
    `import npubuild` stays light. See npubuild.engine.doit_executor.dodo_namespace.
    """
    from npubuild.engine.doit_executor import dodo_namespace as namespace
    from npubuild.stages import STAGES

    return namespace(dodo_file, STAGES)
