"""lower stage: run the pipeline's passes, lower the ONNX graph to TOSA 1.0, and partition it per NPU family.

model.tosa / io.json are the whole model in one TOSA graph (what the TOSA
check verifies and what a family that supports every node compiles). For an
INT build each lowering family (U55, U65, U85, U85-1024/2048; accelerator.LOWERING_FAMILIES) is lowered
with the forms it runs best (lowering/options.py) and written as
`<family>_model.tosa` where that differs from model.tosa; the support rules
of each family (U65 has U55's) place every node, a family that cannot run
some node gets its own partition files (`<family>_partN.tosa`,
`<family>_hostN.onnx`), and a partitioned or own-lowered model is run here
(NPU parts on the TOSA reference model, host parts on onnxruntime) against
the whole QDQ model on onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from npubuild.build.plan import StageTask
from npubuild.config.accelerator import LOWERING_FAMILIES
from npubuild.errors import StageError
from npubuild.ethosu.partition import PartitionPlan, plan_partitions, write_partitions
from npubuild.fileio import write_bytes
from npubuild.frontend.passes import run_passes
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.stages.records import FamilyRecord, LowerRecord, NodeRecord, PartitionRecord
from npubuild.tosa.graph import ops_by_node, read_tosa, tensor_nodes
from npubuild.tosa.iospec import IOSpec
from npubuild.tosa.run import OnnxSession
from npubuild.verify.partitioned import worst_error

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
CHECK_SAMPLES = 4
MAX_PARTITION_LSB = 1.0


def node_tensors(lowered: LoweredGraph) -> dict[str, str]:
    """TOSA tensor -> ONNX node (empty if the ops cannot be lined up with the nodes)."""
    try:
        return tensor_nodes(ops_by_node(read_tosa(lowered.tosa), lowered.node_ops))
    except ValueError:
        return {}


def family_record(model: onnx.ModelProto, lowered: LoweredGraph, io: LowerRecord, plan: PartitionPlan, fam: str,
                  out_dir: Path) -> FamilyRecord:
    placements = tuple(plan.placements.values())
    if len(plan.partitions) == 1 and plan.partitions[0].kind == "npu":
        parts = (io.whole_partition([p.node for p in placements]),)
    else:
        parts = tuple(write_partitions(model, plan, lowered.profile, out_dir, f"{fam}_", family=fam))
    return FamilyRecord(parts, placements)


def own_whole_graph(fam: str, fam_lowered: LoweredGraph, whole: PartitionRecord, out_dir: Path) -> PartitionRecord:
    """The family's own lowering of the whole model, written as <family>_model.tosa, in place of model.tosa."""
    file = f"{fam}_model.tosa"
    write_bytes(out_dir / file, fam_lowered.tosa)
    return replace(whole, file=file, inputs_io=tuple(fam_lowered.inputs), outputs_io=tuple(fam_lowered.outputs),
                   tensor_nodes=node_tensors(fam_lowered))


def _input_range(spec: IOSpec) -> tuple[float, float]:
    """The real range an int8 input can represent (the calibrated range), else [-1, 1]."""
    return spec.representable_range() or (-1.0, 1.0)


def check_partitioned(qdq_path: Path, out_dir: Path, partitions: Sequence[PartitionRecord], io: LowerRecord,
                      seed: int = 0) -> float:
    """Max error (output LSB) of the partitioned model against the whole QDQ model on onnxruntime."""
    rng = np.random.default_rng(seed)
    reference = OnnxSession(qdq_path)  # the QDQ model's own semantics, as the TOSA check compares against
    worst = 0.0
    for _ in range(CHECK_SAMPLES):
        feeds = {s.onnx_name: rng.uniform(*_input_range(s), s.onnx_shape).astype(np.float32) for s in io.inputs}
        worst = worst_error(out_dir, partitions, io.outputs, feeds, reference(feeds), worst)
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
    nodes = tuple(NodeRecord(n.name, n.op_type, tuple(lowered.node_ops.get(n.name, []))) for n in compute_nodes)
    io = LowerRecord(lowered.profile, tuple(lowered.inputs), tuple(lowered.outputs), nodes, node_tensors(lowered))
    families: dict[str, FamilyRecord] = {}
    base_error: list[float] = []  # the portable graph's own error, measured once for every family that needs it
    if lowered.profile == "int":
        qdq_path = out_dir / "model_partitioning.onnx"
        for fam in LOWERING_FAMILIES:
            fam_lowered = lower_model(model, pipeline["profile"], family=fam)  # forms only this family runs
            own = fam_lowered.tosa != lowered.tosa
            plan = plan_partitions(model, fam_lowered if own else lowered, fam)
            rec = family_record(model, fam_lowered if own else lowered, io, plan, fam, out_dir)
            if own and len(rec.partitions) == 1 and rec.partitions[0].file == "model.tosa":
                rec = replace(rec, partitions=(own_whole_graph(fam, fam_lowered, rec.partitions[0], out_dir),))
            if len(rec.partitions) > 1 or own:
                if not qdq_path.exists():
                    onnx.save(model, qdq_path)
                err = check_partitioned(qdq_path, out_dir, rec.partitions, io)
                rec = replace(rec, max_error_lsb=err)
                # a family's own lowering rounds differently: hold it to the portable graph's own error
                if own and not base_error:
                    base_error.append(check_partitioned(qdq_path, out_dir, [io.whole_partition([])], io))
                base = base_error[0] if own else 0.0
                if err > base + MAX_PARTITION_LSB:
                    raise StageError(f"the {fam} partitioned model differs from the whole model by {err:g} LSB")
            families[fam] = rec
    io = replace(io, families=families)
    io.write(task.outputs["io"])
    return {"onnx_nodes": len(compute_nodes), "tosa_ops": tosa_ops, "tosa_op_count": lowered.tosa_op_count,
            "transposes": tosa_ops.get("TRANSPOSE", 0),
            "partitioning": {f: {"npu_partitions": r.npu_partitions, "host_partitions": r.host_partitions,
                                 "host_ops": r.host_ops} for f, r in families.items()}}
