"""npu-sim stage: the raw Vela artifact run on npu-sim, bit-exact against the TOSA reference (verify/npu_sim.py)."""

from __future__ import annotations

from npubuild.build.stage import Chain, Skip, Stage, TaskSpec, run_of
from npubuild.config.load import Build
from npubuild.frontend.samples import SampleSource


def skip_reason(output_format: str) -> str | None:
    """Why a build with a Vela stage gets no npu-sim run, or None. Every accelerator Vela targets (U55, U65,
    U85) is modelled; a feature an artifact uses that is not is reported at run time (npusim.NotModelled)."""
    if output_format != "raw":
        return "Vela wrote tflite; npu-sim runs raw artifacts (set the target's vela.output_format: raw)"
    return None


def plan(b: Build, chain: Chain) -> TaskSpec | Skip | None:
    if "vela" not in chain:
        return None
    reason = skip_reason(b.vela.output_format)
    if reason is None and not b.spec.verify.tosa:
        reason = "verify.tosa is off (npu-sim runs on its samples)"
    if reason is not None:
        return Skip(reason)
    vela, lower, model = chain["vela"], chain["lower"], b.model
    inputs = {"vela": vela.outputs["summary"], "io": lower.outputs["io"],
              "float": chain["import"].outputs["onnx"]}
    source = SampleSource.of(b)
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    if source.kind == "evaluation" and b.evaluation is not None:
        inputs["eval_inputs"] = b.evaluation.inputs
    return TaskSpec(f"{b.model_name}-{b.target.name}",
                    {"vela": vela.key, "accelerator": b.target.accelerator, "output_format": b.vela.output_format,
                     "verify": b.spec.verify.model_dump(exclude={"fvp"}), "calibration": model.calibration.model_dump(),
                     "samples_from": source.to_json()},
                    inputs, {"result": "npusim.json"}, ("vela",))


STAGE = Stage("npu-sim", "npubuild.verify.npu_sim", ("ethos-u-vela", "tosa-tools"), plan,
              run_of("npubuild.verify.npu_sim"))
