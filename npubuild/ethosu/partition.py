"""Target-aware partitioning: NPU partitions (TOSA, compiled by Vela) and host partitions (ONNX, onnxruntime).

Vela has no CPU fallback for TOSA input, so a node whose TOSA ops a family's
support rules reject (support.py) must run on the host, and so must a node no
lowering takes (lowering/fallback.py: placed first, on every family). The whole
model (or, with such nodes, the model without them) is lowered once; each
compute node is placed by the rules; Q/DQ nodes follow the
node that produces their input (so every NPU partition output is a
dequantized, float ONNX tensor) and weight DequantizeLinears go with their
consumers. Nodes are then grouped greedily, in dependency order, into
alternating runs of one placement. A host partition is saved as ONNX; an NPU
partition is lowered again on its own, with a copy of the Quantize/Dequantize
pair in front of each float input, which is exact because the host already
produced values on that quantisation grid.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import onnx
from onnx import helper

from npubuild.errors import StageError
from npubuild.ethosu.host_work import node_macs
from npubuild.ethosu.support import check_node
from npubuild.frontend.graph_index import GraphIndex, node_inputs
from npubuild.frontend.host_runnable import onnxruntime_reason
from npubuild.frontend.precision.qdq import node_precisions
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.fallback import HostNode, value_infos
from npubuild.lowering.options import LoweringOptions
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import PartitionRecord, Placement, Where
from npubuild.tosa.graph import TosaGraphInfo, TosaOpInfo, ops_by_node, read_tosa, tensor_nodes
from npubuild.tosa.run import OnnxSession

QDQ = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class Partition:
    index: int
    kind: Where
    nodes: list[onnx.NodeProto]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def held_nodes(node: onnx.NodeProto) -> int:
    """The node and every node of its subgraphs (an If's branches, a Loop's body), recursively: the work it
    stands for when it runs whole on the host."""
    count = 1
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            count += sum(held_nodes(n) for n in sub.node)
    return count


def place_nodes(model: onnx.ModelProto, by_node: dict[str, list[TosaOpInfo]], graph: TosaGraphInfo | None,
                fam: str | None, host: Mapping[str, HostNode] | None = None) -> dict[str, Placement]:
    """Where each compute node runs on this family, and the rule that decided a host placement: a node with no
    lowering (`host`) first, then the family's support rules (none for fam None: the portable split)."""
    out = {}
    host = host or {}
    precision = node_precisions(model)
    for n in model.graph.node:
        if n.op_type in QDQ:
            continue
        if n.name in host:
            h = host[n.name]
            out[n.name] = Placement(n.name, n.op_type, Where.HOST, [], h.rule, h.reason, nodes=held_nodes(n),
                                    precision=precision.get(n.name))
            continue
        ops = by_node.get(n.name, [])
        verdict = check_node(ops, graph, fam) if fam is not None and graph is not None else None
        out[n.name] = Placement(n.name, n.op_type, Where.HOST if verdict else Where.NPU, [o.op for o in ops],
                                *(verdict or (None, None)), precision=precision.get(n.name))
    return out


HOST_VALUE_RULE = "host-value"


def follow_host_values(model: onnx.ModelProto, placed: dict[str, Placement]) -> None:
    """An NPU node that reads a bool tensor a host node computes goes to the host as well: an NPU partition
    takes quantized activations at its boundary (and integer ids for a Gather), and the lowering has no form
    of a bool graph input (a Reshape or a Where of a comparison's result, when the comparison is on the host:
    U55/U65 run no GREATER). Repeated until nothing moves."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.value_info, *model.graph.input]
             if vi.type.HasField("tensor_type")}
    producer = {o: n for n in model.graph.node for o in n.output}
    moved = True
    while moved:
        moved = False
        for n in model.graph.node:
            p = placed.get(n.name)
            if p is None or p.kind != Where.NPU:
                continue
            for v in node_inputs(n):
                src = producer.get(v)
                if src is None or src.op_type in QDQ or types.get(v) != onnx.TensorProto.BOOL:
                    continue
                if placed.get(src.name) is not None and placed[src.name].kind == Where.HOST:
                    kind = onnx.TensorProto.DataType.Name(types[v]).lower()
                    placed[n.name] = Placement(n.name, n.op_type, Where.HOST, p.tosa_ops, HOST_VALUE_RULE,
                                               f"reads '{v}' ({kind}), which node '{src.name}' computes on the host:"
                                               " an NPU partition takes no bool input", precision=p.precision)
                    moved = True
                    break


def _label_nodes(model: onnx.ModelProto, placed: dict[str, Placement], host: Collection[str] = ()) -> dict[str, Where]:
    """npu/host for every node, Q/DQ included (they follow their input's producer, else their consumers: the
    host if any of them is there; a Q/DQ node the lowering itself refused, in `host`, runs on the host)."""
    index = GraphIndex(model)
    labels: dict[str, Where] = {}

    def first_compute_user(n: onnx.NodeProto) -> onnx.NodeProto | None:
        for _ in range(8):
            users = index.consumers.get(n.output[0], [])
            if not users:
                return None
            n = users[0]
            if n.op_type not in QDQ:
                return n
        return None

    def label(n: onnx.NodeProto) -> Where:
        if n.name in labels:
            return labels[n.name]
        if n.name in host:
            result = Where.HOST
        elif n.op_type not in QDQ:
            result = placed[n.name].kind
        else:
            src = index.producer.get(n.input[0])
            if src is not None:
                result = label(src)
            elif any(label(u) == Where.HOST for u in index.uses(n.output[0], [])):
                result = Where.HOST  # a graph input a host node reads too: the NPU partition gets it from the host
            else:  # a graph input or an initializer: go with whoever reads it
                user = first_compute_user(n)
                result = label(user) if user is not None else Where.HOST
        labels[n.name] = result
        return result

    for n in model.graph.node:
        label(n)
    return labels


def constant_nodes(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Nodes that read only initializers (weight DequantizeLinears), by output: copied into each user partition."""
    inits = {i.name for i in model.graph.initializer}
    return {n.output[0]: n for n in model.graph.node
            if n.input and all(i in inits for i in node_inputs(n)) and len(n.output) == 1}


def group(model: onnx.ModelProto, labels: dict[str, Where]) -> list[Partition]:
    """Greedy grouping in dependency order: take every ready node of the current kind, then switch kinds."""
    consts = constant_nodes(model)
    const_names = {n.name for n in consts.values()}
    producer = {o: n.name for n in model.graph.node for o in n.output if n.name not in const_names}
    deps = {n.name: {producer[i] for i in node_inputs(n) if i in producer} for n in model.graph.node}
    remaining = [n for n in model.graph.node if n.name not in const_names]
    done: set[str] = set()
    parts: list[Partition] = []
    while remaining:
        ready = [n for n in remaining if deps[n.name] <= done]
        # the kind of the first ready compute node: a graph input's Q/DQ waits for the partition of its reader;
        # with only Q/DQ ready, the host's first (an NPU partition of nothing but Q/DQ computes no TOSA output)
        compute = next((n for n in ready if n.op_type not in QDQ), None)
        if compute is not None:
            kind = labels[compute.name]
        else:
            kind = Where.HOST if any(labels[n.name] == Where.HOST for n in ready) else labels[ready[0].name]
        taken: list[onnx.NodeProto] = []
        progress = True
        while progress:
            progress = False
            for n in list(remaining):
                if labels[n.name] == kind and deps[n.name] <= done:
                    taken.append(n)
                    done.add(n.name)
                    remaining.remove(n)
                    progress = True
        parts.append(Partition(len(parts), kind, taken))  # type: ignore[arg-type]
    _boundaries(model, parts)
    return parts


def _boundaries(model: onnx.ModelProto, parts: list[Partition]) -> None:
    inits = {i.name for i in model.graph.initializer} | set(constant_nodes(model))
    graph_outputs = [o.name for o in model.graph.output]
    for p in parts:
        produced = {o for n in p.nodes for o in n.output}
        needed = [i for n in p.nodes for i in node_inputs(n) if i not in produced and i not in inits]
        p.inputs = list(dict.fromkeys(needed))
    for p in parts:
        outs = []
        for n in p.nodes:
            for o in n.output:
                used_elsewhere = any(o in q.inputs for q in parts if q.index != p.index)
                if used_elsewhere or o in graph_outputs:
                    outs.append(o)
        p.outputs = outs


def _dq_params(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == tensor:
            return n
    return None


def sub_model(model: onnx.ModelProto, part: Partition, infos: dict[str, onnx.ValueInfoProto],
              requantize_inputs: bool) -> onnx.ModelProto:
    """A standalone ONNX model of one partition (initializers it reads, typed inputs and outputs)."""
    consts = constant_nodes(model)
    needed = {i for n in part.nodes for i in node_inputs(n)}
    nodes = []
    for n in [consts[o] for o in consts if o in needed] + list(part.nodes):
        c = onnx.NodeProto()
        c.CopyFrom(n)
        nodes.append(c)
    inputs = []
    for name in part.inputs:
        inputs.append(infos[name])
        dq = _dq_params(model, name) if requantize_inputs else None
        if dq is None:
            continue
        # A copy of the producer's Q/DQ pair so the NPU partition sees a quantized input (exact: same grid).
        fresh = f"{name}__npu"
        q_out = f"{fresh}_q"
        q = helper.make_node("QuantizeLinear", [fresh, *dq.input[1:]], [q_out], name=f"{fresh}_QuantizeLinear")
        d = helper.make_node("DequantizeLinear", [q_out, *dq.input[1:]], [f"{fresh}_dq"],
                             name=f"{fresh}_DequantizeLinear")
        for n in nodes:
            for k, i in enumerate(n.input):
                if i == name:
                    n.input[k] = f"{fresh}_dq"
        nodes = [q, d, *nodes]
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(infos[name])
        vi.name = fresh
        inputs[-1] = vi
    used = {i for n in nodes for i in node_inputs(n)}
    inits = [i for i in model.graph.initializer if i.name in used]
    outputs = [infos[o] for o in part.outputs]
    g = helper.make_graph(nodes, f"partition{part.index}", inputs, outputs, inits)
    sub = helper.make_model(g, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    return sub


@dataclass
class PartitionPlan:
    placements: dict[str, Placement]
    partitions: list[Partition]


def plan_partitions(model: onnx.ModelProto, lowered: LoweredGraph | None, fam: str | None,
                    host: Mapping[str, HostNode] | None = None) -> PartitionPlan:
    """Place every node on this family (fam None: only the `host` nodes, which have no lowering, leave the
    NPU) and group them into partitions. `lowered` is the whole model, or the model without the host nodes
    (None if nothing is left to lower)."""
    host = host or {}
    graph = read_tosa(lowered.tosa) if lowered is not None else None
    by_node: dict[str, list[TosaOpInfo]] = {}
    if lowered is not None and graph is not None:
        try:
            by_node = ops_by_node(graph, lowered.node_ops)
        except ValueError as exc:  # ops cannot be charged to nodes: all on the NPU, or say why not
            everything = [o for o in graph.ops if o.op not in ("CONST", "CONST_SHAPE")]
            verdict = check_node(everything, graph, fam) if fam is not None else None
            if verdict:
                raise StageError(f"cannot partition for {fam}: {exc}; and {verdict[1]}") from None
            by_node = {n: [] for n in lowered.node_ops}
    placed = place_nodes(model, by_node, graph, fam, host)
    follow_host_values(model, placed)
    if not host and all(p.kind == Where.NPU for p in placed.values()):
        return PartitionPlan(placed, [Partition(0, Where.NPU, list(model.graph.node), [], [])])
    labels = _label_nodes(model, placed, set(host))
    parts = group(model, labels)
    for p in parts:
        for n in p.nodes:
            if n.name in placed:
                placed[n.name].partition = p.index
    return PartitionPlan(placed, parts)


def write_partitions(model: onnx.ModelProto, plan: PartitionPlan, profile: Literal["int", "fp"], out_dir: Path,
                     prefix: str, family: str | None = None,
                     options: LoweringOptions | None = None) -> list[PartitionRecord]:
    """Write each partition (<prefix>partN.tosa or <prefix>hostN.onnx); returns their records for io.json.
    `options`: the family's lowering options as measured for this model (ethosu/measured.py), else its own."""
    infos = value_infos(model)
    records = []
    for part in plan.partitions:
        nodes = tuple(n.name for n in part.nodes if n.op_type not in QDQ)
        sub = sub_model(model, part, infos, requantize_inputs=part.kind == Where.NPU)
        if part.kind == Where.HOST:
            for n in part.nodes:  # what the host computes, counted (its time is not estimated: host_work.py)
                if n.name in plan.placements:
                    plan.placements[n.name].macs = node_macs(n, infos)
            file = f"{prefix}host{part.index}.onnx"
            onnx.save(sub, out_dir / file)
            check_host_partition(out_dir / file, part)
            records.append(PartitionRecord(part.index, part.kind, file, tuple(part.inputs), tuple(part.outputs),
                                           nodes))
            continue
        try:
            low = lower_model(sub, profile, family=family, options=options)
        except Exception as exc:  # a boundary the lowering cannot take (e.g. a bool tensor input)
            raise StageError(f"NPU partition {part.index} cannot be lowered on its own: {exc}") from exc
        file = f"{prefix}part{part.index}.tosa"
        (out_dir / file).write_bytes(low.tosa)
        try:
            tensors = tensor_nodes(ops_by_node(read_tosa(low.tosa), low.node_ops))
        except ValueError:
            tensors = {}
        records.append(PartitionRecord(part.index, part.kind, file, tuple(part.inputs), tuple(part.outputs), nodes,
                                       tuple(_rename(i) for i in low.inputs), tuple(low.outputs), low.profile,
                                       tensors))
    return records


def check_host_partition(path: Path, part: Partition) -> None:
    """onnxruntime must load a host partition as it will run it (its graph optimisation on): else one line naming
    the partition's first compute node. A stage failure (exit 1), not the model's: the import checked that
    onnxruntime runs the whole model; what it refuses is the partition npubuild made (onnxruntime's optimiser
    fusing a dilated QDQ AveragePool into a QLinearAveragePool it then rejects)."""
    try:
        OnnxSession(path, qdq_semantics=False)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's error types differ by cause: any refusal counts
        node = next((n for n in part.nodes if n.op_type not in QDQ), part.nodes[0])
        raise StageError(f"node '{node.name}' ({node.op_type}) runs on the host, but onnxruntime cannot run its "
                         f"host partition: {onnxruntime_reason(exc)}") from None


def _rename(spec: IOSpec) -> IOSpec:
    """An NPU partition's input is the copy sub_model made of the boundary tensor: give it the tensor's name."""
    return spec.renamed(spec.onnx_name.removesuffix("__npu"))


def split_io(model: onnx.ModelProto, parts: Sequence[PartitionRecord]) -> tuple[tuple[IOSpec, ...], tuple[IOSpec, ...]]:
    """The graph inputs and outputs of a model that exists only as partitions, in ONNX order: as the NPU
    partition that reads or writes each sees it (its quantisation), else as the host does (ONNX layout; a
    host output is quantized when the graph's last node is a DequantizeLinear, with its parameters)."""
    index = GraphIndex(model)
    npu_in = {s.onnx_name: s for p in parts if p.kind == Where.NPU for s in p.inputs_io or ()}
    npu_out = {s.onnx_name: s for p in parts if p.kind == Where.NPU for s in p.outputs_io or ()}
    infos = {vi.name: vi for vi in [*model.graph.input, *model.graph.output]}
    inputs = tuple(npu_in.get(name) or _host_spec(infos[name], None, index) for name in sorted(
        index.inputs, key=[i.name for i in model.graph.input].index))
    outputs = tuple(npu_out.get(name) or _host_spec(infos[name], index.producer.get(name), index)
                    for name in index.output_names)
    return inputs, outputs


def _host_spec(vi: onnx.ValueInfoProto, producer: onnx.NodeProto | None, index: GraphIndex) -> IOSpec:
    """An ONNX tensor as the host reads or writes it."""
    tt = vi.type.tensor_type
    shape = tuple(d.dim_value for d in tt.shape.dim)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    scale = zero_point = None
    if producer is not None and producer.op_type == "DequantizeLinear":
        s = index.array(producer.input[1])
        z = index.array(producer.input[2]) if len(producer.input) > 2 and producer.input[2] else None
        if s is not None and s.size == 1 and z is not None and z.size == 1:
            scale, zero_point, dtype = float(s.reshape(())), int(z.reshape(())), z.dtype.name
    return IOSpec(vi.name, "", shape, tuple(range(len(shape))), dtype, scale, zero_point)
