"""lower stage: run the pipeline's passes, then lower the ONNX graph to one TOSA 1.0 flatbuffer."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from npubuild.fileio import write_bytes, write_json
from npubuild.lowering.driver import lower_model
from npubuild.passes import run_passes
from npubuild.plan import StageTask

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


def run(task: StageTask) -> dict:
    src = task.inputs["onnx"]
    pipeline = task.config["pipeline"]
    model = onnx.load(str(src))
    ir_model = run_passes(ir.serde.deserialize_model(model), pipeline["passes"])
    model = ir.serde.serialize_model(ir_model)
    lowered = lower_model(model, pipeline["profile"])
    write_bytes(task.outputs["tosa"], lowered.tosa)
    compute_nodes = [n for n in model.graph.node if n.op_type not in QDQ_OPS]
    tosa_ops: dict[str, int] = {}
    for ops in lowered.node_ops.values():
        for op in ops:
            tosa_ops[op] = tosa_ops.get(op, 0) + 1
    nodes = [{"name": n.name, "op_type": n.op_type, "tosa_ops": lowered.node_ops.get(n.name, [])}
             for n in compute_nodes]
    write_json(task.outputs["io"], {
        "profile": lowered.profile,
        "inputs": [i.as_dict() for i in lowered.inputs],
        "outputs": [o.as_dict() for o in lowered.outputs],
        "nodes": nodes,
    })
    return {"onnx_nodes": len(compute_nodes), "tosa_ops": tosa_ops, "tosa_op_count": lowered.tosa_op_count,
            "transposes": tosa_ops.get("TRANSPOSE", 0)}
