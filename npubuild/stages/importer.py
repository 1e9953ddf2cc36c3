"""import stage: the user's model file, checked and normalised (frontend/normalise.py) into model.onnx."""

from __future__ import annotations

from pathlib import Path

from npubuild.config.load import Build
from npubuild.engine.stage import Chain, Stage, TaskSpec, run_of


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path.resolve())


def plan(b: Build, chain: Chain) -> TaskSpec:
    return TaskSpec(b.model_name, {"model": _rel(b.model_path, b.project_root), "input_shapes": b.model.input_shapes},
                    {"model": b.model_path}, {"onnx": "model.onnx"}, ())


STAGE = Stage("import", "npubuild.frontend.normalise", ("onnx", "onnx-ir"), plan, run_of("npubuild.frontend.normalise"),
              preload=("onnxruntime", "npubuild.frontend.passes:load_all"))  # the host check; the passes
