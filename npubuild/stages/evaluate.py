"""evaluate stage: the spec's `evaluate:` metric, what a target deploys against the float model on real inputs
(verify/evaluate.py). One task per target where the build has a vela stage (its deployable on the virtual
device); one per model and lowering family where it has none (the family's TOSA graph, shared by its targets)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import Evaluate
from npubuild.engine.stage import Chain, Stage, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build
    from npubuild.engine.stage import StageTask


@dataclass(frozen=True)
class EvaluateConfig:
    """The evaluate task's config (its key): the lower task's key, the spec's evaluation, the family whose graph
    runs, and what runs it (virtual-device: with the vela task's key, whose deployable it runs)."""

    lower_key: str
    evaluate: Evaluate
    family: str
    engine: Literal["tosa-reference", "virtual-device"]
    vela_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"lower": self.lower_key, "evaluate": self.evaluate.model_dump(), "family": self.family,
             "engine": self.engine}
        if self.vela_key is not None:
            d["vela"] = self.vela_key
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvaluateConfig:
        return cls(d["lower"], Evaluate.model_validate(d["evaluate"]), d["family"], d["engine"], d.get("vela"))


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    ev = b.model.evaluation_spec
    if ev is None or b.evaluation is None or "lower" not in chain:
        return None
    lower = chain["lower"]
    family = Accelerator.parse(b.target.accelerator).lowering_family
    inputs = {"float": chain["import"].outputs["onnx"], "io": lower.outputs["io"], "eval_inputs": b.evaluation.inputs}
    if b.evaluation.labels is not None:
        inputs["eval_labels"] = b.evaluation.labels
    if b.evaluation.metric_module is not None:
        inputs["metric_module"] = b.evaluation.metric_module
    qdq = chain.get("precision") or chain.get("quantize")  # the QDQ model the deployed graph is built from
    if qdq is not None:
        inputs["qdq"] = qdq.outputs["onnx"]
    config = EvaluateConfig(lower.key, ev, family, "tosa-reference")
    deps: tuple[str, ...] = ("lower",)
    label = f"{b.model_name}-{family}"
    if "vela" in chain:  # the build's deployable, on the virtual device
        vela = chain["vela"]
        inputs["vela"] = vela.outputs["summary"]
        config = EvaluateConfig(lower.key, ev, family, "virtual-device", vela.key)
        deps, label = ("lower", "vela"), f"{b.model_name}-{b.target.name}"
    return TaskSpec(label, config.to_json(), inputs, {"result": "evaluate.json"}, deps)


def run(task: StageTask) -> dict:
    from npubuild.verify.evaluate import EvalFiles, evaluate_build

    config = EvaluateConfig.from_json(task.config)
    i = task.inputs
    files = EvalFiles(i["float"], i["io"], i["eval_inputs"], i.get("eval_labels"), i.get("qdq"), i.get("vela"),
                      i.get("metric_module"))
    return evaluate_build(files, config.evaluate, config.family, task.outputs["result"])


STAGE = Stage("evaluate", __name__, "npubuild.verify.evaluate", ("onnx", "onnxruntime", "tosa-tools"), plan, run,
              preload=("tosa_reference_model",))
