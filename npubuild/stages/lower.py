"""lower stage: the pipeline's passes, the model lowered to TOSA, and per Ethos-U family its builds target its
own lowering and partitions (ethosu/families.py): io.json, model.tosa (when one TOSA graph runs the whole
model, which is why it is not a declared output: io.json says which files exist) and the partition files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import Pipeline
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class LowerConfig:
    """The lower task's config (its key): the key of the task whose model it lowers (precision when the spec asks
    for a precision other than 8x8, else quantize, or import for an FP pipeline), the pipeline, and the lowering families of every build sharing it (`families`: merged
    over those builds by the plan, TaskSpec.union)."""

    input_key: str
    pipeline: Pipeline
    families: tuple[str, ...] = ()
    # "size": the families' measured choices go by memory (ethosu/measured.py); in the key only then, so a
    # performance build's key is what it was
    optimise: str = "performance"

    def to_json(self) -> dict[str, Any]:
        """Without `families`: the plan writes their union over the builds."""
        d = {"input": self.input_key, "pipeline": self.pipeline.model_dump()}
        if self.optimise == "size":
            d["optimise"] = "size"
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LowerConfig:
        return cls(d["input"], Pipeline.model_validate(d["pipeline"]), tuple(d.get("families", ())),
                   d.get("optimise", "performance"))


def plan(b: Build, chain: Chain) -> TaskSpec:
    """One task per model and pipeline, lowering (for an INT build) the families of every target of the specs
    of the builds that share it (`families` in its config, sorted): a target of a family no other has adds it.
    An INT build's calibration file is an input where the spec has one: the families' tolerance check runs a
    few of its rows (ethosu/families.real_feeds), so its content is in the task's cache key (a file whose new
    rows leave the QDQ model as it was still checks the families again)."""
    prev = chain.get("precision") or chain.get("quantize") or chain["import"]
    own = (Accelerator.parse(b.target.accelerator).lowering_family,)
    families = (b.spec_families or own) if b.pipeline.profile == "int" else ()
    inputs = {"onnx": prev.outputs["onnx"]}
    if b.pipeline.profile == "int" and b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    return TaskSpec(b.model_name, LowerConfig(prev.key, b.pipeline, optimise=b.optimise).to_json(),
                    inputs, {"io": "io.json"}, (prev.stage,), union={"families": families})


def run(task: StageTask) -> dict:
    from npubuild.ethosu.families import lower_stage

    config = LowerConfig.from_json(task.config)
    return lower_stage(task.inputs["onnx"], config.pipeline.passes, config.pipeline.profile, config.families,
                       task.outputs["io"], config.optimise, task.inputs.get("calibration"))


# Vela too: the measured family choices (ethosu/measured.py) compile with it, so a new Vela decides them again
STAGE = Stage("lower", __name__, "npubuild.ethosu.families", ("onnx", "onnx-ir", "tosa-tools", "ethos-u-vela"),
              plan, run,
              preload=("numpy.random", "tosa_reference_model", "npubuild.frontend.passes:load_all",
                       "npubuild.lowering:load_all",  # the pipeline's passes, the op lowerings, the families' runs
                       "npubuild.ethosu.vela"))  # Vela, which the measured choices fork: imported once, not per child
