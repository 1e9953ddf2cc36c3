"""Helpers the rewriting passes share (a leading underscore: load_all registers no pass from here)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Readers of `old` read `new`; a graph output keeps its name (the model's interface is unchanged)."""
    was_output, name = old.is_graph_output(), old.name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if was_output:
        old.name = f"{name}__replaced"
        new.name = name


def broadcasts_into(small: ir.Value, big: ir.Value | None) -> bool:
    """Whether broadcasting `small` against `big` leaves `big`'s shape as it is."""
    if small.const_value is not None and small.const_value.size == 1 and (small.shape is None or len(small.shape) <= (
            len(big.shape) if big is not None and big.shape is not None else 0)):
        return True
    if big is None or big.shape is None or small.shape is None or len(small.shape) > len(big.shape):
        return False
    for s, b in zip(reversed(list(small.shape)), reversed(list(big.shape)), strict=False):
        if s != 1 and s != b:
            return False
    return True


def new_initializer(graph: ir.Graph, base: str, arr: np.ndarray) -> ir.Value:
    """A new initializer holding `arr`, named `base` (or base2, base3, ... where that name is taken)."""
    name, n = base, 1
    while name in graph.initializers:
        n += 1
        name = f"{base}{n}"
    value = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
    graph.register_initializer(value)
    return value


class NodeRewrite(ir.passes.InPlacePass):
    """A pass that offers each node of the main graph (ONNX's own domain) to `rewrite`, which changes the graph
    around it or returns False."""

    def rewrite(self, graph: ir.Graph, node: ir.Node) -> bool:
        raise NotImplementedError

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.domain in ("", "ai.onnx"):
                modified |= self.rewrite(model.graph, node)
        return ir.passes.PassResult(model, modified)
