"""npubuild: a declarative, cached build system from ONNX models to Arm Ethos-U NPUs."""

__version__ = "0.1.0"
