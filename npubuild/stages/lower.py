"""lower stage: the pipeline's passes, the model lowered to TOSA, and per Ethos-U family its own lowering and
partitions (ethosu/families.py): model.tosa, io.json and the family files."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build


def plan(b: Build, chain: Chain) -> TaskSpec:
    prev = chain.get("quantize") or chain["import"]
    return TaskSpec(b.model_name, {"input": prev.key, "pipeline": b.pipeline.model_dump()},
                    {"onnx": prev.outputs["onnx"]}, {"tosa": "model.tosa", "io": "io.json"}, (prev.stage,))


STAGE = Stage("lower", "npubuild.ethosu.families", ("onnx", "onnx-ir", "tosa-tools"), plan,
              run_of("npubuild.ethosu.families"))
