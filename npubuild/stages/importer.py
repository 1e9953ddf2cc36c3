"""import stage: the user's model file, checked and normalised (frontend/normalise.py) into model.onnx.

The model is untrusted input parsed by native code: a crash in the stage's child is the model's doing (bad
input, exit 2, naming the file), and the external data beside it is part of the task's inputs (companions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class ImportConfig:
    """The import task's config (its key): the model file and the input shapes the spec gives it."""

    model: str  # relative to the project root (absolute outside it): the key does not move with the checkout
    input_shapes: Mapping[str, list[int]]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "input_shapes": dict(self.input_shapes)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ImportConfig:
        return cls(d["model"], d["input_shapes"])


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path.resolve())


def plan(b: Build, chain: Chain) -> TaskSpec:
    config = ImportConfig(_rel(b.model_path, b.project_root), b.model.input_shapes)
    return TaskSpec(b.model_name, config.to_json(), {"model": b.model_path}, {"onnx": "model.onnx"}, ())


def run(task: StageTask) -> dict:
    from npubuild.frontend.normalise import import_model

    config = ImportConfig.from_json(task.config)
    return import_model(task.inputs["model"], dict(config.input_shapes), task.outputs["onnx"])


def external_data(model: Path) -> dict[str, Path]:
    """The external-data files the model names beside it (frontend/external_data.py): the task's companions."""
    from npubuild.frontend.external_data import external_data_files

    return external_data_files(model)


STAGE = Stage("import", __name__, "npubuild.frontend.normalise", ("onnx", "onnx-ir"), plan, run,
              untrusted_input="model", companions={"model": external_data},
              preload=("onnxruntime", "npubuild.frontend.passes:load_all"))  # the host check; the passes
