"""npu-sim stage: the Vela artifact run on npu-sim, bit-exact against the TOSA reference, and the deployable measured
against the float model (verify/npu_sim.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.schema import Calibration, Verify
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec
from npubuild.frontend.samples import SampleSource
from npubuild.records.build import Skip

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class NpuSimConfig:
    """The npu-sim task's config (its key): the vela task's key, the accelerator and output format, and how
    tosa-check draws its samples (`verify` without `fvp`, the calibration range)."""

    vela_key: str
    accelerator: str
    output_format: str
    verify: Verify
    calibration: Calibration
    samples_from: SampleSource  # tosa-check's samples (frontend/samples.py)

    def to_json(self) -> dict[str, Any]:
        return {"vela": self.vela_key, "accelerator": self.accelerator, "output_format": self.output_format,
                "verify": self.verify.model_dump(exclude={"fvp"}), "calibration": self.calibration.model_dump(),
                "samples_from": self.samples_from.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NpuSimConfig:
        return cls(d["vela"], d["accelerator"], d["output_format"], Verify.model_validate(d["verify"]),
                   Calibration.model_validate(d["calibration"]), SampleSource.from_json(d["samples_from"]))


def skip_reason(output_format: str) -> str | None:
    """Why a build with a Vela stage gets no npu-sim run, or None. Every accelerator Vela targets (U55, U65,
    U85) is modelled, in either output format: a .tflite's ethos-u operators carry the same command stream and
    constants as the raw .npz (npusim/tflite.py), and npu-sim runs what is deployed. A feature an artifact
    uses that is not modelled is reported at run time (npusim.NotModelled)."""
    if output_format not in ("raw", "tflite"):
        return f"Vela wrote {output_format}, which npu-sim does not read"
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
    qdq = next((chain[s] for s in ("precision", "quantize") if s in chain), None)
    if qdq is not None:  # the QDQ model the deployed graph implements (a mixed-precision build's, not its int8 one)
        inputs["reference"] = qdq.outputs["onnx"]
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    if source.kind == "evaluation" and b.evaluation is not None:
        inputs["eval_inputs"] = b.evaluation.inputs
    deps: tuple[str, ...] = ("vela",)
    if "tosa-check" in chain:  # the runs it made on the same samples, taken instead of made again (tosa/memo.py)
        inputs["runs"] = chain["tosa-check"].outputs["runs"]
        deps = ("vela", "tosa-check")
    config = NpuSimConfig(vela.key, b.target.accelerator, b.vela.output_format, b.spec.verify, model.calibration,
                          source)
    return TaskSpec(f"{b.model_name}-{b.target.name}", config.to_json(), inputs, {"result": "npusim.json"}, deps)


def run(task: StageTask) -> dict:
    from npubuild.verify.npu_sim import SimFiles, SimSamples, simulate_build

    config = NpuSimConfig.from_json(task.config)
    files = SimFiles(task.inputs["vela"], task.inputs["io"], task.inputs["float"], task.inputs.get("calibration"),
                     task.inputs.get("eval_inputs"), task.inputs.get("reference"), task.inputs.get("runs"))
    return simulate_build(files, SimSamples(config.samples_from, config.calibration), task.outputs["result"])


STAGE = Stage("npu-sim", __name__, "npubuild.verify.npu_sim", ("ethos-u-vela", "tosa-tools"), plan, run)
