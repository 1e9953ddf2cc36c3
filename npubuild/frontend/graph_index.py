"""One index over an ONNX graph: who produces and who reads each tensor, seen through Q -> DQ pairs.

Built once per model and shared by the ONNX rewrites (frontend/), the lowering context, partitioning and
debug-numerics, so every one of them means the same thing by "the only reader" or "the value behind a
Q/DQ pair". The graph must not change while an index of it is in use.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


class GraphIndex:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.graph = g
        self.producer: dict[str, onnx.NodeProto] = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for name in n.input:
                if name:
                    self.consumers.setdefault(name, []).append(n)
        self.inits: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
        self.inputs: set[str] = {i.name for i in g.input} - set(self.inits)
        self.output_names: list[str] = [o.name for o in g.output]
        self.outputs: set[str] = set(self.output_names)
        self.order: dict[str, int] = {n.name: i for i, n in enumerate(g.node)}

    def array(self, name: str) -> np.ndarray | None:
        """The initializer `name` as an array, or None."""
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def only_user(self, name: str, op_type: str | None = None) -> onnx.NodeProto | None:
        """The single reader of `name` (of `op_type`, if given), provided `name` is not also a graph output."""
        users = self.consumers.get(name, [])
        if name in self.outputs or len(users) != 1 or (op_type is not None and users[0].op_type != op_type):
            return None
        return users[0]

    def consumer_of_type(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The single reader of `name` if it is an `op_type` (whether or not `name` is a graph output)."""
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and users[0].op_type == op_type else None

    def quantized_copy(self, name: str) -> str | None:
        """The DequantizeLinear output of the one Q -> DQ pair that is `name`'s only reader chain, or None."""
        q = self.consumer_of_type(name, "QuantizeLinear")
        dq = self.consumer_of_type(q.output[0], "DequantizeLinear") if q is not None else None
        return dq.output[0] if dq is not None else None

    def source(self, name: str) -> str:
        """The real value behind `name`: the input of the Q of a Q -> DQ chain ending at `name`."""
        for _ in range(8):
            dq = self.producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                return name
            q = self.producer.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                return name
            name = q.input[0]
        return name

    def uses(self, name: str, seen: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        """The non-Q/DQ nodes that read `name`, directly or through Q -> DQ; Q/DQ passed are added to `seen`."""
        found = []
        for n in self.consumers.get(name, []):
            if n.op_type in QDQ:
                seen.append(n)
                found += self.uses(n.output[0], seen)
            else:
                found.append(n)
        return found

    def graph_output_for(self, value: str) -> str | None:
        """The graph output `value` reaches through a chain of sole-reader Q/DQ nodes (at most 4), if any."""
        seen = value
        for _ in range(4):
            if seen in self.outputs:
                return seen
            users = self.consumers.get(seen, [])
            nexts = [n for n in users if n.op_type in QDQ]
            if len(nexts) != 1 or len(users) != 1:
                return None
            seen = nexts[0].output[0]
        return seen if seen in self.outputs else None

    def reaches_output(self, name: str) -> bool:
        """True if `name`, or a Q/DQ copy of it (along any branch), is a graph output."""
        if self.graph_output_for(name) is not None or name in self.outputs:
            return True
        return any(self.reaches_output(n.output[0]) for n in self.consumers.get(name, []) if n.op_type in QDQ)


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs, and the outer-scope names its subgraphs (Loop, If, Scan bodies)
    use, which a partition or a cut must carry in as well."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            names += [n for n in _outer_names(sub) if n not in names]
    return names


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    return list(dict.fromkeys(i for n in graph.node for i in node_inputs(n) if i not in defined))
