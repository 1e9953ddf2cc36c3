"""tosa-check stage: the TOSA graph on the TOSA reference model against onnxruntime (verify/tosa_check.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.schema import Calibration, Verify
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec
from npubuild.frontend.samples import SampleSource

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class TosaCheckConfig:
    """The tosa-check task's config (its key). `verify.fvp` is not part of it: it changes no number here."""

    lower_key: str
    verify: Verify
    passes: tuple[str, ...]  # the per-node check cuts the model as the lower stage sees it
    input_shapes: Mapping[str, list[int]]
    calibration: Calibration
    samples_from: SampleSource  # which rows verify (never the ones that calibrate, where there is real data)
    node_check: Mapping[str, Any] | None = None  # when the per-node cuts run (node_check_policy)

    def to_json(self) -> dict[str, Any]:
        return {"lower": self.lower_key, "verify": self.verify.model_dump(exclude={"fvp"}),
                "passes": list(self.passes), "input_shapes": dict(self.input_shapes),
                "calibration": self.calibration.model_dump(), "samples_from": self.samples_from.to_json(),
                "node_check": dict(self.node_check) if self.node_check is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TosaCheckConfig:
        return cls(d["lower"], Verify.model_validate(d["verify"]), tuple(d.get("passes", ())), d["input_shapes"],
                   Calibration.model_validate(d["calibration"]), SampleSource.from_json(d["samples_from"]),
                   d.get("node_check"))


# gates on what the whole-graph check measures: one that falls short runs the per-node check to find the node
# (the accuracy gates are the evaluate stage's, after this one: `debug-numerics` finds where accuracy goes)
WHOLE_GRAPH_GATES = ("max_tosa_error_lsb", "min_tosa_snr_db", "min_quant_snr_db")


def node_check_policy(b: Build) -> dict:
    """When the per-node check runs: always where a spec gates a node's error (max_tosa_node_error_lsb), else
    only where a whole-graph gate falls short (the first bad node is then found as before)."""
    expect = b.spec.expect.model_dump()
    return {"gated": expect.get("max_tosa_node_error_lsb") is not None,
            "whole_graph_expect": {k: expect[k] for k in WHOLE_GRAPH_GATES if expect.get(k) is not None}}


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if not b.spec.verify.tosa:
        return None
    lower, model = chain["lower"], b.model
    reference = next(chain[s].outputs["onnx"] for s in ("precision", "quantize", "import") if s in chain)
    inputs = {"io": lower.outputs["io"], "reference": reference,
              "float": chain["import"].outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    source = SampleSource.of(b)
    if source.kind == "evaluation" and b.evaluation is not None:
        inputs["eval_inputs"] = b.evaluation.inputs
    config = TosaCheckConfig(lower.key, b.spec.verify, tuple(b.pipeline.passes), model.input_shapes,
                             model.calibration, source, node_check_policy(b))
    return TaskSpec(b.model_name, config.to_json(), inputs, {"numerics": "numerics.json", "reference": "reference.npz",
                                                  "runs": "runs.npz"},
                    ("lower",))


def run(task: StageTask) -> dict:
    from npubuild.verify.tosa_check import CheckFiles, CheckOptions, check_tosa

    config = TosaCheckConfig.from_json(task.config)
    files = CheckFiles(task.inputs["io"], task.inputs["reference"], task.inputs["float"],
                       task.inputs.get("calibration"), task.inputs.get("eval_inputs"))
    options = CheckOptions(config.samples_from, config.calibration, config.passes, config.node_check)
    return check_tosa(files, options, task.outputs["numerics"], task.outputs.get("reference"), task.outputs.get("runs"))


STAGE = Stage("tosa-check", __name__, "npubuild.verify.tosa_check", ("onnx", "onnxruntime", "tosa-tools"), plan, run,
              preload=("numpy.random", "tosa_reference_model", "npubuild.frontend.passes:load_all",
                       "npubuild.lowering:load_all"))  # the per-node check cuts and lowers the model again
