"""tosa-check stage: the TOSA graph on the TOSA reference model against onnxruntime (verify/tosa_check.py)."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build

# gates on what the whole-graph check measures: one that falls short runs the per-node check to find the node
WHOLE_GRAPH_GATES = ("max_tosa_error_lsb", "min_tosa_snr_db", "min_quant_snr_db", "min_accuracy", "max_accuracy_drop")


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
    reference = chain["quantize"].outputs["onnx"] if "quantize" in chain else chain["import"].outputs["onnx"]
    inputs = {"io": lower.outputs["io"], "reference": reference,
              "float": chain["import"].outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    if b.evaluation is not None:
        inputs.update(eval_inputs=b.evaluation[0], eval_labels=b.evaluation[1])
    config = {"lower": lower.key, "verify": b.spec.verify.model_dump(exclude={"fvp"}),
              "passes": list(b.pipeline.passes),  # node errors cut the model as the lower stage sees it
              "input_shapes": model.input_shapes, "calibration": model.calibration.model_dump(),
              "evaluation": model.evaluation.model_dump() if model.evaluation else None,
              "node_check": node_check_policy(b)}
    return TaskSpec(b.model_name, config, inputs, {"numerics": "numerics.json", "reference": "reference.npz"},
                    ("lower",))


STAGE = Stage("tosa-check", "npubuild.verify.tosa_check", ("onnx", "onnxruntime", "tosa-tools"), plan,
              run_of("npubuild.verify.tosa_check"),
              preload=("numpy.random", "tosa_reference_model", "npubuild.frontend.passes:load_all",
                       "npubuild.lowering:load_all"))  # the per-node check cuts and lowers the model again
