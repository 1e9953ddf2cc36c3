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
onnxruntime on the group as the QDQ model has it: the float nodes with every
Q -> DQ pair between them kept, so each intermediate is rounded and saturated
to its int8 grid exactly where onnxruntime's QDQ reference rounds it. The table
then reproduces the QDQ model bit for bit (up to onnxruntime's own float
kernels, which it also runs), at no cost on the NPU: a table holds any function
of 256 codes. Rounding once instead (the float f, as this module did before)
is closer to the float model but differs from the QDQ reference by up to 1 LSB
per group, and a network with gain turns that into more: MobileViT-xxs
(timm, random weights) measured 11 LSB / 24.6 dB TOSA-vs-QDQ, the first
jump at a SiLU (x * Sigmoid(x), the sigmoid rounded to 1/255 first in the
reference) and growing through LayerNorm and the attention MatMuls.

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
from npubuild.lowering.table import emit_function

QDQ = ("QuantizeLinear", "DequantizeLinear")
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Erf", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt",
               "Reciprocal", "Abs", "Neg", "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Gelu", "PRelu",
               "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Swish", "ThresholdedRelu", "Shrink", "Sign",
               "Floor", "Ceil", "Round"}
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
            if c in group or c.op_type not in ELEMENTWISE or c.domain not in ("", "ai.onnx") \
                    or ctx.index.order[c.name] <= ctx.index.order[start.name]:  # ONNX's own ops only
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


def _qdq_chain(ctx: LoweringContext, name: str) -> list[tuple[onnx.NodeProto, onnx.NodeProto]]:
    """The Q -> DQ pairs between `name` and its source, first pair (nearest the source) first."""
    pairs = []
    while name != ctx.index.source(name):
        dq = ctx.index.producer[name]
        q = ctx.index.producer[dq.input[0]]
        pairs.append((q, dq))
        name = q.input[0]
    return pairs[::-1]


def _evaluator(ctx: LoweringContext, part: list[onnx.NodeProto], x: str, out: str
               ) -> Callable[[np.ndarray], np.ndarray]:
    """f(x) of the group as the QDQ model computes it, run by onnxruntime on a 1-D x (the dequantized codes or table knots).

    Each Q -> DQ pair inside the group is kept as a QuantizeLinear -> DequantizeLinear with its scale and
    zero point, so an intermediate is rounded and saturated where the QDQ reference does it.
    """
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    requantized: dict[str, str] = {}

    def constant(v: np.ndarray) -> str:
        inits.append(onnx.numpy_helper.from_array(np.asarray(v), f"c{len(inits)}"))
        return inits[-1].name

    def through_qdq(name: str) -> str:
        """`name` (a DQ output inside the group) rebuilt from its source by the same Q -> DQ pairs."""
        if name not in requantized:
            cur = ctx.index.source(name)
            for q, dq in _qdq_chain(ctx, name):
                for node, suffix in ((q, "q"), (dq, "dq")):
                    ins = [cur] + [constant(ctx.values[i]) if i else "" for i in node.input[1:]]
                    made = helper.make_node(node.op_type, ins, [f"{node.output[0]}_{suffix}"])
                    made.attribute.extend(node.attribute)
                    nodes.append(made)
                    cur = made.output[0]
            requantized[name] = cur
        return requantized[name]

    for n in part:
        ins = []
        for name in n.input:
            c = ctx.real_const(name) if name else None
            if not name:
                ins.append("")
            elif c is not None:
                ins.append(constant(np.array(float(c.reshape(-1)[0]), np.float32)))
            elif ctx.index.source(name) == x:
                ins.append("x")
            elif name != ctx.index.source(name):
                ins.append(through_qdq(name))
            else:
                ins.append(name)
        m = helper.make_node(n.op_type, ins, list(n.output), name=n.name)
        m.attribute.extend(n.attribute)
        nodes.append(m)
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[o for o in ctx.model.opset_import if o.domain in ("", "ai.onnx")])
    model.ir_version = min(ctx.model.ir_version, 10) or 8
    sess = _session(model.SerializeToString())
    return lambda v: np.asarray(sess.run(None, {"x": np.asarray(v, np.float32)})[0], np.float64).reshape(-1)


@functools.lru_cache(maxsize=256)
def _session(model: bytes) -> ort.InferenceSession:
    """An onnxruntime session of a group's f(x) model, made once per distinct model: the lower stage lowers its
    model once per family and measured variant (~10 times), each with the same groups, and a session is most
    of a group's cost (PP-OCRv4 rec: 40 groups, ~0.1 CPU s of its ~0.4 s lowering). A session runs the same
    model the same way whichever lowering asks. One thread: a kept session's own thread pool spins on the
    CPU after each run (yolov8n's 57 kept sessions cost 3 CPU s so), and elementwise kernels on a few hundred
    values give the same floats on any number of threads."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the QDQ semantics, as the check
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


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
    if not qs or not isinstance(xt, TTensor) or xt.q is None or xt.dtype not in (np.int8, np.int16):
        return False
    out_q = ctx.qparams_of(qs[0])
    if out_q.dtype not in (np.int8, np.int16) or not out_q.is_per_tensor:
        return False
    ctx.values[out] = emit_function(ctx, xt, _evaluator(ctx, part, x, out), out_q, output_of=out)
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
