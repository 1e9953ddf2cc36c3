"""evaluate stage: the spec's `evaluate:` metric, the graph a target deploys against the float model on real
inputs (verify/evaluate.py). One task per model and lowering family where the TOSA reference model runs the
graph (targets of one family share it); one per target where npu-sim runs the target's raw artifact."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.accelerator import Accelerator
from npubuild.config.load import Build


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
    if "quantize" in chain:
        inputs["qdq"] = chain["quantize"].outputs["onnx"]
    config = {"lower": lower.key, "evaluate": ev.model_dump(), "family": family, "engine": "tosa-reference"}
    deps: tuple[str, ...] = ("lower",)
    label = f"{b.model_name}-{family}"
    if "vela" in chain and b.vela.output_format == "raw":  # the command stream itself, on npu-sim
        vela = chain["vela"]
        inputs["vela"] = vela.outputs["summary"]
        config.update(engine="npu-sim", vela=vela.key)
        deps, label = ("lower", "vela"), f"{b.model_name}-{b.target.name}"
    return TaskSpec(label, config, inputs, {"result": "evaluate.json"}, deps)


STAGE = Stage("evaluate", "npubuild.verify.evaluate", ("onnx", "onnxruntime", "tosa-tools"), plan,
              run_of("npubuild.verify.evaluate"), preload=("tosa_reference_model",))
