"""A data-dependent If whose branches are both cheap: both branches computed, a Where picks the result.

An If whose condition depends on the input (openWakeWord's wake-word head runs its second stage only when
the first score is high; a sample-rate input choosing between two front ends) cannot fold
(control_flow.py). Left as an If it is one host node holding everything inside it: the host runs both
the dispatch and the branch taken, on a CPU that is tens of times slower than the NPU for the MACs these
branches are made of. If-converted (the classical compiler transform), both branches become ordinary
nodes of the graph, lowered and placed like any other, and `Where(cond, then, else)` selects per output:
the NPU runs the untaken branch's work as well, so the worst case is bounded by both branches on the NPU
rather than the taken one on the host; the select itself is SELECT on Ethos-U85 and a host node on U55/U65
(Vela has no SELECT there), beside the condition.

Converted only when that is the same function and cheap:
- both branches return values of one static shape and element type per output (Where cannot reconcile
  branches of different shapes; ONNX allows them);
- no control flow inside a branch (what could fold has folded before this pass runs);
- together at most SELECT_MAX_MACS multiply-accumulates (both branches then cost at most ~3 ms a run on a
  U55-128, where the host would spend that on the taken one alone; beyond it, a rarely taken expensive
  branch would cost every inference, so the If stays on the host whole, placed with that reason).
The untaken branch's values never reach an output (Where drops them, NaN included); calibration sees both
branches' ranges, as it must, since both now run.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes.control_flow import (
    CONTROL_FLOW_OPS,
    Namer,
    StaticValues,
    connect,
    mark_host,
    splice,
)

SELECT_MAX_MACS = 50_000_000


def _numel(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return math.prod(value.shape)


def node_macs(node: ir.Node) -> int | None:
    """Multiply-accumulates of a Conv, ConvTranspose, Gemm or MatMul from its static shapes (0 for any other
    op: elementwise work is not what makes a branch expensive); None when a shape it needs is unknown."""
    if node.op_type in ("Conv", "ConvTranspose"):
        w = node.inputs[1] if len(node.inputs) > 1 else None
        out = _numel(node.outputs[0])
        x = _numel(node.inputs[0])
        if w is None or w.shape is None or out is None or x is None or not all(isinstance(d, int) for d in w.shape):
            return None
        per = math.prod(w.shape[1:])
        return out * per if node.op_type == "Conv" else x * per
    if node.op_type in ("Gemm", "MatMul"):
        a, out = node.inputs[0], _numel(node.outputs[0])
        if a is None or a.shape is None or out is None or not isinstance(a.shape[-1], int):
            return None
        k = a.shape[0] if node.op_type == "Gemm" and node.attributes.get_int("transA", 0) else a.shape[-1]
        return out * k
    return 0


def _branch(node: ir.Node, name: str) -> ir.Graph | None:
    attr = node.attributes.get(name)
    return attr.as_graph() if attr is not None and attr.type == ir.AttributeType.GRAPH else None


def why_not_select(node: ir.Node) -> str | None:
    """Why this If's branches cannot both run with a select (None: they can)."""
    then_g, else_g = _branch(node, "then_branch"), _branch(node, "else_branch")
    if then_g is None or else_g is None or not (len(then_g.outputs) == len(else_g.outputs) == len(node.outputs)):
        return "its branches are not plain subgraphs with one output per If output"
    for i, (a, b) in enumerate(zip(then_g.outputs, else_g.outputs, strict=True)):
        if a.dtype is None or a.dtype != b.dtype:
            return f"its branches return different element types for output {i}"
        if _numel(a) is None or _numel(b) is None or list(a.shape) != list(b.shape):
            return f"its branches return different or unknown shapes for output {i} ({a.shape} and {b.shape})"
    macs = 0
    for g in (then_g, else_g):
        for n in ir.traversal.RecursiveGraphIterator(g):
            if n.op_type in CONTROL_FLOW_OPS:
                return f"a branch holds control flow of its own ({n.op_type} '{n.name}')"
            m = node_macs(n)
            if m is None:
                return f"a branch's node '{n.name}' ({n.op_type}) has shapes that are not static"
            macs += m
    if macs > SELECT_MAX_MACS:
        return f"its branches hold {macs:,} MACs together, over the {SELECT_MAX_MACS:,} that both may cost every run"
    return None


def _scalar_condition(graph: ir.Graph, node: ir.Node, namer: Namer) -> ir.Value:
    """The condition in a shape Where broadcasts to every output's shape unchanged: as it is if its rank is at
    most theirs (a [1] or [1, 1] comparison result), else a rank-0 bool."""
    cond = node.inputs[0]
    ranks = [len(o.shape) for o in node.outputs if o.shape is not None]
    if cond.shape is not None and (len(cond.shape) == 0 or len(ranks) == len(node.outputs)
                                   and len(cond.shape) <= min(ranks)):
        return cond
    empty = ir.Value(name=namer.claim(f"{node.name}_cond_shape", namer.values, node.name or "If"),
                     const_value=ir.tensor([], dtype=ir.DataType.INT64), shape=ir.Shape([0]),
                     type=ir.TensorType(ir.DataType.INT64))
    graph.register_initializer(empty)
    reshape = ir.node("Reshape", [cond, empty], name=namer.claim(f"{node.name}_cond_scalar", namer.nodes, "If"))
    reshape.outputs[0].shape = ir.Shape([])
    reshape.outputs[0].type = ir.TensorType(ir.DataType.BOOL)
    graph.insert_before(node, reshape)
    return reshape.outputs[0]


def select_if(graph: ir.Graph, node: ir.Node, namer: Namer) -> None:
    then_g, else_g = _branch(node, "then_branch"), _branch(node, "else_branch")
    assert then_g is not None and else_g is not None
    cond = _scalar_condition(graph, node, namer)
    prefix = node.name or "If"
    then_out = splice(graph, node, then_g, namer, f"{prefix}/then")
    else_out = splice(graph, node, else_g, namer, f"{prefix}/else")
    for i, (old, a, b) in enumerate(zip(node.outputs, then_out, else_out, strict=True)):
        where = ir.node("Where", [cond, a, b], name=namer.claim(f"{prefix}_select{i}", namer.nodes, prefix))
        where.outputs[0].shape = a.shape
        where.outputs[0].type = a.type
        graph.insert_before(node, where)
        connect(graph, node, old, where.outputs[0], namer)
    graph.remove(node, safe=True)


@register("if_select")
class IfSelect(ir.passes.InPlacePass):
    """Data-dependent If nodes with cheap branches of one shape: both branches and a Where per output."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        values = StaticValues(model.opset_imports.get("", 13))
        namer = Namer(model.graph)
        modified = False
        for node in list(model.graph):
            if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs:
                continue
            if values.value(node.inputs[0]) is not None:
                continue  # a static condition: fold_control_flow's
            why = why_not_select(node)
            if why is None:
                select_if(model.graph, node, namer)
                modified = True
            else:
                modified |= mark_host(node, f"an If whose condition depends on the data, and no select can run both branches: "
                                f"{why}; it runs whole on the host")
        return ir.passes.PassResult(model, modified)
