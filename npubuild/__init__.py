"""npubuild: a declarative, cached build system from ONNX models to Arm Ethos-U NPUs."""

from npubuild import deferred_imports

__version__ = "0.1.0"

deferred_imports.defer()  # before anything imports onnx_ir: sympy only when used (deferred_imports.py says why)
