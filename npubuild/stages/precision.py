"""precision stage: 16-bit activations and 4-bit weights on the int8 QDQ model, fixed by the spec or chosen by
measurement (frontend/precision/). Only builds whose `quantization` asks for a precision other than 8x8 have
it; the lower stage then lowers its model instead of the quantize stage's. One task per model, for the NPU
families of every build sharing it (what reads int16 differs per family) and, for `precision: auto`, every
target (the search weighs Vela's estimate on each and holds the slowdown on each)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import Calibration, Quantization, TargetProfile, VelaOptions
from npubuild.engine.stage import Chain, Stage, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build
    from npubuild.engine.plan import StageTask


@dataclass(frozen=True)
class PrecisionConfig:
    """The task's config (its key): the quantize task's key, the precision settings, the calibration, the
    pipeline's passes (the search lowers as the build does), and merged over the builds sharing it
    (TaskSpec.union) their families and, for `auto`, their targets with Vela options."""

    quantize_key: str
    quantization: Quantization
    calibration: Calibration
    passes: tuple[str, ...]
    families: tuple[str, ...] = ()
    targets: tuple[tuple[TargetProfile, VelaOptions], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Without `families` and `targets`: the plan writes their union over the builds."""
        return {"quantize": self.quantize_key, "quantization": self.quantization.model_dump(),
                "calibration": self.calibration.model_dump(), "passes": list(self.passes)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PrecisionConfig:
        targets = tuple((TargetProfile.model_validate(t["target"]), VelaOptions.model_validate(t["vela"]))
                        for t in d.get("targets", ()))
        return cls(d["quantize"], Quantization.model_validate(d["quantization"]),
                   Calibration.model_validate(d["calibration"]), tuple(d["passes"]), tuple(d.get("families", ())),
                   targets)


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    q = b.spec.quantization
    if b.pipeline.profile != "int" or not q.mixed:
        return None
    quantize, imp = chain["quantize"], chain["import"]
    inputs = {"float": imp.outputs["onnx"], "int8": quantize.outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    config = PrecisionConfig(quantize.key, q, b.model.calibration, tuple(b.pipeline.passes))
    own = (Accelerator.parse(b.target.accelerator).lowering_family,)
    union: dict[str, tuple[Any, ...]] = {"families": b.spec_families or own}
    if q.precision == "auto":
        union["targets"] = ({"target": b.target.model_dump(), "vela": b.vela.model_dump()},)
    return TaskSpec(b.model_name, config.to_json(), inputs, {"onnx": "model_qdq.onnx", "plan": "precision.json"},
                    ("quantize",), union=union)


def run(task: StageTask) -> dict:
    from npubuild.frontend.precision.choose import precision_stage

    config = PrecisionConfig.from_json(task.config)
    cost, host_ops = None, None
    if config.quantization.precision == "auto":
        from npubuild.deploy.host_ops import HOST_OPS
        from npubuild.ethosu.cost import vela_cost

        def cost(model):  # Vela's estimate of a candidate on every target, in the task's own directory
            return {t.name: vela_cost(model, config.passes, t, v, task.dir) for t, v in config.targets}

        if any(t.host.kind == "cortex-m" for t, _ in config.targets):  # TensorFlow Lite Micro's builtins only
            host_ops = frozenset(HOST_OPS)
    return precision_stage(task.inputs["float"], task.inputs["int8"], config.quantization, config.calibration,
                           task.inputs.get("calibration"), config.families, cost, task.outputs["onnx"],
                           task.outputs["plan"], host_ops)


STAGE = Stage("precision", __name__, "npubuild.frontend.precision.choose",
              ("onnx", "onnxruntime", "onnx-ir", "tosa-tools", "ethos-u-vela"), plan, run,
              preload=("numpy.random",))
