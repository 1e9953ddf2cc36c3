"""lower stage: run the pipeline's passes, lower the ONNX graph to TOSA 1.0, and partition it per NPU family.

model.tosa / io.json are the whole model in one TOSA graph (what the TOSA
check verifies and what a family that supports every node compiles). For an
INT build each lowering family (U55, U65, U85, U85-1024/2048; support.FAMILIES) is lowered
with the forms it runs best (lowering/family_choices.py) and written as
`<family>_model.tosa` where that differs from model.tosa; the support rules
of each family (U65 has U55's) place every node, a family that cannot run
some node gets its own partition files (`<family>_partN.tosa`,
`<family>_hostN.onnx`), and a partitioned or own-lowered model is run here
(NPU parts on the TOSA reference model, host parts on onnxruntime) against
the whole QDQ model on onnxruntime.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from npubuild.build.plan import StageTask
from npubuild.errors import StageError
from npubuild.ethosu.partition import PartitionPlan, plan_partitions, write_partitions
from npubuild.ethosu.support import FAMILIES
from npubuild.fileio import write_bytes, write_json
from npubuild.frontend.passes import run_passes
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.tosa.graph import ops_by_node, read_tosa, tensor_nodes
from npubuild.tosa.run import run_onnx
from npubuild.verify.partitioned import run_partitions

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
CHECK_SAMPLES = 4
MAX_PARTITION_LSB = 1.0


def node_tensors(lowered: LoweredGraph) -> dict[str, str]:
    """TOSA tensor -> ONNX node (empty if the ops cannot be lined up with the nodes)."""
    try:
        return tensor_nodes(ops_by_node(read_tosa(lowered.tosa), lowered.node_ops))
    except ValueError:
        return {}


def family_record(model: onnx.ModelProto, lowered: LoweredGraph, io: dict, plan: PartitionPlan, fam: str,
                  out_dir: Path) -> dict:
    placements = [asdict(p) for p in plan.placements.values()]
    if len(plan.partitions) == 1 and plan.partitions[0].kind == "npu":
        parts = [{"index": 0, "kind": "npu", "file": "model.tosa", "inputs": [i["onnx_name"] for i in io["inputs"]],
                  "outputs": [o["onnx_name"] for o in io["outputs"]], "nodes": [p["node"] for p in placements],
                  "inputs_io": io["inputs"], "outputs_io": io["outputs"], "profile": io["profile"]}]
    else:
        parts = write_partitions(model, plan, lowered.profile, out_dir, f"{fam}_", family=fam)
    return {"partitions": parts, "placements": placements,
            "npu_partitions": sum(1 for p in parts if p["kind"] == "npu"),
            "host_partitions": sum(1 for p in parts if p["kind"] == "host"),
            "host_ops": sum(1 for p in placements if p["kind"] == "cpu")}


def portable(io: dict) -> dict:
    """model.tosa (the lowering for every family) as a one-partition record."""
    return {"index": 0, "kind": "npu", "file": "model.tosa", "inputs_io": io["inputs"], "outputs_io": io["outputs"],
            "profile": io["profile"]}


def _input_range(spec: dict) -> tuple[float, float]:
    """The real range an int8 input can represent (the calibrated range), else [-1, 1]."""
    if spec.get("scale") is None or spec["dtype"] == "float32":
        return -1.0, 1.0
    info = np.iinfo(np.dtype(spec["dtype"]))
    return (info.min - spec["zero_point"]) * spec["scale"], (info.max - spec["zero_point"]) * spec["scale"]


def check_partitioned(qdq_path: Path, out_dir: Path, record: dict, io: dict, seed: int = 0) -> float:
    """Max error (output LSB) of the partitioned model against the whole QDQ model on onnxruntime."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(CHECK_SAMPLES):
        feeds = {s["onnx_name"]: rng.uniform(*_input_range(s), [s["shape"][i] for i in np.argsort(s["perm"])])
                 .astype(np.float32) for s in io["inputs"]}
        ref = run_onnx(str(qdq_path), feeds)
        got = run_partitions(out_dir, record["partitions"], io["outputs"], feeds)
        for spec in io["outputs"]:
            name = spec["onnx_name"]
            if spec.get("scale") is None:
                err = float(np.max(np.abs(got[name].astype(np.float64) - ref[name])))
            else:
                ref_q = np.round(ref[name] / spec["scale"]) + spec["zero_point"]
                err = float(np.max(np.abs(ref_q - got[name].astype(np.float64))))
            worst = max(worst, err)
    return worst


def run(task: StageTask) -> dict:
    src = task.inputs["onnx"]
    pipeline = task.config["pipeline"]
    model = onnx.load(str(src))
    ir_model = run_passes(ir.serde.deserialize_model(model), pipeline["passes"])
    model = ir.serde.serialize_model(ir_model)
    lowered = lower_model(model, pipeline["profile"])
    out_dir = task.outputs["tosa"].parent
    write_bytes(task.outputs["tosa"], lowered.tosa)
    compute_nodes = [n for n in model.graph.node if n.op_type not in QDQ_OPS]
    tosa_ops: dict[str, int] = {}
    for ops in lowered.node_ops.values():
        for op in ops:
            tosa_ops[op] = tosa_ops.get(op, 0) + 1
    nodes = [{"name": n.name, "op_type": n.op_type, "tosa_ops": lowered.node_ops.get(n.name, [])}
             for n in compute_nodes]
    io = {
        "profile": lowered.profile,
        "inputs": [i.as_dict() for i in lowered.inputs],
        "outputs": [o.as_dict() for o in lowered.outputs],
        "nodes": nodes,
        "tensor_nodes": node_tensors(lowered),
    }
    families: dict[str, dict] = {}
    if lowered.profile == "int":
        qdq_path = out_dir / "model_partitioning.onnx"
        for fam in FAMILIES:
            fam_lowered = lower_model(model, pipeline["profile"], family=fam)  # forms only this family runs
            own = fam_lowered.tosa != lowered.tosa
            plan = plan_partitions(model, fam_lowered if own else lowered, fam)
            families[fam] = family_record(model, fam_lowered if own else lowered, io, plan, fam, out_dir)
            whole = families[fam]["partitions"][0]
            if own and len(families[fam]["partitions"]) == 1 and whole["file"] == "model.tosa":
                whole["file"] = f"{fam}_model.tosa"
                write_bytes(out_dir / whole["file"], fam_lowered.tosa)
                whole["inputs_io"] = [i.as_dict() for i in fam_lowered.inputs]
                whole["outputs_io"] = [o.as_dict() for o in fam_lowered.outputs]
                whole["tensor_nodes"] = node_tensors(fam_lowered)
            if len(families[fam]["partitions"]) > 1 or own:
                if not qdq_path.exists():
                    onnx.save(model, qdq_path)
                err = check_partitioned(qdq_path, out_dir, families[fam], io)
                families[fam]["max_error_lsb"] = err
                # a family's own lowering rounds differently: hold it to the portable graph's own error
                base = check_partitioned(qdq_path, out_dir, {"partitions": [portable(io)]}, io) if own else 0.0
                if err > base + MAX_PARTITION_LSB:
                    raise StageError(f"the {fam} partitioned model differs from the whole model by {err:g} LSB")
    io["families"] = families
    write_json(task.outputs["io"], io)
    return {"onnx_nodes": len(compute_nodes), "tosa_ops": tosa_ops, "tosa_op_count": lowered.tosa_op_count,
            "transposes": tosa_ops.get("TRANSPOSE", 0),
            "partitioning": {f: {k: r[k] for k in ("npu_partitions", "host_partitions", "host_ops")}
                             for f, r in families.items()}}

