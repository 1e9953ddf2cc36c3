"""Fuse a chain of elementwise ONNX nodes that is a function of one int8 tensor into one TABLE.

If a connected group of elementwise nodes reads only one activation x (plus
scalar constants) and only one of its results is used outside the group, the
group computes y = f(x) for a unary f, and an int8 x has only 256 values: the
whole group is one TOSA TABLE. This catches the Erf form of GELU torch
exports (x * (1 + Erf(x / sqrt 2)) * 0.5, five nodes), its tanh form (nine
nodes), SiLU (x * Sigmoid(x)), a hand-written hard-swish (x * Clip(x + 3, 0, 6)
/ 6), Mish and the like, without a matcher per formula.

The matcher looks through Q -> DQ pairs (every intermediate of a QDQ graph has
one), fires at the group's first node in graph order and marks the rest, with
the Q/DQ between them, as fused so the driver skips them. f is evaluated by
onnxruntime on the float nodes, each Q/DQ inside the group kept only as the
clamp to its int8 range (onnxruntime folds Relu/Clip into such ranges), so the
table is the float function rounded once. onnxruntime's QDQ reference rounds after
every node instead, so the two can differ by a LSB or so (1 measured for GELU
and SiLU); that is the reference's extra rounding, not the lowering's.

Groups made only of affine ops and clamps (x * c, x + c, Relu, Clip) are left
alone: they lower to RESCALE/CLAMP, which Vela fuses into the op before them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.table import build_table, emit_table

QDQ = ("QuantizeLinear", "DequantizeLinear")
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt",
               "Reciprocal", "Abs", "Neg", "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "PRelu"}
CHEAP = {"Add", "Sub", "Mul", "Div", "Relu", "Clip", "Min", "Max"}  # affine or clamp with one activation input
MAX_NODES = 32


def gelu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _activation_inputs(ctx: LoweringContext, node: onnx.NodeProto) -> set[str] | None:
    """Sources of the node's non-constant inputs, or None if a constant input is not a scalar."""
    found = set()
    for name in node.input:
        if not name:
            continue
        c = ctx.real_const(name)
        if c is None:
            found.add(ctx.index.source(name))
        elif c.size != 1:
            return None
    return found


def _grow(ctx: LoweringContext, start: onnx.NodeProto, x: str) -> list[onnx.NodeProto]:
    """Every later elementwise node reachable from `start` that reads only x, the group's results and scalars."""
    group = [start]
    produced = set(start.output)
    frontier = [*start.output, x]
    while frontier and len(group) < MAX_NODES:
        t = frontier.pop()
        for c in ctx.index.uses(t, []):
            if c in group or c.op_type not in ELEMENTWISE or ctx.index.order[c.name] <= ctx.index.order[start.name]:
                continue
            srcs = _activation_inputs(ctx, c)
            if srcs is None or not srcs <= produced | {x} or c.name in ctx.fused:
                continue
            group.append(c)
            produced.update(c.output)
            frontier += list(c.output)
    return group


def _ancestors(ctx: LoweringContext, group: list[onnx.NodeProto], out: str) -> list[onnx.NodeProto]:
    by_output = {o: n for n in group for o in n.output}
    keep: dict[str, onnx.NodeProto] = {}
    todo = [out]
    while todo:
        n = by_output.get(ctx.index.source(todo.pop()))
        if n is not None and n.name not in keep:
            keep[n.name] = n
            todo += [i for i in n.input if i]
    return sorted(keep.values(), key=lambda n: ctx.index.order[n.name])


def _closed(ctx: LoweringContext, part: list[onnx.NodeProto], out: str) -> list[onnx.NodeProto] | None:
    """The Q/DQ nodes inside `part` if every result but `out` is used only inside it, else None."""
    names = {n.name for n in part}
    inner: list[onnx.NodeProto] = []
    for n in part:
        for o in n.output:
            if o == out:
                continue
            seen: list[onnx.NodeProto] = []
            if ctx.index.reaches_output(o) or any(u.name not in names for u in ctx.index.uses(o, seen)):
                return None
            inner += seen
    return inner


def _evaluator(ctx: LoweringContext, part: list[onnx.NodeProto], x: str, out: str
               ) -> Callable[[np.ndarray], np.ndarray]:
    """f(x) of the float nodes, run by onnxruntime on a 1-D x.

    A Q -> DQ pair inside the group becomes a Clip to its int8 range: no rounding, but its saturation kept,
    as onnxruntime folds a Relu/Clip into the range of the Q before it and the graph then has no Clip node.
    """
    inits, nodes, clipped = [], [], {}

    def scalar(v: float) -> str:
        inits.append(onnx.numpy_helper.from_array(np.array(v, np.float32), f"c{len(inits)}"))
        return inits[-1].name

    for n in part:
        ins = []
        for name in n.input:
            c = ctx.real_const(name) if name else None
            if not name:
                ins.append("")
            elif c is not None:
                ins.append(scalar(float(c.reshape(-1)[0])))
            elif ctx.index.source(name) == x:
                ins.append("x")
            elif name != ctx.index.source(name):
                if name not in clipped:
                    q = ctx.qparams_of(ctx.index.producer[name])
                    lo, hi = (q.qmin - q.zp) * q.s, (q.qmax - q.zp) * q.s
                    clipped[name] = f"{name}_saturated"
                    nodes.append(helper.make_node("Clip", [ctx.index.source(name), scalar(lo), scalar(hi)], [clipped[name]]))
                ins.append(clipped[name])
            else:
                ins.append(name)
        m = helper.make_node(n.op_type, ins, list(n.output), name=n.name)
        m.attribute.extend(n.attribute)
        nodes.append(m)
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[o for o in ctx.model.opset_import if o.domain in ("", "ai.onnx")])
    model.ir_version = min(ctx.model.ir_version, 10) or 8
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda v: np.asarray(sess.run(None, {"x": np.asarray(v, np.float32)})[0], np.float64).reshape(-1)


def try_fuse_unary_region(ctx: LoweringContext) -> bool:
    """If the current node starts a group computing f(x) of one int8 tensor, emit one TABLE for it."""
    node = ctx.current
    srcs = _activation_inputs(ctx, node)
    if not srcs or len(srcs) != 1:
        return False
    (x,) = srcs
    group = _grow(ctx, node, x)
    if len(group) < 2:
        return False
    best: tuple[list[onnx.NodeProto], list[onnx.NodeProto], str] | None = None
    for n in group:
        for out in n.output:
            part = _ancestors(ctx, group, out)
            if node not in part or len(part) < 2 or (best is not None and len(part) <= len(best[0])):
                continue
            if all(p.op_type in CHEAP and len(_activation_inputs(ctx, p) or ()) == 1 for p in part):
                continue
            inner = _closed(ctx, part, out)
            if inner is not None:
                best = (part, inner, out)
    if best is None:
        return False
    part, inner, out = best
    qs = [n for n in ctx.consumers.get(out, []) if n.op_type == "QuantizeLinear"]
    x_in = next(i for i in node.input if i and ctx.index.source(i) == x)
    xt = ctx.value(x_in)
    if not qs or not isinstance(xt, TTensor) or xt.q is None or xt.dtype != np.int8:
        return False
    out_q = ctx.qparams_of(qs[0])
    if out_q.dtype != np.int8 or not out_q.is_per_tensor:
        return False
    table = build_table(_evaluator(ctx, part, x, out), xt.q, out_q)
    ctx.values[out] = emit_table(ctx, xt, table, out_q, output_of=out)
    ctx.fused.update(n.name for n in [*part, *inner] if n.name != node.name)
    return True


def fusable(lower: Callable[[LoweringContext], None]) -> Callable[[LoweringContext], None]:
    """Wrap an elementwise lowering: in the INT profile try the one-TABLE fusion first."""

    @functools.wraps(lower)
    def wrapped(ctx: LoweringContext) -> None:
        if ctx.profile == "int" and try_fuse_unary_region(ctx):
            return
        lower(ctx)

    return wrapped
