"""Lower what can be lowered: a node the lowering refuses becomes a host node instead of failing the build.

When every node lowers, the result is the whole model as one TOSA graph (lower_model, unchanged). Otherwise
each node the lowering refuses (UnsupportedOpError: no lowering for its op type, an operator domain other
than ONNX's, a form its lowering does not take) is cut out of the graph: its inputs become graph outputs
and its outputs graph inputs, and the rest is lowered again until it lowers. That graph is never deployed
as it is: it gives every other node its TOSA ops, which the support rules place (ethosu/partition.py), and
the host nodes run on onnxruntime in host partitions. One lowering per host node found, each on a graph
that is the model minus the nodes found so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import onnx
from onnx import helper

from npubuild.errors import InputError, UncomputedOutputError, UnsupportedOpError
from npubuild.frontend.graph_index import QDQ, GraphIndex, node_inputs
from npubuild.frontend.passes import CONTROL_FLOW_RULE, KEPT_FLOAT, KEPT_FLOAT_RULE
from npubuild.lowering.context import ModelArrays
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import LoweringOptions

NO_LOWERING = "no-lowering"  # the rule a host node's placement names: nothing lowers this op type or domain
LOWERING_REFUSED = "lowering-unsupported"  # its lowering exists but does not take this node's form


@dataclass(frozen=True)
class HostNode:
    """A node that runs on the host on every NPU family, and why (the lowering's own message)."""

    node: str
    op_type: str
    rule: str
    reason: str


@dataclass(frozen=True)
class PartialLowering:
    """The model lowered where it can be: `lowered` is the whole model (no host nodes) or the model with the
    host nodes cut out (None when nothing is left to lower)."""

    lowered: LoweredGraph | None
    host: dict[str, HostNode]

    @property
    def whole(self) -> bool:
        """One TOSA graph runs the whole model."""
        return not self.host and self.lowered is not None


def name_nodes(model: onnx.ModelProto) -> None:
    """Give unnamed nodes the names lower_model gives them, before any cut changes their positions."""
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{i}"


def host_node(exc: UnsupportedOpError) -> HostNode:
    if exc.op_type in ("If", "Loop", "Scan"):  # control flow the import could not fold or select (its reason)
        return HostNode(exc.node_name, exc.op_type, CONTROL_FLOW_RULE, exc.reason)
    if exc.reason == KEPT_FLOAT:
        return HostNode(exc.node_name, exc.op_type, KEPT_FLOAT_RULE, exc.reason)
    missing = exc.reason.startswith(("no lowering", "operator domain"))
    return HostNode(exc.node_name, exc.op_type, NO_LOWERING if missing else LOWERING_REFUSED, exc.reason)


def lower_lowerable(model: onnx.ModelProto, profile: Literal["int", "fp"], family: str | None = None,
                    options: LoweringOptions | None = None, host: dict[str, HostNode] | None = None,
                    arrays: ModelArrays | None = None) -> PartialLowering:
    """The model lowered with every node the lowering refuses on the host (`host`: ones already known;
    `arrays`: the model's initializers and QParams read once, lower_model's)."""
    name_nodes(model)
    names = {n.name for n in model.graph.node}
    found = dict(host or {})
    while True:
        graph = cut_model(model, set(found)) if found else model
        if not graph.graph.node:
            return PartialLowering(None, found)
        try:
            return PartialLowering(lower_model(graph, profile, family=family, options=options, arrays=arrays),
                                   found)
        except UnsupportedOpError as exc:
            if exc.node_name not in names or exc.node_name in found:
                raise  # not a node of the model, or cutting it did not help: nothing more to try
            found[exc.node_name] = host_node(exc)
        except UncomputedOutputError as exc:  # a graph output that lowers to a constant or to a graph input
            node = computing_node(graph, exc.output_name)
            if node is None or node.name not in names or node.name in found:
                raise
            found[node.name] = HostNode(node.name, node.op_type, LOWERING_REFUSED,
                                        f"its output '{exc.output_name}' is a graph output that no TOSA op computes "
                                        "(a constant, or a graph input passed through): the host writes it")


def computing_node(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    """The compute node behind `tensor`, through the Q/DQ nodes that end at it; None for a graph input."""
    index = GraphIndex(model)
    node = index.producer.get(tensor)
    for _ in range(8):
        if node is None or node.op_type not in QDQ:
            return node
        node = index.producer.get(node.input[0])
    return None


def constant_outputs(model: onnx.ModelProto) -> set[str]:
    """Outputs of nodes that read only initializers (weight DequantizeLinears): constants, not boundaries."""
    inits = {i.name for i in model.graph.initializer}
    return {o for n in model.graph.node if n.input and all(i in inits for i in node_inputs(n)) for o in n.output}


def cut_model(model: onnx.ModelProto, host: set[str]) -> onnx.ModelProto:
    """The model without the `host` nodes: what they read becomes graph outputs, what they write graph inputs.

    A graph output that is a host node's result (directly or through Q/DQ) is left out, with the Q/DQ
    nodes that only lead to it: the host computes it. So is a host node's input that no kept compute node
    makes (a graph input through Q/DQ): the host reads it as it is.
    """
    g = model.graph
    index = GraphIndex(model)
    infos = value_infos(model)
    consts = constant_outputs(model) | set(index.inits)
    cut = [n for n in g.node if n.name in host]
    host_out = {o for n in cut for o in n.output if o}
    outputs = [o for o in g.output if o.name not in host_out and index.source(o.name) not in host_out]
    kept = [n for n in g.node if n.name not in host]
    computed = {o for n in g.node if n.name not in host and n.op_type not in QDQ for o in n.output}  # TOSA ops
    wanted = {o.name for o in outputs} | {i for n in cut for i in node_inputs(n)
                                          if i and i not in consts and index.source(i) in computed}
    while True:  # drop what now feeds nothing (the Q/DQ chains to outputs the host computes)
        read = {i for n in kept for i in node_inputs(n)} | wanted
        alive = [n for n in kept if any(o in read for o in n.output)]
        if len(alive) == len(kept):
            break
        kept = alive
    produced = {o for n in kept for o in n.output}
    read = {i for n in kept for i in node_inputs(n)}
    extra_out = [i for n in cut for i in node_inputs(n) if i in produced and i not in consts and i not in index.outputs
                 and index.source(i) in computed]
    new_in = [o for o in host_out if o in read]
    graph_inputs = [vi for vi in g.input if vi.name not in index.inits]
    nodes = []
    for n in kept:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        nodes.append(c)
    sub = helper.make_graph(nodes, g.name, graph_inputs + [_info(infos, t, model) for t in dict.fromkeys(new_in)],
                            outputs + [_info(infos, t, model) for t in dict.fromkeys(extra_out)],
                            [i for i in g.initializer if i.name in read])
    sub.value_info.extend(vi for name, vi in infos.items() if name in produced)
    out = helper.make_model(sub, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Type and shape of every tensor shape inference (or the import stage) knows, initializers included (a host
    node's constant weights: ethosu/host_work.py counts their multiply-accumulates)."""
    known = {t.name: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer}
    known.update({vi.name: vi for vi in model.graph.value_info})
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - a model onnx cannot infer still has the import stage's value_info
        inferred = model.graph
    known.update({vi.name: vi for vi in [*inferred.value_info, *inferred.input, *inferred.output]})
    return {k: v for k, v in known.items() if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def _info(infos: dict[str, onnx.ValueInfoProto], name: str, model: onnx.ModelProto) -> onnx.ValueInfoProto:
    vi = infos.get(name)
    if vi is None:
        node = GraphIndex(model).producer.get(name) or next(n for n in model.graph.node if name in n.input)
        raise InputError(f"node '{node.name}' ({node.op_type}): runs on the host, but the type and shape of "
                         f"'{name}' are unknown (no shape inference for this op)")
    return vi
