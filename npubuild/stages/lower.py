"""lower stage: the pipeline's passes, the model lowered to TOSA, and per Ethos-U family its own lowering and
partitions (ethosu/families.py): io.json, model.tosa (when one TOSA graph runs the whole model, which is why
it is not a declared output: io.json says which files exist) and the partition files."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build


def plan(b: Build, chain: Chain) -> TaskSpec:
    prev = chain.get("quantize") or chain["import"]
    return TaskSpec(b.model_name, {"input": prev.key, "pipeline": b.pipeline.model_dump()},
                    {"onnx": prev.outputs["onnx"]}, {"io": "io.json"}, (prev.stage,))


STAGE = Stage("lower", "npubuild.ethosu.families", ("onnx", "onnx-ir", "tosa-tools"), plan,
              run_of("npubuild.ethosu.families"))
