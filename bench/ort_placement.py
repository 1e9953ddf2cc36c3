"""Which nodes of a QDQ model compute on float data: what a peer quantiser left out of int8.

onnxruntime's `quantize_static` quantises only the op types in its QDQ registry and never the bodies of an
If or Loop, so its "int8 model" can run part of the network in float32: openWakeWord's hey_jarvis runs its
whole second stage (the If's then-branch, the output whenever the first stage fires) in float, Silero VAD
gathers h and c from its float state input before quantising each on its own grid. An NPU runs neither:
a comparison with npubuild's all-int8 graph must say so (bench/real_models.py's notes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx

QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})


@dataclass
class Placement:
    """Compute nodes in all, and those reading a float activation that no DequantizeLinear produced (per op
    type), those inside control-flow bodies counted whole."""

    nodes: int = 0
    float_nodes: Counter = field(default_factory=Counter)
    in_subgraphs: int = 0

    @property
    def total_float(self) -> int:
        return sum(self.float_nodes.values())

    def describe(self) -> str:
        ops = ", ".join(f"{n} {op}" for op, n in self.float_nodes.most_common())
        where = f", {self.in_subgraphs} of them inside If/Loop bodies" if self.in_subgraphs else ""
        return f"{self.total_float} of {self.nodes} compute nodes read float data ({ops}{where})"


def float_placement(model: onnx.ModelProto) -> Placement:
    model = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.input,
                                                           *model.graph.output)}
    p = Placement()
    _walk(model.graph, types, p, inside=False)
    return p


def _walk(graph: onnx.GraphProto, types: dict[str, int], p: Placement, inside: bool) -> None:
    consts = {t.name for t in graph.initializer}
    produced = {o: n.op_type for n in graph.node for o in n.output}
    for n in graph.node:
        if n.op_type in QDQ or n.op_type == "Constant":
            continue
        p.nodes += 1
        floats = [i for i in n.input if i and i not in consts and types.get(i, onnx.TensorProto.FLOAT)
                  == onnx.TensorProto.FLOAT and produced.get(i) not in ("DequantizeLinear", "Constant")]
        if inside or floats and n.op_type not in SUBGRAPH_OPS:
            p.float_nodes[n.op_type] += 1
            p.in_subgraphs += inside
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _walk(a.g, types, p, inside=True)
