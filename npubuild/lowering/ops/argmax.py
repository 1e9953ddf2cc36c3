"""Index selection: ArgMax, ArgMin, Hardmax, TopK (K = 1 in int8; any static K in fp32).

TOSA ARGMAX reduces one axis; Vela runs it on U55/U65 only over the last axis of an int8 tensor (up to
127 entries, support rules u55-argmax-axis and u55-argmax-channels), so the axis is first brought
physically last (reduction.axis_last: an int8 layout change, free when it already is). An int8 ArgMin
is the ArgMax of -1 - q, one NEGATE with input zero point -1: exact and order-reversing on all 256
codes, so ties keep the first index as ONNX wants. select_last_index reverses the axis first and maps
the index back (K - 1 - i). The indices are int32 (TOSA has no int64 in PRO-INT); ONNX's int64 values
are the same numbers.

Hardmax in int8: the ArgMax index i, then per element the int32 difference (position - i) narrowed to
int8 (saturating) through a TABLE that gives the output's code for 1.0 at 0 and for 0.0 elsewhere, so
only the first maximum is set, as ONNX says. TopK with K = 1 is a ReduceMax (values) and an ArgMax
(indices); fp32 TopK takes K maxima one after another, masking each found element with -inf.
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering import fp
from npubuild.lowering import intmath as im
from npubuild.lowering.context import LoweringContext, TTensor
from npubuild.lowering.emit import Op, attr, requantize, reshape
from npubuild.lowering.movement import norm_axis
from npubuild.lowering.quant import QParams
from npubuild.lowering.reduction import axis_last, emit_reduce
from npubuild.lowering.registry import lowers, quantize_also
from npubuild.lowering.table import emit_table

quantize_also("ArgMin", "Hardmax", "TopK")

RAW_Q = QParams(np.float64(1.0), np.int64(0), np.dtype(np.int8))


def _last_axis_input(ctx: LoweringContext) -> tuple[TTensor, int]:
    """Input 0 with the node's `axis` physically last, and that logical axis."""
    x = ctx.tensor(0)
    default = 0 if ctx.current.op_type in ("ArgMax", "ArgMin") else -1
    axis = norm_axis(ctx, int(ctx.attr("axis", default)), len(x.shape))
    return axis_last(ctx, x, [axis]), axis


def _negated(ctx: LoweringContext, x: TTensor) -> TTensor:
    """An order-reversing copy: -x in fp32; -1 - q in int8 (NEGATE with input zero point -1, no saturation)."""
    if x.dtype == np.float32:
        return fp.negate(ctx, x)
    out = ctx.new_tensor(x.shape, x.dtype, x.perm)
    ctx.op(Op.NEGATE, [x.name, ctx.zp(-1, x.dtype), ctx.zp(0, x.dtype)], [out.name], attr("Negate"))
    return out


def _reversed_last(ctx: LoweringContext, x: TTensor) -> TTensor:
    """REVERSE of the last physical axis, as the W axis of a [1, rows, K, 1] view (U55 reverses H or W only)."""
    rows, k = int(np.prod(x.shape[:-1])), x.shape[-1]
    view = reshape(ctx, x, (1, rows, k, 1), (0, 1, 2, 3))
    out = ctx.new_tensor(view.shape, x.dtype, view.perm, x.q)
    ctx.op(Op.REVERSE, [view.name], [out.name], attr("Reverse", 2))
    return reshape(ctx, out, x.shape, x.perm)


def _argmax_last(ctx: LoweringContext, x: TTensor, last_index: bool) -> TTensor:
    """int32 index of the (first, or with last_index the last) maximum along the last physical axis, kept
    as size 1."""
    k = x.shape[-1]
    src = _reversed_last(ctx, x) if last_index else x
    idx = ctx.new_tensor(x.shape[:-1], np.int32, tuple(range(len(x.shape) - 1)))
    ctx.op(Op.ARGMAX, [src.name], [idx.name], attr("ArgMax", len(x.shape) - 1, ts.NanPropagationMode.PROPAGATE))
    idx = reshape(ctx, idx, (*x.shape[:-1], 1), x.perm)
    if last_index:
        idx = im.sub(ctx, im.const_i32(ctx, k - 1, idx), idx)
    return idx


def _finish_index(ctx: LoweringContext, idx: TTensor, axis: int, keepdims: bool, out: int = 0) -> None:
    name = ctx.current.output[out]
    shape = idx.shape if keepdims else tuple(d for j, d in enumerate(idx.shape) if idx.perm[j] != axis)
    if keepdims:
        ctx.set_output(out, reshape(ctx, idx, shape, idx.perm, output_of=name))
        return
    kept = [p for p in idx.perm if p != axis]
    rank = {p: i for i, p in enumerate(sorted(kept))}
    ctx.set_output(out, reshape(ctx, idx, shape, tuple(rank[p] for p in kept), output_of=name))


def _arg(ctx: LoweringContext, smallest: bool) -> None:
    x, axis = _last_axis_input(ctx)
    if ctx.profile == "int" and (x.q is None or x.dtype != np.int8):
        raise ctx.unsupported("the integer ArgMax/ArgMin needs an int8 input")
    src = _negated(ctx, x) if smallest else x
    idx = _argmax_last(ctx, src, bool(int(ctx.attr("select_last_index", 0))))
    _finish_index(ctx, idx, axis, bool(int(ctx.attr("keepdims", 1))))


@lowers("ArgMax")
def lower_argmax(ctx: LoweringContext) -> None:
    _arg(ctx, smallest=False)


@lowers("ArgMin")
def lower_argmin(ctx: LoweringContext) -> None:
    _arg(ctx, smallest=True)


def _one_hot(ctx: LoweringContext, x: TTensor, idx: TTensor, out_q: QParams | None, output_of: str | None) -> TTensor:
    """1.0 where the position along the last axis equals idx, else 0.0 (int8 out_q, or fp32)."""
    k = x.shape[-1]
    iota = np.arange(k, dtype=np.int64).reshape((1,) * (len(x.shape) - 1) + (k,))
    diff = im.sub(ctx, im.const_i32(ctx, iota, idx), idx)  # [.., K] int32
    if out_q is None:
        zero = TTensor(ctx.const(np.zeros((1,) * len(x.shape), np.int32), "i32"), (1,) * len(x.shape),
                       np.dtype(np.int32), x.perm)
        return fp.select(ctx, fp.equal(ctx, diff, zero), fp.scalar(ctx, 1.0, x), fp.scalar(ctx, 0.0, x),
                         output_of=output_of)
    code = ctx.new_tensor(diff.shape, np.int8, diff.perm)  # saturating: only 0 matters
    ins = [diff.name, ctx.const(np.array([1 << 30], np.int32), "multiplier"), ctx.const(np.array([30], np.int8), "shift"),
           ctx.zp(0, np.int32), ctx.zp(0, np.int8)]
    ctx.op(Op.RESCALE, ins, [code.name], attr("Rescale", True, ts.RoundingMode.SINGLE_ROUND, False, False, False))
    table = np.full(256, out_q.quantize(np.array([0.0]))[0], np.int8)
    table[128] = out_q.quantize(np.array([1.0]))[0]
    return emit_table(ctx, TTensor(code.name, code.shape, code.dtype, code.perm, RAW_Q), table, out_q,
                      output_of=output_of)


@lowers("Hardmax")
def lower_hardmax(ctx: LoweringContext) -> None:
    x0 = ctx.tensor(0)
    x, axis = _last_axis_input(ctx)
    out_q = ctx.require_output_q() if ctx.profile == "int" else None
    if out_q is not None and (x.q is None or x.dtype != np.int8 or out_q.dtype != np.int8):
        raise ctx.unsupported("the integer Hardmax needs int8 input and output")
    idx = _argmax_last(ctx, x, False)
    name = ctx.current.output[0]
    y = _one_hot(ctx, x, idx, out_q, name if x.perm == x0.perm else None)
    ctx.set_output(0, y if x.perm == x0.perm else reshape(ctx, y, y.shape, y.perm, output_of=name))


@lowers("TopK")
def lower_topk(ctx: LoweringContext) -> None:
    k = ctx.constant(1)
    if k is None:
        raise ctx.unsupported("K must be a constant")
    k = int(np.asarray(k).reshape(-1)[0])
    largest, is_sorted = bool(int(ctx.attr("largest", 1))), bool(int(ctx.attr("sorted", 1)))
    x, axis = _last_axis_input(ctx)
    if not is_sorted and k > 1:
        raise ctx.unsupported("unsorted TopK is not supported")
    if ctx.profile == "int":
        if k != 1:
            raise ctx.unsupported(f"the integer TopK supports K = 1 only (K = {k})")
        if x.q is None or x.dtype != np.int8:
            raise ctx.unsupported("the integer TopK needs an int8 input")
        src = x if largest else _negated(ctx, x)
        idx = _argmax_last(ctx, src, False)
        values = emit_reduce(ctx, Op.REDUCE_MAX if largest else Op.REDUCE_MIN, x, [len(x.shape) - 1])
        out_q = ctx.output_q(0)
        if out_q is not None and not x.q.same_as(out_q):
            values = requantize(ctx, values, out_q)
        ctx.set_output(0, reshape(ctx, values, values.shape, values.perm, output_of=ctx.current.output[0]))
        _finish_index(ctx, idx, axis, True, out=1)
        return
    src = x if largest else fp.negate(ctx, x)
    values, indices = [], []
    for j in range(k):
        idx = _argmax_last(ctx, src, False)
        hit = _one_hot(ctx, src, idx, None, None)  # 1.0 at the found element
        best = emit_reduce(ctx, Op.REDUCE_MAX, src, [len(x.shape) - 1])
        values.append(best if largest else fp.negate(ctx, best))
        indices.append(idx)
        if j + 1 < k:
            src = fp.select(ctx, fp.greater(ctx, hit, fp.scalar(ctx, 0.5, hit)), fp.scalar(ctx, -np.inf, src), src)
    for out, parts, dtype in ((0, values, np.float32), (1, indices, np.int32)):
        if out >= len(ctx.current.output) or not ctx.current.output[out]:
            continue
        t = parts[0]
        if len(parts) > 1:
            shape = (*t.shape[:-1], len(parts))
            t = ctx.new_tensor(shape, dtype, parts[0].perm)
            ctx.op(Op.CONCAT, [p.name for p in parts], [t.name], attr("Concat", len(shape) - 1))
        ctx.set_output(out, reshape(ctx, t, t.shape, t.perm, output_of=ctx.current.output[out]))
