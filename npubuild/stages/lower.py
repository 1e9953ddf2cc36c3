"""lower stage: the pipeline's passes, the model lowered to TOSA, and per Ethos-U family its builds target its
own lowering and partitions (ethosu/families.py): io.json, model.tosa (when one TOSA graph runs the whole
model, which is why it is not a declared output: io.json says which files exist) and the partition files."""

from __future__ import annotations

from npubuild.config.accelerator import Accelerator
from npubuild.config.load import Build
from npubuild.engine.stage import Chain, Stage, TaskSpec, run_of


def plan(b: Build, chain: Chain) -> TaskSpec:
    """One task per model and pipeline, lowering (for an INT build) the families of every target of the specs
    of the builds that share it (`families` in its config, sorted): a target of a family no other has adds it."""
    prev = chain.get("quantize") or chain["import"]
    own = (Accelerator.parse(b.target.accelerator).lowering_family,)
    families = (b.spec_families or own) if b.pipeline.profile == "int" else ()
    return TaskSpec(b.model_name, {"input": prev.key, "pipeline": b.pipeline.model_dump()},
                    {"onnx": prev.outputs["onnx"]}, {"io": "io.json"}, (prev.stage,), union={"families": families})


STAGE = Stage("lower", "npubuild.ethosu.families", ("onnx", "onnx-ir", "tosa-tools"), plan,
              run_of("npubuild.ethosu.families"),
              preload=("numpy.random", "tosa_reference_model", "npubuild.frontend.passes:load_all",
                       "npubuild.lowering:load_all"))  # the pipeline's passes, the op lowerings, the families' runs
