"""tosa-check stage: the TOSA graph on the TOSA reference model against onnxruntime (verify/tosa_check.py)."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build
from npubuild.frontend.samples import SampleSource


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if not b.spec.verify.tosa:
        return None
    lower, model = chain["lower"], b.model
    reference = chain["quantize"].outputs["onnx"] if "quantize" in chain else chain["import"].outputs["onnx"]
    inputs = {"io": lower.outputs["io"], "reference": reference,
              "float": chain["import"].outputs["onnx"]}
    source = SampleSource.of(b)
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    if source.kind == "evaluation" and b.evaluation is not None:
        inputs["eval_inputs"] = b.evaluation.inputs
    config = {"lower": lower.key, "verify": b.spec.verify.model_dump(exclude={"fvp"}),
              "passes": list(b.pipeline.passes),  # node errors cut the model as the lower stage sees it
              "input_shapes": model.input_shapes, "calibration": model.calibration.model_dump(),
              "samples_from": source.to_json()}
    return TaskSpec(b.model_name, config, inputs, {"numerics": "numerics.json", "reference": "reference.npz"},
                    ("lower",))


STAGE = Stage("tosa-check", "npubuild.verify.tosa_check", ("onnx", "onnxruntime", "tosa-tools"), plan,
              run_of("npubuild.verify.tosa_check"),
              preload=("numpy.random", "tosa_reference_model", "npubuild.frontend.passes:load_all",
                       "npubuild.lowering:load_all"))  # the per-node check cuts and lowers the model again
