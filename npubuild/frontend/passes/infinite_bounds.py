"""Min, Max and Clip with an infinite bound on the side where it changes nothing: that bound removed.

TensorFlow's `tf.clip_by_value(x, 1e-10, inf)` (openWakeWord's mel front end, before its log), Keras's
`ReLU(max_value=None)` and torch's `clamp(min=0)` traced with an explicit `float('inf')` reach ONNX as
`Min(x, +inf)`, `Max(x, -inf)` or a Clip whose max is +inf / min is -inf. Each is the identity on that
side, but an infinite constant breaks what comes next: onnxruntime's quantiser asserts on it ("scale
issue") and no int8 scale holds it. So the import refuses infinite constants (frontend/model_checks.py)
except in exactly these places, and this pass, the first of the import's normalisation passes, removes
them: `Min(x, +inf)` is x, a Clip loses its infinite bound (and is x when both go). A constant that is
infinite only in part, on the other side (`Min(x, -inf)` is -inf), or whose broadcast would widen x's
shape is not a harmless bound: it stays, and the import refuses it after the passes with the same line.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import broadcasts_into, replace_value

BOUND_OPS = frozenset({"Min", "Max", "Clip"})


def identity_bound(op_type: str, index: int, values: np.ndarray) -> bool:
    """Whether constant `values` at input `index` of a Min, Max or Clip leaves the other operand unchanged
    (the shape aside): all +inf as a Min operand or a Clip's max, all -inf as a Max operand or a Clip's min."""
    if values.size == 0 or not np.issubdtype(values.dtype, np.floating):
        return False
    if op_type == "Min" or (op_type == "Clip" and index == 2):
        return bool(np.all(np.isposinf(values)))
    if op_type == "Max" or (op_type == "Clip" and index == 1):
        return bool(np.all(np.isneginf(values)))
    return False


def _drop_bounds(graph: ir.Graph, node: ir.Node) -> bool:
    infinite = [i for i, v in enumerate(node.inputs) if v is not None and v.const_value is not None
                and identity_bound(node.op_type, i, v.const_value.numpy())]
    data = node.inputs[0]
    if not infinite or node.op_type == "Clip" and 0 in infinite:
        return False
    kept = [v for i, v in enumerate(node.inputs) if i not in infinite and v is not None]
    if not kept or not all(broadcasts_into(node.inputs[i], data if node.op_type == "Clip" else kept[0])
                           for i in infinite):
        return False
    if node.op_type == "Clip":
        bounds = [None if i in infinite else v for i, v in enumerate(node.inputs)][1:]
        while bounds and bounds[-1] is None:
            bounds.pop()
        if bounds:  # the finite bound stays
            _replace_node(graph, node, [data, *bounds])
            return True
    elif len(kept) > 1:  # a Min of several operands: the others stay
        _replace_node(graph, node, kept)
        return True
    out, rest = node.outputs[0], kept[0]
    if out.is_graph_output() and (rest.is_graph_output() or rest.is_graph_input() or rest.is_initializer()):
        _replace_node(graph, node, [rest], op_type="Identity")  # a graph output keeps its own node
        return True
    replace_value(out, rest)
    graph.remove(node, safe=True)
    return True


def _replace_node(graph: ir.Graph, node: ir.Node, inputs: list[ir.Value | None], op_type: str | None = None) -> None:
    new = ir.node(op_type or node.op_type, inputs, name=node.name)
    graph.insert_before(node, new)
    out = node.outputs[0]
    name = out.name
    replace_value(out, new.outputs[0])
    graph.remove(node, safe=True)
    new.outputs[0].name = name
    new.outputs[0].shape, new.outputs[0].type = out.shape, out.type


@register("infinite_bounds")
class InfiniteBounds(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
            if node.op_type in BOUND_OPS and node.domain in ("", "ai.onnx"):
                modified |= _drop_bounds(node.graph, node)
        return ir.passes.PassResult(model, modified)
