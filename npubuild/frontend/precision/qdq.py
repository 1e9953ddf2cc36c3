"""An int8 QDQ model seen as what a precision plan changes: quantised activations, their groups, weighted layers.

A quantised activation is one QuantizeLinear of a non-constant tensor and the DequantizeLinears reading it
(onnxruntime's QDQ models have one Q and one DQ per tensor). Data movement (MaxPool, Reshape, Concat,
Resize...) keeps its input's quantisation in the QDQ model and in the lowering, so the activations it joins
form a group: promoted to int16 together, with one scale, so no requantisation appears between them. A
group is named after its first activation in graph order and described by the compute nodes that produce it
(its layers, what the report shows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

Q, DQ = "QuantizeLinear", "DequantizeLinear"
# ops whose output keeps their input's quantisation (the lowering moves the integers as they are)
MOVEMENT = frozenset({"MaxPool", "GlobalMaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                      "Identity", "Slice", "Split", "Pad", "DepthToSpace", "SpaceToDepth", "Concat", "Resize",
                      "Gather", "Tile", "Expand", "Dropout", "ReduceMax", "ReduceMin"})
WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


@dataclass
class Activation:
    """One quantised activation: the tensor its Q reads, the Q node, its DQ nodes and int8 parameters."""

    name: str
    q: onnx.NodeProto
    dqs: list[onnx.NodeProto]
    scale: float
    zero_point: int
    producer: onnx.NodeProto | None  # None for a graph input
    readers: list[tuple[onnx.NodeProto, int]] = field(default_factory=list)  # (node, input index) via a DQ

    @property
    def real_range(self) -> tuple[float, float]:
        """The real values the int8 grid covers."""
        return (-128 - self.zero_point) * self.scale, (127 - self.zero_point) * self.scale


@dataclass
class Group:
    """Activations sharing one quantisation through data movement: int16 together or not at all."""

    name: str
    activations: list[str]
    layers: list[str]  # compute nodes producing its activations (a graph input's name for an input)


@dataclass
class Layer:
    """A node with a constant int8 weight (a Conv, ConvTranspose, Gemm or a constant-weight MatMul)."""

    name: str
    node: onnx.NodeProto
    weight_dq: onnx.NodeProto
    weight_elements: int

    @property
    def op_type(self) -> str:
        return self.node.op_type


class QdqModel:
    """The activations, groups and weighted layers of an int8 QDQ model (read once; the model is not changed)."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.inits = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for n in g.node:
            for i, name in enumerate(n.input):
                if name:
                    self.consumers.setdefault(name, []).append((n, i))
        self.order = {n.name: i for i, n in enumerate(g.node)}
        self.activations: dict[str, Activation] = {}
        for n in g.node:
            if n.op_type != Q or n.input[0] in self.inits:
                continue
            dqs = [c for c, _ in self.consumers.get(n.output[0], []) if c.op_type == DQ]
            scale = self.array(n.input[1])
            zp = self.array(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros(1, np.int8)
            if scale is None or zp is None or scale.size != 1 or zp.dtype != np.int8:
                continue  # per-axis or already another type: not an int8 activation this pass changes
            producer = self.producer.get(n.input[0])
            act = Activation(n.input[0], n, dqs, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), producer)
            for dq in dqs:
                act.readers += [(c, i) for c, i in self.consumers.get(dq.output[0], [])]
            self.activations[act.name] = act
        self.of_dq_output = {dq.output[0]: a for a in self.activations.values() for dq in a.dqs}
        self.groups = self._groups()
        self.group_of = {a: grp.name for grp in self.groups.values() for a in grp.activations}
        self.layers = self._layers()

    def array(self, name: str) -> np.ndarray | None:
        init = self.inits.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def read_activation(self, node: onnx.NodeProto, i: int) -> Activation | None:
        """The quantised activation input i of `node` reads through its DQ, if any."""
        return self.of_dq_output.get(node.input[i]) if i < len(node.input) else None

    def written_activations(self, node: onnx.NodeProto) -> list[Activation]:
        return [self.activations[o] for o in node.output if o in self.activations]

    def _groups(self) -> dict[str, Group]:
        parent = {a: a for a in self.activations}

        def find(a: str) -> str:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for n in self.model.graph.node:
            if n.op_type not in MOVEMENT:
                continue
            joined = [a.name for i in range(len(n.input)) if (a := self.read_activation(n, i)) is not None]
            joined += [a.name for a in self.written_activations(n)]
            for other in joined[1:]:
                ra, rb = find(joined[0]), find(other)
                if ra != rb:
                    parent[rb] = ra
        members: dict[str, list[str]] = {}
        for a in self.activations:  # graph order: Q nodes are in it
            members.setdefault(find(a), []).append(a)
        groups = {}
        for acts in members.values():
            layers = []
            for a in acts:
                p = self.activations[a].producer
                if p is None:
                    layers.append(a)
                elif p.op_type not in MOVEMENT and p.op_type not in (Q, DQ):
                    layers.append(p.name)
            groups[acts[0]] = Group(acts[0], acts, layers)
        return groups

    def _layers(self) -> dict[str, Layer]:
        out = {}
        for n in self.model.graph.node:
            if n.op_type not in WEIGHTED or len(n.input) < 2:
                continue
            dq = self.producer.get(n.input[1])
            if dq is None or dq.op_type != DQ or dq.input[0] not in self.inits:
                continue
            data = self.array(dq.input[0])
            if data is None or data.dtype != np.int8 or data.ndim < 2:
                continue
            zp = self.array(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
            if zp is not None and np.any(zp != 0):
                continue
            out[n.name] = Layer(n.name, n, dq, int(data.size))
        return out


BITS = {onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8, onnx.TensorProto.INT16: 16, onnx.TensorProto.UINT16: 16,
        onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4, onnx.TensorProto.INT32: 32}


def node_precisions(model: onnx.ModelProto) -> dict[str, str]:
    """Per compute node of a QDQ model its precision, as the reports show it: `16x8`, `8x8`, `8x4` (activation x
    weight bits) for a conv or fully connected layer, else `int16` / `int8`, `int8->int16` where the output's type
    differs from the inputs'. Empty for a model with no 16-bit activation or 4-bit weight (an 8x8 build says
    nothing new, and its records stay as they were)."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def qbits(node: onnx.NodeProto) -> int | None:
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        return BITS.get(inits[zp].data_type) if zp in inits else 8

    def dq_of(name: str) -> onnx.NodeProto | None:
        p = producer.get(name)
        return p if p is not None and p.op_type == DQ else None

    if not any(n.op_type in (Q, DQ) and qbits(n) in (4, 16) for n in model.graph.node):
        return {}
    out = {}
    for n in model.graph.node:
        if n.op_type in (Q, DQ):
            continue
        ins = [qbits(d) for i in n.input if i and (d := dq_of(i)) is not None and d.input[0] not in inits]
        outs = [qbits(q) for o in n.output for q in readers.get(o, []) if q.op_type == Q]
        weight = dq_of(n.input[1]) if n.op_type in WEIGHTED and len(n.input) > 1 else None
        w_bits = BITS.get(inits[weight.input[0]].data_type) if weight is not None and weight.input[0] in inits else None
        a_in = max((b for b in ins if b), default=None)
        a_out = max((b for b in outs if b), default=None)
        if w_bits in (4, 8) and a_in:
            text = f"{a_in}x{w_bits}"
            out[n.name] = text if a_out in (None, a_in) else f"{text}->int{a_out}"
        elif a_in or a_out:
            a_in, a_out = a_in or a_out, a_out or a_in
            out[n.name] = f"int{a_in}" if a_in == a_out else f"int{a_in}->int{a_out}"
    return out
