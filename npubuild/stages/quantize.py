"""quantize stage: onnxruntime static int8 quantisation to a QDQ model (frontend/quantize.py); INT pipelines only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.schema import Calibration, Quantization
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec
from npubuild.frontend.samples import SampleSource

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class QuantizeConfig:
    """The quantize task's config (its key): the import task's key, the spec's quantisation and calibration, and
    the calibration rows held back for verification (frontend/samples.py; only a `held-back` source has any),
    and the model's fed-back state (output -> input: frontend/qdq_feedback.py)."""

    import_key: str
    quantization: Quantization
    calibration: Calibration
    held_back: SampleSource | None = None
    feedback: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = {"import": self.import_key, "quantization": self.quantization.recipe(),
             "calibration": self.calibration.model_dump()}
        if self.held_back is not None:  # absent otherwise: a build without held-back rows keeps its key
            d["held_back"] = self.held_back.to_json()
        if self.feedback:  # likewise: a model without a fed-back state keeps its key
            d["feedback"] = [list(p) for p in self.feedback]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> QuantizeConfig:
        return cls(d["import"], Quantization.model_validate(d["quantization"]),
                   Calibration.model_validate(d["calibration"]),
                   SampleSource.from_json(d["held_back"]) if d.get("held_back") else None,
                   tuple((o, i) for o, i in d.get("feedback", ())))


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":  # an FP build lowers the float model itself
        return None
    imp = chain["import"]
    inputs = {"float": imp.outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    source = SampleSource.of(b)
    config = QuantizeConfig(imp.key, b.spec.quantization, b.model.calibration,
                            source if source.kind == "held-back" else None, tuple(b.model.feedback.items()))
    deps = ("import", "early-fit") if "early-fit" in chain else ("import",)  # no quantising a model that cannot fit
    return TaskSpec(b.model_name, config.to_json(), inputs, {"onnx": "model_qdq.onnx"}, deps)


def run(task: StageTask) -> dict:
    from npubuild.frontend.quantize import quantize_model

    config = QuantizeConfig.from_json(task.config)
    return quantize_model(task.inputs["float"], config.quantization, config.calibration,
                          task.inputs.get("calibration"), task.outputs["onnx"], config.held_back,
                          dict(config.feedback))


STAGE = Stage("quantize", __name__, "npubuild.frontend.quantize", ("onnx", "onnxruntime"), plan, run,
              preload=("numpy.random",))  # the calibration data
