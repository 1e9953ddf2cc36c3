"""Terms that are exactly zero: an integer times a zero constant, and a zero constant added.

torch exports keep an input that the traced path does not use alive with `+ sr * 0`: Silero VAD's
16 kHz export computes `stateN = state' + float(sr * 0)` from its int64 sample-rate input. Nothing of it is
data, yet it is a dependency: the int64 Mul and its Cast cannot run on the NPU, so they split the graph
around a host partition at the model's output. An integer times zero is zero whatever the integer
(no inf or NaN to propagate, as a float would), so the product is a zero constant (constant folding then
folds the Cast); and `x + 0` / `x - 0` is x (for a float x too: x + 0.0 == x, -0.0 becoming +0.0, which
compares equal). The Add is only dropped when the zeros do not widen x's shape by broadcasting.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import broadcasts_into, replace_value

INTEGER = frozenset({ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64, ir.DataType.UINT8,
                     ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64, ir.DataType.BOOL})


def _zeros(value: ir.Value | None) -> bool:
    return value is not None and value.const_value is not None and value.const_value.size > 0 and \
        not np.any(value.const_value.numpy())


def _static(value: ir.Value) -> list[int] | None:
    if value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return None
    return list(value.shape)


def _integer_times_zero(graph: ir.Graph, node: ir.Node) -> bool:
    out = node.outputs[0]
    shape = _static(out)
    if len(node.inputs) != 2 or out.dtype not in INTEGER or shape is None or out.is_graph_output():
        return False
    if not (_zeros(node.inputs[0]) or _zeros(node.inputs[1])):
        return False
    zero = np.zeros(shape, out.dtype.numpy())
    name = f"{out.name}__zero"
    value = ir.Value(name=name, const_value=ir.tensor(zero, name=name), shape=ir.Shape(shape), type=out.type)
    graph.register_initializer(value)
    ir.convenience.replace_all_uses_with(out, value)
    graph.remove(node, safe=True)
    return True


def _plus_zero(graph: ir.Graph, node: ir.Node) -> bool:
    if len(node.inputs) != 2:
        return False
    sides = (0, 1) if node.op_type == "Add" else (0,)  # 0 - x is not x
    for keep in sides:
        x, zero = node.inputs[keep], node.inputs[1 - keep]
        if x is None or not _zeros(zero) or not broadcasts_into(zero, x) or x.dtype != node.outputs[0].dtype:
            continue
        out = node.outputs[0]
        if out.is_graph_output() and (x.is_graph_output() or x.is_graph_input() or x.is_initializer()):
            return False  # one value cannot be two graph outputs, or an output and an input
        replace_value(out, x)
        graph.remove(node, safe=True)
        return True
    return False


@register("zero_terms")
class ZeroTerms(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Mul":
                modified |= _integer_times_zero(model.graph, node)
            elif node.op_type in ("Add", "Sub"):
                modified |= _plus_zero(model.graph, node)
        return ir.passes.PassResult(model, modified)
