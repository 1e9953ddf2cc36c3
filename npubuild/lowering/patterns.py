"""Multi-node ONNX patterns that lower better as one TOSA op: the Erf form of GELU, and SiLU.

torch exports nn.GELU() (before opset 20) as x * (1 + Erf(x / sqrt 2)) * 0.5,
and after quantisation every intermediate gets a Q/DQ pair. Lowered node by
node that is five int8 ops with four extra roundings; recognised as one GELU it
is a single TABLE. The matcher looks through Q -> DQ chains, so it works on the
QDQ graph; it fires at the first node of the pattern (in graph order) and
marks the rest as fused so the driver skips them.

Accuracy: the TABLE computes GELU exactly (one rounding), while onnxruntime's
QDQ reference rounds after each of the five nodes, so the two can differ by a
few LSB (1 measured); the difference is the reference's error, not the lowering's.
SiLU (x * Sigmoid(x), torch's nn.SiLU export) is the same idea on two nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.lowering.context import LoweringContext, QConst
from npubuild.lowering.table import build_table, emit_table

QDQ = ("QuantizeLinear", "DequantizeLinear")


def gelu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


class GraphView:
    """Producer/consumer look-ups over the ONNX graph that see through Q -> DQ pairs."""

    def __init__(self, ctx: LoweringContext):
        self.ctx = ctx
        self.producer: dict[str, onnx.NodeProto] = {o: n for n in ctx.model.graph.node for o in n.output}
        self.order = {n.name: i for i, n in enumerate(ctx.model.graph.node)}
        self.inits = {i.name for i in ctx.model.graph.initializer}

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
        for n in self.ctx.consumers.get(name, []):
            if n.op_type in QDQ:
                seen.append(n)
                found += self.uses(n.output[0], seen)
            else:
                found.append(n)
        return found

    def const(self, name: str) -> np.ndarray | None:
        """A real-valued constant (an initializer, or a DequantizeLinear of one), or None."""
        v = self.ctx.values.get(name)
        if isinstance(v, np.ndarray) and name in self.inits:
            return v.astype(np.float64)
        node = self.producer.get(name)
        if node is not None and node.op_type == "DequantizeLinear" and node.input[0] in self.inits:
            data = self.ctx.values.get(node.input[0])
            if isinstance(data, np.ndarray):
                return self.ctx.qparams_of(node).dequantize(data)
        return v.real().astype(np.float64) if isinstance(v, QConst) else None

    def is_scalar(self, name: str, value: float, rtol: float = 1e-2) -> bool:
        c = self.const(name)
        return c is not None and c.size == 1 and math.isclose(float(c.reshape(-1)[0]), value, rel_tol=rtol)

    def split(self, node: onnx.NodeProto) -> tuple[str, str] | None:
        """(activation source, constant input name) of a binary node with exactly one constant input."""
        a, b = node.input[0], node.input[1]
        ca, cb = self.const(a) is not None, self.const(b) is not None
        if ca == cb:
            return None
        return (self.source(b), a) if ca else (self.source(a), b)


@dataclass
class Match:
    x_input: str  # the current node's input carrying x (a DQ output)
    output: str  # the final node's output
    nodes: list[onnx.NodeProto] = field(default_factory=list)  # compute nodes of the pattern
    qdq: list[onnx.NodeProto] = field(default_factory=list)  # Q/DQ nodes strictly inside the pattern


def _single_use(g: GraphView, node: onnx.NodeProto, m: Match, op_type: str) -> onnx.NodeProto | None:
    if g.ctx.is_graph_output(node.output[0]):
        return None
    seen: list[onnx.NodeProto] = []
    uses = g.uses(node.output[0], seen)
    if len(uses) != 1 or uses[0].op_type != op_type:
        return None
    m.qdq += seen
    return uses[0]


def _other(g: GraphView, node: onnx.NodeProto, prev: onnx.NodeProto) -> str:
    """The input of a binary `node` that does not come from `prev`."""
    a, b = node.input[0], node.input[1]
    return b if g.source(a) == prev.output[0] else a


def match_gelu(ctx: LoweringContext) -> Match | None:
    """The Erf GELU pattern whose first node (in graph order) is the current node, or None."""
    g = GraphView(ctx)
    node = ctx.current
    parts = g.split(node) if len(node.input) == 2 else None
    if parts is None:
        return None
    x = parts[0]
    for start in g.uses(x, []):
        m = _match_from(g, x, start)
        if m is not None and min(m.nodes, key=lambda n: g.order[n.name]).name == node.name:
            m.x_input = next(i for i in node.input if g.source(i) == x)
            return m
    return None


def _match_from(g: GraphView, x: str, div: onnx.NodeProto) -> Match | None:
    """Match Div(x, sqrt2) | Mul(x, 1/sqrt2) -> Erf -> Add 1 -> (Mul x, Mul 0.5 in either order)."""
    parts = g.split(div) if div.op_type in ("Div", "Mul") and len(div.input) == 2 else None
    if parts is None or parts[0] != x:
        return None
    want = math.sqrt(2.0) if div.op_type == "Div" else 1.0 / math.sqrt(2.0)
    if div.op_type == "Div" and g.const(div.input[0]) is not None or not g.is_scalar(parts[1], want):
        return None
    m = Match("", "", [div])
    erf = _single_use(g, div, m, "Erf")
    add = erf and _single_use(g, erf, m, "Add")
    if add is None or not g.is_scalar(_other(g, add, erf), 1.0):
        return None
    mul1 = _single_use(g, add, m, "Mul")
    if mul1 is None:
        return None
    m.nodes += [erf, add, mul1]
    other = _other(g, mul1, add)
    if g.source(other) == x or g.is_scalar(other, 0.5):
        mul2 = _single_use(g, mul1, m, "Mul")
        if mul2 is None:
            return None
        rest = _other(g, mul2, mul1)
        if not (g.is_scalar(rest, 0.5) if g.source(other) == x else g.source(rest) == x):
            return None
        m.nodes.append(mul2)
    else:  # (x * 0.5) * (1 + erf)
        half = g.producer.get(g.source(other))
        if half is None or half.op_type != "Mul" or g.split(half) is None:
            return None
        hx, hc = g.split(half)
        seen: list[onnx.NodeProto] = []
        if hx != x or not g.is_scalar(hc, 0.5) or g.uses(half.output[0], seen) != [mul1]:
            return None
        m.qdq += seen
        m.nodes.append(half)
    final = max(m.nodes, key=lambda n: g.order[n.name])
    m.output = final.output[0]
    return m


def try_fuse_gelu(ctx: LoweringContext) -> bool:
    """If the current node starts an Erf GELU, emit one int8 TABLE for the whole pattern and skip the rest."""
    m = match_gelu(ctx)
    if m is None:
        return False
    x = ctx.value(m.x_input)
    qs = [n for n in ctx.consumers.get(m.output, []) if n.op_type == "QuantizeLinear"]
    if not qs or not hasattr(x, "q") or x.q is None or x.dtype != np.int8:
        return False
    out_q = ctx.qparams_of(qs[0])
    if out_q.dtype != np.int8:
        return False
    out = emit_table(ctx, x, build_table(gelu, x.q, out_q), out_q, output_of=m.output)
    ctx.values[m.output] = out
    ctx.fused.update(n.name for n in [*m.nodes, *m.qdq] if n.name != ctx.current.name)
    return True


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / (1.0 + np.exp(-x))


def try_fuse_silu(ctx: LoweringContext) -> bool:
    """Sigmoid(x) whose only use is Mul(x, Sigmoid(x)) (SiLU/Swish as torch exports it): one int8 TABLE."""
    g = GraphView(ctx)
    node = ctx.current
    if ctx.is_graph_output(node.output[0]):
        return False
    seen: list[onnx.NodeProto] = []
    uses = g.uses(node.output[0], seen)
    if len(uses) != 1 or uses[0].op_type != "Mul" or len(uses[0].input) != 2:
        return False
    mul = uses[0]
    x = g.source(node.input[0])
    srcs = [g.source(i) for i in mul.input]
    if sorted(srcs) != sorted([x, node.output[0]]):
        return False
    xt = ctx.value(node.input[0])
    qs = [n for n in ctx.consumers.get(mul.output[0], []) if n.op_type == "QuantizeLinear"]
    if not qs or getattr(xt, "q", None) is None or xt.dtype != np.int8:
        return False
    out_q = ctx.qparams_of(qs[0])
    if out_q.dtype != np.int8:
        return False
    ctx.values[mul.output[0]] = emit_table(ctx, xt, build_table(silu, xt.q, out_q), out_q, output_of=mul.output[0])
    ctx.fused.update(n.name for n in [mul, *seen])
    return True
