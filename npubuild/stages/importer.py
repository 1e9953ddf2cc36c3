"""import stage: load and check the ONNX model, make shapes static, fold constants and BatchNorm."""

from __future__ import annotations

from npubuild.build.plan import StageTask
from npubuild.fileio import write_bytes
from npubuild.frontend.normalise import load_onnx, normalise


def run(task: StageTask) -> dict:
    src = task.inputs["model"]
    model = load_onnx(src)
    before = len(model.graph.node)
    model = normalise(model, task.config["input_shapes"], str(src))
    write_bytes(task.outputs["onnx"], model.SerializeToString())
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"nodes_in": before, "nodes_out": len(model.graph.node), "op_types": ops}
